"""Dynamic activation quantization for the W8A8 GEMMs: ``A[M, K]`` (bf16/fp16) -> e4m3 ``A`` and fp32 scales.

Per token (``GROUP == 0``): ``s[m] = max(amax(|A[m, :]|), tiny) / 448``, ``q = e4m3(clamp(A / s, +-448))``;
one program per row: rows up to ``ROW_MAX_K`` elements in one pass (the row held in registers: one load,
its max, the codes), longer rows in two passes of ``BLOCK_K`` (the second reads it back from L1/L2). Per token per
128-group (``GROUP == 128``, the block-FP8 checkpoints' activations): ``s[m, j]`` over
``A[m, 128j:128j+128]``; one program per row, ``GROUPS`` groups a step. All-zero rows/groups get
scale 1, as :func:`autoopt.backend.quant.quantize_activations` (the reference) does. The division is
``div_rn`` (IEEE round to nearest) so codes match the torch reference. Under Triton's CPU interpreter
(triton 3.9) the fp32 -> e4m3 cast rounds wrongly where rounding up crosses a power of two (127.4 -> 64):
there ``EXACT_FP8`` rounds to the e4m3 grid in fp32 first, so the cast only converts exact values;
on a GPU the hardware cast (round to nearest even, saturating) runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import interpreter_active, traceable

__all__ = ["act_quant_prepare", "act_quant_traced", "round_to_e4m3"]

#: K elements a per-token program loads at once: 4 warps x 32 lanes x 8 elements (16-byte loads of bf16)
_BLOCK_K = 1024
#: rows this long or shorter are quantized in one pass, the whole row in registers (32768: Qwen2.5-7B's
#: 18944-wide down_proj input fits; 64 fp32 values a thread at 16 warps). The two-pass loop, BLOCK_K at a
#: time, was latency-bound at decode batches: 142 us a step for 32 launches (4.4 us each) at M = 32 on the
#: H200, 8 Llama-3-8B layers (``benchmarks/results/h200/quant_trace_b32_layers8.json``): each of its
#: 2 x K / 1024 steps waits on its own load.
ROW_MAX_K = 32768
#: 128-groups a per-group program handles at once (a [8, 128] tile: the same 1024 elements)
_GROUPS = 8


# The @triton.jit kernels carry no annotations on purpose (Triton would read them as types); each
# is exempt from mypy's no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def round_to_e4m3(y):  # type: ignore[no-untyped-def]
    """``y`` (fp32, |y| <= 448) rounded to the nearest e4m3 value, ties to even, in fp32 arithmetic:
    e4m3 keeps 3 fraction bits, so the spacing at ``2^e`` is ``2^(e-3)``, and ``2^-9`` below ``2^-6``
    (subnormals); adding and subtracting 1.5 * 2^23 rounds ``y / spacing`` (< 16) to an integer."""
    bits = y.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    inv = ((130 - e) << 23).to(tl.float32, bitcast=True)  # 2^(3 - e)
    ulp = ((124 + e) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3)
    return ((y * inv + 12582912.0) - 12582912.0) * ulp


@triton.jit
def _act_quant_token_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm,  # type: ignore[no-untyped-def]
                            BLOCK_K: tl.constexpr, EXACT_FP8: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * stride_qm
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    top = tl.max(amax, axis=0)
    scale = tl.where(top > 0, tl.math.div_rn(top, 448.0), 1.0)
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
        if EXACT_FP8:
            y = round_to_e4m3(y)
        tl.store(q_row + offs, y.to(q_ptr.dtype.element_ty), mask=offs < K)


@triton.jit
def _act_quant_row_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm,  # type: ignore[no-untyped-def]
                          BLOCK_K: tl.constexpr, EXACT_FP8: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
    top = tl.max(tl.abs(x), axis=0)
    scale = tl.where(top > 0, tl.math.div_rn(top, 448.0), 1.0)
    tl.store(s_ptr + row, scale)
    y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
    if EXACT_FP8:
        y = round_to_e4m3(y)
    tl.store(q_ptr + row * stride_qm + offs, y.to(q_ptr.dtype.element_ty), mask=offs < K)


def _token_launch(wrap: Callable[[Any], Any], x: Any, q: Any, s: Any) -> None:
    """Per-token quantization of ``x`` into ``q`` and ``s``: one pass over rows of at most ``ROW_MAX_K``
    (warps sized for 32 elements a thread, 4 to 16), the two-pass loop beyond; ``wrap`` the kernel as
    launched (``traceable`` under torch.compile, or as is)."""
    m, k = x.shape
    exact = interpreter_active()
    if k <= ROW_MAX_K:
        block = triton.next_power_of_2(k)
        warps = min(16, max(4, block // 1024))
        wrap(_act_quant_row_kernel)[(m,)](x, q, s, k, x.stride(0), q.stride(0), BLOCK_K=block, EXACT_FP8=exact,
                                          num_warps=warps)
        return
    wrap(_act_quant_token_kernel)[(m,)](x, q, s, k, x.stride(0), q.stride(0), BLOCK_K=_BLOCK_K, EXACT_FP8=exact,
                                        num_warps=4)


@triton.jit
def _act_quant_group_kernel(x_ptr, q_ptr, s_ptr, K, NG, stride_xm, stride_qm, stride_sm,  # type: ignore[no-untyped-def]
                            GROUP: tl.constexpr, GROUPS: tl.constexpr, EXACT_FP8: tl.constexpr):
    row = tl.program_id(0)
    for g0 in range(0, NG, GROUPS):
        gi = g0 + tl.arange(0, GROUPS)
        offs = gi[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        ok = offs < K
        x = tl.load(x_ptr + row * stride_xm + offs, mask=ok, other=0.0).to(tl.float32)
        top = tl.max(tl.abs(x), axis=1)
        scale = tl.where(top > 0, tl.math.div_rn(top, 448.0), 1.0)
        tl.store(s_ptr + row * stride_sm + gi, scale, mask=gi < NG)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale[:, None]), -448.0), 448.0)
        if EXACT_FP8:
            y = round_to_e4m3(y)
        tl.store(q_ptr + row * stride_qm + offs, y.to(q_ptr.dtype.element_ty), mask=ok)


def act_quant_prepare(x: Any, q: Any, scales: Any, *, group: int = 0) -> Callable[[], None]:
    """A launcher writing e4m3 ``q`` ``[M, K]`` and fp32 ``scales`` (``[M]``; ``[M, ceil(K/group)]``
    with ``group`` 128) from ``x`` ``[M, K]`` (unit stride along K)."""
    m, k = x.shape
    exact = interpreter_active()
    if x.stride(1) != 1 or q.stride(1) != 1:
        raise ValueError("activation quantization reads and writes rows of unit stride along K")
    if group == 0:
        def run() -> None:
            _token_launch(lambda kernel: kernel, x, q, scales)
        return run
    if group != 128:
        raise ValueError(f"activation groups are 128 wide (block-FP8), got {group}")
    ng = triton.cdiv(k, group)

    def run_group() -> None:
        _act_quant_group_kernel[(m,)](x, q, scales, k, ng, x.stride(0), q.stride(0), scales.stride(0),
                                      GROUP=group, GROUPS=_GROUPS, EXACT_FP8=exact, num_warps=4)
    return run_group


def act_quant_traced(x: Any) -> tuple[Any, Any]:
    """Per-token e4m3 ``q`` ``[M, K]`` and fp32 scales ``[M]`` of ``x`` ``[M, K]`` (unit stride along K), as
    :func:`act_quant_prepare` makes them, allocated here and launched through
    :func:`~autoopt.backend.kernels.traceable`: traced by ``torch.compile``, the compiled graph launches the
    kernel itself instead of calling back into a custom op's Python."""
    import torch

    m, k = x.shape
    if x.stride(1) != 1:
        raise ValueError("activation quantization reads rows of unit stride along K")
    q = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty((m,), device=x.device, dtype=torch.float32)
    _token_launch(traceable, x, q, s)
    return q, s
