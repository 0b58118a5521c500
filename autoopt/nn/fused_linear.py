"""A quantized decode linear with its neighbours fused in: ``residual + g(rmsnorm(x) * w_norm @ W^T)``.

:func:`quant_linear_fused` is what a fused decode layer (:mod:`autoopt.nn.decode_layer`) calls in place of a norm,
a quantized linear, SwiGLU and a residual add: at one token (M = 1) on a GPU (or under Triton's interpreter) one
``quant_gemv`` launch with its RMSNorm prologue, SwiGLU epilogue (``gated``: W is ``[gate; up]``) and residual
epilogue (:func:`autoopt.backend.kernels.quant_gemv.quant_gemv_prepare`); elsewhere the same result from torch's
separate ops, logged and counted as a fallback. Each launch runs the best ranked config that the fusion can take
(:data:`FUSED_REQUIRE`).

The norm is transformers' RMSNorm: ``w_norm * (x / rms(x))`` in x's dtype (``rms`` in fp32 with ``eps``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from autoopt.nn.dispatch import choose, matmul_kind
from autoopt.nn.ops import _LIB, _check_quant_linear, _direct, _fallback, _grad_needed, _packed, dequant_linear

__all__ = ["fused_reference", "quant_linear_fused"]

OP = "quant_linear_fused"


def fused_reference(x: Tensor, qw: Any, bias: Tensor | None, norm_weight: Tensor | None, eps: float, gated: bool,
                    residual: Tensor | None) -> Tensor:
    """The fused op's result from torch's separate ops (the fallback, and what tests compare the kernel with)."""
    h = x
    if norm_weight is not None:
        xf = x.float()
        h = norm_weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = dequant_linear(h, qw, bias)
    if gated:
        i = y.shape[-1] // 2
        y = F.silu(y[..., :i]) * y[..., i:]
    return y if residual is None else residual + y


def _why_not_kernel(m: int, choice: Any) -> str | None:
    if m != 1:
        return f"{m} rows (the fused GEMV serves one token)"
    if choice.config is None:
        return str(choice.fallback)
    if choice.config.kernel != "quant_gemv":
        return f"the chosen kernel {choice.config.kernel} is not the decode GEMV"
    return None


#: what a fused launch's config must hold: the FMA path (``BLOCK_M`` 1: rank() may pick the 16-row dot tile for
#: symmetric int4 at M = 1, whose loop has no fused prologue) at split-K 1: an epilogue (SwiGLU, the residual add)
#: writes each output once. Asked of the ranking, not
#: forced onto its pick: forcing split-K 1 onto Llama-3-8B down's split-K 2 pick (BLOCK_N 64) left 64 programs,
#: 29.5 us where the best split-K 1 tile (BLOCK_N 16) takes 17.4 (H200 graph grid,
#: ``h200/quant_kernels_fmagrid_graph.json``); a decode step built that way measured 3.03 ms where the unfused one
#: took 2.70 (``h200/quant_trace_decode_layer.json``).
FUSED_REQUIRE = (("BLOCK_M", 1), ("SPLIT_K", 1))


def _impl(x: Tensor, qweight: Tensor, scales: Tensor, offsets: Tensor | None, bias: Tensor | None,
          norm_weight: Tensor | None, residual: Tensor | None, weight: str, k: int, eps: float, gated: bool) -> Tensor:
    from autoopt.backend.kernels.quant_gemv import fusion_problem, quant_gemv_prepare

    _check_quant_linear(x, qweight, scales, offsets, bias, weight, k)
    qw = _packed(qweight, scales, offsets, weight, k)
    m = math.prod(x.shape[:-1])
    n_out = qw.n // 2 if gated else qw.n
    choice = choose("quant_linear", matmul_kind(max(m, 1)), (max(m, 1), qw.n, k), x.dtype, x.device,
                    weight=qw.fmt.spec, require=FUSED_REQUIRE)
    why = _why_not_kernel(m, choice)
    if why is not None:
        return _fallback(OP, why, lambda: fused_reference(x, qw, bias, norm_weight, eps, gated, residual))
    assert choice.config is not None  # _why_not_kernel said so
    params = dict(choice.config.params)
    out = torch.empty((1, n_out), dtype=x.dtype, device=x.device)
    a = x.reshape(1, k).contiguous()
    r = None if residual is None else residual.reshape(1, n_out).contiguous()
    why = fusion_problem(a, qw, out, params, norm_weight, gated, r)
    if why is not None:  # a config or operand the fused kernel cannot take: the separate ops, not an error
        return _fallback(OP, why, lambda: fused_reference(x, qw, bias, norm_weight, eps, gated, residual))
    quant_gemv_prepare(a, qw, out, params, bias=bias, norm_weight=norm_weight, eps=eps, gated=gated, residual=r)()
    return out.view(*x.shape[:-1], n_out)


_op = torch.library.custom_op(
    f"{_LIB}::{OP}", mutates_args=(),
    schema="(Tensor x, Tensor qweight, Tensor scales, Tensor? offsets, Tensor? bias, Tensor? norm_weight, "
           "Tensor? residual, str weight, int k, float eps, bool gated) -> Tensor",
)(_impl)


@_op.register_fake
def _fake(x: Tensor, qweight: Tensor, scales: Tensor, offsets: Tensor | None, bias: Tensor | None,
          norm_weight: Tensor | None, residual: Tensor | None, weight: str, k: int, eps: float, gated: bool) -> Tensor:
    _check_quant_linear(x, qweight, scales, offsets, bias, weight, k)
    n = qweight.shape[0] // 2 if gated else qweight.shape[0]
    return x.new_empty((*x.shape[:-1], n))


def quant_linear_fused(x: Tensor, qweight: Tensor, scales: Tensor, offsets: Tensor | None = None,
                       bias: Tensor | None = None, *, weight: str, k: int, norm_weight: Tensor | None = None,
                       eps: float = 1e-6, gated: bool = False, residual: Tensor | None = None) -> Tensor:
    """``residual + act(rmsnorm(x) * norm_weight @ dequant(W)^T + bias)`` over a packed weight (as
    :func:`autoopt.nn.ops.quant_linear` takes it); each part only when given: ``norm_weight`` (x is the norm's input),
    ``gated`` (W is ``[gate; up]``, the output ``silu(gate) * up``, half as wide), ``residual`` (the output's shape).
    One fused kernel at one token; torch's separate ops otherwise (and with autograd)."""
    tensors = (x, qweight, scales, offsets, bias, norm_weight, residual)
    if _grad_needed(x, bias, norm_weight, residual):
        qw = _packed(qweight, scales, offsets, weight, k)
        return fused_reference(x, qw, bias, norm_weight, eps, gated, residual)
    if _direct(*tensors):
        return _impl(*tensors, weight, k, float(eps), gated)
    out: Tensor = torch.ops.autoopt.quant_linear_fused(*tensors, weight, k, float(eps), gated)
    return out
