"""Weight formats: exact bits per weight, hardware gating, and the choice by preference and fit."""

from __future__ import annotations

import pytest
from _recommend_hw import H100, RTX3070

from autoopt.errors import ModelError
from autoopt.planning.catalog import get_model
from autoopt.planning.quant import FORMATS, available_formats, choose_format, get_format, weight_bytes


@pytest.mark.parametrize("name,bits", [("bf16", 16), ("fp16", 16), ("q8_0", 8.5), ("q6_k", 6.5625),
                                       ("q5_k_m", 5.7), ("q4_k_m", 4.85), ("mxfp4", 4.25)])
def test_bits_per_weight(name, bits):
    assert FORMATS[name].bits_per_weight(4096, 4096) == bits


def test_fp8_adds_a_per_channel_fp32_scale():
    assert FORMATS["fp8"].bits_per_weight(4096) == 8 + 32 / 4096


def test_nvfp4_adds_block_and_tensor_scales():
    # e2m1 4 bits + e4m3 scale per 16 (0.5) + one fp32 per 4096 x 4096 tensor
    assert FORMATS["nvfp4"].bits_per_weight(4096, 4096) == 4.5 + 32 / (4096 * 4096)


def test_gguf_bits_apply_to_the_whole_model():
    m = get_model("mistral-7b")
    assert weight_bytes(m, FORMATS["q8_0"]) == pytest.approx(m.num_params * 8.5 / 8)


def test_gpu_formats_keep_embeddings_in_checkpoint_dtype():
    m = get_model("llama-3-8b")
    emb = 2 * 128256 * 4096 * 2  # embedding + head, bf16
    assert weight_bytes(m, FORMATS["fp8"]) > emb + 6.9e9


def test_fp8_needs_sm89_and_fp4_needs_sm100():
    names = {f.name for f in available_formats(H100, get_model("llama-3-8b"))}
    assert "fp8" in names and "nvfp4" not in names and "mxfp4" not in names
    old = {f.name for f in available_formats(RTX3070, get_model("llama-3-8b"))}
    assert "fp8" not in old and {"int8", "q8_0", "q4_k_m"} <= old


def test_weight_only_formats_are_labelled():
    assert {n for n, f in FORMATS.items() if f.mode == "weight-only" and not f.extra} == \
        {"int8", "q8_0", "q6_k", "q5_k_m", "q4_k_m"}


def test_runtime_only_formats_stay_out_of_the_default_pool():
    extras = {n for n, f in FORMATS.items() if f.extra}
    assert {"awq", "gptq", "nf4", "w8a8_int8", "bnb_int8", "q4_0", "fp8-weight-only", "int4"} == extras
    assert not extras & {f.name for f in available_formats(H100, get_model("llama-3-8b"))}


def test_awq_and_gptq_count_their_group_scales_and_zeros():
    assert FORMATS["awq"].bits_per_weight(4096, 4096) == pytest.approx(4 + 20 / 128)
    assert FORMATS["nf4"].bits_per_weight(4096, 4096) == pytest.approx(4.127, abs=1e-3)


def test_never_larger_than_the_checkpoint():
    names = {f.name for f in available_formats(H100, get_model("deepseek-v3"))}  # fp8 checkpoint
    assert "bf16" not in names and "q8_0" not in names and "fp8" in names


def test_quality_picks_the_most_bits_that_fit():
    fits = lambda f: f.bits <= 8  # noqa: E731
    assert choose_format(RTX3070, get_model("mistral-7b"), preference="quality", fits=fits).format.name == "int8"


def test_speed_picks_native_fp8_on_hopper():
    assert choose_format(H100, get_model("llama-3-8b"), preference="speed").format.name == "fp8"


def test_balanced_keeps_bf16_on_ampere_when_it_fits():
    assert choose_format(RTX3070, get_model("llama-3-8b"), preference="balanced").format.name == "bf16"


def test_requested_fp8_on_ampere_is_refused():
    with pytest.raises(ModelError, match="sm_89"):
        choose_format(RTX3070, get_model("llama-3-8b"), requested="fp8")


def test_unknown_format_is_named():
    with pytest.raises(ModelError) as exc:
        get_format("int3")
    assert exc.value.field == "weight_dtype"


@pytest.mark.parametrize(("plan", "spec"), [("fp8", "fp8"), ("fp8-weight-only", "fp8-wo"), ("int8", "int8"),
                                            ("int4", "int4")])
@pytest.mark.parametrize("k", [128, 4096, 14336])
def test_autoopts_own_formats_count_what_its_kernels_store(plan, spec, k):
    """recommend()'s bits per weight for the formats optimize(weights=) runs are autoopt.kernels.quant's exact ones
    (int8's scales are fp32 as the kernels store them; int4 a bf16 scale per 128)."""
    from autoopt.kernels.quant import parse_weight

    assert FORMATS[plan].bits_per_weight(k, 4096) == pytest.approx(parse_weight(spec).bits_per_weight(k, 4096))


def test_the_autoopt_runtime_offers_what_optimize_runs():
    from autoopt.runtimes import get_runtime

    rt = get_runtime("autoopt")
    assert set(rt.formats_for(H100)) == {"fp32", "bf16", "fp16", "fp8", "fp8-weight-only", "int8", "int4"}
    assert "fp8" not in rt.formats_for(RTX3070) and {"fp8-weight-only", "int4"} <= set(rt.formats_for(RTX3070))
    # speed on a GPU without FP8 tensor cores: the fewest bits autoopt runs, int4
    rec = choose_format(RTX3070, get_model("llama-3-8b"), preference="speed", names=rt.formats_for(RTX3070))
    assert rec.format.name == "int4"


def test_the_autoopt_runtime_prices_the_quantized_kernels_optimize_runs():
    """Under runtime="autoopt" a format autoopt's kernels run is priced as optimize(weights=) runs it: each layer
    GEMM as OpSpec(weight=...) over the quantized templates, the LM head 16-bit."""
    from autoopt.planning.recommendation import recommend

    rec = recommend("h100-sxm", "llama-3-8b", phase="decode", weight_dtype="int4", runtime="autoopt", max_devices=1)
    kernels = {o.name: o.kernel for o in rec.ops if o.kind in ("gemv", "gemm")}
    assert {kernels[n] for n in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")} == {"quant_gemv"}
    assert kernels["lm_head"] == "gemv" and "(autoopt int4)" in rec.ops[0].mode
    plain = recommend("h100-sxm", "llama-3-8b", phase="decode", weight_dtype="int4", max_devices=1)
    assert "quant_gemv" not in {o.kernel for o in plain.ops}  # other runtimes: priced as before
