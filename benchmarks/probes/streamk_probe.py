"""Probe: where stream-K's time goes in the persistent TMA GEMM, and a version that moves its partials by TMA.

The cost model prices a stream-K K-iteration at 0.70 of a data-parallel one, and the broad suite's
worst shapes (M = 333 / 1000 / 2047: one or two ragged waves of output tiles) are the ones stream-K
exists for. The first run (H200, ``h200/streamk_probe_run1.json``; an earlier version of this script,
whose rows carry ``sk_local`` and ``sk_nofix``) timed the shipped kernel beside a copy with its
hand-over removed (``sk_nofix``: output not checked, a diagnostic only). The hand-over cost 3-17 us a
launch on the skinny shapes (333 x 8192 x 3584 with 128 x 256 tiles: 54.8 against 42.0 us), 41 us at
77 x 3072 x 8192 with 128 x 256 tiles, where 5-6 programs share each tile: more than the idle SMs
stream-K recovers. A copy with the partial's offsets built at their use
(155 registers against 204) ran no faster. At 4096^3, where each SM walks ~8 tiles, stream-K ran 20 %
behind data-parallel even without the hand-over: an SM's contiguous range of tiles is far from its
neighbours', so the tiles in flight share no operands in L2 (data-parallel runs 132 adjacent tiles).
Compiled for sm_90, the kernel converts each fp32 partial between the wgmma accumulator layout and a
blocked one through shared memory, out and in (128 KB at 128 x 256): the second run
(``h200/streamk_probe.json``) removed that with TMA-moved partials, and it ran no faster either.

This version times, per shape and tile, beside torch.matmul and the zero-shot pick in the same run:

- ``dp``: the shipped data-parallel kernel (SPLIT_K = 1) with the same tile;
- ``sk``: the shipped stream-K kernel;
- ``sk_tma``: the same walk with the partials stored and loaded through a TMA descriptor over the
  ``[NUM_SMS * BLOCK_M, BLOCK_N]`` fp32 workspace: they go through shared memory in the accumulator's
  own layout, no conversion (compiled: no fp32 ``convert_layout``; the staging reuses the dead
  pipeline buffers, 164 KB at 128 x 128 x 64 with 5 stages);
- ``hybrid_tma``: where the tiles span more than two waves, all but the last partial wave and one
  full wave before it run data-parallel (the flattened loop, adjacent tiles), and ``sk_tma`` the rest
  (CUTLASS's DP + stream-K split): each SM's stream-K share is one to two tiles.

Every output is checked against float64 before it is timed.

    PYTHONPATH=. python benchmarks/probes/streamk_probe.py --out $OUT/streamk_probe.json
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoopt.backend.kernels.gemm_tma import _tile_of
from benchmarks.probes.probe_kit import probe_main, tile_rows

SHAPES = ((1000, 4608, 3584), (333, 7168, 8192), (333, 8192, 3584), (2047, 3584, 4096), (256, 6144, 4096),
          (77, 3072, 8192), (512, 8192, 3584), (4095, 2560, 8192), (2047, 8192, 3584), (4096, 4096, 4096),
          (333, 128256, 4096))
TILES = ((128, 128, 64, 8, 5), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3))


@triton.jit
def _sk_tma(a_desc, b_desc, c_desc, w_desc, flag_ptr, M, N, K, DP_TILES,  # type: ignore[no-untyped-def]
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    """Tiles [0, DP_TILES) data-parallel (the shipped flattened loop), then stream-K over the rest with the
    shipped backward walk; the fp32 partials go through TMA (``w_desc`` over [NUM_SMS * BLOCK_M, BLOCK_N]),
    so they leave and enter registers in the accumulator's own layout (no 128 KB layout conversion)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(pid, DP_TILES, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
    total = (num_pid_m * num_pid_n - DP_TILES) * k_tiles
    start = pid * total // NUM_SMS
    cur = (pid + 1) * total // NUM_SMS
    while cur > start:
        local = (cur - 1) // k_tiles
        seg_start = tl.maximum(start, local * k_tiles)
        pid_m, pid_n = _tile_of(DP_TILES + local, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(seg_start - local * k_tiles, cur - local * k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if cur == (local + 1) * k_tiles:
            first = ((local * k_tiles + 1) * NUM_SMS - 1) // total
            for c in range(first, pid):
                if (c + 1) * total // NUM_SMS > c * total // NUM_SMS:
                    flag = tl.atomic_add(flag_ptr + c, 0, sem="acquire")
                    while flag == 0:
                        flag = tl.atomic_add(flag_ptr + c, 0, sem="acquire")
                    acc += w_desc.load([c * BLOCK_M, 0])
                    tl.atomic_xchg(flag_ptr + c, 0)
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
        else:
            w_desc.store([pid * BLOCK_M, 0], acc)
            tl.debug_barrier()
            tl.atomic_xchg(flag_ptr + pid, 1, sem="release")
        cur = seg_start


def dp_tiles(tiles: int, sms: int) -> int:
    """Tiles left data-parallel in the hybrid: all but the last partial wave and one full wave before it
    (CUTLASS's DP + stream-K split), so every SM's stream-K share is one to two tiles; 0 below two waves."""
    if tiles % sms == 0:
        return tiles
    return max(0, (tiles // sms - 1) * sms)


def tma_launcher(a: Any, w: Any, out: Any, tile: tuple[int, ...], hybrid: bool) -> Any:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, warps, stages = tile
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    a_d = TensorDescriptor.from_tensor(a, [bm, bk])
    b_d = TensorDescriptor.from_tensor(w, [bn, bk])
    c_d = TensorDescriptor.from_tensor(out, [bm, bn])
    ws = torch.empty((sms * bm, bn), device=a.device, dtype=torch.float32)
    w_d = TensorDescriptor.from_tensor(ws, [bm, bn])
    flags = torch.zeros((sms,), device=a.device, dtype=torch.int32)
    m, n, k = a.shape[0], w.shape[0], a.shape[1]
    dp = dp_tiles(triton.cdiv(m, bm) * triton.cdiv(n, bn), sms) if hybrid else 0

    def run() -> None:
        _sk_tma[(sms,)](a_d, b_d, c_d, w_d, flags, m, n, k, dp, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                        NUM_SMS=sms, num_warps=warps, num_stages=stages)
    return run


def shipped(a: Any, w: Any, out: Any, tile: tuple[int, ...], *, stream_k: int) -> Any:
    """The shipped ``gemm_tma`` launcher, data-parallel (``stream_k=0``) or stream-K."""
    from autoopt.backend.kernels.gemm_tma import gemm_tma_prepare

    bm, bn, bk, warps, stages = tile
    return gemm_tma_prepare(a, w, out, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_K": 1,
                                        "STREAM_K": stream_k, "num_warps": warps, "num_stages": stages})


def hybrid_launcher(a: Any, w: Any, out: Any, tile: tuple[int, ...]) -> Any:
    """``tma_launcher`` with a data-parallel head, where the tiles span more than two waves (else None)."""
    import torch

    tiles = triton.cdiv(a.shape[0], tile[0]) * triton.cdiv(w.shape[0], tile[1])
    dp = dp_tiles(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count)
    return tma_launcher(a, w, out, tile, True) if 0 < dp < tiles else None


VARIANTS = {"dp": partial(shipped, stream_k=0), "sk": partial(shipped, stream_k=1),
            "sk_tma": partial(tma_launcher, hybrid=False), "hybrid_tma": hybrid_launcher}


def main() -> int:
    return probe_main("streamk_probe", __doc__ or "", "shapes",
                      lambda gpu, _copy: tile_rows(gpu, SHAPES, TILES, VARIANTS))


if __name__ == "__main__":
    sys.exit(main())
