"""``autoopt bench``: compile, check and time the recommended configs of some ops against torch (here or on a
fleet), or a whole catalog model end to end (``--model``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt.cli._common import FORMATS, UsageError, add_fleet_args, add_profile_arg, chosen_profile, emit, fleet_wanted

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers
    from autoopt.kernels.ops import OpSpec


def register(sub: Subparsers) -> None:
    """Add ``bench``."""
    sp = sub.add_parser("bench", help="compile, check and time recommended configs against torch")
    sp.add_argument("--suite", default=None, help="op suite (llm); default llm unless --op is given")
    sp.add_argument("--op", help="one op kind instead of a suite")
    sp.add_argument("--shape", help="shape for --op")
    sp.add_argument("--top", type=int, default=1, help="the K best-predicted configs of each op (1..50, default 1)")
    sp.add_argument("--dtype", default="bf16")
    add_profile_arg(sp)
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.add_argument("--out", metavar="FILE", help="write the results as JSON")
    sp.add_argument("--plot", metavar="FILE", help="write a roofline chart (PNG)")
    sp.add_argument("--model", help="end to end on a catalog model: eager, torch.compile, autoopt.optimize, both")
    sp.add_argument("--weights", metavar="FORMAT",
                    help="with --model: the autoopt.optimize variants quantize the weights into FORMAT "
                         "(optimize(weights=...): fp8, fp8-wo, int8, int4, int4-asym, auto)")
    add_fleet_args(sp)
    sp.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """``autoopt bench``: --model end to end, else the ops of --op/--suite, here or on a fleet (--gpus|--ray)."""
    if args.model:
        return _bench_model(args)
    from autoopt.backend import bench

    ops = _ops(args)
    if not 1 <= args.top <= 50:
        raise UsageError(f"bench: --top must be in 1..50, got {args.top}")
    for target in (args.out, args.plot):
        if target and not Path(target).resolve().parent.is_dir():
            raise UsageError(f"cannot write {target!r}: its folder does not exist")
    rows, gpu, data = _bench_fleet(args, ops) if fleet_wanted(args, "bench") else _bench_here(args, ops)
    _write_files(args, rows, gpu, data)
    emit(data, args.format, bench.format_table(rows))
    return 0


def _ops(args: argparse.Namespace) -> list[OpSpec]:
    """The ops to benchmark: --op with its --shape, else the ops of --suite (default llm)."""
    from autoopt.kernels.ops import OpSpec, parse_shape
    from autoopt.kernels.suite import suite

    if args.op:
        if not args.shape:
            raise UsageError("--op needs --shape")
        return [OpSpec(kind=args.op.lower(), shape=parse_shape(args.shape), dtype=args.dtype)]
    return [op for _, op in suite(args.suite or "llm", args.dtype)]


def _write_files(args: argparse.Namespace, rows: list[Any], gpu: Any, data: dict[str, Any]) -> None:
    """--out (the results as JSON) and --plot (a roofline chart of the measured rows)."""
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    if args.plot:
        if not any(r.label == "measured" for r in rows):
            print("autoopt: no measured rows (no GPU here): --plot skipped", file=sys.stderr)
        else:
            from autoopt.backend.plot import roofline_png

            roofline_png(rows, gpu, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)


def _bench_here(args: argparse.Namespace, ops: list[Any]) -> tuple[list[Any], Any, dict[str, Any]]:
    """(rows, GPU, data) of the recommended configs benchmarked in this process."""
    from autoopt.backend import bench
    from autoopt.search.ranking import predict_config, validate_config

    prof = chosen_profile(args.profile)
    gpu = prof.gpu
    if gpu is None:
        raise UsageError("no GPU in this profile; pass --profile NAME|FILE for predictions (see `autoopt profiles`)")
    rows = bench.run_bench(bench.recommended_cases(gpu, ops, top=args.top), gpu, progress=args.format == "table",
                           validate=lambda op, cfg: validate_config(gpu, op, cfg),
                           predict=lambda op, cfg: predict_config(gpu, op, cfg).us)
    versions = next((r.result.versions for r in rows if r.result.versions), {})
    return rows, gpu, {"profile": prof.name, "gpu": gpu.name, "versions": versions,
                       "rows": [r.to_dict() for r in rows]}


def _bench_fleet(args: argparse.Namespace, ops: list[Any]) -> tuple[list[Any], Any, dict[str, Any]]:
    """(rows, GPU, data) of each GPU kind's recommended configs benchmarked on a fleet (rows and GPU for
    --plot: the first kind's)."""
    from autoopt.fleet import jobs

    def progress(done: int, total: int, r: Any) -> None:
        if args.format == "table":
            print(f"[{done}/{total}] {r.row.op.label()} {r.row.config.kernel} on {r.worker}: {r.row.label}",
                  file=sys.stderr, flush=True)

    with jobs.open_fleet(mode="bench", gpus=args.gpus, ray=args.ray, profile=args.profile) as fleet:
        found = jobs.bench(fleet, ops, top=args.top, on_row=progress)
    kinds = fleet.kinds()
    first = next(iter(kinds.values()))[0].gpu
    versions = next((r.row.result.versions for r in found if r.row.result.versions), {})
    data = {"profile": args.profile, "gpu": ", ".join(d[0].gpu.name for d in kinds.values()),
            "devices": [d.to_dict() for d in fleet.devices], "versions": versions,
            "rows": [r.to_dict() for r in found]}
    return [r.row for r in found if r.gpu.device_fingerprint == first.device_fingerprint], first, data


def _bench_model(args: argparse.Namespace) -> int:
    """``autoopt bench --model NAME``: the end-to-end comparison of autoopt.nn.e2e (GPU), or on a machine
    without one, the same code path on a tiny config of the family, labelled as such."""
    _check_model_run(args)
    import torch

    from autoopt.nn.e2e import run

    gpu = torch.cuda.is_available()
    if gpu:
        result = run(args.model, profile=chosen_profile(args.profile), weights=args.weights)
    else:
        print("autoopt: no CUDA GPU: running a tiny config of the same family on the CPU (the code path only; "
              "its times say nothing about the real model)", file=sys.stderr)
        result = run(args.model, device="cpu", tiny=True, variants=("eager", "optimize"), prefill=((1, 32),),
                     decode_batches=(1,), new_tokens=8, prompts=4, reps=1, weights=args.weights)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    rows = [(v, json.dumps(r["prefill_ms"]), json.dumps(r["decode_ms_per_token"]),
             json.dumps(r.get("graphed_decode_ms_per_step", {})), *_agreement_cells(r))
            for v, r in result["variants"].items()]
    from autoopt.report import format_table

    title = f"{args.model} end to end (measured)" + ("" if gpu else " - tiny config on the CPU")
    headers = ("variant", "prefill ms", "decode ms/token", "CUDA-graph ms/step", "top-1 vs eager", "rel err")
    emit(result, args.format, format_table(headers, rows, title=title))
    return 0


def _check_model_run(args: argparse.Namespace) -> None:
    """Refuse --model with the --op/--suite options, a model not in the catalog, or no torch/transformers."""
    if args.weights and not args.model:
        raise UsageError("bench: --weights quantizes the model of --model (autoopt.optimize(weights=...))")
    if args.weights and args.weights.strip().lower() not in ("auto", "bf16", "fp16"):
        from autoopt.nn.weights import parse_weights

        parse_weights(args.weights)  # an unknown format fails here, before any model is built (exit 2)
    if args.gpus is not None or args.ray is not None:
        raise UsageError("bench: --gpus and --ray spread --op/--suite benchmarks, not --model")
    if args.top != 1:
        raise UsageError("bench: --top picks configs per op for --op/--suite; --model runs the model's own plan")
    from autoopt.planning.catalog import model_names

    if args.model not in model_names():
        raise UsageError(f"bench: --model must be a catalog model ({', '.join(model_names())}), got {args.model!r}")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"bench --model needs torch and transformers ({exc.name} is missing)") from None


def _agreement_cells(row: dict[str, Any]) -> tuple[str, str]:
    """top-1 and relative error vs eager (eager-mode variants), else the greedy-token agreement."""
    agree = row.get("agreement_vs_eager")
    if agree is None:
        tokens = row.get("decode_token_agreement_vs_eager", {})
        return f"tokens {min(tokens.values()):.3f}" if tokens else "-", "-"
    return f"{agree['top1_agreement']:.3f}", f"{agree['rel_err']:.2e}"
