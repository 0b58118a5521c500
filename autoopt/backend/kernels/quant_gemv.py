"""Decode GEMV ``C[M, N] = X[M, K] @ dequant(W)^T (+ bias)`` over a packed quantized weight, M = 1..16.

The kernel exists to stream the packed weight once (fp8/int8: 1 byte, int4: half a byte per
weight, plus scales) and dequantize it in registers. Each program owns ``BLOCK_N`` rows of W and
one K-slice (``SPLIT_K`` slices through the same fp32 workspace + reduce as ``gemm.py``), loads
``[BLOCK_N, BLOCK_K]`` weights a step as contiguous row runs, and reuses them for all M rows.

Dequantization costs ALU, and at M = 1 it would bind before DRAM on an H100 if every weight paid an
int->float conversion (16 a clock per SM: CUDA C++ Programming Guide, arithmetic instruction
throughput), so codes become floats by bit tricks, two or three integer ops and no conversion:

- int4 (bf16 activations): four packed bytes decode at once into bf16 pairs ``q - 8`` (PRMT, shifts, one
  LOP3 per pair onto a magic exponent, a paired subtraction) and multiply their activations in paired bf16
  FMAs (:func:`int4_pair_dot`, four fp32 out); symmetric int4 on unmasked tiles reads the weight as 32-bit
  words and chains a word's eight products into one bf16 pair, widened and scaled once (:func:`int4_word_dot`:
  3.05 SASS instructions a weight against 3.56, 0.85-0.91x the time over the H200's graph-timed grid); fp16
  activations and the interpreter take ``q - 8 = 16 (1 + q/16) - 24``,
  the code's 4 bits at the top of an fp32 mantissa with exponent 0 (:func:`int4_as_float`), exactly.
- int8: ``f = 1 + (q + 128)/256`` the same way; ``sum w*x = s (256 P - 384 S)`` per row, ``S = sum x``.
- e4m3: sign and the 7 exponent+mantissa bits placed at fp32's bits 31 and 26..20 make exactly
  ``w * 2^-120`` (e4m3 subnormals land on fp32 subnormals); the scale is multiplied by 2^120 at the end.

``BLOCK_M == 1``: FMAs into fp32. Per-row formats (fp8, int8) keep a ``[BLOCK_N, BLOCK_K]`` accumulator and
scale at the end; grouped ones (int4, fp8_block) a ``[BLOCK_N, groups, group]`` one, each tile's products
times their group's scale added elementwise (asymmetric int4 adds ``z`` times the group's activation sum),
and everything summed once after the loop. The grouped loop runs as ``tl.range(num_stages=...)``, so its
tiles come through cp.async stages (a plain ``range`` left them register-fed, one tile in flight: no LDGSTS
in the sm_90 SASS); the per-row loop stays register-fed: staged, fp8 ran 3-9 % slower
(``benchmarks/results/h100/quant_kernels_fma_pipelined.json``). On the H100 the paired decode with the
elementwise accumulation took int4's best configs from 14.3 / 11.8 / 40.8 / 28.8 to 13.0 / 11.4 / 35.2 /
27.7 us (Llama-3-8B qkv / o / gate_up / down at M = 1, same run: ``int4_gemv_ab.json``).

Fusions for a decode layer (M = 1, every format, ``quant_gemv_prepare(norm_weight=, gated=, residual=)``): RMSNorm
(``1/rms`` factors out of ``W (x g / rms)``: each program sums the squares of x's whole row, L2-resident, in a first
pass and scales its outputs by it; ``x g`` rounds to x's type as the norm's output would), SwiGLU in the epilogue (a
program holds the gate rows and the up rows of its outputs) and the residual add. On a graphed 32-layer Llama-3-8B
decode chain on the H200 (five launches a layer against twelve) they took the step from 2.558 to 2.246 ms, and 2.570
to 2.267 in a second run (``benchmarks/probes/fused_chain_probe.py``, ``h200/fused_chain_int4*.json``; each fused
GEMV within 2.4-4.0e-3 of its separate ops in float64), fp8 3.155 to 2.782. ``optimize(ops=[..., "decode_layer"])``
runs them in a model (:mod:`autoopt.nn.decode_layer`), where they measured slower than the compiled default (2.859
against 2.691 ms a step, ``h200/quant_trace_decode_layer_sk1.json``; 2.869 against 2.709 again,
``h200/step_variants_decode_layer_loads.json``): Inductor already fuses the add + norm there into one ~1 us kernel,
while each fused GEMV costs ~3 us more than the plain one (its GEMVs +432 us a step over 128 launches). Summing the
squares from the x tiles the main loop loads, instead of the first pass, measured slower still (2.940 ms, same file,
where its variant is named ``decode_layer``; the code is in git at 206150d).

``BLOCK_M > 1`` (and ``BLOCK_M = 16`` at M = 1 for symmetric int4): ``tl.dot`` with M padded to 16 (the MMA
minimum; padded rows are masked loads); int4 codes become ``q - 8`` in the dot's 16-bit type by a few lines of
PTX (:func:`int4_unpack16`), so a tile's dot is scaled by its group's scale alone, fp8/int8 codes convert
exactly (e4m3 by the bit trick, no Triton e4m3 type, so any GPU; e4m3 and |q| <= 127 fit bf16 and fp16), and a
tile spans at most one group. The interpreter's bf16 ``tl.dot`` is wrong (triton 3.9), so there (and for fp16
activations) the dot runs in fp16.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import interpreter_active
from autoopt.backend.kernels.gemm import split_k_output

__all__ = ["FMT_CODES", "coded_tile_dot", "e4m3_bits_scaled", "e4m3_exact", "fusion_problem", "int4_as_float",
           "int4_pair_dot", "int4_tile_dot", "int4_unpack16", "int4_word_dot", "quant_gemv_prepare", "row_tiles",
           "weight_views"]

#: the kernels' FMT constexpr per format name
FMT_CODES = {"fp8": 0, "fp8_block": 1, "int8": 2, "int4": 3}
#: 2^120: e4m3 bits at fp32 bits 26..20 read as w * 2^-120
_E4M3_UNBIAS = 2.0 ** 120
#: fp32 1.0's bits, passed to the kernel as an argument (see ``int4_as_float``)
_ONE_BITS = 0x3F800000


@triton.jit
def e4m3_bits_scaled(v):  # type: ignore[no-untyped-def]
    """fp32 ``w * 2^-120`` of e4m3 codes ``v`` (sign-extended int32 of the byte): sign to bit 31,
    exponent and mantissa to bits 26..20 (``(v << 20) & 0x87F00000``)."""
    return ((v << 20) & -2014314496).to(tl.float32, bitcast=True)


@triton.jit
def int4_as_float(b, SHIFT: tl.constexpr, one):  # type: ignore[no-untyped-def]
    """fp32 ``1 + q/16`` of the nibble of ``b`` (int32 of the byte) at bit ``SHIFT`` (0: low, 4: high).
    ``one`` is fp32 1.0's bits (0x3F800000) given as a kernel argument: with both the mask and 1.0 as
    literals ptxas emits an AND and an OR (a LOP3 takes one immediate: read in the sm_90 SASS, two LOP3 a
    nibble); with 1.0 in a register it is one LOP3 (``(x & mask) | one``)."""
    return (((b << (19 - SHIFT)) & 0x780000) | one).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_exact(b, INT8: tl.constexpr):  # type: ignore[no-untyped-def]
    """The codes ``b`` (int8 view) as exact fp32 values: int8 as they are, e4m3 by the bit trick times
    2^120 (no Triton e4m3 type: it needs sm_89+, and this path serves fp8 weights on any GPU); the
    caller narrows to the dot's 16-bit type, exactly (e4m3 has 4 significant bits, |q| <= 127)."""
    if INT8:
        return b.to(tl.float32)
    return e4m3_bits_scaled(b.to(tl.int32)) * 1.329227995784916e36


#: int4 codes ``q`` as 16-bit ``q - 8`` (exact in bf16 and fp16), four packed bytes ``[b3 b2 b1 b0]`` a
#: 32-bit register: one PRMT to ``[b3 b1 b2 b0]``, three shifts, four LOP3 (``(t & 0x000F000F) | MAGIC``
#: makes a pair ``MAGIC + q``: bf16 0x4300 = 128, fp16 0x6400 = 1024, where the code lands on the unit
#: bit) and four paired subtractions of ``MAGIC + 8`` (one instruction for two values): 1.5 instructions a
#: weight. Triton's own ops for the same decode (extract, shift, and, or, convert, pack per value) took ~4,
#: and the ``MAGIC + q`` form without the subtraction needs the activations' row sums every tile.
_UNPACK_ASM = """
{
.reg .b32 t, u, o, n;
mov.b32 o, ONE;
mov.b32 n, NEG;
prmt.b32 t, $4, $4, 0x3120;
lop3.b32 u, t, 0x000F000F, MAGIC, 0xea;
fma.rn.TYPE $0, u, o, n;
shr.u32 u, t, 8;
lop3.b32 u, u, 0x000F000F, MAGIC, 0xea;
fma.rn.TYPE $1, u, o, n;
shr.u32 u, t, 4;
lop3.b32 u, u, 0x000F000F, MAGIC, 0xea;
fma.rn.TYPE $2, u, o, n;
shr.u32 u, t, 12;
lop3.b32 u, u, 0x000F000F, MAGIC, 0xea;
fma.rn.TYPE $3, u, o, n;
}
"""


def _one_line(asm: str) -> str:
    """PTX on one line (statements end in ';'): inductor copies a traced kernel's globals into a module it
    writes as a string, where the escaped newlines of a multi-line constant broke the string literal (H100,
    torch 2.11: "unterminated string literal" compiling the fused-MoE triton_op)."""
    return " ".join(asm.split())


def _unpack_asm(type_: str, magic: int, one: int, neg: int) -> str:
    """The decode for one 16-bit type: its magic pair, 1.0 pair and -(magic + 8) pair (bit patterns)."""
    return _one_line(_UNPACK_ASM.replace("TYPE", type_).replace("MAGIC", f"0x{magic:08X}")
                     .replace("ONE", f"0x{one:08X}").replace("NEG", f"0x{neg:08X}"))


# bf16: 0x4300 = 128, 0x3F80 = 1.0, 0xC308 = -136; fp16: 0x6400 = 1024, 0x3C00 = 1.0, 0xE408 = -1032
_UNPACK_BF16 = tl.constexpr(_unpack_asm("bf16x2", 0x43004300, 0x3F803F80, 0xC308C308))
_UNPACK_F16 = tl.constexpr(_unpack_asm("f16x2", 0x64006400, 0x3C003C00, 0xE408E408))


@triton.jit
def int4_unpack16(wb, F16: tl.constexpr, ASM: tl.constexpr):  # type: ignore[no-untyped-def]
    """(low nibbles, high nibbles) of the packed bytes ``wb`` as 16-bit ``q - 8`` (fp16 if ``F16`` else bf16).
    ``ASM``: the PTX above (4 bytes a call); else Triton ops (the interpreter runs no PTX)."""
    if ASM:
        if F16:
            lo, hi = tl.inline_asm_elementwise(_UNPACK_F16, "=r,=r,=r,=r,r", [wb],
                                               dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
        else:
            lo, hi = tl.inline_asm_elementwise(_UNPACK_BF16, "=r,=r,=r,=r,r", [wb],
                                               dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        b16 = wb.to(tl.int16)
        lo = (b16 & 0xF) - 8
        hi = ((b16 >> 4) & 0xF) - 8
        if F16:
            lo = lo.to(tl.float16)
            hi = hi.to(tl.float16)
        else:
            lo = lo.to(tl.bfloat16)
            hi = hi.to(tl.bfloat16)
    return lo, hi


#: the eight codes of the 32-bit register WORD as four bf16 pairs ``q - 8`` in w0..w3 (w0: bytes 0 and 1's low
#: nibbles, w1: bytes 2 and 3's, w2 and w3 their high nibbles), as ``_UNPACK_ASM`` decodes them; o, n and z hold
#: the pairs 1.0, -136 and -0.0 for the products that follow
_DECODE_BF16_PAIRS = """
mov.b32 o, 0x3F803F80;
mov.b32 n, 0xC308C308;
mov.b32 z, 0x80008000;
prmt.b32 t, WORD, WORD, 0x3120;
lop3.b32 u, t, 0x000F000F, 0x43004300, 0xea;
fma.rn.bf16x2 w0, u, o, n;
shr.u32 u, t, 8;
lop3.b32 u, u, 0x000F000F, 0x43004300, 0xea;
fma.rn.bf16x2 w1, u, o, n;
shr.u32 u, t, 4;
lop3.b32 u, u, 0x000F000F, 0x43004300, 0xea;
fma.rn.bf16x2 w2, u, o, n;
shr.u32 u, t, 12;
lop3.b32 u, u, 0x000F000F, 0x43004300, 0xea;
fma.rn.bf16x2 w3, u, o, n;
"""


#: ``(q_lo - 8) x_lo + (q_hi - 8) x_hi`` of four packed bytes and their bf16 activations (two registers of
#: bf16 pairs each), as four fp32: the codes decode as in ``_UNPACK_ASM`` and multiply in paired bf16
#: FMAs, 20 instructions for 8 weights (2.5 a weight, 1.5 of them INT), against ~5 for the fp32 trick
#: (``int4_as_float``: extract, shift, LOP3, FFMA a nibble). Each byte's two products round to bf16 (8
#: bits) in two FMAs, ~2^-9 relative each: on the H100 the kernel's error against the dequantized reference
#: went from 1.7e-3 (the bf16 output's rounding alone) to 2.5-2.7e-3, inside the 8e-3 bound.
_PAIR_DOT_BF16 = tl.constexpr(_one_line(
    "{ .reg .b32 t, u, o, n, z, w0, w1, w2, w3, s0, s1;" + _DECODE_BF16_PAIRS.replace("WORD", "$4") + """
fma.rn.bf16x2 s0, w0, $5, z;
fma.rn.bf16x2 s0, w2, $7, s0;
fma.rn.bf16x2 s1, w1, $6, z;
fma.rn.bf16x2 s1, w3, $8, s1;
shl.b32 $0, s0, 16;
and.b32 $1, s0, 0xFFFF0000;
shl.b32 $2, s1, 16;
and.b32 $3, s1, 0xFFFF0000;
}
"""))


@triton.jit
def int4_pair_dot(b, x_lo, x_hi, one, PAIRED: tl.constexpr):  # type: ignore[no-untyped-def]
    """fp32 ``(q_lo - 8) x_lo + (q_hi - 8) x_hi`` per packed byte of ``b``: by the paired-bf16 PTX above when
    ``PAIRED`` (bf16 activations on a GPU), else exactly in fp32 (``16 (1 + q/16) - 24 = q - 8``; fp16
    activations, whose kernel check allows 1e-3, and the interpreter, which runs no PTX)."""
    if PAIRED:
        out = tl.inline_asm_elementwise(_PAIR_DOT_BF16, "=r,=r,=r,=r,r,r,r,r,r", [b, x_lo, x_hi],
                                        dtype=tl.float32, is_pure=True, pack=4)
    else:
        v = b.to(tl.int32)
        w_lo = int4_as_float(v, 0, one) * 16.0 - 24.0
        w_hi = int4_as_float(v, 4, one) * 16.0 - 24.0
        out = w_lo * x_lo.to(tl.float32) + w_hi * x_hi.to(tl.float32)
    return out


#: ``sum (q_lo - 8) x_lo + (q_hi - 8) x_hi`` over the four packed bytes of one 32-bit word, as one fp32: the
#: decode and the paired products of ``_PAIR_DOT_BF16`` with all four bytes' products chained into one bf16
#: pair (each lane sums two bytes' four products), whose lanes widen and add once. Against the per-byte form
#: (four fp32 out, each then scaled and added: 24 instructions a word), 20 a word: one scale FFMA and one
#: widening for four bytes. ``$2 $3`` / ``$4 $5`` are the word's activations, bf16 pairs (low and high nibbles').
_WORD_SUM = """
fma.rn.bf16x2 a, w0, $2, z;
fma.rn.bf16x2 a, w2, $4, a;
fma.rn.bf16x2 a, w1, $3, a;
fma.rn.bf16x2 a, w3, $5, a;
shl.b32 u, a, 16;
and.b32 t, a, 0xFFFF0000;
add.f32 $0, u, t;
}
"""
_WORD_DOT_BF16 = tl.constexpr(_one_line("{ .reg .b32 t, u, o, n, z, w0, w1, w2, w3, a;"
                                        + _DECODE_BF16_PAIRS.replace("WORD", "$1") + _WORD_SUM))


@triton.jit
def int4_word_dot(w, x_lo, x_hi):  # type: ignore[no-untyped-def]
    """fp32 ``sum (q - 8) x`` over the 8 codes of each packed int32 word of ``w`` against its 4 + 4 activations
    (``x_lo``/``x_hi``: int64 words of four bf16, handed over as their 32-bit halves, bf16 pairs), by the PTX
    above (GPU, bf16 activations only)."""
    lo0 = x_lo.to(tl.int32)
    lo1 = (x_lo >> 32).to(tl.int32)
    hi0 = x_hi.to(tl.int32)
    hi1 = (x_hi >> 32).to(tl.int32)
    return tl.inline_asm_elementwise(_WORD_DOT_BF16, "=r,r,r,r,r,r", [w, lo0, lo1, hi0, hi1], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def int4_tile_dot(acc, x_lo, x_hi, wb, s_ptr, z_ptr, offs_wn, stride_sn, grp,  # type: ignore[no-untyped-def]
                  HAS_Z: tl.constexpr, DOT_F16: tl.constexpr, ASM: tl.constexpr):
    """``acc`` plus one K-tile of int4 codes ``wb`` (bytes ``[BLOCK_N, BLOCK_K/2]``, one group ``grp``) against
    the activations of its low and high halves: dots on ``q - 8``, scaled by the group's ``s``; asymmetric
    (``w = (q - 8) s + z``) adds ``z S``, ``S`` the row sums of X."""
    if DOT_F16:
        x_lo = x_lo.to(tl.float16)
        x_hi = x_hi.to(tl.float16)
    w_lo, w_hi = int4_unpack16(wb, DOT_F16, ASM)
    p = tl.dot(x_lo, tl.trans(w_lo))
    p = tl.dot(x_hi, tl.trans(w_hi), p)
    s = tl.load(s_ptr + offs_wn * stride_sn + grp).to(tl.float32)
    out = acc + s[None, :] * p
    if HAS_Z:
        sx = tl.sum(x_lo.to(tl.float32), axis=1) + tl.sum(x_hi.to(tl.float32), axis=1)
        z = tl.load(z_ptr + offs_wn * stride_sn + grp).to(tl.float32)
        out += sx[:, None] * z[None, :]
    return out


@triton.jit
def coded_tile_dot(acc, x, wb, s_ptr, offs_wn, stride_sn, byte0,  # type: ignore[no-untyped-def]
                   FMT: tl.constexpr, G: tl.constexpr, DOT_F16: tl.constexpr):
    """``acc`` plus one K-tile of int8 / e4m3 codes ``wb`` (int8 view ``[BLOCK_N, BLOCK_K]``) against ``x``, the
    codes exact in the dot's 16-bit type; block-FP8 scales the tile's product by its 128-block's scale
    (``BLOCK_K`` divides 128), per-channel scales wait for the epilogue."""
    w = e4m3_exact(wb, FMT == 2)
    if DOT_F16:
        x = x.to(tl.float16)
        w = w.to(tl.float16)
    else:
        w = w.to(tl.bfloat16)
    if FMT == 1:
        s = tl.load(s_ptr + (offs_wn // G) * stride_sn + byte0 // G).to(tl.float32)
        out = acc + tl.dot(x, tl.trans(w)) * s[None, :]
    else:
        out = tl.dot(x, tl.trans(w), acc)
    return out


@triton.jit
def times_norm_weight(x, g_ptr, offs, K, XT: tl.constexpr):  # type: ignore[no-untyped-def]
    """``x * g[offs]`` rounded to ``XT`` (x's type), as an RMSNorm's output is before its ``1/rms`` (which the fused
    GEMV applies to its outputs); ``g`` past K is 0."""
    g = tl.load(g_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
    return (x.to(tl.float32) * g).to(XT)


#: two bf16 pairs multiplied lane by lane (the low and high 32 bits of an int64 word of four bf16)
_BF16_WORD_MUL = tl.constexpr("mul.rn.bf16x2 $0, $2, $4; mul.rn.bf16x2 $1, $3, $5;")


@triton.jit
def bf16_words_mul(a, b):  # type: ignore[no-untyped-def]
    """Lane-by-lane bf16 product of int64 words of four bf16 each (``a * b`` rounded to bf16, as the norm's
    output is), by paired multiplies (PTX; sm_90 has ``mul.rn.bf16x2``)."""
    lo, hi = tl.inline_asm_elementwise(_BF16_WORD_MUL, "=r,=r,r,r,r,r",
                                       [a.to(tl.int32), (a >> 32).to(tl.int32), b.to(tl.int32),
                                        (b >> 32).to(tl.int32)], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    return (hi.to(tl.int64) << 32) | (lo.to(tl.int64) & 0xFFFFFFFF)


# The @triton.jit kernels carry no annotations on purpose: Triton reads a parameter's annotation as its
# type or specialisation; each is exempt from mypy's no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _quant_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,  # type: ignore[no-untyped-def]
                       M, N, K, NG, stride_xm, stride_wn, stride_sn, stride_cs, stride_cm, tiles_per_split, one_bits,
                       g_ptr, r_ptr, eps, n_half,
                       FMT: tl.constexpr, G: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       DOT_M: tl.constexpr, EVEN_W: tl.constexpr, EVEN_X: tl.constexpr, DOT_F16: tl.constexpr,
                       ASM: tl.constexpr, PAIRED: tl.constexpr, WORDS: tl.constexpr, STAGES: tl.constexpr,
                       NORM: tl.constexpr, GATED: tl.constexpr, RES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if GATED:  # rows [gate n0 .. n0 + BN/2, up I + n0 ..]: one program holds both halves of its outputs
        HALF: tl.constexpr = BLOCK_N // 2
        r = tl.arange(0, BLOCK_N)
        offs_wn = (pid_n * HALF + r % HALF) % n_half + (r // HALF) * n_half
        offs_n = pid_n * HALF + tl.arange(0, HALF)
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # Wrapped rows of W keep the loads unmasked; the store mask drops them.
        offs_wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    if NORM:  # RMSNorm's 1/rms from x's whole row (L2-resident) first; W (x g) rstd = rstd W (x g)
        ssq = tl.zeros((1024,), dtype=tl.float32)
        for k0 in range(0, K, 1024):
            kk = k0 + tl.arange(0, 1024)
            xv = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
            ssq += xv * xv
        rstd = tl.rsqrt(tl.sum(ssq, axis=0) / K + eps)
    # bytes of W one K-tile covers, and of a whole (padded) row
    TILE_B: tl.constexpr = BLOCK_K // 2 if FMT == 3 else BLOCK_K
    ROW_B = (NG * G) // 2 if FMT == 3 else K
    tile0 = pid_k * tiles_per_split
    w_rows = w_ptr + offs_wn * stride_wn

    if BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if FMT == 0 or FMT == 2:  # one scale per row: sum over the whole K-slice, scale at the end
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            sx = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for kt in range(0, tiles_per_split):
                offs_k = (tile0 + kt) * BLOCK_K + tl.arange(0, BLOCK_K)
                if EVEN_W:
                    b = tl.load(w_rows[:, None] + offs_k[None, :], eviction_policy="evict_first")
                    x = tl.load(x_ptr + offs_k).to(tl.float32)
                else:
                    b = tl.load(w_rows[:, None] + offs_k[None, :], mask=offs_k[None, :] < K, other=0,
                                eviction_policy="evict_first")
                    x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
                if NORM:
                    x = times_norm_weight(x, g_ptr, offs_k, K, x_ptr.dtype.element_ty).to(tl.float32)
                v = b.to(tl.int32)
                if FMT == 2:  # uint8 view: 1 + (q + 128) / 256
                    f = ((v << 15) ^ 0x3FC00000).to(tl.float32, bitcast=True)
                    sx += x
                else:  # int8 view (sign-extended): e4m3 * 2^-120
                    f = e4m3_bits_scaled(v)
                acc2 += f * x[None, :]
            row = tl.sum(acc2, axis=1)
            scale = tl.load(s_ptr + offs_wn).to(tl.float32)
            if FMT == 2:
                acc = scale * (256.0 * row - 384.0 * tl.sum(sx, axis=0))
            else:
                acc = scale * 1.329227995784916e36 * row  # 2^120
        elif WORDS:  # symmetric int4 on the paired PTX: [BLOCK_N, GT, GW] tiles of int32 words, four bytes each
            GBW: tl.constexpr = (BLOCK_K if BLOCK_K < G else G) // 2  # bytes of a slice (one group's)
            GTW: tl.constexpr = TILE_B // GBW
            GW: tl.constexpr = GBW // 4
            HBW: tl.constexpr = G // 2
            pw = tl.arange(0, GTW)[:, None] * GW + tl.arange(0, GW)[None, :]  # [GT, GW] word offsets in a tile
            w_words = w_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + offs_wn * (stride_wn // 4)
            x_words = x_ptr.to(tl.pointer_type(tl.int64), bitcast=True)  # four bf16 activations a word
            accw = tl.zeros((BLOCK_N, GTW, GW), dtype=tl.float32)
            for kt in tl.range(0, tiles_per_split, num_stages=STAGES):
                byte0 = (tile0 + kt) * TILE_B
                b = tl.load(w_words[:, None, None] + (byte0 // 4 + pw)[None, :, :], eviction_policy="evict_first")
                s0 = byte0 + tl.arange(0, GTW) * GBW
                grp = s0 // HBW
                q_lo = tl.multiple_of(((grp * G + s0 % HBW) // 4), GW)[:, None] + tl.arange(0, GW)[None, :]
                x_lo = tl.load(x_words + q_lo)
                x_hi = tl.load(x_words + q_lo + HBW // 4)
                if NORM:
                    g_words = g_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
                    x_lo = bf16_words_mul(x_lo, tl.load(g_words + q_lo))
                    x_hi = bf16_words_mul(x_hi, tl.load(g_words + q_lo + HBW // 4))
                s = tl.load(s_ptr + offs_wn[:, None] * stride_sn + grp[None, :], mask=(grp < NG)[None, :],
                            other=0.0).to(tl.float32)
                accw += s[:, :, None] * int4_word_dot(b, x_lo[None, :, :], x_hi[None, :, :])
            acc = tl.sum(tl.sum(accw, axis=2), axis=1)
        else:  # int4 / fp8_block: [BLOCK_N, GT, GB] tiles, GT groups of GB bytes
            GB: tl.constexpr = (BLOCK_K if BLOCK_K < G else G) // (2 if FMT == 3 else 1)
            GT: tl.constexpr = TILE_B // GB
            HB: tl.constexpr = G // 2 if FMT == 3 else G  # bytes of one group in a row
            pt = tl.arange(0, GT)[:, None] * GB + tl.arange(0, GB)[None, :]  # [GT, GB] byte offsets in a tile
            # Scaled products accumulate elementwise, one FFMA a byte; the tile is summed once, after the
            # loop. Summing each tile's groups inside the loop with the fp32 decode (as this kernel did) took
            # 419 SASS instructions a loop for 64 weights a thread (6.5 a weight), now 262 (4.1), at BLOCK_N 16
            # / BLOCK_K 512 / 4 warps; 762 -> 458 (6.0 -> 3.6) at BLOCK_K 1024 (sm_90, compiled offline by
            # Triton 3.9 with the JIT's divisibility hints).
            acc3 = tl.zeros((BLOCK_N, GT, GB), dtype=tl.float32)
            accz = tl.zeros((BLOCK_N, GT), dtype=tl.float32)
            for kt in tl.range(0, tiles_per_split, num_stages=STAGES):
                byte0 = (tile0 + kt) * TILE_B
                pb = byte0 + pt
                grp = (byte0 + tl.arange(0, GT) * GB) // HB  # [GT] the group of each slice
                w_ptrs = w_rows[:, None, None] + pb[None, :, :]
                if EVEN_W:
                    b = tl.load(w_ptrs, eviction_policy="evict_first")
                else:
                    b = tl.load(w_ptrs, mask=(pb < ROW_B)[None, :, :], other=0, eviction_policy="evict_first")
                g_ok = grp < NG
                if FMT == 3:
                    # a slice lies in one group: its activations are GB contiguous values from a GB multiple
                    # (said so, or Triton loads them one by one with an address computed for each)
                    s0 = byte0 + tl.arange(0, GT) * GB
                    k_base = tl.multiple_of((s0 // HB) * G + s0 % HB, GB)
                    k_lo = k_base[:, None] + tl.arange(0, GB)[None, :]
                    k_hi = k_lo + HB
                    if EVEN_X:
                        x_lo = tl.load(x_ptr + k_lo)
                        x_hi = tl.load(x_ptr + k_hi)
                    else:
                        x_lo = tl.load(x_ptr + k_lo, mask=k_lo < K, other=0.0)
                        x_hi = tl.load(x_ptr + k_hi, mask=k_hi < K, other=0.0)
                    if NORM:
                        x_lo = times_norm_weight(x_lo, g_ptr, k_lo, K, x_ptr.dtype.element_ty)
                        x_hi = times_norm_weight(x_hi, g_ptr, k_hi, K, x_ptr.dtype.element_ty)
                    s_ptrs = s_ptr + offs_wn[:, None] * stride_sn + grp[None, :]
                    s = tl.load(s_ptrs, mask=g_ok[None, :], other=0.0).to(tl.float32)
                    acc3 += s[:, :, None] * int4_pair_dot(b, x_lo[None, :, :], x_hi[None, :, :], one_bits,
                                                          PAIRED)
                    if HAS_Z:  # w = (q - 8) s + z: z times the group's activation sum
                        z = tl.load(z_ptr + offs_wn[:, None] * stride_sn + grp[None, :], mask=g_ok[None, :],
                                    other=0.0).to(tl.float32)
                        accz += z * tl.sum(x_lo.to(tl.float32) + x_hi.to(tl.float32), axis=1)[None, :]
                else:
                    if EVEN_X:
                        x = tl.load(x_ptr + pb).to(tl.float32)
                    else:
                        x = tl.load(x_ptr + pb, mask=pb < K, other=0.0).to(tl.float32)
                    if NORM:
                        x = times_norm_weight(x, g_ptr, pb, K, x_ptr.dtype.element_ty).to(tl.float32)
                    s_ptrs = s_ptr + (offs_wn // G)[:, None] * stride_sn + grp[None, :]
                    s = tl.load(s_ptrs, mask=g_ok[None, :], other=0.0).to(tl.float32)
                    acc3 += s[:, :, None] * (e4m3_bits_scaled(b.to(tl.int32)) * x[None, :, :])
            acc = tl.sum(tl.sum(acc3, axis=2), axis=1) + tl.sum(accz, axis=1)
            if FMT == 1:
                acc = acc * 1.329227995784916e36  # 2^120
        if NORM:
            acc = acc * rstd
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_wn).to(tl.float32) * (pid_k == 0).to(tl.float32)
        n_out = N
        if GATED:  # silu(gate) * up of the program's two row halves
            gate, up = tl.split(tl.trans(tl.reshape(acc, (2, HALF))))
            acc = gate * tl.sigmoid(gate) * up
            n_out = n_half
        if RES:  # the residual stream's add (split-K 1 only)
            acc += tl.load(r_ptr + offs_n, mask=offs_n < n_out, other=0.0).to(tl.float32)
        tl.store(c_ptr + pid_k * stride_cs + offs_n, acc.to(c_ptr.dtype.element_ty), mask=offs_n < n_out)
    else:
        offs_m = tl.arange(0, DOT_M)
        m_ok = offs_m < M
        acc = tl.zeros((DOT_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, tiles_per_split):
            byte0 = (tile0 + kt) * TILE_B
            pb = byte0 + tl.arange(0, TILE_B)
            if EVEN_W:
                b = tl.load(w_rows[:, None] + pb[None, :], eviction_policy="evict_first")
            else:
                b = tl.load(w_rows[:, None] + pb[None, :], mask=(pb < ROW_B)[None, :], other=0,
                            eviction_policy="evict_first")
            if FMT == 3:  # one group a tile (BLOCK_K <= G): q - 8 in the dot's type
                HB3: tl.constexpr = G // 2
                grp = byte0 // HB3
                k_lo = grp * G + pb % HB3
                k_hi = k_lo + HB3
                x_lo_ptrs = x_ptr + offs_m[:, None] * stride_xm + k_lo[None, :]
                x_hi_ptrs = x_ptr + offs_m[:, None] * stride_xm + k_hi[None, :]
                if EVEN_X:
                    x_lo = tl.load(x_lo_ptrs, mask=m_ok[:, None], other=0.0)
                    x_hi = tl.load(x_hi_ptrs, mask=m_ok[:, None], other=0.0)
                else:
                    x_lo = tl.load(x_lo_ptrs, mask=m_ok[:, None] & (k_lo < K)[None, :], other=0.0)
                    x_hi = tl.load(x_hi_ptrs, mask=m_ok[:, None] & (k_hi < K)[None, :], other=0.0)
                acc = int4_tile_dot(acc, x_lo, x_hi, b, s_ptr, z_ptr, offs_wn, stride_sn, grp, HAS_Z, DOT_F16, ASM)
            else:  # int8 / e4m3 codes (fp8_block: one 128-block a tile, BLOCK_K <= 128)
                x_ptrs = x_ptr + offs_m[:, None] * stride_xm + pb[None, :]
                if EVEN_X:
                    x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
                else:
                    x = tl.load(x_ptrs, mask=m_ok[:, None] & (pb < K)[None, :], other=0.0)
                acc = coded_tile_dot(acc, x, b, s_ptr, offs_wn, stride_sn, byte0, FMT, G, DOT_F16)
        if FMT == 0 or FMT == 2:
            acc = acc * tl.load(s_ptr + offs_wn).to(tl.float32)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_wn).to(tl.float32)[None, :] * (pid_k == 0).to(tl.float32)
        c_ptrs = c_ptr + pid_k * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & (offs_n[None, :] < N))


def row_tiles(fmt_name: str, k: int, kp: int, bk: int, split_k: int) -> tuple[int, bool, bool]:
    """(K-tiles per split, EVEN_W, EVEN_X): W loads need no mask when a split's tiles lie inside the
    stored row; activation loads none when, besides, the row is not padded past K (int4)."""
    row = kp // 2 if fmt_name == "int4" else k
    tile = bk // 2 if fmt_name == "int4" else bk
    tiles = triton.cdiv(row, tile)
    even_w = row % tile == 0 and tiles % split_k == 0
    return triton.cdiv(tiles, split_k), even_w, even_w and kp == k


def weight_views(qw: Any, *, fma: bool) -> tuple[Any, Any, Any]:
    """(W as the kernels read it, scales, offsets or the scales again as a placeholder): fp8 as int8
    (sign-extended codes), int8 as uint8 on the FMA path (zero-extended: the 1 + (q+128)/256 trick)
    and as int8 on the dot path, int4 as stored."""
    import torch

    w = qw.qweight
    if qw.fmt.name in ("fp8", "fp8_block"):
        w = w.view(torch.int8)
    elif qw.fmt.name == "int8" and fma:
        w = w.view(torch.uint8)
    return w, qw.scales, qw.offsets if qw.offsets is not None else qw.scales


@functools.cache
def _sm_at_least(device_type: str, index: int | None, major: int) -> bool:
    """Whether a CUDA device's compute capability is at least ``major``: paired bf16 FMAs (``fma.rn.bf16x2``,
    :func:`int4_pair_dot`'s PTX) need sm_80, paired bf16 multiplies (``mul.rn.bf16x2``, the word path's norm
    fusion) sm_90; without them the exact fp32 decode runs. Tensors elsewhere are bound for a named target's
    compile (``tests/_compile_sm90.py``), which takes the PTX."""
    if device_type != "cuda":
        return True
    import torch

    return torch.cuda.get_device_capability(index)[0] >= major


def _words_fit(x: Any, w: Any, qw: Any, bk: int, even: bool) -> bool:
    """Whether int4's word path (:func:`int4_word_dot`) can read this GEMV: symmetric int4 (the offsets need
    the activations' sums as values), unmasked tiles (``even``: a masked word would split a group), a slice
    a whole number of words and groups of whole activation words, W rows 4-byte and X 8-byte aligned."""
    g = qw.fmt.group_size or 0
    return (qw.fmt.name == "int4" and qw.offsets is None and even and g % 8 == 0 and (min(bk, g) // 2) % 4 == 0
            and w.stride(0) % 4 == 0 and w.data_ptr() % 4 == 0 and x.data_ptr() % 8 == 0)


def fusion_problem(x: Any, qw: Any, out: Any, params: dict[str, int], norm_weight: Any, gated: bool,
                    residual: Any) -> str | None:
    """Why this GEMV cannot take the asked fusions (None: it can): M = 1 on the FMA path, any format; the gated and
    residual epilogues at split-K 1 (each program writes its own outputs)."""
    fused = norm_weight is not None or gated or residual is not None
    if not fused:
        return None
    if x.shape[0] != 1 or params["BLOCK_M"] != 1:
        return "the fused prologue/epilogues serve M = 1 on the FMA path (BLOCK_M 1)"
    if (gated or residual is not None) and params.get("SPLIT_K", 1) != 1:
        return "the gated and residual epilogues need SPLIT_K 1"
    if gated and (qw.n % 2 or params["BLOCK_N"] % 2 or out.shape[1] != qw.n // 2):
        return f"gated: W has 2I rows (gate, then up), BLOCK_N even, out [1, I]; got N={qw.n}, out {tuple(out.shape)}"
    if norm_weight is not None and (norm_weight.shape != (qw.k,) or norm_weight.dtype != x.dtype
                                    or not norm_weight.is_contiguous()):
        return f"norm weight: a contiguous [{qw.k}] tensor of x's dtype"
    if residual is not None and (residual.shape != out.shape or not residual.is_contiguous()):
        return f"residual: a contiguous {tuple(out.shape)} tensor"
    return None


def quant_gemv_prepare(x: Any, qw: Any, out: Any, params: dict[str, int], *, bias: Any = None,
                       norm_weight: Any = None, eps: float = 1e-6, gated: bool = False,
                       residual: Any = None) -> Callable[[], None]:
    """Bind a config to tensors; returns a no-argument launcher (split-K workspace allocated here).

    ``x`` ``[M, K]`` (bf16/fp16, unit stride along K), ``qw`` a :class:`~autoopt.backend.quant.QuantizedWeight`
    of ``[N, K]``, ``out`` ``[M, N]`` (unit stride along N), ``bias`` ``[N]`` or None. Fusions (M = 1):
    ``norm_weight`` (``[K]``) makes it ``rmsnorm(x, eps) * g`` times W (x is the norm's input); ``gated`` reads W
    as ``[gate; up]`` and writes ``silu(gate) * up`` (``out`` ``[1, N/2]``); ``residual`` adds a ``[1, N]``
    tensor to the output."""
    import torch

    why = fusion_problem(x, qw, out, params, norm_weight, gated, residual)
    if why is not None:
        raise ValueError(f"quant gemv fusion: {why}")
    m, k = x.shape
    n = qw.n
    f = qw.fmt
    if k != qw.k:
        raise ValueError(f"x has K={k}, the weight K={qw.k}")
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    if bm < m:
        raise ValueError(f"quant gemv BLOCK_M={bm} must be >= M={m} (one program covers every row of X)")
    if x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("quant gemv reads X and writes C with unit stride along K and N")
    g = f.group_size or 0
    if bm > 1 and g and bk > g:
        raise ValueError(f"quant gemv on the dot path (BLOCK_M > 1) takes BLOCK_K <= the group {g}, got {bk}")
    split_k = params.get("SPLIT_K", 1)
    kp = f.padded_k(k)
    tiles_per_split, even_w, even_x = row_tiles(f.name, k, kp, bk, split_k)
    w, s, z = weight_views(qw, fma=bm == 1)
    ng = s.shape[1] if s.dim() == 2 else 1
    dot_f16 = x.dtype == torch.float16 or interpreter_active()
    paired = not dot_f16 and not interpreter_active() and _sm_at_least(x.device.type, x.device.index, 8)
    meta = dict(FMT=FMT_CODES[f.name], G=g, HAS_Z=qw.offsets is not None, HAS_BIAS=bias is not None,
                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_M=max(16, bm), EVEN_W=even_w, EVEN_X=even_x,
                DOT_F16=dot_f16, ASM=not interpreter_active(),
                PAIRED=paired, WORDS=paired and bm == 1 and _words_fit(x, w, qw, bk, even_w and even_x)
                and (norm_weight is None or _sm_at_least(x.device.type, x.device.index, 9)),
                NORM=norm_weight is not None, GATED=gated, RES=residual is not None,
                STAGES=params.get("num_stages", 2),
                num_warps=params.get("num_warps", 4), num_stages=params.get("num_stages", 2))
    grid = (triton.cdiv(n // 2 if gated else n, bn // 2 if gated else bn), split_k)
    g_t = norm_weight if norm_weight is not None else s
    r_t = residual if residual is not None else s
    fuse = (g_t, r_t, float(eps), n // 2 if gated else n)
    b = bias if bias is not None else s
    stride_sn = s.stride(0)

    def launch(c: Any, stride_cs: int, stride_cm: int) -> None:
        _quant_gemv_kernel[grid](x, w, s, z, b, c, m, n, k, ng, x.stride(0), w.stride(0), stride_sn, stride_cs,
                                 stride_cm, tiles_per_split, _ONE_BITS, *fuse, **meta)
    return split_k_output(out, split_k, launch, "quant gemv")
