"""Flat elementwise kernels: ``silu_mul`` (``silu(x) * y``) and ``add`` (``x + y``).

Both are pure streaming (3 bytes-per-element-times-dtype through DRAM), so the
tensors are flattened and each program handles one ``BLOCK_SIZE`` chunk with
16-byte vector loads. When ``numel % BLOCK_SIZE == 0`` the bounds mask is
compiled out (``EVEN``). Math is in fp32 whatever the storage dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

log = logging.getLogger(__name__)

__all__ = ["add_prepare", "silu_mul_prepare"]


# The @triton.jit kernels here carry no annotations on purpose: Triton reads a parameter's annotation
# as its type or specialisation (``n: int`` would pin n to i32), so each is exempt from mypy's
# no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, out_ptr, numel, BLOCK_SIZE: tl.constexpr, EVEN: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if EVEN:
        x = tl.load(x_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        y = tl.load(y_ptr + offs, eviction_policy="evict_first").to(tl.float32)
    else:
        mask = offs < numel
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    out = x / (1.0 + tl.exp(-x)) * y
    if EVEN:
        tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=offs < numel)


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, numel, BLOCK_SIZE: tl.constexpr, EVEN: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if EVEN:
        x = tl.load(x_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        y = tl.load(y_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        tl.store(out_ptr + offs, (x + y).to(out_ptr.dtype.element_ty))
    else:
        mask = offs < numel
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(out_ptr + offs, (x + y).to(out_ptr.dtype.element_ty), mask=mask)


def _prepare(kernel: Any, x: Any, y: Any, out: Any, params: dict[str, int]) -> Callable[[], None]:
    for name, t in (("x", x), ("y", y), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"elementwise kernels take contiguous tensors; {name} has strides {tuple(t.stride())}")
    numel = x.numel()
    block = params["BLOCK_SIZE"]
    grid = (triton.cdiv(numel, block),)
    even = numel % block == 0
    warps = params.get("num_warps", 4)

    def run() -> None:
        kernel[grid](x, y, out, numel, BLOCK_SIZE=block, EVEN=even, num_warps=warps)
    return run


def silu_mul_prepare(x: Any, y: Any, out: Any, params: dict[str, int]) -> Callable[[], None]:
    """A launcher for ``out = silu(x) * y`` over the flattened tensors."""
    return _prepare(_silu_mul_kernel, x, y, out, params)


def add_prepare(x: Any, y: Any, out: Any, params: dict[str, int]) -> Callable[[], None]:
    """A launcher for ``out = x + y`` over the flattened tensors."""
    return _prepare(_add_kernel, x, y, out, params)
