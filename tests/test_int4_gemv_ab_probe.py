"""The int4 GEMV A/B probe (benchmarks/probes/int4_gemv_ab.py) refuses an --old that is not a kernel module, in
one line and exit 2, before it imports torch or touches a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "benchmarks" / "probes" / "int4_gemv_ab.py"


@pytest.mark.parametrize("old,why", [("/dev/urandom", "not a regular .py file"),
                                     ("README.md", "not a regular .py file"),
                                     ("no-such-file.py", "No such file or directory"),
                                     ("big.py", "a kernel module is at most")])
def test_an_old_that_is_not_a_kernel_module_is_refused_in_one_line(tmp_path, old, why):
    if old == "big.py":
        (tmp_path / old).write_bytes(b"#" * ((1 << 20) + 1))
        old = str(tmp_path / old)
    out = subprocess.run([sys.executable, str(PROBE), "--old", old, "--out", str(tmp_path / "ab.json")],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and why in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "ab.json").exists()
