"""Cost model: what it predicts for known shapes, how each term moves, and calibration."""

from __future__ import annotations

import math

import pytest

from autoopt._paths import builtin_templates
from autoopt.errors import AutooptError
from autoopt.hardware.library import load_profile
from autoopt.kernels import cost
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import CostConstants, predict_matmul, using
from autoopt.kernels.ops import OpSpec
from autoopt.search.calibration import fit_constants
from autoopt.search.ranking import predict_config, rank

builtin_templates()
from autoopt.templates.gemm import GemmTemplate  # noqa: E402

H100 = load_profile("h100-sxm").gpu
BIG = OpSpec(kind="gemm", shape=(4096, 4096, 4096))


def cfg(bm=128, bn=128, bk=64, stages=3, warps=8, group=8, split=1, path="wgmma"):
    return KernelConfig(kernel="gemm", template="gemm", path=path,
                        params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "SPLIT_K": split,
                                "num_warps": warps, "num_stages": stages})


def us(op, c, gpu=H100):
    return predict_config(gpu, op, c).us


def test_h100_4096_cubed_best_is_a_128_row_tile_with_64_k_3_to_4_stages_and_8_warps():
    best = rank(H100, BIG, templates=[GemmTemplate()]).best.config.params
    assert (best["BLOCK_M"], best["BLOCK_N"]) in {(128, 256), (128, 128), (256, 128)}
    assert best["BLOCK_K"] == 64 and best["num_warps"] == 8 and best["num_stages"] in (3, 4)


def test_large_gemm_is_compute_bound_and_within_the_roofline():
    p = predict_config(H100, BIG, cfg())
    assert p.bound == "compute"
    assert 40 < p.roofline_pct <= 100
    assert p.us > cost.floor_us(H100, BIG)


def test_decode_gemm_is_memory_bound_and_prefers_a_16_row_tile():
    op = OpSpec(kind="gemm", shape=(16, 4096, 4096))
    best = rank(H100, op, templates=[GemmTemplate()]).best
    assert best.bound == "memory"
    assert best.config.params["BLOCK_M"] == 16


def test_wgmma_beats_mma_sync_for_the_same_tile_on_hopper():
    assert us(BIG, cfg(path="wgmma")) < us(BIG, cfg(warps=8, path="wgmma")) * 1.0001
    wg = us(BIG, cfg(bm=128, warps=8, path="wgmma"))
    sync = predict_matmul(H100, BIG, cfg(), mma="mma_sync", smem_bytes=98304, regs_per_thread=160).us
    assert sync > 1.3 * wg


def test_one_tile_past_a_full_wave_costs_a_second_wave():
    # 132 SMs: 11 x 12 tiles of 128x128 fill one wave exactly; one more row of tiles starts a second
    full = OpSpec(kind="gemm", shape=(128 * 11, 128 * 12, 4096))
    over = OpSpec(kind="gemm", shape=(128 * 11 + 1, 128 * 12, 4096))
    c = cfg(stages=4, warps=8)
    assert us(over, c) > 1.5 * us(full, c)


def test_two_stages_hide_less_latency_than_three():
    assert us(BIG, cfg(bk=128, stages=2)) > us(BIG, cfg(bk=128, stages=3))


def test_group_m_swizzle_reduces_dram_traffic():
    # Two row-blocks over 224 column-blocks: row-major order (GROUP_M=1) reaches the second row's
    # use of each W tile a whole wave later, after ~230 MB of W went through L2, so W is read twice.
    # Measured on an H200 (TMA GEMM): GROUP_M=1 131.9 us vs GROUP_M=8 106.3 us.
    wide = OpSpec(kind="gemm", shape=(256, 28672, 4096))
    a = predict_config(H100, wide, cfg(group=1)).breakdown["dram_mb"]
    b = predict_config(H100, wide, cfg(group=8)).breakdown["dram_mb"]
    assert a == pytest.approx(b + 28672 * 4096 * 2 / 1e6, rel=0.01)
    assert b >= wide.min_bytes / 1e6


def test_split_k_adds_partial_traffic_and_a_launch():
    op = OpSpec(kind="gemm", shape=(16, 1024, 8192))
    one = predict_config(H100, op, cfg(bm=16, bn=64, bk=128, stages=4, warps=4, group=1, path="standard"))
    four = predict_config(H100, op, cfg(bm=16, bn=64, bk=128, stages=4, warps=4, group=1, split=4,
                                        path="standard"))
    assert four.breakdown["launch_us"] == 2 * one.breakdown["launch_us"]
    assert "split-K 4" in four.reason
    # 16 tiles on 132 SMs: splitting K puts 4x the SMs to work and wins despite the extra launch
    assert four.us < one.us


def test_prediction_reports_its_terms():
    p = predict_config(H100, BIG, cfg())
    assert {"compute_us", "dram_us", "l2_us", "latency_us", "launch_us", "floor_us", "waves"} <= set(p.breakdown)
    assert math.isclose(p.breakdown["waves"], 1024 / 132 / p.breakdown["ctas_per_sm"])


def test_using_swaps_constants_and_rank_does_not_serve_stale_results():
    base = rank(H100, BIG, top=1).best.predicted_us
    with using(CostConstants(tc_efficiency=0.39)):
        slow = rank(H100, BIG, top=1).best.predicted_us
    assert slow > 1.5 * base
    assert rank(H100, BIG, top=1).best.predicted_us == base


def test_constants_round_trip_through_a_dict():
    c = CostConstants(launch_us=3.0)
    assert CostConstants.from_dict(c.to_dict()) == c
    with pytest.raises(AutooptError, match="unknown field"):
        CostConstants.from_dict({"nonsense": 1.0})


def test_fit_constants_recovers_a_known_efficiency_from_synthetic_timings():
    truth = CostConstants(tc_efficiency=0.6, launch_us=3.0)
    shapes = [(4096, 4096, 4096), (2048, 8192, 4096), (8192, 1024, 2048)]
    configs = [cfg(128, 256, 64, 3), cfg(128, 128, 64, 4), cfg(256, 128, 64, 3), cfg(64, 128, 64, 4, warps=4)]
    with using(truth):
        samples = [(H100, op, c, us(op, c)) for op in (OpSpec(kind="gemm", shape=s) for s in shapes)
                   for c in configs]
    fitted = fit_constants(samples, names=["tc_efficiency", "launch_us"])
    assert fitted.tc_efficiency == pytest.approx(0.6, rel=0.03)


def test_fit_constants_refuses_bad_samples():
    with pytest.raises(AutooptError, match="at least one"):
        fit_constants([])
    with pytest.raises(AutooptError, match="measured_us > 0"):
        fit_constants([(H100, BIG, cfg(), -1.0)])


def test_short_row_runs_keep_less_of_dram_bandwidth():
    c = CostConstants()
    # bf16 W [N, K]: BLOCK_K = 32 reads 64 contiguous bytes of each row per K-iteration
    assert cost.run_efficiency(256, 32, 2, "nk", c) == pytest.approx(0.73, abs=0.01)
    assert cost.run_efficiency(256, 64, 2, "nk", c) == pytest.approx(0.97, abs=0.01)
    assert cost.run_efficiency(256, 128, 2, "nk", c) > 0.99
    # a [K, N] weight runs along N
    assert cost.run_efficiency(256, 32, 2, "kn", c) > 0.99
    assert cost.run_efficiency(16, 32, 2, "nk", CostConstants(dram_run_bytes=0.0)) == 1.0


def test_short_row_runs_rank_the_measured_lm_head_sweeps_better():
    # 45 timed configs of each GPU's decode lm_head / gate_up (benchmarks/results/*/wide_sweep.json):
    # BLOCK_K = 32 configs ran up to 2x slower than predicted with the term off
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from autoopt.search.calibration import score
    from benchmarks.replay_ranking import sweep_samples

    for gpu_dir, before, after in (("h100", 0.950, 0.973), ("h200", 0.936, 0.969)):
        samples = sweep_samples(gpu_dir, "wide_sweep.json")
        assert score(samples, CostConstants(dram_run_bytes=0.0)).geomean_top1 == pytest.approx(before, abs=0.002)
        assert score(samples, CostConstants()).geomean_top1 == pytest.approx(after, abs=0.002)


@pytest.mark.parametrize("profile", ["h100-sxm", "h200"])
def test_one_n256_wgmma_per_warpgroup_outranks_two_n128_at_m4096(profile):
    """128x256 tiles (each warpgroup one m64n256k16) beat 256x128 (two m64n128k16) on 14 of 16 same-run
    shape timings on both GPUs (benchmarks/results/{h100,h200}/ranking_samerun_m4096_*.json)."""
    gpu = load_profile(profile).gpu
    best = rank(gpu, OpSpec(kind="gemm", shape=(4096, 6144, 4096)), measured=False).best.config.params
    assert (best["BLOCK_M"], best["BLOCK_N"], best["num_warps"]) == (128, 256, 8)


def test_wgmma_width_prices_n128_slices_and_narrower_below_them():
    c = cost.constants()
    assert cost.wgmma_width_efficiency(128, 256, 8, c) == 1.0  # two 64x256 slices
    assert cost.wgmma_width_efficiency(256, 128, 8, c) == c.n128_wgmma_efficiency == 0.95
    assert cost.wgmma_width_efficiency(64, 256, 8, c) == 0.95  # one row of slices: 64x128 each
    assert cost.wgmma_width_efficiency(64, 64, 4, c) == pytest.approx(0.95 * c.narrow_wgmma_efficiency)
    assert cost.wgmma_width_efficiency(64, 64, 8, c) == pytest.approx(0.95 * c.narrow_wgmma_efficiency ** 2)
