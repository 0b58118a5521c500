"""Quantized weight formats as data, and ops over them: names, exact bytes, floors, errors (no torch)."""

from __future__ import annotations

import pytest
from _fuzz import budget
from hypothesis import given
from hypothesis import strategies as st

from autoopt.errors import OpError
from autoopt.hardware.library import load_profile
from autoopt.kernels.cost import floor_us
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.quant import INT4_GROUPS, WeightFormat, parse_weight
from autoopt.results.records import op_columns, op_from_columns
from autoopt.search.rank_cache import op_key

#: Llama-3-8B's linears (N, K): q/k/v fused, o, gate/up fused, down, lm_head
LLAMA3_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
SPECS = ["fp8", "fp8-wo", "fp8_block", "fp8_block-wo", "int8", "int4-g128", "int4-g128-asym", "int4-g32",
         "int4-g64-asym", "int4-g256-asym-sfp32"]


@pytest.mark.parametrize("spec", SPECS)
def test_spec_names_round_trip(spec):
    fmt = parse_weight(spec)
    assert fmt.spec == spec and parse_weight(fmt.spec) == fmt
    assert WeightFormat.from_dict(fmt.to_dict()) == fmt


def test_aliases_and_defaults_name_the_documented_formats():
    assert parse_weight("INT4").spec == "int4-g128"
    assert parse_weight("w4a16") == parse_weight("int4-sym-g128")
    assert parse_weight("int4-asym").symmetric is False
    assert parse_weight("w8a16").spec == "int8" and parse_weight("w8a8").spec == "fp8"
    assert parse_weight("fp8").activation == "per_token" and parse_weight("fp8-wo").activation == "none"
    assert parse_weight("fp8_block").activation == "per_token_group" and parse_weight("fp8_block").group_size == 128


@pytest.mark.parametrize("spec,why", [("int3", "unknown weight format"), ("int4-g100", "group 100"),
                                      ("int8-asym", "does not apply to int8"), ("int4-sym-asym", "twice"),
                                      ("fp8-g64", "does not apply to fp8"), ("", "non-empty")])
def test_bad_specs_say_what_is_wrong(spec, why):
    with pytest.raises(OpError, match=why):
        parse_weight(spec)


def test_inconsistent_format_fields_are_refused():
    with pytest.raises(OpError, match="symmetric only"):
        WeightFormat(name="fp8", symmetric=False)
    with pytest.raises(OpError, match="activation"):
        WeightFormat(name="int8", activation="per_token")
    with pytest.raises(OpError, match="bits: unknown field"):
        WeightFormat.from_dict({"name": "int4", "bits": 4})


@budget(300)
@given(st.text(alphabet="fpint48_blockgasymwo-0123456789", max_size=24))
def test_any_spec_text_parses_to_a_format_that_round_trips_or_is_an_op_error(text):
    try:
        fmt = parse_weight(text)
    except OpError as exc:
        assert str(exc)
        return
    assert parse_weight(fmt.spec) == fmt and fmt.name in ("fp8", "fp8_block", "int8", "int4")


@budget(200)
@given(st.sampled_from(["fp8", "fp8_block", "int8", "int4"]), st.sampled_from(INT4_GROUPS), st.booleans(),
       st.integers(1, 5000), st.integers(1, 5000))
def test_weight_bytes_are_packed_values_plus_scales(name, g, sym, n, k):
    fmt = parse_weight(f"int4-g{g}-{'sym' if sym else 'asym'}" if name == "int4" else name)
    kp = -(-k // g) * g
    want = {"fp8": n * k + 4 * n, "int8": n * k + 4 * n,
            "fp8_block": n * k + 4 * -(-n // 128) * -(-k // 128),
            "int4": n * kp // 2 + (2 if sym else 4) * n * (kp // g)}[name]
    assert fmt.weight_bytes(n, k) == want
    assert fmt.weight_bytes(n, k) >= fmt.ideal_bytes(n, k)


@pytest.mark.parametrize("spec", SPECS)
def test_llama_weights_cost_at_most_3_percent_over_the_theoretical_bytes(spec):
    # theoretical: N*K values at the format's bits plus its scales; stored: what the packed tensors hold
    fmt = parse_weight(spec)
    for n, k in LLAMA3_8B:
        assert fmt.weight_bytes(n, k) <= 1.03 * fmt.ideal_bytes(n, k)


def test_bits_per_weight_at_k_4096():
    bits = {s: round(parse_weight(s).bits_per_weight(4096), 4) for s in ("fp8", "fp8_block", "int8", "int4",
                                                                      "int4-asym")}
    assert bits == {"fp8": 8.0078, "fp8_block": 8.002, "int8": 8.0078, "int4": 4.125, "int4-asym": 4.25}


def test_a_padded_int4_group_is_stored_whole():
    fmt = parse_weight("int4")
    assert fmt.packed_shape(100, 200) == (100, 128) and fmt.scale_shape(100, 200) == (100, 2)


@pytest.mark.parametrize("spec,weight_bytes", [("int4", 4096 * 2048 + 2 * 4096 * 32),
                                               ("int4-asym", 4096 * 2048 + 4 * 4096 * 32),
                                               ("fp8", 4096 * 4096 + 4 * 4096),
                                               ("int8", 4096 * 4096 + 4 * 4096),
                                               ("fp8_block", 4096 * 4096 + 4 * 32 * 32)])
def test_gemv_bytes_count_the_packed_weight_exactly(spec, weight_bytes):
    op = OpSpec(kind="gemv", shape=(1, 4096, 4096), dtype="bf16", weight=spec)
    assert op.min_bytes == 2 * 4096 + weight_bytes + 2 * 4096
    assert op.flops == 2 * 4096 * 4096


def test_the_floor_of_an_int4_decode_is_its_weight_read():
    gpu = load_profile("h100-sxm").gpu
    op = OpSpec(kind="gemv", shape=(1, 28672, 4096), weight="int4")
    plain = OpSpec(kind="gemv", shape=(1, 28672, 4096))
    assert floor_us(gpu, op) == pytest.approx(op.min_bytes / 3350e9 * 1e6)
    assert floor_us(gpu, op) / floor_us(gpu, plain) == pytest.approx(4.125 / 16, rel=1e-3)


def test_a_w8a8_gemm_is_floored_at_the_fp8_tensor_rate():
    gpu = load_profile("h100-sxm").gpu
    op = OpSpec(kind="gemm", shape=(8192, 8192, 8192), weight="fp8")
    assert op.compute_dtype == "fp8" and OpSpec(kind="gemm", shape=(8192, 8192, 8192), weight="fp8-wo").compute_dtype \
        == "bf16"
    assert floor_us(gpu, op) == pytest.approx(op.flops / 1978.9e12 * 1e6)
    # decode GEMVs never quantize activations
    assert OpSpec(kind="gemv", shape=(1, 4096, 4096), weight="fp8").compute_dtype == "bf16"


def test_op_weight_is_canonical_and_round_trips_as_data():
    op = OpSpec(kind="gemm", shape=(64, 128, 256), dtype="fp16", weight="W4A16")
    assert op.weight == "int4-g128" and op.label() == "gemm[64x128x256] fp16 w=int4-g128"
    assert OpSpec.from_dict(op.to_dict()) == op
    assert "weight" not in OpSpec(kind="gemm", shape=(1, 2, 3)).to_dict()


@pytest.mark.parametrize("kw,why", [({"kind": "rmsnorm", "shape": (4, 8)}, "no weight to quantize"),
                                    ({"dtype": "fp32"}, "bf16 or fp16 activations"),
                                    ({"layout": "kn"}, "layout must be 'nk'"),
                                    ({"weight": 4}, "format name")])
def test_ops_that_cannot_have_a_quantized_weight_are_op_errors(kw, why):
    args = {"kind": "gemm", "shape": (16, 32, 64), "weight": "int4", **kw}
    with pytest.raises(OpError, match=why):
        OpSpec(**args)


def test_quantized_ops_key_apart_from_plain_ones_everywhere():
    plain = OpSpec(kind="gemv", shape=(1, 4096, 4096))
    quant = OpSpec(kind="gemv", shape=(1, 4096, 4096), weight="int4")
    assert op_key(plain) != op_key(quant) and op_key(plain) == "gemv 1x4096x4096 bf16 nk bf16"
    assert op_columns(plain)[2] == "bf16" and op_columns(quant)[2] == "bf16+int4-g128"
    assert op_from_columns(*op_columns(quant)) == quant and op_from_columns(*op_columns(plain)) == plain


@budget(200)
@given(st.fixed_dictionaries({"kind": st.sampled_from(["gemm", "gemv", "rmsnorm"]),
                              "shape": st.lists(st.integers(-3, 70000), min_size=2, max_size=3),
                              "dtype": st.sampled_from(["bf16", "fp16", "fp32", "fp8"]),
                              "weight": st.one_of(st.none(), st.integers(), st.text(max_size=8),
                                                  st.sampled_from([*SPECS, "int3", "int4-g7"]))}))
def test_any_op_dict_with_a_weight_is_a_valid_op_or_an_op_error(data):
    try:
        op = OpSpec.from_dict(data)
    except OpError as exc:
        assert str(exc)
        return
    assert op.flops > 0 and op.min_bytes > 0 and OpSpec.from_dict(op.to_dict()) == op
    if op.weight is not None:
        fmt = parse_weight(op.weight)
        m, n, k = op.shape
        assert op.min_bytes == m * k * 2 + fmt.weight_bytes(n, k) + m * n * 2
