"""Row-wise normalisations over the last dimension N: RMSNorm, LayerNorm, softmax.

Two variants of each:
- ``*_single``: the whole row lives in registers (``BLOCK_N = next_pow2(N)``),
  one read and one write per element: the DRAM floor. ``ROWS_PER_PROGRAM``
  rows share a program when N is small, so each program still moves enough
  bytes to hide latency.
- ``*_looped``: the row is streamed in ``BLOCK_N`` chunks for rows too wide for
  registers: RMSNorm/LayerNorm read the row twice (statistics, then
  normalise); softmax keeps an online max/sum per lane (Milakov & Gimelshein,
  2018) and then writes ``exp(x - max) / sum`` in a second pass. The second
  read usually hits L2 (a 16 KB row of 8192 bf16 is far below the 50 MB L2).
- ``rmsnorm_split``: for a few very wide rows (64 x 262144: one program per
  row leaves half of 132 SMs idle and each SM streams one long row with little
  in flight), ``SPLIT_N`` programs share a row: a first launch writes each
  chunk's sum of squares to an fp32 ``[rows, SPLIT_N]`` buffer, a second sums
  a row's partials and normalises its chunk. The second launch walks the
  programs in reverse order, so it starts on the chunks the first read last,
  which are still in L2; a tensor of up to the L2 (50 MB on H100/H200) is read
  from DRAM once.
Statistics are fp32. LayerNorm-looped sums ``x - x[0]`` (a shift by the row's
first element) so the one-pass variance ``E[d^2] - E[d]^2`` does not cancel
catastrophically when |mean| >> std.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import traceable

log = logging.getLogger(__name__)

__all__ = ["NORM_KERNELS", "norm_prepare"]


# The @triton.jit kernels here carry no annotations on purpose: Triton reads a parameter's annotation
# as its type or specialisation (``n: int`` would pin n to i32), so each is exempt from mypy's
# no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _rmsnorm_single(x_ptr, w_ptr, b_ptr, o_ptr, n_rows, N, stride_x, stride_o, eps,  # type: ignore[no-untyped-def]
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < n_rows
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(o_ptr + rows64[:, None] * stride_o + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_looped(x_ptr, w_ptr, b_ptr, o_ptr, n_rows, N, stride_x, stride_o, eps,  # type: ignore[no-untyped-def]
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    o_row = o_ptr + row * stride_o
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        x = tl.load(x_row + cols, mask=cmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(o_row + cols, (x * rstd * w).to(o_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _layernorm_single(x_ptr, w_ptr, b_ptr, o_ptr, n_rows, N, stride_x, stride_o, eps,  # type: ignore[no-untyped-def]
                      BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = (rows < n_rows)[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(o_ptr + rows64[:, None] * stride_o + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm_looped(x_ptr, w_ptr, b_ptr, o_ptr, n_rows, N, stride_x, stride_o, eps,  # type: ignore[no-untyped-def]
                      BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    o_row = o_ptr + row * stride_o
    shift = tl.load(x_row).to(tl.float32)
    s1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        x = tl.load(x_row + cols, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        d = tl.where(cmask, x - shift, 0.0)
        s1 += d
        s2 += d * d
    m1 = tl.sum(s1, axis=0) / N
    var = tl.maximum(tl.sum(s2, axis=0) / N - m1 * m1, 0.0)
    mean = shift + m1
    rstd = tl.rsqrt(var + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        x = tl.load(x_row + cols, mask=cmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(o_row + cols, ((x - mean) * rstd * w + b).to(o_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _softmax_single(x_ptr, w_ptr, b_ptr, o_ptr, n_rows, N, stride_x, stride_o, eps,  # type: ignore[no-untyped-def]
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < N)[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"),
                eviction_policy="evict_first").to(tl.float32)
    m = tl.max(x, axis=1)
    # Rows past n_rows are all -inf: shift them by 0 so no inf - inf NaN is formed (never stored).
    m = tl.where(m == -float("inf"), 0.0, m)
    e = tl.exp(x - m[:, None])
    s = tl.sum(e, axis=1)
    y = e / tl.where(s == 0.0, 1.0, s)[:, None]
    tl.store(o_ptr + rows64[:, None] * stride_o + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_looped(x_ptr, w_ptr, b_ptr, o_ptr, n_rows, N, stride_x, stride_o, eps,  # type: ignore[no-untyped-def]
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    o_row = o_ptr + row * stride_o
    neg_inf = -float("inf")
    m = tl.full((BLOCK_N,), neg_inf, dtype=tl.float32)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=neg_inf, eviction_policy="evict_last").to(tl.float32)
        m_new = tl.maximum(m, x)
        # Lanes that have seen only padding keep m = -inf; guard exp(-inf - -inf) = NaN.
        safe = m_new != neg_inf
        alpha = tl.where(safe, tl.exp(m - m_new), 0.0)
        p = tl.where(safe, tl.exp(x - m_new), 0.0)
        s = s * alpha + p
        m = m_new
    m_row = tl.max(m, axis=0)
    s_row = tl.sum(tl.where(m != neg_inf, s * tl.exp(m - m_row), 0.0), axis=0)
    inv = 1.0 / s_row
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        x = tl.load(x_row + cols, mask=cmask, other=neg_inf, eviction_policy="evict_first").to(tl.float32)
        tl.store(o_row + cols, (tl.exp(x - m_row) * inv).to(o_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _rmsnorm_partial(x_ptr, p_ptr, N, stride_x, chunk,  # type: ignore[no-untyped-def]
                     BLOCK_N: tl.constexpr, SPLIT_N: tl.constexpr, STAGES: tl.constexpr):
    """p[row, s] = sum of x[row, c]^2 over chunk s of the row (columns s*chunk .. (s+1)*chunk - 1)."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    x_row = x_ptr + row * stride_x
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for off in tl.range(0, chunk, BLOCK_N, num_stages=STAGES):
        cols = s * chunk + off + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    tl.store(p_ptr + row * SPLIT_N + s, tl.sum(acc, axis=0))


@triton.jit
def _rmsnorm_apply(x_ptr, w_ptr, p_ptr, o_ptr, n_rows, N, stride_x, stride_o, chunk, eps,  # type: ignore[no-untyped-def]
                   BLOCK_N: tl.constexpr, SPLIT_N: tl.constexpr, STAGES: tl.constexpr):
    """Normalise chunk s of a row with the row's summed partials; programs in reverse launch order."""
    row = (n_rows - 1 - tl.program_id(0)).to(tl.int64)
    s = SPLIT_N - 1 - tl.program_id(1)
    parts = tl.load(p_ptr + row * SPLIT_N + tl.arange(0, SPLIT_N))
    rstd = tl.rsqrt(tl.sum(parts, axis=0) / N + eps)
    x_row = x_ptr + row * stride_x
    o_row = o_ptr + row * stride_o
    for off in tl.range(0, chunk, BLOCK_N, num_stages=STAGES):
        cols = s * chunk + off + tl.arange(0, BLOCK_N)
        cmask = cols < N
        x = tl.load(x_row + cols, mask=cmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(o_row + cols, (x * rstd * w).to(o_ptr.dtype.element_ty), mask=cmask)


def _rmsnorm_split_prepare(x: Any, weight: Any, out: Any, params: dict[str, int], eps: float
                           ) -> Callable[[], None]:
    """Two launches over a ``[rows, SPLIT_N]`` fp32 partials buffer (allocated once here)."""
    import torch

    rows, n = x.shape
    block_n, split = params["BLOCK_N"], params["SPLIT_N"]
    chunk = triton.cdiv(triton.cdiv(n, split), block_n) * block_n  # whole BLOCK_N steps: chunks never overlap
    partials = torch.empty((rows, split), device=x.device, dtype=torch.float32)
    grid = (rows, split)
    # STAGES: chunk loads the loop keeps in flight (Triton's software pipelining of tl.range)
    meta = dict(BLOCK_N=block_n, SPLIT_N=split, STAGES=params.get("num_stages", 1),
                num_warps=params.get("num_warps", 4))

    def run() -> None:
        _rmsnorm_partial[grid](x, partials, n, x.stride(0), chunk, **meta)
        _rmsnorm_apply[grid](x, weight, partials, out, rows, n, x.stride(0), out.stride(0), chunk, eps, **meta)
    return run


#: kernel name -> (jit function, single-pass?)
NORM_KERNELS: dict[str, tuple[Any, bool]] = {
    "rmsnorm_single": (_rmsnorm_single, True),
    "rmsnorm_looped": (_rmsnorm_looped, False),
    "layernorm_single": (_layernorm_single, True),
    "layernorm_looped": (_layernorm_looped, False),
    "softmax_single": (_softmax_single, True),
    "softmax_looped": (_softmax_looped, False),
}


def norm_prepare(kernel: str, x: Any, weight: Any, bias: Any, out: Any, params: dict[str, int], *,
                 eps: float) -> Callable[[], None]:
    """Bind a row-norm config to tensors ``x``/``out`` of shape ``[rows, N]``; returns a launcher.

    ``weight``/``bias`` may be None where the op has none (softmax; RMSNorm's bias).
    A single-pass ``BLOCK_N`` below N would silently drop columns, so it is refused.
    """
    rows, n = x.shape
    if x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError(f"{kernel}: rows must be contiguous (stride 1 along N)")
    if kernel == "rmsnorm_split":
        return _rmsnorm_split_prepare(x, weight, out, params, eps)
    fn, single = NORM_KERNELS[kernel]
    block_n = params["BLOCK_N"]
    if single and block_n < n:
        raise ValueError(f"{kernel}: BLOCK_N={block_n} < N={n}; the single-pass kernel holds the whole row "
                         f"(use BLOCK_N={triton.next_power_of_2(n)} or the looped variant)")
    rows_per = params.get("ROWS_PER_PROGRAM", 1) if single else 1
    grid = (triton.cdiv(rows, rows_per),)
    w = weight if weight is not None else x  # never read when absent (softmax)
    b = bias if bias is not None else w
    warps = params.get("num_warps", 4)

    def run() -> None:  # through traceable: a torch.library.triton_op (autoopt.nn.ops) launches it under compile
        traceable(fn)[grid](x, w, b, out, rows, n, x.stride(0), out.stride(0), eps,
                            BLOCK_N=block_n, ROWS=rows_per, num_warps=warps)
    return run
