"""Persistent TMA GEMM: ``C[M,N] = A[M,K] @ W[N,K]^T`` through tensor descriptors.

Follows Triton's tutorial 09-persistent-matmul: the grid is
``min(num_tiles, NUM_SMS)`` programs, each walking tiles ``pid, pid+NUM_SMS, ...``
in group-M order; tiles are fetched by the TMA copy engine (sm_90+) from
host-built descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``,
present in Triton 3.4 onwards, so in 3.6 and 3.9). Host descriptors need no
device-side scratch, so no ``triton.set_allocator`` is required. TMA pads
out-of-bounds boxes with zeros and clips out-of-bounds stores, so ragged
edges need no masks. Rows must be 16-byte aligned (a TMA rule): K*elem and
N*out_elem divisible by 16.

Split-K (``SPLIT_K > 1``): the persistent loop walks ``tiles x SPLIT_K`` work
units, split-major (units running together share a K-slice of A across N
tiles, as group-M intends), and each writes its fp32 partial tile through a
TMA descriptor over a ``[SPLIT_K * M_PAD, N]`` workspace (M_PAD = M rounded up
to BLOCK_M, so one slice's ragged last rows never land in the next slice);
``gemm.splitk_reduce_prepare`` then sums the slices in a fixed order. It pays
where the output tiles underfill the SMs: at 256 x 6144 x 4096 with 128 x 128
tiles there are 96 tiles for 132 SMs (a third idle); SPLIT_K=4 gives 384 units,
2.9 waves of a quarter the K each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels.gemm import k_split, splitk_reduce_prepare
from autoopt.errors import BackendError

log = logging.getLogger(__name__)

__all__ = ["gemm_tma_prepare", "tma_support"]


# The @triton.jit kernels here carry no annotations on purpose: Triton reads a parameter's annotation
# as its type or specialisation (``n: int`` would pin n to i32), so each is exempt from mypy's
# no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _gemm_tma_kernel(a_desc, b_desc, c_desc, M, N, K, tiles_per_split, M_PAD,  # type: ignore[no-untyped-def]
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, KN: tl.constexpr, SPLIT_K: tl.constexpr):
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n
    for unit in tl.range(start_pid, num_tiles * SPLIT_K, NUM_SMS, flatten=True):
        ks = unit // num_tiles
        tile_id = unit % num_tiles
        group_id = tile_id // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile_id % group_size_m)
        pid_n = (tile_id % num_pid_in_group) // group_size_m
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        k0 = ks * tiles_per_split * BLOCK_K
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tiles_per_split):
            off_k = k0 + ki * BLOCK_K  # past K: TMA fills the box with zeros
            a = a_desc.load([off_m, off_k])
            if KN:
                b = b_desc.load([off_k, off_n])
                acc = tl.dot(a, b, acc)
            else:
                b = b_desc.load([off_n, off_k])
                acc = tl.dot(a, b.T, acc)
        if SPLIT_K == 1:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
        else:
            c_desc.store([ks * M_PAD + off_m, off_n], acc)


@triton.jit
def _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):  # type: ignore[no-untyped-def]
    """(pid_m, pid_n) of a tile in group-M order (Triton matmul tutorial)."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    return first_pid_m + (tile_id % group_size_m), (tile_id % num_pid_in_group) // group_size_m


@triton.jit
def _gemm_tma_streamk_kernel(a_desc, b_desc, c_desc, ws_ptr, flag_ptr, M, N, K,  # type: ignore[no-untyped-def]
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, KN: tl.constexpr):
    """Stream-K: the tiles x K-iterations of the whole GEMM are cut into ``NUM_SMS`` equal contiguous
    ranges, one per program. A program that ends inside a tile parks its fp32 partial in its workspace
    slot and raises its flag; the program holding the tile's last iteration (always a higher pid) adds
    the partials of the lower programs that share the tile, lowers their flags and stores C.

    Each program walks its range from the end: its first segment is the one it hands over (published at
    once) and its last the one it finishes, so a finisher waits only for work its neighbours did first.
    Walking forwards chains the programs (each finisher waits for its neighbour's whole range): measured
    4-20x slower than data-parallel on the H200 (benchmarks/results/h200/hw_limit_streamk_forward.json)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = num_pid_m * num_pid_n * k_tiles
    start = pid * total // NUM_SMS
    tile_elems = BLOCK_M * BLOCK_N
    slot = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    cur = (pid + 1) * total // NUM_SMS  # the end of the segment still to do
    while cur > start:
        tile_id = (cur - 1) // k_tiles
        seg_start = tl.maximum(start, tile_id * k_tiles)
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(seg_start - tile_id * k_tiles, cur - tile_id * k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])  # past K: TMA fills the box with zeros
            if KN:
                b = b_desc.load([ki * BLOCK_K, off_n])
                acc = tl.dot(a, b, acc)
            else:
                b = b_desc.load([off_n, ki * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
        if cur == (tile_id + 1) * k_tiles:
            # the owner of the tile's first iteration, and every program up to this one, left a partial
            first = ((tile_id * k_tiles + 1) * NUM_SMS - 1) // total
            for c in range(first, pid):
                if (c + 1) * total // NUM_SMS > c * total // NUM_SMS:  # a program with no iterations left none
                    flag = tl.atomic_add(flag_ptr + c, 0, sem="acquire")
                    while flag == 0:
                        flag = tl.atomic_add(flag_ptr + c, 0, sem="acquire")
                    acc += tl.load(ws_ptr + c * tile_elems + slot, cache_modifier=".cg")
                    tl.atomic_xchg(flag_ptr + c, 0)  # self-resetting: ready for the next launch
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
        else:
            tl.store(ws_ptr + pid * tile_elems + slot, acc, cache_modifier=".cg")
            tl.debug_barrier()  # every thread's part of the partial is written before the flag rises
            tl.atomic_xchg(flag_ptr + pid, 1, sem="release")
        cur = seg_start


def tma_support(device: Any) -> str | None:
    """Why TMA GEMM cannot run on ``device`` (None: it can)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return (f"triton {triton.__version__} has no triton.tools.tensor_descriptor.TensorDescriptor "
                "(host tensor descriptors arrived in Triton 3.4); install triton>=3.4 for gemm_tma")
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        return None  # the interpreter emulates descriptors
    if dev.type != "cuda":
        return f"gemm_tma needs a CUDA device, got {dev}"
    cc = torch.cuda.get_device_capability(dev)
    if torch.version.hip is not None or cc < (9, 0):
        return (f"gemm_tma needs TMA (NVIDIA compute capability >= 9.0); "
                f"{torch.cuda.get_device_name(dev)} has {cc[0]}.{cc[1]}: use kernel 'gemm'")
    return None


def gemm_tma_prepare(a: Any, w: Any, out: Any, params: dict[str, int], *,
                     layout: str = "nk") -> Callable[[], None]:
    """Bind a config to tensors; returns a no-argument launcher. ``BackendError`` if TMA is unavailable."""
    import torch

    why = tma_support(a.device)
    if why:
        raise BackendError(why)
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = w.shape[0] if layout == "nk" else w.shape[1]
    for name, t in (("A", a), ("W", w), ("C", out)):
        if t.stride(-1) != 1 or (t.stride(0) * t.element_size()) % 16:
            raise BackendError(f"gemm_tma: {name} rows must be contiguous and 16-byte aligned "
                               f"(TMA rule); got strides {tuple(t.stride())}, {t.element_size()} B/elem")
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    split_k = params.get("SPLIT_K", 1)
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk] if layout == "nk" else [bk, bn])
    # on the interpreter (no CUDA device): a few programs, so the persistent tile loop is exercised
    num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.device.type == "cuda" else 4
    m_pad = triton.cdiv(M, bm) * bm
    tiles_per_split, _ = k_split(K, bk, split_k)
    units = triton.cdiv(M, bm) * triton.cdiv(N, bn) * split_k
    grid = (min(units, num_sms),)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=params.get("GROUP_M", 8),
                NUM_SMS=num_sms, KN=layout == "kn", SPLIT_K=split_k)
    launch = {"num_warps": params.get("num_warps", 4), "num_stages": params.get("num_stages", 3)}
    if params.get("STREAM_K", 0):
        return _streamk_launcher(a_desc, b_desc, out, (M, N, K), params, num_sms, layout)
    if split_k == 1:
        c_desc = TensorDescriptor.from_tensor(out, [bm, bn])

        def run() -> None:
            _gemm_tma_kernel[grid](a_desc, b_desc, c_desc, M, N, K, tiles_per_split, m_pad, **meta, **launch)
        return run
    if not out.is_contiguous():
        raise BackendError("gemm_tma split-K writes a contiguous output; got a strided one")
    ws = torch.empty((split_k * m_pad, N), device=a.device, dtype=torch.float32)
    w_desc = TensorDescriptor.from_tensor(ws, [bm, bn])
    reduce = splitk_reduce_prepare(ws, out, split_k, split_stride=m_pad * N)

    def run_split() -> None:
        _gemm_tma_kernel[grid](a_desc, b_desc, w_desc, M, N, K, tiles_per_split, m_pad, **meta, **launch)
        reduce()
    return run_split


def _streamk_launcher(a_desc: Any, b_desc: Any, out: Any, dims: tuple[int, int, int], params: dict[str, int],
                      num_sms: int, layout: str) -> Callable[[], None]:
    """One program per SM over a ``[NUM_SMS, BLOCK_M, BLOCK_N]`` fp32 partials workspace and one int32
    flag per program (zeroed once here; every launch leaves them zero again)."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    ws = torch.empty((num_sms, bm, bn), device=out.device, dtype=torch.float32)
    flags = torch.zeros((num_sms,), device=out.device, dtype=torch.int32)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=params.get("GROUP_M", 8), NUM_SMS=num_sms,
                KN=layout == "kn", num_warps=params.get("num_warps", 4), num_stages=params.get("num_stages", 3))

    def run() -> None:
        _gemm_tma_streamk_kernel[(num_sms,)](a_desc, b_desc, c_desc, ws, flags, *dims, **meta)
    return run
