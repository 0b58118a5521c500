"""``autoopt tune``: measure a few configs per op on this GPU (or on a fleet's) and keep the winners in the
results store."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autoopt.cli._common import UsageError, add_fleet_args, add_profile_arg, chosen_profile, emit, fleet_wanted

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers
    from autoopt.hardware.profile import HardwareProfile


def register(sub: Subparsers) -> None:
    """Add ``tune``."""
    sp = sub.add_parser("tune", help="measure a few configs per op on this GPU; keep the winners")
    sp.add_argument("op", metavar="OP", nargs="?",
                    help="gemm, gemv, silu_mul, add, rmsnorm, layernorm, softmax, fused_moe (shape M,E,topk,N,K)")
    sp.add_argument("--shape", help="shape for OP, e.g. 256,6144,4096")
    sp.add_argument("--suite", help="an op suite instead of one op (llm, quick)")
    sp.add_argument("--model", help="the distinct ops of this model's plan (catalog name or config.json)")
    sp.add_argument("--batch", type=int, default=1, help="with --model")
    sp.add_argument("--context", type=int, help="with --model")
    sp.add_argument("--dtype", default="bf16")
    sp.add_argument("--trials", type=int, default=8, help="evaluations per op (1..10000, default 8)")
    sp.add_argument("--seconds", type=float, help="time budget per op in seconds")
    sp.add_argument("--no-store", action="store_true", help="do not read or write the results store")
    add_profile_arg(sp)
    add_fleet_args(sp)
    sp.add_argument("--format", choices=("table", "json", "jsonl"), default="table")
    sp.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    """``autoopt tune``: measure a few configs per op on this GPU (or a fleet's) and keep the winners in the store."""
    from autoopt.tuning import campaign

    _check(args)
    if fleet_wanted(args, "tune"):
        return _tune_fleet(args)
    prof = chosen_profile(args.profile)
    ops = _tune_ops(args, prof)
    progress = _TuneProgress(len(ops) * args.trials, fmt=args.format)
    try:
        done = campaign.tune_ops(prof, ops, budget_trials=args.trials, budget_s=args.seconds,
                                 use_store=not args.no_store, on_trial=progress.trial)
    finally:
        progress.close()
    data = {"profile": prof.name, "gpu": prof.gpu.name if prof.gpu else None, "ops": [t.to_dict() for t in done]}
    if args.format != "jsonl":
        emit(data, args.format, _tune_table(done))
    return 0


def _check(args: argparse.Namespace) -> None:
    """Refuse budgets out of range, and anything but exactly one of OP, --suite and --model."""
    if args.trials < 1 or args.trials > 10_000:
        raise UsageError(f"tune: --trials must be in 1..10000, got {args.trials}")
    if args.seconds is not None and not 0 < args.seconds <= 86_400:
        raise UsageError(f"tune: --seconds must be in (0, 86400], got {args.seconds}")
    chosen = [bool(args.op), bool(args.suite), bool(args.model)]
    if sum(chosen) != 1:
        raise UsageError("tune: name exactly one of OP (with --shape), --suite NAME or --model NAME")


def _tune_ops(args: argparse.Namespace, prof: HardwareProfile | None) -> list[tuple[str, Any]]:
    """(name, OpSpec) of OP --shape, --suite or --model (whose plan is made on ``prof``, else this host)."""
    from autoopt.kernels.ops import OpSpec, parse_shape
    from autoopt.tuning import campaign

    if args.op:
        if not args.shape:
            raise UsageError("tune: OP needs --shape, e.g. --shape 256,6144,4096")
        return [(args.op, OpSpec(kind=args.op.lower(), shape=parse_shape(args.shape), dtype=args.dtype))]
    if args.suite:
        return campaign.suite_ops(args.suite, args.dtype)
    return campaign.model_ops(prof or chosen_profile(args.profile), args.model, batch=args.batch,
                              context=args.context)


def _tune_fleet(args: argparse.Namespace) -> int:
    """``autoopt tune ... --gpus|--ray``: the same tuning, its evaluations spread over a fleet."""
    from autoopt.fleet import jobs

    ops = _tune_ops(args, None)
    t0 = time.perf_counter()
    with jobs.open_fleet(mode="tune", gpus=args.gpus, ray=args.ray, profile=args.profile) as fleet:
        progress = _TuneProgress(len(ops) * args.trials * len(fleet.kinds()), fmt=args.format)
        try:
            done = jobs.tune(fleet, ops, budget_trials=args.trials, budget_s=args.seconds,
                             use_store=not args.no_store, on_trial=progress.trial)
        finally:
            progress.close()
        print(f"autoopt: fleet: {fleet.pool.stats.utilisation(time.perf_counter() - t0)}", file=sys.stderr)
    data = {"profile": args.profile, "gpu": ", ".join(d[0].gpu.name for d in fleet.kinds().values()),
            "devices": [d.to_dict() for d in fleet.devices], "ops": [t.to_dict() for t in done]}
    if args.format != "jsonl":
        emit(data, args.format, _tune_table(done))
    return 0


class _TuneProgress:
    """One JSON line per evaluation (``--format jsonl``), else a progress bar on a terminal's stderr."""

    def __init__(self, total: int, *, fmt: str) -> None:
        self.fmt, self._bar, self._task = fmt, None, None
        if fmt == "table" and sys.stderr.isatty():
            try:
                from rich.progress import Progress
            except ImportError:
                return
            self._bar = Progress(transient=True)
            self._bar.start()
            self._task = self._bar.add_task("tuning", total=total)

    def trial(self, name: str, trial: Any) -> None:
        if self.fmt == "jsonl":
            sys.stdout.write(json.dumps({"op": name, **trial.to_dict()}) + "\n")
            sys.stdout.flush()
        elif self._bar is not None and self._task is not None:
            us = f"{trial.us:.1f} µs" if trial.us is not None else trial.label
            self._bar.update(self._task, advance=1, description=f"{name}: {us}"[:60])

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _tune_table(done: Sequence[Any]) -> str:
    from autoopt.report import format_table

    rows = []
    for t in done:
        r, best, zs = t.result, t.result.best, t.result.zero_shot
        rows.append((t.name, "x".join(map(str, r.op.shape)), len(r.trials), r.stopped,
                     f"{zs.predicted_us:.1f}" if zs else "-",
                     f"{zs.us:.1f}" if zs is not None and zs.us is not None else "-",
                     f"{best.us:.1f}" if best is not None and best.us is not None else "-",
                     f"{r.gain:.3f}x" if r.gain else "-",
                     f"{best.config.kernel} {best.config.describe()}" if best else "no config matched the reference"))
    return format_table(("op", "shape", "trials", "stopped", "zero-shot predicted µs", "zero-shot measured µs",
                         "tuned measured µs", "gain", "winner"), rows,
                        title="Tuning (measured = output matched the float64 reference, then do_bench median)")
