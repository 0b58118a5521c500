"""Prefill GEMM ``C[M, N] = A[M, K] @ dequant(W)^T (+ bias)`` over a packed quantized weight.

Tiled like ``gemm.py`` (group-M ordering, fp32 accumulation, ragged rows wrapped and masked at the
store). Per format:

- W8A8 (``fp8``, ``fp8_block``): A is quantized to e4m3 first (``act_quant.py``, a second launch;
  buffers allocated in :func:`quant_gemm_prepare`), then ``tl.dot`` runs on e4m3 operands (wgmma on
  sm_90, mma on sm_89). ``fp8``: one accumulator over K, row scale x column scale in the epilogue.
  ``fp8_block``: each K-tile (``BLOCK_K`` divides 128) is its own dot, scaled by its token-group
  scale x 128-block scale before it is added (DeepSeek-V3's fine-grained scaling; vLLM's
  ``w8a8_block_fp8_matmul`` does the same), which also promotes the fp8 partial sums to fp32 every
  tile. Under the interpreter the e4m3 operands go through fp16 (exact), as in ``gemm.py``.
- weight-only (``int8``, ``int4``, ``fp8-wo``, ``fp8_block-wo``): the W tile is dequantized on chip
  into the dot's 16-bit type (the Marlin idea: W crosses DRAM packed, the tensor cores see bf16):
  int8/e4m3 codes convert exactly (e4m3 by bit tricks, so this runs on any GPU) and the
  per-channel scale waits for the epilogue; int4 codes become ``q - 8`` (``quant_gemv.int4_unpack16``:
  1.5 instructions a weight, no conversion) and each K-tile, within one group, adds ``s P`` (asymmetric:
  ``s P + z S``) with ``P`` the dot and ``S`` the tile's activation row sums.

int4 ``BLOCK_K`` is at most the group; ``fp8_block`` ``BLOCK_K`` divides 128 (the templates check both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import interpreter_active
from autoopt.backend.kernels.act_quant import act_quant_prepare
from autoopt.backend.kernels.gemm_tma import _tile_of
from autoopt.backend.kernels.quant_gemv import FMT_CODES, coded_tile_dot, int4_tile_dot, row_tiles, weight_views

__all__ = ["quant_gemm_prepare"]

#: the kernel's ACT constexpr per activation mode
ACT_CODES = {"none": 0, "per_token": 1, "per_token_group": 2}


@triton.jit
def _quant_gemm_kernel(a_ptr, as_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,  # type: ignore[no-untyped-def]
                       M, N, K, NG, stride_am, stride_asm, stride_wn, stride_sn, stride_cm, k_tiles,
                       FMT: tl.constexpr, G: tl.constexpr, ACT: tl.constexpr, HAS_Z: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_W: tl.constexpr,
                       EVEN_X: tl.constexpr, DOT_F16: tl.constexpr, ASM: tl.constexpr):
    # Group-M ordering (Triton matmul tutorial): GROUP_M row bands share the W tiles they load through L2;
    # gemm_tma's helper, as the epilogue kernels use it (the last band's tiles rotated)
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrapped rows/columns keep the loads unmasked; the store mask drops them.
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    TILE_B: tl.constexpr = BLOCK_K // 2 if FMT == 3 else BLOCK_K
    ROW_B = (NG * G) // 2 if FMT == 3 else K
    a_rows = a_ptr + offs_am[:, None] * stride_am
    w_rows = w_ptr + offs_wn[:, None] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, k_tiles):
        byte0 = kt * TILE_B
        pb = byte0 + tl.arange(0, TILE_B)
        if ACT != 0:  # e4m3 x e4m3 on the tensor cores
            b_ptrs = w_ptr + pb[:, None] + offs_wn[None, :] * stride_wn  # [BLOCK_K, BLOCK_N], K-major
            if EVEN_W:
                a = tl.load(a_rows + pb[None, :])
                b = tl.load(b_ptrs)
            else:
                a = tl.load(a_rows + pb[None, :], mask=(pb < K)[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=(pb < K)[:, None], other=0.0)
            if DOT_F16:  # e4m3 -> fp16 is exact; the interpreter has no fp8 dot
                a = a.to(tl.float16)
                b = b.to(tl.float16)
            if ACT == 2:
                kg = byte0 // G
                a_s = tl.load(as_ptr + offs_am * stride_asm + kg)
                w_s = tl.load(s_ptr + (offs_wn // G) * stride_sn + kg)
                acc += tl.dot(a, b) * (a_s[:, None] * w_s[None, :])
            else:
                acc = tl.dot(a, b, acc)
        else:
            if EVEN_W:
                wb = tl.load(w_rows + pb[None, :])
            else:
                wb = tl.load(w_rows + pb[None, :], mask=(pb < ROW_B)[None, :], other=0)
            if FMT == 3:  # one int4 group a tile: dot on q - 8, scale (and offset) per tile
                HB: tl.constexpr = G // 2
                grp = byte0 // HB
                k_lo = grp * G + pb % HB
                k_hi = k_lo + HB
                if EVEN_X:
                    a_lo = tl.load(a_rows + k_lo[None, :])
                    a_hi = tl.load(a_rows + k_hi[None, :])
                else:
                    a_lo = tl.load(a_rows + k_lo[None, :], mask=(k_lo < K)[None, :], other=0.0)
                    a_hi = tl.load(a_rows + k_hi[None, :], mask=(k_hi < K)[None, :], other=0.0)
                acc = int4_tile_dot(acc, a_lo, a_hi, wb, s_ptr, z_ptr, offs_wn, stride_sn, grp, HAS_Z, DOT_F16, ASM)
            else:
                if EVEN_X:
                    a = tl.load(a_rows + pb[None, :])
                else:
                    a = tl.load(a_rows + pb[None, :], mask=(pb < K)[None, :], other=0.0)
                acc = coded_tile_dot(acc, a, wb, s_ptr, offs_wn, stride_sn, byte0, FMT, G, DOT_F16)
    if FMT == 0 or FMT == 2:  # per-channel weight scale, and per-token activation scale (W8A8)
        acc = acc * tl.load(s_ptr + offs_wn).to(tl.float32)[None, :]
        if ACT == 1:
            acc = acc * tl.load(as_ptr + offs_am)[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_wn).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def quant_gemm_prepare(a: Any, qw: Any, out: Any, params: dict[str, int], *, bias: Any = None) -> Callable[[], None]:
    """Bind a config to tensors; returns a no-argument launcher (W8A8 activation buffers allocated here).

    ``a`` ``[M, K]`` (bf16/fp16, unit stride along K), ``qw`` a :class:`~autoopt.backend.quant.QuantizedWeight`
    of ``[N, K]``, ``out`` ``[M, N]`` (unit stride along N), ``bias`` ``[N]`` or None. A W8A8 format
    runs two launches: activation quantization, then the GEMM."""
    import torch

    m, k = a.shape
    n, f = qw.n, qw.fmt
    if k != qw.k:
        raise ValueError(f"A has K={k}, the weight K={qw.k}")
    if a.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("quant gemm reads A and writes C with unit stride along K and N")
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    g = f.group_size or 0
    if g and (bk > g or g % bk):
        raise ValueError(f"quant gemm takes a BLOCK_K dividing the {f.spec} group {g}, got {bk}")
    k_tiles, even_w, even_x = row_tiles(f.name, k, f.padded_k(k), bk, 1)
    act = ACT_CODES[f.activation]
    interp = interpreter_active()
    if act:
        w, s, z = qw.qweight, qw.scales, qw.scales
        a_q = torch.empty((m, k), device=a.device, dtype=torch.float8_e4m3fn)
        a_s = torch.empty((m,) if act == 1 else (m, triton.cdiv(k, g)), device=a.device, dtype=torch.float32)
        quant_a = act_quant_prepare(a, a_q, a_s, group=g if act == 2 else 0)
        a_in, stride_asm = a_q, a_s.stride(0)
        dot_f16 = interp or a.device.type != "cuda" or torch.cuda.get_device_capability(a.device) < (8, 9)
    else:
        w, s, z = weight_views(qw, fma=False)
        a_in, a_s, stride_asm = a, s, 0
        dot_f16 = interp or a.dtype == torch.float16
    ng = s.shape[1] if s.dim() == 2 else 1
    meta = dict(FMT=FMT_CODES[f.name], G=g, ACT=act, HAS_Z=qw.offsets is not None, HAS_BIAS=bias is not None,
                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=params.get("GROUP_M", 8), EVEN_W=even_w,
                EVEN_X=even_x, DOT_F16=dot_f16, ASM=not interp, num_warps=params.get("num_warps", 4),
                num_stages=params.get("num_stages", 3))
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    b = bias if bias is not None else s

    def gemm() -> None:
        _quant_gemm_kernel[grid](a_in, a_s, w, s, z, b, out, m, n, k, ng, a_in.stride(0), stride_asm, w.stride(0),
                                 s.stride(0), out.stride(0), k_tiles, **meta)
    if not act:
        return gemm

    def run() -> None:
        quant_a()
        gemm()
    return run
