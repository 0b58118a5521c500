"""The int4 decode GEMV's fused prologue and epilogues (prototype, branch wip/fused-decode): RMSNorm of x in the
prologue, SwiGLU over [gate; up] rows and a residual add in the epilogue, each against torch's separate ops."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare  # noqa: E402
from autoopt.backend.quant import dequantize, quantize  # noqa: E402

K = 512
#: the interpreter converts fp32 to bf16 by truncation (half of 4096 random values land farther than round-to-
#: nearest, triton 3.9), so x g rounds coarser here than on a GPU (``mul.rn`` / ``cvt.rn``): 0.65 % on the norm
#: row against 0.39 % for the same product rounded by torch, 1.2 % once SwiGLU multiplies two such outputs
TOL = 1e-2
TOL_GATED_NORM = 2e-2
CFG = {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 2, "num_stages": 2}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


FORMATS = ["int4", "int4-asym", "int8", "fp8", "fp8_block"]


def _setup(n: int, seed: int = 0, spec: str = "int4", k: int = K):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn((n, k), generator=gen) * k ** -0.5
    q = quantize(w.bfloat16(), spec)
    x = (torch.randn((1, k), generator=gen) * 3).bfloat16()
    g = (1 + 0.5 * torch.randn(k, generator=gen)).bfloat16()
    return q, dequantize(q).float(), x, g


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _rmsnorm(x, g, eps=1e-6):
    """RMSNorm in float64 (no rounding: the kernel rounds x g once, transformers rounds x / rms and its product
    with g, so each is compared with the exact value)."""
    xf = x.double()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * g.double()).float()


@pytest.mark.parametrize("spec", FORMATS)
def test_the_norm_prologue_computes_the_linear_of_the_normed_row(spec):
    q, w, x, g = _setup(100, spec=spec)
    out = torch.empty((1, 100), dtype=torch.bfloat16)
    quant_gemv_prepare(x, q, out, CFG, norm_weight=g, eps=1e-6)()
    assert _rel(out, _rmsnorm(x, g) @ w.t()) < TOL


@pytest.mark.parametrize("spec", ["int4", "fp8"])
def test_a_split_k_norm_sums_the_squares_of_the_whole_row_first(spec):
    q, w, x, g = _setup(100, spec=spec)
    out = torch.empty((1, 100), dtype=torch.bfloat16)
    quant_gemv_prepare(x, q, out, {**CFG, "SPLIT_K": 2}, norm_weight=g, eps=1e-6)()
    assert _rel(out, _rmsnorm(x, g) @ w.t()) < TOL


@pytest.mark.parametrize("spec", ["int4", "int8", "fp8"])
def test_the_norm_counts_only_the_rows_real_columns_when_k_is_not_a_tile_multiple(spec):
    q, w, x, g = _setup(64, spec=spec, k=384)  # BLOCK_K 256: the second tile half past K
    out = torch.empty((1, 64), dtype=torch.bfloat16)
    quant_gemv_prepare(x, q, out, CFG, norm_weight=g, eps=1e-6)()
    assert _rel(out, _rmsnorm(x, g) @ w[:, :384].t()) < TOL


@pytest.mark.parametrize("spec", FORMATS)
def test_the_gated_epilogue_writes_silu_of_the_gate_rows_times_the_up_rows(spec):
    q, w, x, _ = _setup(2 * 40, spec=spec)
    out = torch.empty((1, 40), dtype=torch.bfloat16)
    quant_gemv_prepare(x, q, out, CFG, gated=True)()
    h = x.float() @ w.t()
    assert _rel(out, torch.nn.functional.silu(h[:, :40]) * h[:, 40:]) < TOL


@pytest.mark.parametrize("spec", FORMATS)
def test_the_residual_epilogue_adds_the_residual_stream(spec):
    q, w, x, _ = _setup(100, spec=spec)
    r = torch.randn((1, 100)).bfloat16()
    out = torch.empty((1, 100), dtype=torch.bfloat16)
    quant_gemv_prepare(x, q, out, CFG, residual=r)()
    assert _rel(out, r.float() + x.float() @ w.t()) < TOL


@pytest.mark.parametrize("spec", FORMATS)
def test_norm_and_gated_together_are_the_mlps_first_half(spec):
    q, w, x, g = _setup(2 * 48, spec=spec)
    out = torch.empty((1, 48), dtype=torch.bfloat16)
    quant_gemv_prepare(x, q, out, CFG, norm_weight=g, gated=True)()
    h = _rmsnorm(x, g) @ w.t()
    assert _rel(out, torch.nn.functional.silu(h[:, :48]) * h[:, 48:]) < TOL_GATED_NORM


@pytest.mark.parametrize(("kw", "says"), [
    ({"gated": True, "params": {"SPLIT_K": 2}}, "SPLIT_K 1"),
    ({"residual": "wrong shape"}, "residual"),
    ({"norm_weight": "wrong shape"}, "norm weight"),
])
def test_a_fusion_the_kernel_cannot_take_is_refused_before_launch(kw, says):
    q, _, x, _ = _setup(100)
    out = torch.empty((1, 100), dtype=torch.bfloat16)
    params = {**CFG, **kw.pop("params", {})}
    if kw.get("residual") == "wrong shape":
        kw["residual"] = torch.zeros((1, 99), dtype=torch.bfloat16)
    if kw.get("norm_weight") == "wrong shape":
        kw["norm_weight"] = torch.ones(K - 1, dtype=torch.bfloat16)
    if kw.get("gated"):
        out = torch.empty((1, 50), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=says):
        quant_gemv_prepare(x, q, out, params, **kw)
