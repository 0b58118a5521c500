"""Check autoopt's whole-model predictions (memory, pipeline step time) against a real GPU run.

The checks live in :mod:`autoopt.validation` (also ``autoopt check memory|pipeline``); this script runs
them with the committed runs' defaults and writes the result file. Usage (repository root, on the GPU host)::

    PYTHONPATH=. python benchmarks/model_checks.py --check all --out benchmarks/results/model_checks_h200x2.json
    PYTHONPATH=. python benchmarks/model_checks.py --check memory --out mem.json --layers 4  # one GPU

Exit status: 0 when the checks ran (pass/fail of each target is in the JSON and the
table), 1 when a check raised, 2 when torch sees no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.errors import AutooptError
from autoopt.validation.run import CheckRun, run_checks
from autoopt.validation.table import summary_table
from autoopt.validation.workload import CheckOptions, OptionError


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, CheckOptions]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--check", choices=("memory", "pipeline", "all"), default="all")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--layers", type=int, default=4, help="layers of the memory-check model")
    ap.add_argument("--pipeline-layers", type=int, default=8, help="layers of the pipeline-check model")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--gen-len", type=int, default=16, help="decode steps of the memory check")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps-prefill", type=int, default=10)
    ap.add_argument("--reps-decode", type=int, default=50)
    ap.add_argument("--profile", help="known profile name or file to predict with (default: detect this machine)")
    ap.add_argument("--no-measure-profile", action="store_true",
                    help="skip the second prediction with measured bandwidth and bf16 rate")
    ap.add_argument("--no-cuda-graphs", action="store_true", help="time decode eagerly only")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        options = CheckOptions(layers=args.layers, pipeline_layers=args.pipeline_layers, batch=args.batch,
                               prompt_len=args.prompt_len, gen_len=args.gen_len, warmup=args.warmup,
                               reps_prefill=args.reps_prefill, reps_decode=args.reps_decode,
                               cuda_graphs=not args.no_cuda_graphs, seed=args.seed)
    except OptionError as exc:
        ap.error(str(exc))
    return args, options


def _write(path: Path, run: CheckRun) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run.to_dict(), indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    args, options = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    recorded: dict[str, Any] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    try:
        profiles = None
        if args.profile:
            from autoopt.api import load_profile

            profiles = {f"profile:{args.profile}": load_profile(args.profile)}
        run = run_checks(args.check, options, profiles=profiles, measure_profile=not args.no_measure_profile,
                         args=recorded, argv=sys.argv[1:], on_partial=lambda partial: _write(args.out, partial))
    except AutooptError as exc:  # no torch, no CUDA device or an unknown profile: nothing measured or written
        sys.stdout.write(f"model_checks: {exc}\n")
        return 2
    _write(args.out, run)
    sys.stdout.write(summary_table(run.to_dict()) + f"\n\nwrote {args.out} ({run.elapsed_s} s)\n")
    return 1 if run.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
