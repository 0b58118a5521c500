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

    PYTHONPATH=. python benchmarks/tma_occupancy_probe.py --out $OUT/tma_occupancy_probe.json
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

SHAPES = ((256, 6144, 4096), (256, 28672, 4096), (256, 4096, 14336), (333, 7168, 8192), (333, 8192, 3584),
          (333, 1280, 8192), (1000, 4608, 3584), (77, 3072, 8192), (77, 9216, 3072), (512, 8192, 3584),
          (2047, 3584, 4096))
#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): each fits twice in the 227 KB an H100/H200 SM has
TILES = ((64, 128, 64, 4, 4), (64, 128, 64, 4, 3), (128, 64, 64, 4, 4), (128, 128, 32, 4, 4), (128, 128, 32, 8, 4),
         (64, 128, 128, 4, 2), (64, 256, 64, 4, 2), (64, 64, 128, 4, 3))


def bench(fn: Any) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def launcher(a: Any, w: Any, out: Any, tile: tuple[int, ...], per_sm: int) -> Any:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from autoopt.backend.kernels.gemm_tma import _gemm_tma_kernel

    bm, bn, bk, warps, stages = tile
    progs = torch.cuda.get_device_properties(a.device).multi_processor_count * per_sm
    a_d = TensorDescriptor.from_tensor(a, [bm, bk])
    b_d = TensorDescriptor.from_tensor(w, [bn, bk])
    c_d = TensorDescriptor.from_tensor(out, [bm, bn])
    m, n, k = a.shape[0], w.shape[0], a.shape[1]
    grid = (min(progs, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

    def run() -> None:
        _gemm_tma_kernel[grid](a_d, b_d, c_d, m, n, k, triton.cdiv(k, bk), m, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                               GROUP_M=8, NUM_SMS=progs, KN=False, SPLIT_K=1, num_warps=warps, num_stages=stages)
    return run


def checked(run: Any, out: Any, ref: Any) -> dict[str, Any]:
    import torch

    try:
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
    except Exception as exc:  # a variant this triton cannot compile is data, not a crash
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    err = float((out.double() - ref).norm() / ref.norm())
    if not err < 1e-2:
        return {"error": f"wrong output: relative error {err:.3g}", "rel_err": err}
    return {"us": bench(run), "rel_err": err}


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
                f"x{per_sm}": checked(launcher(a, w, out, tile, per_sm), out, ref) for per_sm in (1, 2)}
        best = {key: min((c[key]["us"] for c in row["tiles"].values() if c[key].get("us")), default=float("nan"))
                for key in ("x1", "x2")}
        print(f"{row['shape']:16s} torch {row['torch_us']:7.1f} pick {res.us or float('nan'):7.1f} "
              f"best x1 {best['x1']:7.1f} best x2 {best['x2']:7.1f}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main() -> int:
    from autoopt.hardware.detection import detect

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gpu = detect().gpu
    if gpu is None:
        print("tma_occupancy_probe: no GPU detected", file=sys.stderr)
        return 2
    t0 = time.time()
    report: dict[str, Any] = {"env": environment(), "gpu": gpu.name, "shapes": shape_rows(gpu)}
    report["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
