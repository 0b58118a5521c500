"""One multi-GPU regret option, run by every process of a ``torchrun`` group.

``python -m torch.distributed.run --standalone --nproc_per_node N -m autoopt.regret.distributed ...``
(:func:`autoopt.regret.run.measure_layout_ms` starts it):

- ``tensor-parallel``: rank 0 builds the catalog model (random weights, seed 0) and saves it to the shared
  ``--ckpt`` folder; every rank loads it with transformers' own ``tp_plan="auto"`` (its tensor-parallel
  plan: DTensor shards over the group, NCCL or gloo all-reduces) and times the decode step at the
  workload's batch. autoopt's ``optimize()`` is not applied: its fused modules take plain tensors, not
  DTensor shards, so this option runs transformers' 16-bit modules.
- ``replicas``: every rank builds the whole model on its own GPU, ``optimize()``s it into the format and
  times a decode step at ``ceil(batch / N)``: the replicas serve the workload's sequences at once, so the
  slowest rank's step is the workload's.

Rank 0 writes ``--out`` (JSON: ``measured_ms``, each rank's time, the group size, the backend).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m autoopt.regret.distributed", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--layout", required=True, choices=("tensor-parallel", "replicas"))
    ap.add_argument("--weights", default=None, help="optimize()'s weights= (replicas; none: 16-bit)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--prompt", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--graphs", action="store_true", help="replay the step from a CUDA graph (CUDA only)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--ckpt", required=True, help="folder the tensor-parallel model is saved to and loaded from")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def _step_ms(args: argparse.Namespace, rank: int, world: int, device: str) -> float:
    """This rank's decode-step time for its part of the layout."""
    import torch
    import transformers

    from autoopt.nn.e2e import build_model, decode_step_ms

    if args.layout == "replicas":
        from autoopt.nn.optimize import optimize

        # bf16, as the one-GPU options build it (optimize() quantizes 16-bit weights)
        net = build_model(args.model, dtype="bf16", device=device, tiny=args.tiny, layers=args.layers)
        optimize(net, weights=args.weights)
        return decode_step_ms(net, math.ceil(args.batch / world), args.prompt, args.steps, graphed=args.graphs)
    import torch.distributed as dist

    if rank == 0:
        full = build_model(args.model, dtype="bf16", device="cpu", tiny=args.tiny, layers=args.layers)
        full.save_pretrained(args.ckpt)
        del full
    dist.barrier()
    net = transformers.AutoModelForCausalLM.from_pretrained(args.ckpt, tp_plan="auto", dtype=torch.bfloat16).eval()
    return decode_step_ms(net, args.batch, args.prompt, args.steps, graphed=args.graphs)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cuda:
        torch.cuda.set_device(local)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend)
    try:
        mine = _step_ms(args, rank, world, f"cuda:{local}" if cuda else "cpu")
        times: list[Any] = [None] * world
        dist.all_gather_object(times, mine)
        if rank == 0:
            Path(args.out).write_text(json.dumps({"measured_ms": max(times), "rank_ms": times, "world": world,
                                                  "layout": args.layout, "backend": backend}) + "\n")
        dist.barrier()  # no rank tears down while another still talks to it
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
