"""benchmarks/moe_runtime_configs.py's final round: the named sets and the grid's fastest timed again together,
every ratio from that round (no GPU: a fake timer)."""

from __future__ import annotations

import itertools

from benchmarks import moe_runtime_configs as bench

KEYS = bench.GRID[0]


def _cfg(key: str) -> dict[str, int]:
    return dict(zip(KEYS, map(int, key.split("/")), strict=True))


def _row() -> dict:
    grid = {"16/64/64/1/4/3": 60.0, "16/64/128/1/4/3": 90.0, "32/64/64/1/4/3": 70.0, "32/128/64/1/4/3": 80.0,
            "64/64/64/1/4/3": 85.0, "64/128/64/1/4/3": 95.0, "128/128/64/1/8/3": "error"}
    return {"grid": grid, "c_zero_shot": {"config": _cfg("32/64/64/1/4/3"), "measured_us": 75.0},
            "b_default": {"config": _cfg("64/128/64/1/4/3"), "measured_us": 99.0}}


def test_the_grids_lucky_first_pass_does_not_set_the_best():
    # the grid timed 16/64/64 at 60 us once; the final round times it at 72, the zero-shot config at 70
    final = {"16/64/64/1/4/3": 72.0, "32/64/64/1/4/3": 70.0}
    row = _row()
    bench.final_round(row, lambda cfg: {"measured_us": final.get("/".join(str(cfg[k]) for k in KEYS), 100.0)},
                      grid_timed=6, warm=lambda: None)
    assert row["search_best"]["config"] == _cfg("32/64/64/1/4/3") and row["search_best"]["measured_us"] == 70.0
    assert row["c_zero_shot"]["best_over_this"] == 1.0 and row["c_zero_shot"]["measured_us_first"] == 75.0
    assert row["b_default"]["best_over_this"] == 0.7


def test_the_final_round_times_the_sets_and_the_grids_five_fastest_each_pass():
    calls = []
    row = _row()
    bench.final_round(row, lambda cfg: calls.append("/".join(str(cfg[k]) for k in KEYS)) or {"measured_us": 1.0},
                      grid_timed=6, warm=lambda: None)
    assert len(calls) == bench.FINAL_PASSES * 6  # c, b, and the grid's five fastest (c is one of them)
    assert set(calls) == {"32/64/64/1/4/3", "64/128/64/1/4/3", "16/64/64/1/4/3", "32/128/64/1/4/3",
                          "64/64/64/1/4/3", "16/64/128/1/4/3"}
    firsts = [calls[i * 6] for i in range(bench.FINAL_PASSES)]
    assert len(set(firsts)) == bench.FINAL_PASSES  # the order rotates between passes


def test_a_config_that_fails_every_pass_gets_no_time():
    row = _row()
    counter = itertools.count()
    bench.final_round(row, lambda cfg: {"check": "failed"} if cfg["BLOCK_SIZE_M"] == 64 else
                      {"measured_us": 50.0 + next(counter) % 3}, grid_timed=6, warm=lambda: None)
    assert "64/128/64/1/4/3" not in row["final_round"]["us"] or not row["final_round"]["us"]["64/128/64/1/4/3"]
    assert "best_over_this" not in row["b_default"]


# -- --graph: routings shifted by top-k experts ------------------------------------------------------------------

def _case(e=128, topk=8, m=1, n=16, k=32):
    import torch

    ids = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(i))[:topk] for i in range(m)])
    return {"e": e, "topk": topk, "m": m, "ids": ids.to(torch.int32), "w13": torch.zeros(e, 2 * n, k),
            "w2": torch.zeros(e, k, n), ("align", 16): "cached"}


def test_a_shifted_routing_sends_every_token_topk_experts_further_on_the_same_weights():
    c = _case()
    s = bench.shifted_case(c, 3)
    assert s["ids"].tolist() == ((c["ids"] + 24) % 128).tolist()
    assert s["w13"] is c["w13"] and ("align", 16) not in s and ("align", 16) in c


def test_routings_pass_three_l2s_of_touched_experts_capped_by_disjoint_sets():
    c = _case()  # 8 experts of (32 x 32 + 32 x 16) fp32 = 6 KiB each: 48 KiB a routing
    assert bench.routings(c, l2_bytes=32 << 10) == 2  # 96 KiB / 48 KiB
    assert bench.routings(c, l2_bytes=50 << 20) == bench.MAX_ROUTINGS
    assert bench.routings(_case(e=8, topk=2), l2_bytes=50 << 20) == 4  # 8 experts / 2 a token
    assert bench.routings(c, l2_bytes=1 << 10) == 1  # a routing already passes three L2s


def test_a_rotated_runner_runs_the_first_case_first_and_hands_back_its_outputs():
    calls = []
    run, outs = bench.rotated(lambda cc: (lambda: calls.append(cc["name"]), cc["name"] + "-out"),
                              [{"name": "a"}, {"name": "b"}, {"name": "c"}])
    for _ in range(4):
        run()
    assert outs == "a-out" and calls == ["a", "b", "c", "a"]


def test_a_graph_holds_calls_for_two_ms_of_work_within_its_bounds():
    # ~3 ms Mixtral calls at M = 4096: two a graph; 30 us calls: the 32 cap; never fewer than the routings
    assert bench.graph_calls(3000.0) == 2 and bench.graph_calls(30.0) == bench.GRAPH_CALLS
    assert bench.graph_calls(173.0) == 12 and bench.graph_calls(3000.0, least=4) == 4
