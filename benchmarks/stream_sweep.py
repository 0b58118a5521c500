"""Time many valid configs of the memory-bound kernels on a real GPU, to calibrate their model.

For decode GEMV (M = 1 and 16), SiLU-mul, add and RMSNorm at the LLM suite's
shapes, the ranking lists every valid config (no timing); this script times the
``--best`` best-predicted ones plus an even spread of ``--spread`` others through
the backend runner (correctness first), and writes measured next to predicted.

    PYTHONPATH=. python benchmarks/stream_sweep.py --out stream.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.backend import bench, runner
from autoopt.hardware.detection import detect
from autoopt.kernels.ops import OpSpec
from autoopt.search.ranking import rank, validate_config

OPS = [
    OpSpec(kind="gemv", shape=(1, 6144, 4096)), OpSpec(kind="gemv", shape=(1, 28672, 4096)),
    OpSpec(kind="gemv", shape=(1, 4096, 14336)), OpSpec(kind="gemv", shape=(16, 28672, 4096)),
    OpSpec(kind="gemv", shape=(16, 4096, 14336)), OpSpec(kind="gemv", shape=(16, 6144, 4096)),
    OpSpec(kind="gemv", shape=(16, 4096, 4096)),
    OpSpec(kind="silu_mul", shape=(4096, 16384)), OpSpec(kind="add", shape=(4096, 16384)),
    OpSpec(kind="rmsnorm", shape=(4096, 4096)), OpSpec(kind="rmsnorm", shape=(16384, 8192)),
]
#: issue 13's shapes at the bandwidth limit: few wide norm rows, and decode weights >= 200 MB
WIDE = [
    OpSpec(kind="rmsnorm", shape=(64, 262144)), OpSpec(kind="rmsnorm", shape=(256, 131072)),
    OpSpec(kind="rmsnorm", shape=(1024, 65536)), OpSpec(kind="rmsnorm", shape=(4096, 4096)),
    OpSpec(kind="gemv", shape=(1, 28672, 4096)), OpSpec(kind="gemv", shape=(1, 128256, 4096)),
]

#: issue 13's broad-suite shapes furthest below torch.matmul (``hw_limit_fixup.json``, both GPUs):
#: odd token counts and tensor-parallel shards, where the decomposition and tile choice matter most
BROAD_WORST = [
    OpSpec(kind="gemm", shape=(77, 9216, 3072)), OpSpec(kind="gemm", shape=(77, 3072, 3072)),
    OpSpec(kind="gemm", shape=(77, 3072, 8192)), OpSpec(kind="gemm", shape=(333, 8192, 3584)),
    OpSpec(kind="gemm", shape=(333, 7168, 8192)), OpSpec(kind="gemm", shape=(1000, 4608, 3584)),
    OpSpec(kind="gemm", shape=(512, 1280, 8192)), OpSpec(kind="gemm", shape=(333, 8192, 1024)),
]
SETS = {"llm": OPS, "wide": WIDE, "broad": BROAD_WORST}


def _per_class(cands: list, n: int) -> list:
    """The ``n`` best-predicted configs of each (kernel, SPLIT_K, STREAM_K, num_warps) class: the
    decompositions and warp counts the top of the ranking may never reach."""
    seen: dict[tuple, int] = {}
    out = []
    for c in cands:
        p = c.config.params
        cls = (c.config.kernel, p.get("SPLIT_K", 1), p.get("STREAM_K", 0), p.get("num_warps"))
        if seen.get(cls, 0) < n:
            seen[cls] = seen.get(cls, 0) + 1
            out.append(c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--best", type=int, default=20)
    ap.add_argument("--spread", type=int, default=20)
    ap.add_argument("--only", default="", help="only ops whose label contains this text")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop starting new ops after this")
    ap.add_argument("--set", choices=tuple(SETS), default="llm", help="the op set: llm suite, wide/large, broad worst")
    ap.add_argument("--per-class", type=int, default=0, help="also the N best of each (kernel, split, warps) class")
    args = ap.parse_args()
    gpu = detect().gpu
    if gpu is None:
        print("stream_sweep: no GPU detected", file=sys.stderr)
        return 2
    t0 = time.time()
    report: dict = {"gpu": gpu.name, "versions": runner._versions(), "ops": []}
    for op in SETS[args.set]:
        if args.only not in op.label():
            continue
        if time.time() - t0 > args.budget_s:
            break
        cands = rank(gpu, op, top=100000, measured=False).candidates
        step = max(1, (len(cands) - args.best) // max(1, args.spread))
        chosen = list(cands[:args.best]) + list(cands[args.best::step])[:args.spread]
        if args.per_class:
            keys = {c.config.key() for c in chosen}
            chosen += [c for c in _per_class(list(cands), args.per_class) if c.config.key() not in keys]
        rows = []
        for c in chosen:
            res = runner.evaluate(op, c.config, gpu=gpu, validate=lambda o, k: validate_config(gpu, o, k),
                                  warmup_ms=5, rep_ms=25)
            rows.append({"config": c.config.to_dict(), "predicted_us": round(c.predicted_us, 3), "label": res.label,
                         "measured_us": res.us, "gbs": res.gbs, "reason": res.reason[:200]})
        torch_us = bench._torch_us(op, 0, 5, 25)
        meas = [r for r in rows if r["label"] == "measured"]
        best = min(meas, key=lambda r: r["measured_us"]) if meas else None
        report["ops"].append({"op": op.to_dict(), "n_valid": len(cands), "torch_us": torch_us, "rows": rows})
        print(f"{op.label():32s} valid {len(cands):5d} timed {len(meas):3d}  top1 {rows[0]['measured_us']}  "
              f"best {best and best['measured_us']} ({best and best['config']['config']})  torch {torch_us}",
              flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    report["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
