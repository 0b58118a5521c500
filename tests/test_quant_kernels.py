"""Quantizers and the quantized-weight kernels against their torch references (Triton's CPU interpreter
without a GPU, compiled with one).

Kernels are checked against the float64 matmul with the *dequantized* weight (registry.reference), so
a failure is the kernel's, not the format's; quantization error against the bf16 layer is measured
separately. Shapes are small and odd on purpose: K = 200 with group 128 (a padded last group),
N = 100 with BLOCK_N = 64 (a ragged last tile), M = 1, 3, 16 for the GEMV and 33 for the GEMM. The
interpreter's bf16 ``tl.dot`` is wrong (triton 3.9): the kernels route their dots through fp16 there,
so bf16 is checked too; fp16 activations check the dot paths' own fp16 route.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from autoopt.backend import registry  # noqa: E402
from autoopt.backend.accuracy import rel_error as relative_error  # noqa: E402
from autoopt.backend.kernels.act_quant import act_quant_prepare, act_quant_traced  # noqa: E402
from autoopt.backend.quant import (  # noqa: E402
    dequantize,
    quantize,
    quantize_activations,
    reference_matmul,
    unpack_int4,
)
from autoopt.backend.runner import evaluate  # noqa: E402
from autoopt.hardware.library import load_profile  # noqa: E402
from autoopt.kernels.config import KernelConfig  # noqa: E402
from autoopt.kernels.ops import OpSpec  # noqa: E402
from autoopt.kernels.quant import parse_weight  # noqa: E402
from autoopt.search.ranking import validate_config  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU = load_profile("h100-sxm").gpu
FORMATS = ["fp8", "fp8_block", "int8", "int4", "int4-asym"]


def gemv_cfg(bm: int, bk: int, split: int = 1, bn: int = 64) -> KernelConfig:
    return KernelConfig(kernel="quant_gemv", template="quant-gemv",
                        params=dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=4, num_stages=2))


def gemm_cfg(bm: int = 32, bn: int = 64, bk: int = 64) -> KernelConfig:
    # the path tl.dot takes on the H100 the configs are validated for: wgmma from 64-row blocks
    return KernelConfig(kernel="quant_gemm", template="quant-gemm", path="wgmma" if bm % 64 == 0 else "standard",
                        params=dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=2))


def assert_correct(op: OpSpec, cfg: KernelConfig) -> float:
    """The config passes the template's validate, runs, and matches the dequantized reference."""
    res = evaluate(op, cfg, check_only=True, validate=lambda o, c: validate_config(GPU, o, c))
    assert res.label in ("checked", "measured"), res.reason
    assert res.rel_err is not None and res.rel_err <= registry.tolerance(op)
    return res.rel_err


# -- quantizers --------------------------------------------------------------------------------

#: relative Frobenius error of dequantize(quantize(W)) on N(0, 1) weights [256, 1024]. int4 g128 sym:
#: the step is |extreme| / 8, and the extreme of 128 normals is ~2.8 sigma, so the rounding error's
#: rms is 0.35 / sqrt(12) = 0.10 sigma; asym steps (max - min) / 15 ~ 0.37 sigma, the same. int8:
#: amax of 1024 ~ 3.3 sigma / 127 / sqrt(12) = 0.0075. e4m3: 3 fraction bits, a relative step of
#: 2^-3..2^-4 within a binade, ~0.026 rms. Each bound is the derivation's value with ~10 % margin.
QUANT_BOUNDS = {"fp8": 0.03, "fp8_block": 0.03, "int8": 0.0085, "int4": 0.11, "int4-asym": 0.11,
                "int4-g32": 0.095}


@pytest.mark.parametrize("spec", sorted(QUANT_BOUNDS))
def test_dequantized_weights_are_within_the_formats_error_bound(spec):
    w = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0)).bfloat16()
    err = relative_error(dequantize(quantize(w, spec)), w.float())
    assert 0.5 * QUANT_BOUNDS[spec] < err < QUANT_BOUNDS[spec]


def test_symmetric_int4_beats_asymmetric_min_max_by_choosing_each_groups_scale():
    # each group keeps the least-squared-error scale of its candidates (extreme / -8 clipped, extreme / 7)
    w = torch.randn(512, 1024, generator=torch.Generator().manual_seed(1))
    sym = relative_error(dequantize(quantize(w, "int4")), w)
    asym = relative_error(dequantize(quantize(w, "int4-asym")), w)
    assert sym < 0.98 * asym


@pytest.mark.parametrize("spec", [*FORMATS, "int4-g32", "fp8-wo"])
@pytest.mark.parametrize("n,k", [(100, 200), (256, 4096)])
def test_packed_tensors_hold_exactly_the_formats_bytes(spec, n, k):
    q = quantize(torch.randn(n, k).bfloat16(), spec)
    assert q.nbytes == q.fmt.weight_bytes(n, k)
    if k % 128 == 0:
        assert q.nbytes <= 1.03 * q.fmt.ideal_bytes(n, k)


def test_int4_bytes_hold_a_groups_first_half_low_and_second_half_high():
    # codes k % 16 exactly: each group's extreme -1 at k = 0 makes the scale 0.125 (exact in bf16)
    k = torch.arange(256)
    w = ((k % 16) - 8).float()[None, :].repeat(2, 1) * 0.125
    q = quantize(w, "int4")
    codes = (k % 16).to(torch.uint8)
    b = q.qweight[0]
    assert torch.equal(b[:64] & 0xF, codes[:64]) and torch.equal(b[:64] >> 4, codes[64:128])
    assert torch.equal(b[64:] & 0xF, codes[128:192]) and torch.equal(b[64:] >> 4, codes[192:])
    assert torch.equal(unpack_int4(q)[0], codes) and torch.allclose(dequantize(q), w)


def test_a_padded_int4_group_dequantizes_to_the_original_columns():
    w = torch.randn(100, 200).bfloat16()
    q = quantize(w, "int4-asym")
    assert q.qweight.shape == (100, 128) and dequantize(q).shape == (100, 200)
    assert (unpack_int4(q)[:, 200:] == 8).all()  # padding codes, never multiplied by a nonzero activation


@pytest.mark.parametrize("spec", ["fp8", "fp8_block"])
def test_activation_quantization_kernel_matches_the_torch_reference(spec):
    fmt = parse_weight(spec)
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(1)).bfloat16().to(DEVICE)
    x[2] = 0  # an all-zero row: scale 1, codes 0
    q = torch.empty(5, 300, dtype=torch.float8_e4m3fn, device=DEVICE)
    s = torch.empty((5,) if spec == "fp8" else (5, 3), dtype=torch.float32, device=DEVICE)
    act_quant_prepare(x, q, s, group=0 if spec == "fp8" else 128)()
    rq, rs = quantize_activations(x, fmt)
    assert torch.equal(s, rs) and torch.equal(q.float(), rq.float())


def test_rows_longer_than_one_pass_are_quantized_in_two_passes_exactly(monkeypatch):
    # K = 300 over a one-pass limit of 256: the BLOCK_K loop (ragged last block) gives the same codes and scales
    from autoopt.backend.kernels import act_quant

    monkeypatch.setattr(act_quant, "ROW_MAX_K", 256)
    monkeypatch.setattr(act_quant, "_BLOCK_K", 128)
    x = torch.randn(3, 300, generator=torch.Generator().manual_seed(2)).bfloat16().to(DEVICE)
    q = torch.empty(3, 300, dtype=torch.float8_e4m3fn, device=DEVICE)
    s = torch.empty((3,), dtype=torch.float32, device=DEVICE)
    act_quant_prepare(x, q, s)()
    rq, rs = quantize_activations(x, parse_weight("fp8"))
    assert torch.equal(s, rs) and torch.equal(q.float(), rq.float())


def test_the_traceable_activation_quantization_matches_the_torch_reference():
    # the launch torch.compile traces for the vendor fp8 GEMM (ops._quant_linear_traced): same kernel, own buffers
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(1)).bfloat16().to(DEVICE)
    x[2] = 0
    q, s = act_quant_traced(x)
    rq, rs = quantize_activations(x, parse_weight("fp8"))
    assert q.dtype == torch.float8_e4m3fn and torch.equal(s, rs) and torch.equal(q.float(), rq.float())


# -- decode GEMV --------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", FORMATS)
def test_gemv_single_row_bf16_streams_a_padded_group_correctly(spec):
    # M = 1, FMA path, bf16 (no dot involved); K = 200: a padded last group; N = 100 over BLOCK_N = 64
    op = OpSpec(kind="gemv", shape=(1, 100, 200), dtype="bf16", weight=spec)
    assert_correct(op, gemv_cfg(1, 64))


@pytest.mark.parametrize("spec", FORMATS)
def test_gemv_tiles_spanning_two_groups_with_split_k_are_correct(spec):
    # BLOCK_K = 256 holds two 128-groups; SPLIT_K = 2 over K = 512
    op = OpSpec(kind="gemv", shape=(1, 100, 512), dtype="bf16", weight=spec)
    assert_correct(op, gemv_cfg(1, 256, split=2, bn=32))


@pytest.mark.parametrize("spec", FORMATS)
@pytest.mark.parametrize("m", [3, 16])
def test_gemv_multi_row_dot_path_is_correct(spec, m):
    op = OpSpec(kind="gemv", shape=(m, 100, 200), dtype="fp16", weight=spec)
    assert_correct(op, gemv_cfg(4 if m == 3 else 16, 64, split=2))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gemv_single_row_on_the_16_row_dot_tile_is_correct(dtype):
    # M = 1 padded to the 16-row MMA tile (offered for symmetric int4 only); K = 200 pads the last group
    op = OpSpec(kind="gemv", shape=(1, 100, 200), dtype=dtype, weight="int4")
    assert_correct(op, gemv_cfg(16, 64, split=2))


def test_gemv_small_groups_and_bf16_dot_route_are_correct():
    assert_correct(OpSpec(kind="gemv", shape=(3, 100, 200), dtype="bf16", weight="int4-g32-asym"), gemv_cfg(4, 32))


def test_gemv_fp8_needs_no_activation_quantization():
    # a W8A8 format's GEMV keeps activations: its error is the fp16 output's, not e4m3's
    op = OpSpec(kind="gemv", shape=(1, 100, 200), dtype="fp16", weight="fp8")
    assert assert_correct(op, gemv_cfg(1, 64)) < 1e-3


# -- prefill GEMM ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [*FORMATS, "fp8-wo", "fp8_block-wo"])
def test_gemm_ragged_shape_is_correct(spec):
    op = OpSpec(kind="gemm", shape=(33, 100, 200), dtype="fp16", weight=spec)
    assert_correct(op, gemm_cfg())


@pytest.mark.parametrize("spec", ["int4", "int8", "fp8_block"])
def test_gemm_bf16_activations_are_correct(spec):
    assert_correct(OpSpec(kind="gemm", shape=(33, 100, 256), dtype="bf16", weight=spec), gemm_cfg(bk=128))


def test_gemm_full_tiles_take_the_unmasked_path():
    assert_correct(OpSpec(kind="gemm", shape=(64, 128, 256), dtype="fp16", weight="int4-asym"),
                   gemm_cfg(bm=64, bn=64, bk=128))


# -- bias, and what never runs --------------------------------------------------------------------

@pytest.mark.parametrize("kind,m,cfg", [("gemv", 1, gemv_cfg(1, 64, split=2)), ("gemv", 3, gemv_cfg(4, 64, split=2)),
                                        ("gemm", 33, gemm_cfg())])
@pytest.mark.parametrize("spec", ["int4-asym", "fp8"])
def test_bias_is_added_once(kind, m, cfg, spec):
    op = OpSpec(kind=kind, shape=(m, 100, 200), dtype="fp16", weight=spec)
    inputs = registry.make_inputs(op, DEVICE, seed=3)
    inputs["bias"] = torch.randn(100, generator=torch.Generator().manual_seed(4)).half().to(DEVICE)
    out = registry.alloc_out(op, DEVICE).fill_(float("nan"))
    registry.launch(inputs, cfg, out, op)
    ref = registry.reference(inputs, op)
    assert relative_error(out, ref) <= registry.tolerance(op)
    without = ref - inputs["bias"].double()
    assert relative_error(out, without) > 10 * registry.tolerance(op)


def test_kernel_error_is_far_below_the_formats_error():
    op = OpSpec(kind="gemv", shape=(1, 256, 1024), dtype="bf16", weight="int4")
    w = torch.randn(256, 1024, generator=torch.Generator().manual_seed(5)).bfloat16() / 32
    x = torch.randn(1, 1024, generator=torch.Generator().manual_seed(6)).bfloat16()
    q = quantize(w, op.weight)
    inputs = {"a": x.to(DEVICE), **{k: v.to(DEVICE) for k, v in q.tensors().items()}}
    out = registry.alloc_out(op, DEVICE)
    registry.launch(inputs, gemv_cfg(1, 256), out, op)
    kernel_err = relative_error(out.cpu(), reference_matmul(x, q, gemm=False))
    format_err = relative_error(out.cpu(), x.double() @ w.double().t())
    assert kernel_err < 0.01 < format_err < 0.15


@pytest.mark.parametrize("cfg,why", [(gemv_cfg(4, 256), "BLOCK_K=256 > the int4-g128 group 128"),
                                     (gemv_cfg(2, 64), "BLOCK_M=2 must be next_pow2(M)=4")])
def test_an_invalid_config_is_rejected_and_never_launched(cfg, why, monkeypatch):
    import autoopt.backend.kernels.quant_gemv as kernels

    def boom(*args, **kwargs):  # pragma: no cover - reaching it is the failure
        raise AssertionError("an invalid config was launched")
    monkeypatch.setattr(kernels, "quant_gemv_prepare", boom)
    op = OpSpec(kind="gemv", shape=(3, 100, 512), dtype="fp16", weight="int4")
    res = evaluate(op, cfg, validate=lambda o, c: validate_config(GPU, o, c))
    assert res.label == "rejected" and why in res.reason


def test_a_plain_kernel_is_never_given_a_quantized_weight_nor_the_reverse():
    quant = evaluate(OpSpec(kind="gemv", shape=(1, 64, 64), dtype="fp16", weight="int8"),
                     KernelConfig(kernel="gemv", params=dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=32, SPLIT_K=1)))
    plain = evaluate(OpSpec(kind="gemv", shape=(1, 64, 64), dtype="fp16"), gemv_cfg(1, 32))
    assert quant.label == plain.label == "rejected"
    assert "reads a plain fp16 weight" in quant.reason and "reads a quantized weight" in plain.reason


# -- dequantize + cuBLAS (prefill, weight-only formats) -------------------------------------------

def dequant_cfg(bn: int = 16, bk: int = 256) -> KernelConfig:
    return KernelConfig(kernel="quant_dequant_cublas", template="quant-dequant-cublas",
                        params=dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=2))


@pytest.mark.parametrize("spec", ["int4", "int4-asym", "int4-g32", "int8", "fp8-wo", "fp8_block-wo"])
@pytest.mark.parametrize("bk", [64, 256])
def test_dequant_cublas_matches_the_dequantized_reference(spec, bk):
    # K = 200: a padded int4 group and a ragged K tile; N = 100 over BLOCK_N = 16
    assert_correct(OpSpec(kind="gemm", shape=(33, 100, 200), dtype="bf16", weight=spec), dequant_cfg(bk=bk))


@pytest.mark.parametrize("spec", ["int4", "int4-asym", "int4-g32", "fp8_block-wo"])
@pytest.mark.parametrize("bk", [128, 256])
def test_dequant_writes_dequantize_exactly_in_fp32(spec, bk):
    # bk = 256 over int4's 128-groups (and 32-groups): each slice of a tile takes its own group's scale
    from autoopt.backend.kernels.quant_dequant import dequant_prepare

    w = torch.randn(130, 300, generator=torch.Generator().manual_seed(7)).bfloat16().to(DEVICE)
    q = quantize(w, spec)
    out = torch.full((130, 300), float("nan"), device=DEVICE)
    dequant_prepare(q, out, dict(BLOCK_N=16, BLOCK_K=bk, num_warps=2))()
    assert torch.allclose(out, dequantize(q).to(DEVICE), rtol=1e-6, atol=0)


@pytest.mark.parametrize("spec", ["int4-asym", "fp8_block-wo"])
def test_the_traceable_dequant_writes_what_the_launcher_writes(spec):
    # the launch torch.compile traces for the dequantize + cuBLAS path (ops._quant_linear_traced): its own buffer
    from autoopt.backend.kernels.quant_dequant import dequant_prepare, dequant_traced

    q = quantize(torch.randn(130, 300, generator=torch.Generator().manual_seed(7)).bfloat16().to(DEVICE), spec)
    params = dict(BLOCK_N=16, BLOCK_K=128, num_warps=2)
    out = torch.empty((130, 300), dtype=torch.bfloat16, device=DEVICE)
    dequant_prepare(q, out, params)()
    got = dequant_traced(q, torch.bfloat16, params)
    assert got.shape == (130, 300) and got.dtype == torch.bfloat16 and torch.equal(got, out)


def test_dequant_cublas_adds_the_bias_and_rejects_w8a8():
    op = OpSpec(kind="gemm", shape=(33, 100, 256), dtype="fp16", weight="int4")
    inputs = registry.make_inputs(op, DEVICE, seed=3)
    inputs["bias"] = torch.randn(100, generator=torch.Generator().manual_seed(4)).half().to(DEVICE)
    out = registry.alloc_out(op, DEVICE)
    registry.launch(inputs, dequant_cfg(), out, op)
    assert relative_error(out, registry.reference(inputs, op)) <= registry.tolerance(op)
    w8a8 = OpSpec(kind="gemm", shape=(33, 100, 256), dtype="bf16", weight="fp8")
    res = evaluate(w8a8, dequant_cfg(), validate=lambda o, c: validate_config(GPU, o, c))
    assert res.label == "rejected"


def test_the_paired_bf16_decode_is_left_to_gpus_with_bf16x2_fmas(monkeypatch):
    # fma.rn.bf16x2 needs sm_80+: a T4 (sm_75) takes the exact fp32 decode; CPU tensors are bound for a named
    # target's compile (tests/_compile_sm90.py), which takes the PTX
    from autoopt.backend.kernels import quant_gemv

    quant_gemv._sm_at_least.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: {0: (7, 5), 1: (9, 0)}[index])
    try:
        assert [quant_gemv._sm_at_least(*dev, 8) for dev in (("cuda", 0), ("cuda", 1), ("cpu", None))] == \
            [False, True, True]
        # the word path's norm fusion multiplies bf16 pairs: sm_90
        assert [quant_gemv._sm_at_least("cuda", i, 9) for i in (0, 1)] == [False, True]
    finally:
        quant_gemv._sm_at_least.cache_clear()


# -- which int4 decodes take the word path (int4_word_dot) ------------------------------------------------------

def _words(spec: str = "int4", *, k: int = 1024, bk: int = 512, even: bool = True, x_offset: int = 0) -> bool:
    from autoopt.backend.kernels.quant_gemv import _words_fit

    q = quantize(torch.randn(64, k).bfloat16(), spec)
    x = torch.randn(1, k + 8).bfloat16()[:, x_offset:x_offset + k]
    return _words_fit(x, q.qweight, q, bk, even)


def test_symmetric_int4_on_unmasked_tiles_takes_the_word_path():
    assert _words() and _words(bk=128) and _words(bk=64)


def test_asymmetric_int4_keeps_the_per_byte_path_for_its_activation_sums():
    assert not _words("int4-asym")


def test_masked_tiles_keep_the_per_byte_path():
    assert not _words(even=False)


def test_activations_off_an_8_byte_boundary_keep_the_per_byte_path():
    # the word path reads four bf16 activations as one int64
    assert _words(x_offset=4) and not _words(x_offset=1) and not _words(x_offset=2)


def test_other_formats_never_take_the_word_path():
    assert not _words("int8") and not _words("fp8")
