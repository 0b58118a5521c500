"""The fused_moe op kind (exact FLOPs and bytes, round trip), the fused-moe-triton template (space,
constraints, cost model, bounds) and moe_config (the runtime-shaped best config)."""

from __future__ import annotations

import time

import pytest
from _fuzz import budget
from hypothesis import given
from hypothesis import strategies as st

from autoopt.errors import OpError
from autoopt.hardware.library import load_profile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import MOE_GEMMS, OpSpec
from autoopt.kernels.quant import parse_weight
from autoopt.search.moe import MOE_CONFIG_KEYS, moe_config, moe_op
from autoopt.search.ranking import rank
from autoopt.templates.moe import (
    SPACE,
    FusedMoeTemplate,
    expected_blocks,
    expected_touched,
    moe_cost,
    skewed_probs,
    uniform_probs,
)

H100 = load_profile("h100-sxm").gpu
A100 = load_profile("a100-sxm-80gb").gpu
T = FusedMoeTemplate()
MIXTRAL = (8, 2, 14336, 4096)  # E, topk, N, K: Mixtral-8x7B at TP 1
QWEN3 = (128, 8, 768, 2048)  # Qwen3-30B-A3B


def cfg(bm: int = 64, bn: int = 128, bk: int = 64, group: int = 1, warps: int = 4, stages: int = 3,
        gpu=H100) -> KernelConfig:
    from autoopt.templates.gemm import matmul_path

    return KernelConfig(kernel="fused_moe", template=T.name, path=matmul_path(gpu, bm, warps),
                        params={"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
                                "num_warps": warps, "num_stages": stages})


# -- the op kind ------------------------------------------------------------------------------------

def test_flops_are_the_two_expert_gemms_per_routed_token():
    op = OpSpec(kind="fused_moe", shape=(16, 8, 2, 14336, 4096))
    assert op.flops == 2.0 * 16 * 2 * (2 * 14336 * 4096 + 4096 * 14336)
    assert OpSpec(kind="fused_moe", shape=(16, 8, 2, 14336, 4096), moe_gemm="down").flops == 2.0 * 32 * 4096 * 14336


def test_min_bytes_count_the_expected_touched_experts_activations_and_routing():
    m, e, topk, n, k = 3, 8, 2, 64, 32
    op = OpSpec(kind="fused_moe", shape=(m, e, topk, n, k))
    touched = e * (1 - (1 - topk / e) ** m)
    assert op.moe_touched_experts == pytest.approx(touched)
    weights = touched * (2 * n * k + k * n) * 2
    assert op.min_bytes == pytest.approx(weights + m * k * 2 * 2 + m * topk * 8)


def test_min_bytes_of_a_quantized_gate_up_use_the_packed_expert_bytes():
    op = OpSpec(kind="fused_moe", shape=(1, 8, 2, 256, 512), weight="fp8", moe_gemm="gate_up")
    fmt = parse_weight("fp8")
    assert op.min_bytes == pytest.approx(2 * fmt.weight_bytes(512, 512) + 512 * 2 + 2 * 512 * 2 + 2 * 4)
    assert op.compute_dtype == "fp8"


def test_a_decode_token_touches_topk_experts_and_a_long_prefill_all():
    assert OpSpec(kind="fused_moe", shape=(1, 128, 8, 768, 2048)).moe_touched_experts == pytest.approx(8)
    assert OpSpec(kind="fused_moe", shape=(4096, 128, 8, 768, 2048)).moe_touched_experts == pytest.approx(128)


@pytest.mark.parametrize("kw,match", [({"shape": (4, 2, 3, 8, 8)}, "topk=3 exceeds"),
                                      ({"shape": (4, 8, 2, 8, 8), "moe_gemm": "up"}, "moe_gemm"),
                                      ({"shape": (4, 8, 2, 8, 8), "dtype": "fp32"}, "dtype"),
                                      ({"shape": (4, 8, 2, 8, 8), "layout": "kn"}, "layout")])
def test_bad_fused_moe_ops_are_refused(kw, match):
    with pytest.raises(OpError, match=match):
        OpSpec(kind="fused_moe", **kw)


def test_moe_gemm_is_refused_on_other_kinds():
    with pytest.raises(OpError, match="fused_moe only"):
        OpSpec(kind="gemm", shape=(4, 8, 8), moe_gemm="down")


def test_a_plain_op_dict_is_unchanged_by_the_new_field():
    assert "moe_gemm" not in OpSpec(kind="gemm", shape=(4, 8, 8)).to_dict()


@budget(60)
@given(m=st.integers(1, 5000), e=st.integers(1, 300), topk=st.integers(1, 16), n=st.integers(1, 20000),
       k=st.integers(1, 8192), gemm=st.sampled_from(MOE_GEMMS), dtype=st.sampled_from(["bf16", "fp16"]),
       weight=st.sampled_from([None, "fp8", "fp8_block", "int8", "int4"]))
def test_fused_moe_op_round_trips_through_its_dict(m, e, topk, n, k, gemm, dtype, weight):
    topk = min(topk, e)
    op = OpSpec(kind="fused_moe", shape=(m, e, topk, n, k), dtype=dtype, weight=weight, moe_gemm=gemm)
    back = OpSpec.from_dict(op.to_dict())
    assert back == op and back.min_bytes == op.min_bytes and back.flops == op.flops


# -- routing statistics ------------------------------------------------------------------------------------

def test_expected_blocks_equal_the_exact_binomial_sum():
    # M = 3, p = 1/2, BLOCK 2: c = 0,1,2,3 with weights 1,3,3,1 (/8) -> ceil(c/2) = 0,1,1,2
    assert expected_blocks(3, (0.5,), 2) == pytest.approx((3 + 3 + 2) / 8)


def test_uniform_probs_sum_to_topk_and_skewed_ones_too_with_none_above_one():
    assert sum(uniform_probs(8, 2)) == pytest.approx(2)
    sk = skewed_probs(8, 2, skew=3.0)
    assert sum(sk) == pytest.approx(2) and max(sk) <= 1.0 and sk[0] == 1.0 and sk[1] < 1.0


def test_skewed_routing_touches_fewer_experts_so_a_memory_bound_step_reads_less():
    op = OpSpec(kind="fused_moe", shape=(256, *QWEN3))
    c = cfg(bm=64)
    uni, sk = uniform_probs(128, 8), skewed_probs(128, 8, skew=1.5)
    assert expected_touched(256, sk) < expected_touched(256, uni)
    p_uni, p_sk = moe_cost(H100, op, c, uni), moe_cost(H100, op, c, sk)
    assert p_sk.breakdown["touched_experts"] < p_uni.breakdown["touched_experts"]
    assert p_sk.breakdown["dram_us"] < p_uni.breakdown["dram_us"] and p_sk.us < p_uni.us


# -- the template ------------------------------------------------------------------------------------------

def test_space_is_the_runtimes_tuning_grid():
    op = OpSpec(kind="fused_moe", shape=(16, *MIXTRAL))
    configs = list(T.space(H100, op))
    assert len(configs) == 5 * 4 * 4 * 4 * 2 * 4
    assert {k: tuple(sorted({c.params[k] for c in configs})) for k in SPACE} == SPACE


def test_most_of_the_space_is_valid_on_an_h100_and_every_valid_config_fits_its_smem():
    op = OpSpec(kind="fused_moe", shape=(16, *MIXTRAL))
    valid = [c for c in T.space(H100, op) if not T.validate(H100, op, c)]
    assert len(valid) > 1000
    lim_smem = 232448  # H100 opt-in shared memory per block (CUDA guide, compute capability 9.0)
    for c in valid:
        p = c.params
        assert c.num_stages * (p["BLOCK_SIZE_M"] + p["BLOCK_SIZE_N"]) * p["BLOCK_SIZE_K"] * 2 <= lim_smem


def test_validate_rejects_stages_whose_buffers_exceed_shared_memory():
    op = OpSpec(kind="fused_moe", shape=(4096, *MIXTRAL))
    problems = T.validate(H100, op, cfg(bm=256, bn=256, bk=256, warps=8, stages=5))
    assert problems and "smem" in problems[0]


def test_validate_rejects_a_k_tile_wider_than_the_fp8_scale_block():
    op = OpSpec(kind="fused_moe", shape=(64, *MIXTRAL), weight="fp8_block")
    assert any("scale block" in p for p in T.validate(H100, op, cfg(bk=256, stages=2)))
    assert T.validate(H100, op, cfg(bk=128, stages=2)) == []


def test_fp8_experts_need_fp8_tensor_cores():
    op = OpSpec(kind="fused_moe", shape=(64, *MIXTRAL), weight="fp8")
    assert any("fp8" in p for p in T.validate(A100, op, cfg(gpu=A100)))


def test_int4_experts_with_or_without_offsets_are_offered():
    # the kernel's int4 is vLLM's int4_w4a16, with zero points (int4-asym) or without
    assert T.applies(H100, OpSpec(kind="fused_moe", shape=(64, *MIXTRAL), weight="int4"))
    assert T.applies(H100, OpSpec(kind="fused_moe", shape=(64, *MIXTRAL), weight="int4-asym"))
    assert T.applies(H100, OpSpec(kind="fused_moe", shape=(64, *MIXTRAL), weight="fp8"))


def test_weight_only_fp8_experts_are_not_offered():
    # the kernel runs FP8 experts W8A8 only (e4m3 activations on FP8 tensor cores)
    assert not T.applies(H100, OpSpec(kind="fused_moe", shape=(64, *MIXTRAL), weight="fp8-wo"))
    assert not T.applies(H100, OpSpec(kind="fused_moe", shape=(64, *MIXTRAL), weight="fp8_block-wo"))


@pytest.mark.parametrize(("bk", "ok"), [(16, False), (32, True), (128, True), (256, False)])
def test_validate_keeps_an_int4_k_tile_inside_one_group_and_two_mma_steps_wide(bk, ok):
    op = OpSpec(kind="fused_moe", shape=(64, *MIXTRAL), weight="int4")
    problems = T.validate(H100, op, cfg(bk=bk, stages=2))
    assert (problems == []) == ok and (ok or "int4 experts take 32 to the group 128" in " ".join(problems))


def test_int4_experts_are_priced_below_bf16_at_decode_where_weight_bytes_bind():
    # M = 1 reads top-k experts' weights: a quarter of bf16's bytes (plus scales), decoded on chip at the
    # quant-gemm template's int4 price (so above a quarter of bf16's time)
    bf16 = OpSpec(kind="fused_moe", shape=(1, *MIXTRAL))
    int4 = OpSpec(kind="fused_moe", shape=(1, *MIXTRAL), weight="int4")
    assert rank(H100, int4, top=1).best.predicted_us < rank(H100, bf16, top=1).best.predicted_us


def test_predicted_time_grows_with_tokens_and_stays_above_the_floor():
    times = []
    for m in (1, 16, 256, 4096):
        op = OpSpec(kind="fused_moe", shape=(m, *MIXTRAL))
        p = moe_cost(H100, op, cfg(bm=64))
        assert p.us >= p.breakdown["floor_us"] and 0 < p.roofline_pct <= 100
        times.append(p.us)
    assert times == sorted(times) and times[-1] > 5 * times[0]


def test_decode_prices_the_padding_of_a_large_block_m():
    op = OpSpec(kind="fused_moe", shape=(4, *QWEN3))
    assert moe_cost(H100, op, cfg(bm=16)).us < moe_cost(H100, op, cfg(bm=256, bn=64, bk=64)).us


def test_fp8_experts_are_predicted_faster_than_bf16_at_decode():
    bf16 = rank(H100, OpSpec(kind="fused_moe", shape=(1, *MIXTRAL)), top=1, measured=False).best
    fp8 = rank(H100, OpSpec(kind="fused_moe", shape=(1, *MIXTRAL), weight="fp8"), top=1, measured=False).best
    assert fp8.predicted_us < 0.7 * bf16.predicted_us  # half the weight bytes, plus two quantization launches


@pytest.mark.parametrize("m", [1, 64, 2048])
def test_bounds_never_exceed_the_predictions_beneath(m):
    op = OpSpec(kind="fused_moe", shape=(m, *QWEN3))
    space = T.bounded_space(H100, op)
    assert space is not None and space.roots
    for bound, node in space.roots[::7]:
        for b, leaf in node():
            assert b == bound and b <= moe_cost(H100, op, leaf).us * (1 + 1e-9)


@pytest.mark.parametrize("shape", [(1, *MIXTRAL), (1024, *MIXTRAL), (16, *QWEN3)])
def test_pruned_rank_equals_the_exhaustive_top(shape):
    op = OpSpec(kind="fused_moe", shape=shape)
    fast = rank(H100, op, top=3, measured=False)
    full = rank(H100, op, top=3, measured=False, exhaustive=True)
    assert [c.config.key() for c in fast.candidates] == [c.config.key() for c in full.candidates]


def test_rank_answers_a_new_op_in_milliseconds():
    rank(H100, OpSpec(kind="fused_moe", shape=(3, *QWEN3)), top=1, measured=False)  # the per-GPU tables
    t0 = time.perf_counter()
    r = rank(H100, OpSpec(kind="fused_moe", shape=(777, *QWEN3)), top=1, measured=False)
    assert time.perf_counter() - t0 < 0.25  # ~7 ms on a 2-core box; generous for loaded CI
    assert r.best.config.kernel == "fused_moe" and r.templates == ("fused-moe-triton",)


# -- moe_config ------------------------------------------------------------------------------------------

def test_moe_config_is_the_runtime_file_entry_of_the_best_config():
    op = moe_op(64, *MIXTRAL)
    conf = moe_config(op, H100, measured=False)
    assert tuple(conf) == MOE_CONFIG_KEYS
    best = rank(H100, op, top=1, measured=False).best.config.params
    assert conf == {k: best[k] for k in MOE_CONFIG_KEYS}


def test_moe_config_refuses_other_ops():
    with pytest.raises(OpError, match="fused_moe"):
        moe_config(OpSpec(kind="gemm", shape=(4, 8, 8)), H100)


def test_the_tuner_searches_the_fused_moe_space_from_the_models_pick():
    from types import SimpleNamespace

    from autoopt.tuning.tuner import tune

    op = OpSpec(kind="fused_moe", shape=(64, *MIXTRAL))
    top = rank(H100, op, top=1, measured=False).best.config
    seen = []

    def evaluate(op, config):  # a GPU that runs every config 10 % slower than predicted
        seen.append(config)
        return SimpleNamespace(label="measured", us=moe_cost(H100, op, config).us * 1.1, rel_err=1e-3, reason="")
    result = tune(H100, op, budget_trials=4, evaluate=evaluate)
    assert seen[0].key() == top.key() and len(seen) <= 4
    assert all(c.kernel == "fused_moe" for c in seen) and result.best.config.kernel == "fused_moe"


@pytest.mark.parametrize("gemm", MOE_GEMMS)
def test_the_store_columns_keep_which_gemm_a_fused_moe_op_is(gemm):
    from autoopt.results.records import op_columns, op_from_columns
    from autoopt.results.winners import op_key

    op = OpSpec(kind="fused_moe", shape=(16, *QWEN3), weight="fp8", moe_gemm=gemm)
    cols = op_columns(op)
    assert op_from_columns(*cols) == op and op_key(op) == " ".join(cols)


def test_a_two_stage_wgmma_config_is_priced_above_the_same_config_at_three():
    op = OpSpec(kind="fused_moe", shape=(1024, *MIXTRAL), dtype="bf16")
    two, three = cfg(bm=128, bn=128, bk=64, warps=8, stages=2), cfg(bm=128, bn=128, bk=64, warps=8, stages=3)
    assert two.path == "wgmma" and moe_cost(H100, op, two).us > moe_cost(H100, op, three).us


def test_zero_shot_on_an_h200_leaves_the_two_stage_k128_tile_that_measured_slower():
    # H200, vLLM's kernel, Mixtral TP1 M=4096: 128/256/128/16/8/2 6857 us, 128/256/64/16/8/3 4933 us
    h200 = load_profile("h200").gpu
    op = OpSpec(kind="fused_moe", shape=(4096, *MIXTRAL), dtype="bf16")
    params = rank(h200, op, top=1).candidates[0].config.params
    assert (params["BLOCK_SIZE_K"], params["num_stages"]) == (64, 3)
