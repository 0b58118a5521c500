"""benchmarks/replay_quant.py: committed quantized-kernel timings replayed against the cost model, no GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.replay_quant import _picks  # noqa: E402


def test_a_pick_is_the_measured_time_of_the_config_predicted_fastest():
    got = _picks({"qkv M=1 int4": [(1.0, 5.0), (2.0, 3.0)], "o M=1 int4": [(4.0, 2.0), (3.0, 2.5)]})
    assert got["qkv M=1 int4"] == {"picked_us": 5.0, "best_us": 3.0}
    assert got["o M=1 int4"] == {"picked_us": 2.5, "best_us": 2.0}
    assert got["sum_picked_over_best"] == round(7.5 / 5.0, 3)


def test_the_h200_graph_grid_replays_on_its_own_profile_with_its_picks():
    proc = subprocess.run([sys.executable, "benchmarks/replay_quant.py", "--keep-changed", "--results",
                           "benchmarks/results/h200/quant_kernels_fmagrid_graph.json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "picks sum_picked_over_best           1.058" in proc.stdout
    assert "picks down M=1 int4-g128" in proc.stdout


@pytest.mark.parametrize("content,why", [
    (None, "regular file"),  # a directory
    (b"\x00\xff not json", "not JSON"),
    (b'{"rows": 3}', "'rows' list"),
    (b'{"rows": [{"impl": "autoopt quant_gemv", "measured_us": 5.0, "m": 1}]}', "lacks linear, n, k"),
])
def test_a_file_that_is_not_a_result_is_one_line_and_exit_2(tmp_path, content, why):
    path = tmp_path / "r.json"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    proc = subprocess.run([sys.executable, "benchmarks/replay_quant.py", "--results", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and why in proc.stderr and "Traceback" not in proc.stderr


def test_an_unknown_profile_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "benchmarks/replay_quant.py", "--profile", "no-such-gpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no-such-gpu" in proc.stderr
