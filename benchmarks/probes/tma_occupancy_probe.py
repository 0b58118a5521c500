"""Probe: two persistent TMA programs per SM for the skinny GEMMs (issue 13: M = 77 .. 1000 shapes).

The persistent TMA kernel launches one program per SM (``NUM_SMS`` programs walking the tiles with
that stride), so an SM holds one CTA however small its tile. At 256 x 6144 x 4096 with 128 x 128 x 64
tiles, one tile per SM, the H200 ran 0.53 us per K-iteration where the MMAs need ~0.35: with 4
stages in flight, 128 KB of operands per SM, the SM waits on L2 latency. Two CTAs per SM double what
is in flight where their shared memory fits twice (<= 113 KB each: 64 x 128 x 64 with 4 stages is
112 KB with its epilogue tile). The kernel needs no change: ``NUM_SMS`` is only the program count
and stride. Per shape and tile, against torch.matmul and the zero-shot pick in the same run:
``x1`` (one program per SM, as shipped) and ``x2`` (two). Every output is checked against float64
before it is timed.

    PYTHONPATH=. python benchmarks/probes/tma_occupancy_probe.py --out $OUT/tma_occupancy_probe.json
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.probe_kit import probe_main, tile_rows

SHAPES = ((256, 6144, 4096), (256, 28672, 4096), (256, 4096, 14336), (333, 7168, 8192), (333, 8192, 3584),
          (333, 1280, 8192), (1000, 4608, 3584), (77, 3072, 8192), (77, 9216, 3072), (512, 8192, 3584),
          (2047, 3584, 4096))
#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): each fits twice in the 227 KB an H100/H200 SM has
TILES = ((64, 128, 64, 4, 4), (64, 128, 64, 4, 3), (128, 64, 64, 4, 4), (128, 128, 32, 4, 4), (128, 128, 32, 8, 4),
         (64, 128, 128, 4, 2), (64, 256, 64, 4, 2), (64, 64, 128, 4, 3))


def persistent_launcher(a: Any, w: Any, out: Any, tile: tuple[int, ...], *, per_sm: int = 1, ctas: int = 1) -> Any:
    """The shipped persistent TMA kernel (SPLIT_K = 1) over ``per_sm x SMs / ctas`` programs, each a
    cluster of ``ctas`` CTAs (Triton's ``num_ctas``); ``NUM_SMS`` is only the program count and stride."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from autoopt.backend.kernels.gemm_tma import _gemm_tma_kernel

    bm, bn, bk, warps, stages = tile
    progs = torch.cuda.get_device_properties(a.device).multi_processor_count * per_sm // ctas
    a_d = TensorDescriptor.from_tensor(a, [bm, bk])
    b_d = TensorDescriptor.from_tensor(w, [bn, bk])
    c_d = TensorDescriptor.from_tensor(out, [bm, bn])
    m, n, k = a.shape[0], w.shape[0], a.shape[1]
    grid = (min(progs, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

    def run() -> None:
        _gemm_tma_kernel[grid](a_d, b_d, c_d, m, n, k, triton.cdiv(k, bk), m, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                               GROUP_M=8, NUM_SMS=progs, KN=False, SPLIT_K=1, num_warps=warps, num_stages=stages,
                               num_ctas=ctas)
    return run


def main() -> int:
    variants = {f"x{n}": partial(persistent_launcher, per_sm=n) for n in (1, 2)}
    return probe_main("tma_occupancy_probe", __doc__ or "", "shapes",
                      lambda gpu, _copy: tile_rows(gpu, SHAPES, TILES, variants))


if __name__ == "__main__":
    sys.exit(main())
