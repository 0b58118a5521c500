"""Gated activations ``act(x) * y`` whose rows may be strided: SiLU (SwiGLU) and tanh-GELU (GeGLU).

The same flat streaming pass as ``elementwise.py`` (one ``BLOCK_SIZE`` chunk of the ``rows * N``
outputs per program, math in fp32, the bounds mask compiled out when ``numel % BLOCK_SIZE == 0``),
so the elementwise template's configs and cost model apply unchanged. Two things are added:

- ``GELU``: ``gelu_tanh(x) * y`` (Gemma's ``gelu_pytorch_tanh``). ``0.5 * (1 + tanh(z))`` is
  ``sigmoid(2z)``, so ``gelu_tanh(x) = x / (1 + exp(-2z))`` with ``z = sqrt(2/pi) (x + 0.044715 x^3)``:
  one ``exp``, no ``tanh`` (which Triton's interpreter and older Tritons lack), and no overflow
  (``exp`` -> inf gives 0, as it should);
- ``STRIDED``: ``x`` and ``y`` are ``[rows, N]`` with unit stride along N and any row stride, which
  is how a fused gate/up projection's output ``[rows, 2I]`` is read without a copy (gate = the
  first I columns, up = the last I: both row stride 2I). The output is always contiguous. Strided
  addresses cost a 64-bit divide per element; the pass stays memory-bound.

These live in their own file rather than beside ``silu_mul`` in ``elementwise.py`` on purpose: a
stored measurement is tied to its kernel file's hash (see :class:`autoopt.backend.registry.KernelEntry`),
and editing ``elementwise.py`` would turn every measured ``silu_mul``/``add`` winner stale.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import traceable

log = logging.getLogger(__name__)

__all__ = ["gated_prepare", "gelu_tanh_mul_prepare", "rows_view"]

_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # a global a @triton.jit body reads must be constexpr


# The @triton.jit kernel carries no annotations on purpose: Triton reads a parameter's annotation
# as its type or specialisation (``n: int`` would pin n to i32), so it is exempt from mypy's
# no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _gated_kernel(x_ptr, y_ptr, out_ptr, numel, n_cols, stride_x, stride_y,  # type: ignore[no-untyped-def]
                  BLOCK_SIZE: tl.constexpr, EVEN: tl.constexpr, STRIDED: tl.constexpr, GELU: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if STRIDED:
        row = offs // n_cols
        col = offs - row * n_cols
        x_offs = row * stride_x + col
        y_offs = row * stride_y + col
    else:
        x_offs = offs
        y_offs = offs
    if EVEN:
        x = tl.load(x_ptr + x_offs, eviction_policy="evict_first").to(tl.float32)
        y = tl.load(y_ptr + y_offs, eviction_policy="evict_first").to(tl.float32)
    else:
        mask = offs < numel
        x = tl.load(x_ptr + x_offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = tl.load(y_ptr + y_offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if GELU:
        z = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        out = x / (1.0 + tl.exp(-2.0 * z)) * y
    else:
        out = x / (1.0 + tl.exp(-x)) * y
    if EVEN:
        tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=offs < numel)


def rows_view(t: Any) -> tuple[int, int, int] | None:
    """``(rows, N, row_stride)`` when ``t`` reads as ``[rows, N]`` with unit stride along N (last dim)
    and one stride between rows, without a copy; None otherwise (a copy would be needed)."""
    if t.dim() == 0:
        return None
    n = t.shape[-1]
    if n != 1 and t.stride(-1) != 1:
        return None
    if t.dim() == 1:
        return 1, n, n
    try:
        v = t.view(-1, n)
    except RuntimeError:  # leading dims not collapsible into one stride
        return None
    return v.shape[0], n, v.stride(0) if v.shape[0] > 1 else n


def gated_prepare(x: Any, y: Any, out: Any, params: dict[str, int], *, gelu: bool) -> Callable[[], None]:
    """A launcher for ``out = act(x) * y`` (``act`` tanh-GELU when ``gelu``, else SiLU).

    ``out`` must be contiguous with as many elements as ``x`` and ``y``. ``x`` and ``y`` are either
    both contiguous (read flat) or both ``[rows, N]`` row views (see :func:`rows_view`) of the same
    rows and N; anything else is a ``ValueError``.
    """
    if not out.is_contiguous():
        raise ValueError(f"gated kernels write a contiguous output; out has strides {tuple(out.stride())}")
    numel = out.numel()
    if x.numel() != numel or y.numel() != numel:
        raise ValueError(f"x ({x.numel()}), y ({y.numel()}) and out ({numel}) must have as many elements")
    strided = not (x.is_contiguous() and y.is_contiguous())
    n_cols, sx, sy = 1, 0, 0
    if strided:
        vx, vy = rows_view(x), rows_view(y)
        if vx is None or vy is None:
            bad, t = ("x", x) if vx is None else ("y", y)
            raise ValueError(f"gated kernels read rows with unit stride along the last dim; {bad} has shape "
                             f"{tuple(t.shape)} and strides {tuple(t.stride())}")
        if vx[:2] != vy[:2]:
            raise ValueError(f"x rows {vx[:2]} and y rows {vy[:2]} differ")
        n_cols, sx, sy = vx[1], vx[2], vy[2]
    block = params["BLOCK_SIZE"]
    grid = (triton.cdiv(numel, block),)
    even = numel % block == 0
    warps = params.get("num_warps", 4)

    def run() -> None:
        traceable(_gated_kernel)[grid](x, y, out, numel, n_cols, sx, sy, BLOCK_SIZE=block, EVEN=even,
                                       STRIDED=strided, GELU=gelu, num_warps=warps)
    return run


def gelu_tanh_mul_prepare(x: Any, y: Any, out: Any, params: dict[str, int]) -> Callable[[], None]:
    """A launcher for ``out = gelu_tanh(x) * y`` (the registry's ``gelu_tanh_mul`` kernel)."""
    return gated_prepare(x, y, out, params, gelu=True)
