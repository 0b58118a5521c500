"""Tiled Triton GEMM ``C[M,N] = A[M,K] @ W^T`` with group-M ordering and split-K.

``W`` is an ``nn.Linear`` weight ``[N, K]`` (layout ``nk``) or a plain ``[K, N]``
matrix (layout ``kn``); both reach the kernel as (stride_bk, stride_bn), so one
compiled kernel serves either. Accumulation is fp32; fp32 inputs use TF32 dots
(Triton's default on tensor cores, relative error ~3e-4).

Split-K (``SPLIT_K > 1``): each K-slice writes fp32 partials to a workspace
``[SPLIT_K, M, N]`` and a second kernel sums them in a fixed order and casts.
We chose this over ``atomic_add`` into an fp32 buffer because for the skinny M
where split-K pays (decode / small prefill) the partials are tiny next to W:
``SPLIT_K*M*N*4*2`` bytes against ``N*K*2`` for W, 6% at M=16, K=4096, SPLIT_K=4;
atomics would need two extra launches (zero the buffer, cast at the end) against
one reduce launch here, and give run-to-run different roundings (the order of
atomic adds is not fixed), which makes correctness checks flaky.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

log = logging.getLogger(__name__)

__all__ = ["gemm_prepare", "k_split", "split_k_launcher", "split_k_output", "splitk_reduce_prepare", "weight_dims"]


# The @triton.jit kernels here carry no annotations on purpose: Triton reads a parameter's annotation
# as its type or specialisation (``n: int`` would pin n to i32), so each is exempt from mypy's
# no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,  # type: ignore[no-untyped-def]
                 stride_am, stride_ak, stride_bk, stride_bn,
                 stride_cs, stride_cm, stride_cn, tiles_per_split,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                 DOT_FP16: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Group-M ordering (Triton matmul tutorial): consecutive programs share a
    # band of GROUP_M rows of A so the W tiles they load are reused from L2.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrap the ragged rows/cols instead of masking them: the loads stay
    # unmasked (vectorised) and the store mask below drops the extra results.
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    k_start = pid_k * tiles_per_split * BLOCK_K
    offs_k = k_start + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tiles_per_split):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_start - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)
        if DOT_FP16:
            # fp8 e4m3 -> fp16 is exact (fp16 holds every e4m3 value); used where
            # the target has no fp8 MMA (the interpreter, pre-sm_89 GPUs).
            a = a.to(tl.float16)
            b = b.to(tl.float16)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    c_ptrs = c_ptr + pid_k * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _splitk_reduce_kernel(ws_ptr, c_ptr, MN, stride_s, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """c[i] = sum_s ws[s * stride_s + i] in a fixed order (deterministic), cast to c's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * stride_s + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


_REDUCE_BLOCK = 1024  # 1024 fp32 per program: 4 warps x 32 lanes x 8 elements (two 16-byte loads)


def splitk_reduce_prepare(ws: Any, out: Any, split_k: int, *, split_stride: int | None = None) -> Callable[[], None]:
    """A launcher summing the fp32 workspace's ``split_k`` slices into contiguous ``out``. Slice ``s``
    starts ``split_stride`` elements after slice ``s - 1`` (default ``out.numel()``: a ``[split_k, M, N]``
    workspace) and holds ``out``'s elements in the same row-major order."""
    mn = out.numel()
    stride = mn if split_stride is None else split_stride
    grid = (triton.cdiv(mn, _REDUCE_BLOCK),)

    def run() -> None:
        _splitk_reduce_kernel[grid](ws, out, mn, stride, SPLIT_K=split_k, BLOCK=_REDUCE_BLOCK, num_warps=4)
    return run


def split_k_output(out: Any, split_k: int, launch: Callable[[Any, int, int], None], what: str) -> Callable[[], None]:
    """A launcher of ``launch(C, stride_cs, stride_cm)`` writing ``out`` directly (one K-slice: ``stride_cs`` 0) or
    its ``split_k`` slices into an fp32 ``[split_k, M, N]`` workspace summed into ``out`` after (allocated here;
    ``ValueError`` naming ``what`` for a strided ``out``, which the reduce cannot write)."""
    import torch

    if split_k == 1:
        return lambda: launch(out, 0, out.stride(0))
    if not out.is_contiguous():
        raise ValueError(f"split-K {what} writes a contiguous output; got a strided one")
    ws = torch.empty((split_k, *out.shape), device=out.device, dtype=torch.float32)
    reduce = splitk_reduce_prepare(ws, out, split_k)

    def run() -> None:
        launch(ws, ws.stride(0), ws.stride(1))
        reduce()
    return run


def weight_dims(w: Any, layout: str) -> tuple[int, int, int]:
    """(N, stride along N, stride along K) of a weight ``[N, K]`` (layout ``nk``) or ``[K, N]`` (``kn``)."""
    if layout == "nk":
        return w.shape[0], w.stride(0), w.stride(1)
    return w.shape[1], w.stride(1), w.stride(0)


def k_split(k: int, bk: int, split_k: int) -> tuple[int, bool]:
    """(BLOCK_K tiles per K-slice, EVEN_K). Masks on K are compiled out (EVEN_K) when every split's
    K range is whole BLOCK_K tiles inside K."""
    k_tiles = triton.cdiv(k, bk)
    return triton.cdiv(k_tiles, split_k), k % bk == 0 and k_tiles % split_k == 0


def split_k_launcher(kernel: Any, grid: tuple[int, ...], a: Any, w: Any, out: Any, dims: tuple[int, int, int],
                     in_strides: tuple[int, int, int, int], tiles_per_split: int, split_k: int,
                     meta: dict[str, Any]) -> Callable[[], None]:
    """A launcher of ``kernel[grid](a, w, C, M, N, K, *in_strides, stride_cs, stride_cm, stride_cn,
    tiles_per_split, **meta)``: C is ``out`` when ``split_k == 1``, else an fp32 ``[split_k, M, N]``
    workspace (allocated once here) that :func:`splitk_reduce_prepare` then sums into contiguous ``out``."""
    if split_k == 1:
        def run() -> None:
            kernel[grid](a, w, out, *dims, *in_strides, 0, out.stride(0), out.stride(1), tiles_per_split,
                         **meta)
        return run

    import torch

    m, n, _ = dims
    ws = torch.empty((split_k, m, n), device=a.device, dtype=torch.float32)
    reduce = splitk_reduce_prepare(ws, out, split_k)

    def run_split() -> None:
        kernel[grid](a, w, ws, *dims, *in_strides, ws.stride(0), ws.stride(1), ws.stride(2), tiles_per_split,
                     **meta)
        reduce()
    return run_split


def _needs_fp16_dot(a: Any) -> bool:
    """fp8 dots need sm_89+; the interpreter (CPU tensors) and older GPUs go through fp16."""
    import torch

    if a.dtype != torch.float8_e4m3fn:
        return False
    if a.device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(a.device) < (8, 9)


def gemm_prepare(a: Any, w: Any, out: Any, params: dict[str, int], *, layout: str = "nk") -> Callable[[], None]:
    """Bind a config to tensors; returns a no-argument launcher (workspace allocated once here).

    ``a`` is ``[M, K]``, ``w`` is ``[N, K]`` (``nk``) or ``[K, N]`` (``kn``), ``out`` is ``[M, N]``.
    """
    M, K = a.shape
    N, stride_bn, stride_bk = weight_dims(w, layout)
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    group_m = params.get("GROUP_M", 8)
    split_k = params.get("SPLIT_K", 1)
    tiles_per_split, even_k = k_split(K, bk, split_k)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split_k)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SPLIT_K=split_k,
                EVEN_K=even_k, DOT_FP16=_needs_fp16_dot(a),
                num_warps=params.get("num_warps", 4), num_stages=params.get("num_stages", 3))
    if split_k > 1 and not out.is_contiguous():
        raise ValueError("split-K GEMM writes a contiguous output; got a strided one")
    return split_k_launcher(_gemm_kernel, grid, a, w, out, (M, N, K),
                            (a.stride(0), a.stride(1), stride_bk, stride_bn), tiles_per_split, split_k, meta)
