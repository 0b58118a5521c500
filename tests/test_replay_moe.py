"""benchmarks/replay_moe.py: the fused-MoE cost model's order of a committed grid, and what it refuses to read."""

from __future__ import annotations

import json

import pytest

from benchmarks import replay_moe


def test_a_committed_grid_scores_each_point_and_the_geomean(capsys):
    path = replay_moe.FILES[0]
    assert replay_moe.main([str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 50 and lines[-2].startswith(f"{path.name}: 48 points, geomean 0.9")


def test_the_zero_shot_pick_is_scored_where_the_run_timed_it(capsys):
    # rank()'s first config from the whole space, over the run's fastest, on the points whose run timed it
    path = replay_moe.FILES[0]
    assert replay_moe.main([str(path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"{path.name}: zero-shot (rank()'s first from the whole space), 34 of 48 points timed")
    assert "geomean 0.964" in last


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


def test_a_config_timed_twice_in_a_run_counts_its_least_timing():
    from benchmarks.replay_moe import timings

    row = {"grid": {"16/64/128/1/4/4": 385.7, "16/128/128/1/4/4": 64.2, "32/64/64/1/4/3": "error: out of smem"},
           "b_default": {"config": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                                    "num_warps": 4, "num_stages": 4}, "check": "passed", "measured_us": 125.7},
           "c_zero_shot": {"config": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128,
                                      "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4},
                           "check": "failed", "measured_us": 1.0}}
    assert timings(row) == {"16/64/128/1/4/4": 125.7, "16/128/128/1/4/4": 64.2}


def test_a_named_set_counts_the_least_of_its_two_rounds():
    # H200, 2026-11-28, Mixtral TP8 M=1: the sets' second round ran 120-129 us where their first took 70-74
    from benchmarks.replay_moe import timings

    row = {"grid": {"16/64/128/1/4/5": 95.0},
           "c_zero_shot": {"config": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                                      "num_warps": 4, "num_stages": 5}, "check": "passed", "measured_us": 123.23,
                           "measured_us_first": 70.285}}
    assert timings(row) == {"16/64/128/1/4/5": 70.285}


def test_a_file_is_scored_on_the_profile_of_the_gpu_it_was_measured_on():
    h200 = replay_moe.RESULTS.parent / "h200" / "moe_runtime_configs_cases0123.json"
    assert replay_moe.load_run(h200)[1].name == "NVIDIA H200"
    assert replay_moe.load_run(replay_moe.FILES[0])[1].name == "NVIDIA H100 80GB HBM3"


def test_a_file_from_a_gpu_no_profile_describes_is_one_line_and_exit_2(tmp_path, capsys):
    row = {"case": "x", "M": 1, "E": 8, "topk": 2, "N": 64, "K": 64, "dtype": "bf16", "grid": {}}
    path = _write(tmp_path, json.dumps({"device_name": "Imaginary_GPU_9000", "rows": [row]}))
    assert replay_moe.main([path]) == 2
    err = capsys.readouterr().err
    assert "measured on 'Imaginary_GPU_9000', which no profile in profiles/ describes" in err and err.count("\n") == 1
