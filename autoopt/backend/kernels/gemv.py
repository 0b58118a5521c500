"""Decode GEMV/skinny GEMM ``C[M,N] = X[M,K] @ W[N,K]^T`` for M = 1..16.

Memory-bound: the kernel exists to stream W (``N*K`` elements) once at full
bandwidth. Each program owns ``BLOCK_N`` rows of W and one K-slice
(``SPLIT_K`` slices), loads ``[BLOCK_N, BLOCK_K]`` tiles along contiguous K
(16-byte vector loads when K is a multiple of BLOCK_K) and reuses each tile for
all M rows of X.

- ``BLOCK_M == 1``: plain FMAs into a ``[BLOCK_N, BLOCK_K]`` fp32 accumulator,
  reduced over K once at the end (no per-iteration shuffles).
- ``BLOCK_M > 1``: a tensor-core ``tl.dot`` with M padded to 16 (MMA needs
  M >= 16); the padded rows are masked loads of X, so they cost no DRAM bytes.
Split-K partials go through the same deterministic fp32 workspace + reduce as
the tiled GEMM (see ``gemm.py`` for why not atomics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels.gemm import _needs_fp16_dot, k_split, split_k_launcher, weight_dims

log = logging.getLogger(__name__)

__all__ = ["gemv_prepare"]


# The @triton.jit kernels here carry no annotations on purpose: Triton reads a parameter's annotation
# as its type or specialisation (``n: int`` would pin n to i32), so each is exempt from mypy's
# no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _gemv_kernel(x_ptr, w_ptr, c_ptr, M, N, K,  # type: ignore[no-untyped-def]
                 stride_xm, stride_xk, stride_wn, stride_wk,
                 stride_cs, stride_cm, stride_cn, tiles_per_split,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DOT_M: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP16: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrapped rows of W keep the loads unmasked; the store mask drops them.
    offs_wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    k_start = pid_k * tiles_per_split * BLOCK_K
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_wn[:, None] * stride_wn + offs_k[None, :] * stride_wk

    if BLOCK_M == 1:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        x_ptrs = x_ptr + offs_k * stride_xk
        for kt in range(0, tiles_per_split):
            if EVEN_K:
                w = tl.load(w_ptrs, eviction_policy="evict_first")
                x = tl.load(x_ptrs)
            else:
                k_left = K - k_start - kt * BLOCK_K
                kmask = tl.arange(0, BLOCK_K) < k_left
                w = tl.load(w_ptrs, mask=kmask[None, :], other=0.0, eviction_policy="evict_first")
                x = tl.load(x_ptrs, mask=kmask, other=0.0)
            acc2 += w.to(tl.float32) * x.to(tl.float32)[None, :]
            w_ptrs += BLOCK_K * stride_wk
            x_ptrs += BLOCK_K * stride_xk
        acc = tl.sum(acc2, axis=1)
        c_ptrs = c_ptr + pid_k * stride_cs + offs_n * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=offs_n < N)
    else:
        offs_m = tl.arange(0, DOT_M)
        m_ok = offs_m < M
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
        acc = tl.zeros((DOT_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, tiles_per_split):
            if EVEN_K:
                w = tl.load(w_ptrs, eviction_policy="evict_first")
                x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            else:
                k_left = K - k_start - kt * BLOCK_K
                kmask = tl.arange(0, BLOCK_K) < k_left
                w = tl.load(w_ptrs, mask=kmask[None, :], other=0.0, eviction_policy="evict_first")
                x = tl.load(x_ptrs, mask=m_ok[:, None] & kmask[None, :], other=0.0)
            if DOT_FP16:
                w = w.to(tl.float16)
                x = x.to(tl.float16)
            acc = tl.dot(x, tl.trans(w), acc)
            w_ptrs += BLOCK_K * stride_wk
            x_ptrs += BLOCK_K * stride_xk
        c_ptrs = c_ptr + pid_k * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & (offs_n[None, :] < N))


def gemv_prepare(x: Any, w: Any, out: Any, params: dict[str, int], *, layout: str = "nk") -> Callable[[], None]:
    """Bind a config to tensors; returns a no-argument launcher (split-K workspace allocated here)."""
    M, K = x.shape
    N, stride_wn, stride_wk = weight_dims(w, layout)
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    if bm < M:
        raise ValueError(f"gemv BLOCK_M={bm} must be >= M={M} (one program covers every row of X)")
    split_k = params.get("SPLIT_K", 1)
    if split_k > 1 and not out.is_contiguous():  # the reduce writes out as contiguous [M, N]
        raise ValueError("split-K GEMV writes a contiguous output; got a strided one")
    tiles_per_split, even_k = k_split(K, bk, split_k)
    grid = (triton.cdiv(N, bn), split_k)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_M=max(16, bm), EVEN_K=even_k,
                DOT_FP16=_needs_fp16_dot(x),
                num_warps=params.get("num_warps", 4), num_stages=params.get("num_stages", 3))
    return split_k_launcher(_gemv_kernel, grid, x, w, out, (M, N, K),
                            (x.stride(0), x.stride(1), stride_wn, stride_wk), tiles_per_split, split_k, meta)
