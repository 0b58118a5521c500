"""Probe: the persistent TMA GEMM as 2-CTA clusters (Triton's ``num_ctas=2``), beside the shipped launch.

cuBLAS runs the skinny shapes where the persistent TMA kernel trails it (1000 x 4608 x 3584 at
692 TFLOP/s) with thread-block clusters, whose CTAs share operand tiles through TMA multicast. Triton
exposes clusters only as ``num_ctas``: compiled for sm_90 (Triton 3.9, on a CPU machine), the shipped
kernel with ``num_ctas=2`` splits each output tile over the cluster's two CTAs (a ``CGALayout``; the
W box halves to 128 x 64 at 128 x 256 tiles) and needs 131 KB of shared memory instead of 213 KB.
Whether Triton 3.6 multicasts the shared operand, and what it does to the time, only a GPU says.

It said no (H100, ``h100/tma_cluster_probe.json``). Every 2-CTA cluster launch ran slower than the
same tile launched plainly: 0.35-0.84 of torch.matmul against 0.55-1.0. At 256 x 128 tiles Triton
3.6's LLVM lowering failed outright.

Per shape and tile, against torch.matmul and the zero-shot pick in the same run: ``ctas1`` (the
shipped launch: one program per SM) and ``ctas2`` (half as many programs, each a 2-CTA cluster).
Every output is checked against float64 before it is timed.

    PYTHONPATH=. python benchmarks/tma_cluster_probe.py --out $OUT/tma_cluster_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.hw_limit import environment
from benchmarks.tma_occupancy_probe import bench, checked

SHAPES = ((256, 6144, 4096), (256, 28672, 4096), (333, 7168, 8192), (333, 8192, 3584), (1000, 4608, 3584),
          (77, 9216, 3072), (2047, 3584, 4096), (4096, 4096, 4096), (4096, 28672, 4096))
TILES = ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 8, 5),
         (128, 128, 64, 4, 4), (64, 128, 128, 4, 4))


def launcher(a: Any, w: Any, out: Any, tile: tuple[int, ...], ctas: int) -> Any:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from autoopt.backend.kernels.gemm_tma import _gemm_tma_kernel

    bm, bn, bk, warps, stages = tile
    progs = torch.cuda.get_device_properties(a.device).multi_processor_count // ctas
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


def shape_rows(gpu: Any) -> list[dict[str, Any]]:
    import torch

    from autoopt.backend import runner
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import rank

    rows = []
    for m, n, k in SHAPES:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn((m, k), generator=gen).to("cuda", torch.bfloat16)
        w = (torch.randn((n, k), generator=gen) * k ** -0.5).to("cuda", torch.bfloat16)
        ref = a.double() @ w.double().t()
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        op = OpSpec(kind="gemm", shape=(m, n, k), dtype="bf16")
        pick = rank(gpu, op, top=1, measured=False).best.config
        res = runner.evaluate(op, pick, gpu=gpu, warmup_ms=25, rep_ms=100)
        row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "torch_us": bench(lambda a=a, w=w: a @ w.t()),
                               "pick": {"config": pick.to_dict(), "label": res.label, "us": res.us}, "tiles": {}}
        for tile in TILES:
            row["tiles"]["{}x{}x{}_w{}_s{}".format(*tile)] = {
                f"ctas{c}": checked(launcher(a, w, out, tile, c), out, ref) for c in (1, 2)}
        best = {key: min((c[key]["us"] for c in row["tiles"].values() if c[key].get("us")), default=float("nan"))
                for key in ("ctas1", "ctas2")}
        errors = sorted({c["ctas2"]["error"][:80] for c in row["tiles"].values() if c["ctas2"].get("error")})
        print(f"{row['shape']:16s} torch {row['torch_us']:7.1f} pick {res.us or float('nan'):7.1f} "
              f"best ctas1 {best['ctas1']:7.1f} best ctas2 {best['ctas2']:7.1f} {errors}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main() -> int:
    from autoopt.hardware.detection import detect

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gpu = detect().gpu
    if gpu is None:
        print("tma_cluster_probe: no GPU detected", file=sys.stderr)
        return 2
    t0 = time.time()
    report: dict[str, Any] = {"env": environment(), "gpu": gpu.name, "shapes": shape_rows(gpu)}
    report["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
