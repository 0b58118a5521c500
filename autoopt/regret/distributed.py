"""The multi-GPU regret options of one GPU count, run by every process of one ``torchrun`` group.

``python -m torch.distributed.run --standalone --nproc_per_node N -m autoopt.regret.distributed --plan P ...``
(:func:`autoopt.regret.run.measure_layouts` starts it). ``P`` is a JSON list of options
(``{"layout", "weights", "batch", "graphs"}``); the group builds each model once and times every batch and
graphs setting on it, so a GPU count costs one process start and one build per layout and format (one
group per option spent ~20 s a row starting torchrun, importing and building):

- ``tensor-parallel``: rank 0 builds the catalog model (random weights, seed 0) and saves it to the shared
  ``--ckpt`` folder; every rank loads it with transformers' own ``tp_plan="auto"`` (its tensor-parallel
  plan: DTensor shards over the group, NCCL or gloo all-reduces) and times the decode step at the
  workload's batch. autoopt's ``optimize()`` is not applied: its fused modules take plain tensors, not
  DTensor shards, so this option runs transformers' 16-bit modules.
- ``replicas``: every rank builds the whole model on its own GPU, ``optimize()``s it into the format and
  times a decode step at ``ceil(batch / N)``: the replicas serve the workload's sequences at once, so the
  slowest rank's step is the workload's.

Rank 0 writes ``--out``: a JSON list in the plan's order, each ``{"measured_ms", "rank_ms", "why"}`` (the
slowest rank's time, every rank's, or the first failing rank's exception), and the group's size and backend.
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
    ap.add_argument("--plan", required=True, help="JSON file: the options, each {layout, weights, batch, graphs}")
    ap.add_argument("--prompt", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--ckpt", required=True, help="folder the tensor-parallel model is saved to and loaded from")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def _build(args: argparse.Namespace, layout: str, weights: str | None, rank: int, device: str) -> Any:
    """The model one layout and format run: a whole optimised replica, or this rank's tensor-parallel shard."""
    import torch
    import transformers

    from autoopt.nn.e2e import build_model

    if layout == "replicas":
        from autoopt.nn.optimize import optimize

        # bf16, as the one-GPU options build it (optimize() quantizes 16-bit weights)
        net = build_model(args.model, dtype="bf16", device=device, tiny=args.tiny, layers=args.layers)
        optimize(net, weights=weights)
        return net
    import torch.distributed as dist

    if rank == 0 and not Path(args.ckpt).is_dir():
        full = build_model(args.model, dtype="bf16", device="cpu", tiny=args.tiny, layers=args.layers)
        full.save_pretrained(args.ckpt)
        del full
    dist.barrier()
    return transformers.AutoModelForCausalLM.from_pretrained(args.ckpt, tp_plan="auto", dtype=torch.bfloat16).eval()


def _time(net: Any, option: dict[str, Any], args: argparse.Namespace, world: int) -> float:
    """This rank's decode step for one option: its share of the batch on a replica, the batch on a shard."""
    from autoopt.nn.e2e import decode_step_ms

    batch = option["batch"] if option["layout"] == "tensor-parallel" else math.ceil(option["batch"] / world)
    return decode_step_ms(net, batch, args.prompt, args.steps, graphed=bool(option["graphs"]))


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _measure_plan(args: argparse.Namespace, plan: list[dict[str, Any]], rank: int, world: int,
                  device: str) -> list[Any]:
    """This rank's time (float) or failure (str) for every option, building once per (layout, weights)."""
    import torch

    mine: list[Any] = [None] * len(plan)
    groups: dict[tuple[str, str | None], list[int]] = {}
    for i, o in enumerate(plan):
        groups.setdefault((o["layout"], o.get("weights")), []).append(i)
    for (layout, weights), idx in groups.items():
        try:
            net = _build(args, layout, weights, rank, device)
        except Exception as exc:  # a format that does not build is every one of its rows' reason
            for i in idx:
                mine[i] = _why(exc)
            continue
        for i in idx:
            try:
                mine[i] = _time(net, plan[i], args, world)
            except Exception as exc:
                mine[i] = _why(exc)
        del net
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return mine


def _merge(times: list[list[Any]]) -> list[dict[str, Any]]:
    """Per option over the ranks: the slowest rank's time, or the first rank's failure."""
    out = []
    for per_rank in zip(*times, strict=True):
        failed = [t for t in per_rank if isinstance(t, str)]
        out.append({"measured_ms": None if failed else max(per_rank), "rank_ms": list(per_rank),
                    "why": failed[0] if failed else None})
    return out


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import torch
    import torch.distributed as dist

    plan = json.loads(Path(args.plan).read_text())
    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cuda:
        torch.cuda.set_device(local)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend)
    try:
        mine = _measure_plan(args, plan, rank, world, f"cuda:{local}" if cuda else "cpu")
        times: list[Any] = [None] * world
        dist.all_gather_object(times, mine)
        if rank == 0:
            Path(args.out).write_text(json.dumps({"results": _merge(times), "world": world, "backend": backend})
                                      + "\n")
        dist.barrier()  # no rank tears down while another still talks to it
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
