"""Batched decode with the weight as the MMA's A operand: ``C^T[N, M] = dequant(W)[N, K] @ X^T``, M = 2..32.

``quant_gemv``'s dot path computes ``X @ W^T`` with X padded to the MMA's 16 rows: the decoded weight tile is the
dot's B operand, and at 8 tokens half of each MMA is padding. Here the roles swap (the "swap AB" of small-M GEMMs):
each program owns ``BLOCK_N`` weight rows (the MMA's M, 64 or 128) and the tokens, in groups of 8, are the dot's N
(``BLOCK_M`` 8, 16 or 32: one, two or four dots on each decoded tile). The packed tile is decoded in registers once
as in ``quant_gemv`` (int4: ``int4_unpack16``'s PTX, ``q - 8``, one group a K-tile scaled by its group's scale; fp8
/ int8: exact 16-bit codes, the per-channel scale in the epilogue), and the loop is staged
(``tl.range(num_stages=...)``). On an H200, Llama-3-8B's four linears, graph-replayed: at 8 tokens the grid's best
took 62.0 / 77.5 / 71.3 us (int4 / fp8 / int8, the four summed) where ``quant_gemv``'s best of rank()'s top 3 took
72.7 / 96.1 / 83.8 in the same run (``benchmarks/results/h200/gemv_swap_probe.json``); one dot of N = 16 lost to
quant_gemv on int4 and int8 there (gate_up 1.07-1.21x), two dots of 8 at 16 tokens took 71.6 / 86.2 / 75.8
(``h200/gemv_swap_probe_m16_tree.json``), and four at 32 int4 93.2 / int8 87.8 against quant_gemm's first configs'
182.0 / 165.4 in the same run (``h200/gemv_swap_probe_m32_tree.json``).

Split-K slices write an fp32 ``[SPLIT_K, M, N]`` workspace summed by ``gemm.py``'s reduce. The activations are bf16
or fp16; under the interpreter (whose bf16 ``tl.dot`` is wrong, triton 3.9) the dot runs in fp16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import interpreter_active
from autoopt.backend.kernels.gemm import split_k_output
from autoopt.backend.kernels.quant_gemv import FMT_CODES, e4m3_exact, int4_unpack16, weight_views
from autoopt.kernels.constraints import whole_k_tiles

__all__ = ["SWAP_FORMATS", "quant_gemv_swap_prepare", "swap_tiles"]

#: the formats the kernel serves (block-FP8's per-tile block scales are left to quant_gemv)
SWAP_FORMATS = ("fp8", "int8", "int4")


# The @triton.jit functions carry no annotations on purpose (Triton reads them as types); exempt from mypy.
@triton.jit
def _swap_tile_dot(acc, w, x, DOT_F16: tl.constexpr):  # type: ignore[no-untyped-def]
    """``acc`` plus the decoded weight tile ``w`` ``[BLOCK_N, K]`` times the tokens' slice ``x`` ``[8, K]``
    transposed (the MMA's N = 8)."""
    if DOT_F16:
        x = x.to(tl.float16)
    return tl.dot(w, tl.trans(x), acc)


@triton.jit
def _swap_int4_tokens(acc, w_lo, w_hi, s, z_ptr, offs_wn, stride_sn, grp, x_rows, k_lo,  # type: ignore[no-untyped-def]
                    t_ok, HB: tl.constexpr, HAS_Z: tl.constexpr, DOT_F16: tl.constexpr):
    """``acc`` plus one int4 K-tile (one quantization group: ``s`` its scales) against 8 tokens; asymmetric adds
    ``z`` times their activation sums over the tile."""
    x_lo = tl.load(x_rows + k_lo[None, :], mask=t_ok[:, None], other=0.0)
    x_hi = tl.load(x_rows + (k_lo + HB)[None, :], mask=t_ok[:, None], other=0.0)
    p = _swap_tile_dot(tl.zeros(acc.shape, dtype=tl.float32), w_lo, x_lo, DOT_F16)
    acc += s[:, None] * _swap_tile_dot(p, w_hi, x_hi, DOT_F16)
    if HAS_Z:  # w = (q - 8) s + z
        z = tl.load(z_ptr + offs_wn * stride_sn + grp).to(tl.float32)
        acc += z[:, None] * (tl.sum(x_lo.to(tl.float32), axis=1) + tl.sum(x_hi.to(tl.float32), axis=1))[None, :]
    return acc


@triton.jit
def _swap_kt(acc, w_lo, w_hi, s, z_ptr, offs_wn, stride_sn, byte0, pb, x_rows, t_ok,  # type: ignore[no-untyped-def]
             FMT: tl.constexpr, G: tl.constexpr, HAS_Z: tl.constexpr, DOT_F16: tl.constexpr):
    """One K-tile for one group of 8 tokens, on the tile decoded once for every group (int4: its low and high
    nibbles ``w_lo`` / ``w_hi``, scaled by ``s``; int8 / e4m3: ``w_lo``, the per-channel scale left to the
    epilogue)."""
    if FMT == 3:
        HB: tl.constexpr = G // 2
        grp = byte0 // HB
        acc = _swap_int4_tokens(acc, w_lo, w_hi, s, z_ptr, offs_wn, stride_sn, grp, x_rows, grp * G + pb % HB,
                                t_ok, HB, HAS_Z, DOT_F16)
    else:
        acc = _swap_tile_dot(acc, w_lo, tl.load(x_rows + pb[None, :], mask=t_ok[:, None], other=0.0), DOT_F16)
    return acc


@triton.jit
def _quant_gemv_swap_kernel(x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,  # type: ignore[no-untyped-def]
                            M, N, stride_xm, stride_wn, stride_sn, stride_cs, stride_cm, tiles_per_split,
                            FMT: tl.constexpr, G: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            STAGES: tl.constexpr, DOT_F16: tl.constexpr, ASM: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # wrapped rows keep the weight loads unmasked; the store mask drops them
    offs_wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    # tokens in groups of 8 (BLOCK_M 8, 16 or 32): each one dot of N = 8 on the same decoded tile
    offs_t = tl.arange(0, 8)
    TILE_B: tl.constexpr = BLOCK_K // 2 if FMT == 3 else BLOCK_K
    w_rows = w_ptr + offs_wn[:, None] * stride_wn
    x_rows = x_ptr + offs_t[:, None] * stride_xm
    acc0 = tl.zeros((BLOCK_N, 8), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, 8), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, 8), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, 8), dtype=tl.float32)
    tile0 = pid_k * tiles_per_split
    for kt in tl.range(0, tiles_per_split, num_stages=STAGES):
        byte0 = (tile0 + kt) * TILE_B
        pb = byte0 + tl.arange(0, TILE_B)
        b = tl.load(w_rows + pb[None, :], eviction_policy="evict_first")
        if FMT == 3:  # one group a tile: a byte holds k (low nibble) and k + G/2 (high) of its group
            w_lo, w_hi = int4_unpack16(b, DOT_F16, ASM)
            s = tl.load(s_ptr + offs_wn * stride_sn + byte0 // (G // 2)).to(tl.float32)
        else:  # int8 / e4m3 codes, exact in the dot's 16-bit type; the per-channel scale waits for the epilogue
            w_lo = e4m3_exact(b, FMT == 2)
            w_lo = w_lo.to(tl.float16) if DOT_F16 else w_lo.to(tl.bfloat16)
            w_hi = w_lo
            s = tl.zeros((BLOCK_N,), dtype=tl.float32)
        acc0 = _swap_kt(acc0, w_lo, w_hi, s, z_ptr, offs_wn, stride_sn, byte0, pb, x_rows, offs_t < M, FMT, G, HAS_Z,
                        DOT_F16)
        if BLOCK_M >= 16:
            acc1 = _swap_kt(acc1, w_lo, w_hi, s, z_ptr, offs_wn, stride_sn, byte0, pb, x_rows + 8 * stride_xm,
                            offs_t + 8 < M, FMT, G, HAS_Z, DOT_F16)
        if BLOCK_M == 32:
            acc2 = _swap_kt(acc2, w_lo, w_hi, s, z_ptr, offs_wn, stride_sn, byte0, pb, x_rows + 16 * stride_xm,
                            offs_t + 16 < M, FMT, G, HAS_Z, DOT_F16)
            acc3 = _swap_kt(acc3, w_lo, w_hi, s, z_ptr, offs_wn, stride_sn, byte0, pb, x_rows + 24 * stride_xm,
                            offs_t + 24 < M, FMT, G, HAS_Z, DOT_F16)
    c = c_ptr + pid_k * stride_cs
    _swap_store(acc0, offs_t, M, offs_n, offs_wn, s_ptr, bias_ptr, c, N, stride_cm, pid_k, FMT, HAS_BIAS)
    if BLOCK_M >= 16:
        _swap_store(acc1, offs_t + 8, M, offs_n, offs_wn, s_ptr, bias_ptr, c, N, stride_cm, pid_k, FMT, HAS_BIAS)
    if BLOCK_M == 32:
        _swap_store(acc2, offs_t + 16, M, offs_n, offs_wn, s_ptr, bias_ptr, c, N, stride_cm, pid_k, FMT, HAS_BIAS)
        _swap_store(acc3, offs_t + 24, M, offs_n, offs_wn, s_ptr, bias_ptr, c, N, stride_cm, pid_k, FMT, HAS_BIAS)


@triton.jit
def _swap_store(acc, offs_t, M, offs_n, offs_wn, s_ptr, bias_ptr, c_ptr, N, stride_cm,  # type: ignore[no-untyped-def]
                pid_k, FMT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The epilogue of one group of 8 tokens: the per-channel scale (fp8, int8), the bias (first K-slice only), the
    transposed store."""
    if FMT != 3:
        acc = acc * tl.load(s_ptr + offs_wn).to(tl.float32)[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_wn).to(tl.float32)[:, None] * (pid_k == 0).to(tl.float32)
    c_ptrs = c_ptr + offs_t[None, :] * stride_cm + offs_n[:, None]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_t < M)[None, :] & (offs_n[:, None] < N))


def swap_tiles(fmt_name: str, kp: int, bk: int, split_k: int) -> int | None:
    """K-tiles a split walks, or None when the stored row (``kp`` weights, int4 padded to its group) is not whole
    tiles split evenly: the kernel's loads are unmasked along K."""
    row, tile = (kp // 2, bk // 2) if fmt_name == "int4" else (kp, bk)
    return whole_k_tiles(row, tile, split_k)


def quant_gemv_swap_prepare(x: Any, qw: Any, out: Any, params: dict[str, int], *, bias: Any = None
                            ) -> Callable[[], None]:
    """Bind a config to ``x`` ``[M, K]`` (bf16/fp16, unit stride along K), a
    :class:`~autoopt.backend.quant.QuantizedWeight` of ``[N, K]`` and ``out`` ``[M, N]`` (unit stride along N);
    returns a no-argument launcher (the split-K workspace allocated here). ``ValueError`` on a config or operand
    the kernel cannot take (the template rejects such configs before they get here)."""
    import torch

    m, k = x.shape
    f = qw.fmt
    bm, bn, bk, split_k = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params.get("SPLIT_K", 1)
    if bm not in (8, 16, 32):
        raise ValueError(f"quant gemv swap takes BLOCK_M 8, 16 or 32 (tokens in eighths), got {bm}")
    if f.name not in SWAP_FORMATS:
        raise ValueError(f"quant gemv swap serves {', '.join(SWAP_FORMATS)}, not {f.spec}")
    if k != qw.k or not 1 <= m <= bm:
        raise ValueError(f"x is [{m}, {k}]: needs K={qw.k} and 1..BLOCK_M={bm} rows")
    if x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("quant gemv swap reads X and writes C with unit stride along K and N")
    g = f.group_size or 0
    if g and bk > g:
        raise ValueError(f"quant gemv swap takes BLOCK_K <= the group {g}, got {bk}")
    tiles_per_split = swap_tiles(f.name, f.padded_k(k), bk, split_k)
    if tiles_per_split is None:
        raise ValueError(f"K={k} is not whole BLOCK_K={bk} tiles over SPLIT_K={split_k}")
    if f.name == "int4" and f.padded_k(k) != k:
        raise ValueError(f"int4 rows padded past K={k} are not served (unmasked activation loads)")
    w, s, z = weight_views(qw, fma=False)
    n = qw.n
    dot_f16 = x.dtype == torch.float16 or interpreter_active()
    meta = dict(FMT=FMT_CODES[f.name], G=g, HAS_Z=qw.offsets is not None, HAS_BIAS=bias is not None, BLOCK_M=bm,
                BLOCK_N=bn, BLOCK_K=bk, STAGES=params.get("num_stages", 3), DOT_F16=dot_f16,
                ASM=not interpreter_active(), num_warps=params.get("num_warps", 4),
                num_stages=params.get("num_stages", 3))
    grid = (triton.cdiv(n, bn), split_k)
    b = bias if bias is not None else s

    def launch(c: Any, stride_cs: int, stride_cm: int) -> None:
        _quant_gemv_swap_kernel[grid](x, w, s, z, b, c, m, n, x.stride(0), w.stride(0), s.stride(0), stride_cs,
                                      stride_cm, tiles_per_split, **meta)
    return split_k_output(out, split_k, launch, "quant gemv swap")
