"""``autoopt check memory|pipeline|all``: autoopt's memory and step-time predictions against this GPU
(see :mod:`autoopt.validation`; this is the one module that imports it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autoopt.cli._common import FORMATS, UsageError, add_profile_arg, chosen_profile, emit

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers
    from autoopt.validation.run import CheckRun
    from autoopt.validation.workload import CheckOptions


def register(sub: Subparsers) -> None:
    """Add ``check``."""
    sp = sub.add_parser("check", help="run a Llama-shaped model on this GPU: predicted vs measured memory, step time")
    sp.add_argument("which", choices=("memory", "pipeline", "all"), metavar="memory|pipeline|all",
                    help="memory: allocator peak on one GPU; pipeline: 2-stage step time on two GPUs")
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
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.add_argument("--out", metavar="FILE", help="also write the result file (JSON)")
    sp.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    """``autoopt check memory|pipeline|all``: autoopt's memory and step-time predictions against this GPU."""
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
