"""benchmarks/replay_quant.py: committed quantized-kernel timings replayed against the cost model, no GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
