"""``autoopt check memory|pipeline|all``: autoopt's memory and step-time predictions against this GPU
(see :mod:`autoopt.validation`; this is the one module that imports it); ``autoopt check regret``: whether
recommend()'s choices measure fastest here (:mod:`autoopt.regret`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt._files import write_atomic
from autoopt.cli._common import FORMATS, UsageError, add_profile_arg, chosen_profile, emit

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers
    from autoopt.validation.run import CheckRun
    from autoopt.validation.workload import CheckOptions


def register(sub: Subparsers) -> None:
    """Add ``check``."""
    sp = sub.add_parser("check", help="run a Llama-shaped model on this GPU: predicted vs measured memory, step time")
    sp.add_argument("which", choices=("memory", "pipeline", "all", "regret"), metavar="memory|pipeline|all|regret",
                    help="memory: allocator peak on one GPU; pipeline: 2-stage step time on two GPUs; regret: "
                         "each alternative recommend() weighs, measured, against its pick")
    sp.add_argument("--model", default="llama-3-8b", help="catalog model whose shapes are built (dense Llama-style)")
    sp.add_argument("--layers", type=int, default=4, help="layers of the memory-check model")
    sp.add_argument("--pipeline-layers", dest="pipeline_layers", type=int, default=8,
                    help="layers of the pipeline-check model")
    sp.add_argument("--batch", type=int, default=4)
    sp.add_argument("--prompt-len", dest="prompt_len", type=int, default=1024)
    sp.add_argument("--gen-len", dest="gen_len", type=int, default=16, help="decode steps of the memory check")
    sp.add_argument("--warmup", type=int, default=3)
    sp.add_argument("--reps-prefill", dest="reps_prefill", type=int, default=10)
    sp.add_argument("--reps-decode", dest="reps_decode", type=int, default=50)
    add_profile_arg(sp)
    sp.add_argument("--no-measure-profile", dest="no_measure_profile", action="store_true",
                    help="skip the second prediction with measured bandwidth and bf16 rate")
    sp.add_argument("--no-cuda-graphs", dest="no_cuda_graphs", action="store_true", help="time decode eagerly only")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--batches", default="1,8,32", help="regret: the workloads' batches (default %(default)s)")
    sp.add_argument("--formats", help="regret: weight formats to try (default: all the autoopt runtime runs here)")
    sp.add_argument("--gpus", type=int, default=1, help="regret: GPUs of this host; from 2, tensor-parallel and "
                    "replica layouts too, each under torchrun (default 1)")
    sp.add_argument("--tiny", action="store_true", help="regret: a tiny model of the same family (CPU, CI)")
    sp.add_argument("--steps", type=int, default=20, help="regret: timed decode steps per option (default 20)")
    sp.add_argument("--budget-s", dest="budget_s", type=float, help="regret: measure batch by batch (each GPU "
                    "layout group too) and start no batch the slowest so far says would end past this many seconds")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.add_argument("--out", metavar="FILE", help="also write the result file (JSON)")
    sp.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    """``autoopt check memory|pipeline|all``: autoopt's memory and step-time predictions against this GPU."""
    if args.which == "regret":
        return _regret(args)
    from autoopt.validation.run import run_checks
    from autoopt.validation.table import summary_table

    options = _options(args)
    out = Path(args.out) if args.out else None
    if out is not None and not out.resolve().parent.is_dir():
        raise UsageError(f"check: cannot write {args.out!r}: its folder does not exist")

    def write(run: CheckRun) -> None:  # also after the memory check: kept if the pipeline check dies
        if out is not None:
            out.write_text(json.dumps(run.to_dict(), indent=2) + "\n")

    profiles = {f"profile:{args.profile}": chosen_profile(args.profile)} if args.profile else None
    run = run_checks(args.which, options, profiles=profiles, measure_profile=not args.no_measure_profile,
                     argv=sys.argv[1:], on_partial=write)
    write(run)
    if out is not None:
        print(f"wrote {out}", file=sys.stderr)
    data = run.to_dict()
    emit(data, args.format, summary_table(data))
    return 1 if run.failed else 0


def _options(args: argparse.Namespace) -> CheckOptions:
    """The checks' workload and timing options from the command line."""
    from autoopt.validation.workload import CheckOptions

    return CheckOptions(model=args.model, layers=args.layers, pipeline_layers=args.pipeline_layers,
                        batch=args.batch, prompt_len=args.prompt_len, gen_len=args.gen_len, warmup=args.warmup,
                        reps_prefill=args.reps_prefill, reps_decode=args.reps_decode,
                        cuda_graphs=not args.no_cuda_graphs, seed=args.seed)


def _regret(args: argparse.Namespace) -> int:
    """``autoopt check regret``: measure each alternative here and score recommend()'s pick."""
    from autoopt.regret import parse_batches
    from autoopt.regret.run import run_regret

    batches = parse_batches(args.batches)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip()) if args.formats else None
    if not 1 <= args.steps <= 10_000:
        raise UsageError(f"check regret: --steps {args.steps} is out of range; expected 1 to 10000")
    if args.layers is not None and not 1 <= args.layers <= 1000:
        raise UsageError(f"check regret: --layers {args.layers} is out of range; expected 1 to 1000")
    if args.budget_s is not None and not 1 <= args.budget_s <= 86_400:  # also NaN
        raise UsageError(f"check regret: --budget-s {args.budget_s:g} is out of range; expected 1 to 86400 seconds")
    out = Path(args.out) if args.out else None
    if out is not None and not out.resolve().parent.is_dir():
        raise UsageError(f"check regret: cannot write {args.out!r}: its folder does not exist")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and args.gpus > torch.cuda.device_count():
        raise UsageError(f"check regret: --gpus {args.gpus} is more than this host's {torch.cuda.device_count()} "
                         "GPUs; expected 1 to that count")

    def progress(partial: Any) -> None:  # the table so far after each batch: a run cut short keeps it
        data = partial.to_dict()
        if out is not None:
            write_atomic(out, json.dumps(data, indent=2) + "\n")
        print(_workload_line(data["workloads"][-1]), file=sys.stderr)

    run = run_regret(args.model, chosen_profile(args.profile), device=device, gpus=args.gpus, batches=batches,
                     formats=formats, layers=args.layers, tiny=args.tiny, steps=args.steps, on_progress=progress,
                     budget_s=args.budget_s)
    data = run.to_dict()
    if out is not None:
        write_atomic(out, json.dumps(data, indent=2) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    emit(data, args.format, _regret_table(data))
    return 0


def _workload_line(w: dict[str, Any]) -> str:
    regret = "-" if w["regret"] is None else f"{100 * w['regret']:.1f} %"
    return (f"batch {w['batch']}: recommended {w['recommended'] or '-'} ({w['recommended_reason']}), "
            f"measured best {w['measured_best']}, regret {regret}")


def _regret_table(data: dict[str, Any]) -> str:
    lines = [f"{data['model']} ({data['layers'] or 'all'} layers) measured on {data['device']}, predicted for "
             f"{data['predicted_for']}"]
    for w in data["workloads"]:
        lines.append(_workload_line(w))
        for r in w["options"]:
            pred = "-" if r["predicted_ms"] is None else f"{r['predicted_ms']:.3f}"
            meas = "-" if r["measured_ms"] is None else f"{r['measured_ms']:.3f}"
            lines.append(f"  {r['label']:<34} predicted {pred:>9} ms  measured {meas:>9} ms  {r['why']}")
    lines += [f"note: {n}" for n in data["notes"]]
    return "\n".join(lines)
