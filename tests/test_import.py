"""`import autoopt` is cheap: no torch, no triton, no rich, no pynvml, well under 150 ms."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "rich", "pynvml", "numpy", "yaml", "cpuinfo", "pluggy")


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args, "-c", code], capture_output=True, text=True, env=env,
                          check=True, cwd=ROOT)


def test_import_autoopt_pulls_in_no_heavy_module():
    out = _run("import sys, json, autoopt; print(json.dumps(sorted(sys.modules)))")
    loaded = set(json.loads(out.stdout))
    assert not [m for m in HEAVY if m in loaded]


def test_import_time_reported_by_importtime_is_well_under_150ms():
    # -X importtime writes one line per module: "import time: self | cumulative | name".
    best = min(
        int(line.split("|")[1])
        for line in [
            next(ln for ln in _run("import autoopt", "-X", "importtime").stderr.splitlines()
                 if ln.rstrip().endswith("| autoopt"))
            for _ in range(3)
        ]
    )
    assert best < 150_000, f"import autoopt took {best} us"


def test_importtime_lists_neither_torch_nor_triton():
    lines = _run("import autoopt", "-X", "importtime").stderr.splitlines()
    names = {ln.rsplit("|", 1)[-1].strip() for ln in lines if "|" in ln}
    assert "torch" not in names and "triton" not in names


def test_lazy_public_api_resolves_on_first_use():
    out = _run("import autoopt; print(autoopt.OpSpec.__module__, autoopt.HardwareProfile.__name__)")
    assert out.stdout.split() == ["autoopt.kernels.ops", "HardwareProfile"]


def test_public_functions_stay_callable_after_every_submodule_is_imported():
    # a submodule named like a public function would replace it on the package when imported
    code = ("import importlib, pkgutil, autoopt\n"
            "for m in pkgutil.iter_modules(autoopt.__path__):\n"
            "    if m.name != '__main__': importlib.import_module('autoopt.' + m.name)\n"
            "print(all(callable(getattr(autoopt, n)) for n in ('detect', 'rank', 'recommend', 'load_profile')))")
    assert _run(code).stdout.strip() == "True"
