"""benchmarks/replay_moe.py: the fused-MoE cost model's order of a committed grid, and what it refuses to read."""

from __future__ import annotations

import json

import pytest

from benchmarks import replay_moe


def test_a_committed_grid_scores_each_point_and_the_geomean(capsys):
    path = replay_moe.FILES[0]
    assert replay_moe.main([str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 49 and lines[-1].startswith(f"{path.name}: 48 points, geomean 0.9")


@pytest.mark.parametrize(("make", "says"), [
    (lambda tmp: "/dev/urandom", "expected a regular file of at most 16 MiB"),
    (lambda tmp: _write(tmp, "x" * ((16 << 20) + 1)), "expected a regular file of at most 16 MiB"),
    (lambda tmp: _write(tmp, "not json"), "not JSON"),
    (lambda tmp: _write(tmp, json.dumps({"workloads": []})), "not a moe_runtime_configs.py result"),
    (lambda tmp: _write(tmp, json.dumps({"rows": [{"case": "x", "M": 1, "E": 8, "topk": 2, "N": 64, "K": 64,
                                                    "dtype": "nf4"}]})), "has dtype 'nf4'"),
])
def test_a_file_that_is_not_a_grid_is_one_line_and_exit_2(tmp_path, capsys, make, says):
    assert replay_moe.main([make(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replay_moe: ") and says in err and err.count("\n") == 1


def _write(tmp, text: str) -> str:
    path = tmp / "grid.json"
    path.write_text(text)
    return str(path)
