"""Prefill over a packed weight as two steps: dequantize W into a 16-bit scratch ``[N, K]``, then cuBLAS.

At large M a GEMM over a quantized weight is compute-bound, and a bf16 cuBLAS GEMM runs near the
tensor cores' peak while a Triton dequantize-in-the-K-loop GEMM pays CUDA-core work per weight per
row-block (``quant_gemm.py``). Dequantizing once costs one pass over W: the packed bytes read
(0.5 / 1 byte a weight) and 2 bytes written, ~100 us for Llama-3-8B's gate_up (28672 x 4096) at
3 TB/s, against ~1.1 ms of bf16 GEMM at M = 2048. So for weight-only formats (int4, int8,
fp8-wo, fp8_block-wo) at large M this path runs at ~0.9x bf16 (template ``quant-dequant-cublas``
prices it; ``rank()`` picks it where it is predicted faster than ``quant_gemm``). W8A8 formats
quantize A, so their product differs from a bf16 GEMM on dequantized W: not served here.

The dequantization kernel (one program per ``[BLOCK_N, BLOCK_K]`` tile) writes exactly
:func:`autoopt.backend.quant.dequantize`'s values rounded once to the activations' dtype:

- int4 (layout ``int4_group_halves``): a tile is whole groups or lies in one; a byte's low nibble
  goes to K ``t*g + j``, its high nibble to ``t*g + g/2 + j``. The code becomes a float with no
  conversion: ``(b & 0xF) | 0x4B000000`` is fp32 ``2^23 + q`` (one LOP3), minus ``2^23 + 8`` is
  ``q - 8`` exactly; times the group's scale, plus the offset. Per weight: 1-2 INT32 ops, 2-3 FP32.
- int8: ``q`` converts (I2F: 16 a clock per SM, still > 4x the rate the write bandwidth allows).
- e4m3: ``e4m3_bits_scaled`` (two INT32 ops) times ``2^120 * scale`` (per row, or per 128-block).

The GEMM is ``torch.addmm``/``torch.mm`` into ``out`` (the scratch is allocated once per prepare,
outside any timed region). Under ``torch.compile`` the quantized linear traces as :func:`dequant_traced` and a
GEMM instead, both launched by the compiled graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import traceable
from autoopt.backend.kernels.quant_gemv import FMT_CODES, e4m3_bits_scaled

__all__ = ["dequant_prepare", "dequant_traced", "quant_dequant_cublas_prepare"]


@triton.jit
def _int4_half(b, s, z, SHIFT: tl.constexpr, HAS_Z: tl.constexpr):  # type: ignore[no-untyped-def]
    """``(q - 8) * s (+ z)`` of the nibble at bit ``SHIFT`` of int32 bytes ``b``: ``2^23 + q`` by one LOP3."""
    f = (((b >> SHIFT) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0  # 2^23 + 8
    out = f * s
    if HAS_Z:
        out += z
    return out


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, z_ptr, o_ptr, N, K, NG, stride_wn, stride_sn, stride_on,  # type: ignore[no-untyped-def]
                    FMT: tl.constexpr, G: tl.constexpr, HAS_Z: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    if FMT == 3:
        # BLOCK_K weights: GT whole groups, or one slice of one group (GB bytes of each half)
        GB: tl.constexpr = (BLOCK_K if BLOCK_K < G else G) // 2
        GT: tl.constexpr = BLOCK_K // 2 // GB
        HB: tl.constexpr = G // 2
        s0 = pid_k * (BLOCK_K // 2) + tl.arange(0, GT) * GB  # [GT] each slice's first byte
        pb = s0[:, None] + tl.arange(0, GB)[None, :]  # [GT, GB]
        grp = pb // HB
        k_lo = grp * G + pb % HB
        k_hi = k_lo + HB
        ok = n_ok[:, None, None] & (grp < NG)[None, :, :]
        b = tl.load(w_ptr + offs_n[:, None, None] * stride_wn + pb[None, :, :], mask=ok, other=0).to(tl.int32)
        # one scale per (row, slice), loaded as [BLOCK_N, GT] and broadcast over the slice's bytes. Loaded per
        # byte, the PTX kept one 2-byte load per byte a thread (32 ld.global.b16 beside 2 v4 loads of codes, now 2):
        # on the H200 the [16, 256] x 2-warp tile went from 49-63 % of the copy rate to 71-79 % on Llama-3-8B's
        # four linears, 213 -> 167 us a layer (benchmarks/results/h200/dequant_probe.json, same process)
        g_t = s0 // HB
        s_ok = n_ok[:, None] & (g_t < NG)[None, :]
        s = tl.load(s_ptr + offs_n[:, None] * stride_sn + g_t[None, :], mask=s_ok, other=0.0).to(tl.float32)
        s = s[:, :, None]
        z = s
        if HAS_Z:
            z = tl.load(z_ptr + offs_n[:, None] * stride_sn + g_t[None, :], mask=s_ok, other=0.0).to(tl.float32)
            z = z[:, :, None]
        o_rows = o_ptr + offs_n[:, None, None] * stride_on
        lo = _int4_half(b, s, z, 0, HAS_Z)
        hi = _int4_half(b, s, z, 4, HAS_Z)
        tl.store(o_rows + k_lo[None, :, :], lo.to(o_ptr.dtype.element_ty), mask=ok & (k_lo < K)[None, :, :])
        tl.store(o_rows + k_hi[None, :, :], hi.to(o_ptr.dtype.element_ty), mask=ok & (k_hi < K)[None, :, :])
    else:
        offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        ok = n_ok[:, None] & (offs_k < K)[None, :]
        b = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=ok, other=0)
        if FMT == 2:
            s = tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            w = b.to(tl.float32) * s[:, None]
        elif FMT == 0:
            s = tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32) * 1.329227995784916e36  # 2^120
            w = e4m3_bits_scaled(b.to(tl.int32)) * s[:, None]
        else:  # fp8_block: BLOCK_K divides 128 or is a multiple of it; one scale per (row block, K block)
            s = tl.load(s_ptr + (offs_n // G)[:, None] * stride_sn + (offs_k // G)[None, :], mask=ok, other=0.0)
            w = e4m3_bits_scaled(b.to(tl.int32)) * (s * 1.329227995784916e36)
        tl.store(o_ptr + offs_n[:, None] * stride_on + offs_k[None, :], w.to(o_ptr.dtype.element_ty), mask=ok)


def _launch(qw: Any, out: Any, params: dict[str, int]) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """(grid, arguments, meta-parameters) of the dequantization kernel writing ``qw`` into ``out``."""
    import torch

    f, n, k = qw.fmt, qw.n, qw.k
    if tuple(out.shape) != (n, k) or out.stride(1) != 1:
        raise ValueError(f"dequant writes a [{n}, {k}] output of unit stride along K, got {tuple(out.shape)}")
    bn, bk = params["BLOCK_N"], params["BLOCK_K"]
    g = f.group_size or 0
    if g and not (bk % g == 0 or g % bk == 0):
        raise ValueError(f"dequant BLOCK_K={bk} must be a multiple or a divisor of the {f.spec} group {g}")
    w = qw.qweight.view(torch.int8) if f.name in ("fp8", "fp8_block") else qw.qweight
    s = qw.scales
    z = qw.offsets if qw.offsets is not None else s
    ng = s.shape[1] if s.dim() == 2 else 1
    grid = (triton.cdiv(n, bn), triton.cdiv(f.padded_k(k), bk))
    meta = dict(FMT=FMT_CODES[f.name], G=g, HAS_Z=qw.offsets is not None, BLOCK_N=bn, BLOCK_K=bk,
                num_warps=params.get("num_warps", 4))
    return grid, (w, s, z, out, n, k, ng, w.stride(0), s.stride(0), out.stride(0)), meta


def dequant_prepare(qw: Any, out: Any, params: dict[str, int]) -> Callable[[], None]:
    """A launcher writing ``dequantize(qw)`` rounded to ``out``'s dtype into ``out`` ``[N, K]`` (unit
    stride along K). ``params``: ``BLOCK_N``, ``BLOCK_K`` (int4: a multiple or a divisor of the
    group), ``num_warps``."""
    grid, args, meta = _launch(qw, out, params)

    def run() -> None:
        _dequant_kernel[grid](*args, **meta)
    return run


def dequant_traced(qw: Any, dtype: Any, params: dict[str, int]) -> Any:
    """``dequantize(qw)`` rounded to ``dtype``, a new ``[N, K]`` tensor, launched through
    :func:`~autoopt.backend.kernels.traceable`: under torch.compile the graph holds the kernel and launches it
    itself (the prefill's dequantize + cuBLAS path without a custom op's Python: ``autoopt.nn.ops``)."""
    import torch

    out = torch.empty((qw.n, qw.k), device=qw.qweight.device, dtype=dtype)
    grid, args, meta = _launch(qw, out, params)
    traceable(_dequant_kernel)[grid](*args, **meta)
    return out


def quant_dequant_cublas_prepare(a: Any, qw: Any, out: Any, params: dict[str, int], *,
                                 bias: Any = None) -> Callable[[], None]:
    """Bind a config to tensors: a launcher that dequantizes ``qw`` into a scratch ``[N, K]`` of ``a``'s
    dtype (allocated here) and runs ``out = a @ W^T (+ bias)`` on cuBLAS. Weight-only formats only."""
    import torch

    k = a.shape[1]
    if k != qw.k:
        raise ValueError(f"A has K={k}, the weight K={qw.k}")
    if qw.fmt.quantizes_activations:
        raise ValueError(f"{qw.fmt.spec} quantizes activations; the dequantize + cuBLAS path is weight-only")
    if not out.is_contiguous() or out.dtype != a.dtype:
        raise ValueError("dequantize + cuBLAS writes a contiguous output of the activations' dtype")
    scratch = torch.empty((qw.n, k), device=a.device, dtype=a.dtype)
    dequant = dequant_prepare(qw, scratch, params)
    wt = scratch.t()

    def run() -> None:
        dequant()
        if bias is None:
            torch.mm(a, wt, out=out)
        else:
            torch.addmm(bias.to(a.dtype), a, wt, out=out)
    return run
