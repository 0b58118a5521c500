"""Where a tensor-parallel decode step's GPU time goes: transformers' ``tp_plan="auto"`` under torchrun (issue 29).

The regret runs measured transformers' tensor-parallel Llama-3-8B (8 layers) at 1.59-2.79 ms a graphed decode
step on 2 and 4 H100s, against recommend()'s 0.70-1.20 ms. This traces the same step, replayed from one CUDA
graph, with the profiler on every rank, and the same model unsharded on one GPU (transformers' own modules,
no optimize()), so each kernel class's time can be set beside its 1/N share.

    python -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/tp_trace.py --out tp_trace.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = 128


def _trace(replay: Any, steps: int, barrier: Any = None) -> dict[str, Any]:
    """Kernel GPU time per class per step over ``steps`` replays, and the replays' wall time."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from autoopt.trace import summary_of

    for _ in range(5):
        replay()
    torch.cuda.synchronize()
    if barrier:
        barrier()
    t0 = time.perf_counter()
    for _ in range(20):
        replay()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) / 20 * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json.gz"
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                replay()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
        s = summary_of(path).to_dict()
    # the summary's steps come from the trace's step markers; a graph replay has none: divide by the replays
    return {"label": "measured (profiler trace of graph replays, kernels' GPU time)", "replays": steps,
            "wall_ms_per_step": round(wall_ms, 4), "gpu_kernel_us_per_step": round(s["total_us"] / steps, 1),
            "by_class_per_step": {c: {"us": round(v["us"] / steps, 2), "launches": v["launches"] / steps}
                                  for c, v in sorted(s["by_class"].items(), key=lambda kv: -kv[1]["us"])},
            "top_kernels": [{**t, "us_per_step": round(t["us"] / steps, 2)} for t in s["top"][:25]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist
    import transformers

    from autoopt.backend.software import versions
    from autoopt.nn.e2e import build_model, capture_decode_step

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    batches = [int(b) for b in args.batches.split(",")]
    out: dict[str, Any] = {"env": {"device": torch.cuda.get_device_name(0), **versions()}, "model": args.model,
                           "layers": args.layers, "world": world, "tensor_parallel": {}, "one_gpu": {}}
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        shared = [str(Path(tmp) / "ckpt")]
        dist.broadcast_object_list(shared, src=0)  # every rank loads rank 0's folder (each made its own tmp)
        ckpt = Path(shared[0])
        if rank == 0:
            build_model(args.model, dtype="bf16", device="cpu", layers=args.layers).save_pretrained(ckpt)
        dist.barrier()
        tp = transformers.AutoModelForCausalLM.from_pretrained(ckpt, tp_plan="auto", dtype=torch.bfloat16).eval()
        for b in batches:
            out["tensor_parallel"][str(b)] = _trace(capture_decode_step(tp, b, PROMPT, PROMPT + 64).replay,
                                                    args.steps, dist.barrier)
        del tp
        torch.cuda.empty_cache()
        dist.barrier()
        if rank == 0:
            one = build_model(args.model, dtype="bf16", device="cuda", layers=args.layers)
            for b in batches:
                out["one_gpu"][str(b)] = _trace(capture_decode_step(one, b, PROMPT, PROMPT + 64).replay, args.steps)
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
