"""Probe: the persistent TMA GEMM as 2-CTA clusters (Triton's ``num_ctas=2``), beside the shipped launch.

cuBLAS runs the skinny shapes where the persistent TMA kernel trails it (1000 x 4608 x 3584 at
692 TFLOP/s) with thread-block clusters, whose CTAs share operand tiles through TMA multicast. Triton
exposes clusters only as ``num_ctas``: compiled for sm_90 (Triton 3.9, on a CPU machine), the shipped
kernel with ``num_ctas=2`` splits each output tile over the cluster's two CTAs (a ``CGALayout``; the
W box halves to 128 x 64 at 128 x 256 tiles) and needs 131 KB of shared memory instead of 213 KB.
Whether Triton 3.6 multicasts the shared operand, and what it does to the time, only a GPU says.

It said no, the same way in two H100 runs (``h100/tma_cluster_probe.json``, ``..._run2.json``). Of
the 36 tile-and-shape pairs that launched both ways, the cluster was slower in 34, reading 0.35-0.84
of torch.matmul. The 2 it won were the same in both runs: 128 x 256 x 64 tiles at 256 x 6144 x 4096 and
77 x 9216 x 3072 (48.8 against 52.7 us at the first), over a tile a quarter slower than the zero-shot
pick (38.5 us). At 256 x 128 tiles Triton 3.6's LLVM lowering failed outright.

Per shape and tile, against torch.matmul and the zero-shot pick in the same run: ``ctas1`` (the
shipped launch: one program per SM) and ``ctas2`` (half as many programs, each a 2-CTA cluster).
Every output is checked against float64 before it is timed.

    PYTHONPATH=. python benchmarks/probes/tma_cluster_probe.py --out $OUT/tma_cluster_probe.json
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.probe_kit import probe_main, tile_rows
from benchmarks.probes.tma_occupancy_probe import persistent_launcher

SHAPES = ((256, 6144, 4096), (256, 28672, 4096), (333, 7168, 8192), (333, 8192, 3584), (1000, 4608, 3584),
          (77, 9216, 3072), (2047, 3584, 4096), (4096, 4096, 4096), (4096, 28672, 4096))
TILES = ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 8, 5),
         (128, 128, 64, 4, 4), (64, 128, 128, 4, 4))


def main() -> int:
    variants = {f"ctas{c}": partial(persistent_launcher, ctas=c) for c in (1, 2)}
    return probe_main("tma_cluster_probe", __doc__ or "", "shapes",
                      lambda gpu, _copy: tile_rows(gpu, SHAPES, TILES, variants))


if __name__ == "__main__":
    sys.exit(main())
