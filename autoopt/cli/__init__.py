"""The ``autoopt`` command line: a thin layer over the Python API.

Data goes to stdout, diagnostics to stderr. Bad input of any kind (an unknown
profile, a malformed shape, an unreadable file) is one line on stderr and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from autoopt.errors import AutooptError

if TYPE_CHECKING:
    from autoopt.hardware.profile import HardwareProfile
    from autoopt.planning.recommendation import Recommendation

log = logging.getLogger(__name__)

EXIT_USAGE = 2
FORMATS = ("table", "json", "yaml")


class UsageError(Exception):
    """Bad command-line input that argparse itself would report."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
        sub = self.prog.removeprefix("autoopt").strip()
        raise UsageError(f"{sub}: {message}" if sub else message)


def _emit(data: Any, fmt: str, text: str | None = None) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif fmt == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    else:
        sys.stdout.write((text if text is not None else json.dumps(data, indent=2)) + "\n")


def _profile(arg: str | None, *, measure: bool = False) -> HardwareProfile:
    """The profile named by --profile (name or file), else the detected machine."""
    if arg:
        from autoopt.api import load_profile

        return load_profile(arg)
    from autoopt.hardware.detection import detect

    return detect(measure=measure)


# -- commands ----------------------------------------------------------------------------

def cmd_profile(args: argparse.Namespace) -> int:
    from autoopt import report

    prof = _profile(args.profile, measure=args.measure)
    if args.save:
        path = Path(args.save)
        saved = prof.to_yaml() if path.suffix in (".yaml", ".yml") else prof.to_json(indent=2) + "\n"
        try:
            path.write_text(saved)
        except OSError as exc:
            raise UsageError(f"cannot write --save file {str(path)!r}: {exc.strerror or exc}") from None
        print(f"saved profile to {path}", file=sys.stderr)
    kernels = _suite_rankings(prof, "quick") if not args.no_recommend else []
    rec, rec_error = None, None
    if not args.no_recommend:
        try:
            rec = _default_recommendation(prof, args.model)
        except AutooptError as exc:
            if args.model:  # the model was asked for: its error is the answer
                raise
            rec_error = str(exc)  # a partly known machine still gets its profile shown
    data: dict[str, Any] = {"profile": prof.to_dict(), "kernels": kernels}
    if rec is not None:
        data["recommendation"] = rec.to_dict()
    if rec_error:
        data["recommendation_error"] = rec_error
    text = None
    if args.format == "table":
        text = report.profile_text(prof)
        if kernels:
            text += "\n\n" + _kernels_text(kernels)
        if rec is not None:
            text += "\n\n" + rec.explain()
        if rec_error:
            text += f"\n\nModel plan: not available: {rec_error}"
    _emit(data, args.format, text)
    return 0


def _suite_rankings(prof: Any, suite_name: str) -> list[dict[str, Any]]:
    """Top-1 predicted config for each op of a suite on the profile's first GPU."""
    gpu = prof.gpu
    if gpu is None:
        return []
    from autoopt.kernels.suite import suite
    from autoopt.search.ranking import rank

    out: list[dict[str, Any]] = []
    for label, op in suite(suite_name):
        try:
            r = rank(gpu, op, top=1)
        except AutooptError as exc:
            out.append({"op": label, "shape": list(op.shape), "kind": op.kind, "error": str(exc)})
            continue
        best = r.candidates[0].to_dict() if r.candidates else None
        out.append({"op": label, "kind": op.kind, "shape": list(op.shape), "dtype": op.dtype, "best": best})
    return out


def _kernels_text(kernels: list[dict[str, Any]]) -> str:
    from autoopt.report import format_table

    rows = []
    for k in kernels:
        b = k.get("best")
        if not b:
            rows.append((k["op"], "x".join(map(str, k["shape"])), k.get("error", "no valid config"), "", "", ""))
            continue
        cfg = " ".join(f"{a}={v}" for a, v in b["config"].items())
        rows.append((k["op"], "x".join(map(str, k["shape"])), f"{b['kernel']} {cfg}", b["path"],
                     f"{b['predicted_us']:.1f}", b["bound"]))
    return format_table(("op", "shape", "recommended config", "path", "predicted µs", "bound"), rows,
                        title="Recommended kernel configs (cost model, predicted, no timing)")


def _default_recommendation(prof: Any, model: str | None) -> Recommendation | None:
    if prof.gpu is None and not model:
        return None
    from autoopt.planning.recommendation import recommend

    return recommend(prof, model or "llama-3-8b")


def cmd_profiles(args: argparse.Namespace) -> int:
    from autoopt.api import known_profiles
    from autoopt.report import format_bytes, format_table

    devices = known_profiles()
    data = [{"name": d.name, "description": d.description, "count": d.count,
             "gpu": d.gpu.to_dict(), "path": d.path} for d in devices]
    rows = [(d.name, d.count, d.gpu.name, d.gpu.arch, d.gpu.sm_count, format_bytes(d.gpu.memory_total_bytes),
             d.gpu.mem_bandwidth_gbs, d.gpu.peak_tflops.get("bf16"), d.gpu.smem_per_block_optin_bytes)
            for d in devices]
    _emit(data, args.format, format_table(
        ("name", "GPUs", "device", "arch", "SMs", "memory", "GB/s", "bf16 TFLOP/s", "SMEM opt-in B"), rows))
    return 0


def cmd_kernel(args: argparse.Namespace) -> int:
    from autoopt.kernels.ops import OpSpec, parse_shape
    from autoopt.report import format_table
    from autoopt.search.ranking import rank

    prof = _profile(args.profile)
    if prof.gpu is None:
        raise UsageError("no GPU in this profile; pass --profile NAME|FILE (see `autoopt profiles`)")
    op = OpSpec(kind=args.op.lower(), shape=parse_shape(args.shape), dtype=args.dtype, layout=args.layout)
    r = rank(prof.gpu, op, top=args.top, force=args.force)
    data = r.to_dict()
    rows = [(i + 1, c.config.kernel, c.config.describe(), c.config.path, f"{c.predicted_us:.2f}", c.bound,
             f"{c.roofline_pct:.0f}%", c.reason) for i, c in enumerate(r.candidates)]
    text = format_table(("#", "kernel", "config", "path", "predicted µs", "bound", "roofline", "why"), rows,
                        title=f"{op.label()} on {prof.gpu.name} ({prof.name}): top {len(rows)} "
                              f"of {data.get('considered', '?')} configs (predicted by the cost model)")
    _emit(data, args.format, text)
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from autoopt.plugins.manager import list_plugins
    from autoopt.report import format_table

    plugins = list_plugins()
    rows = [(p["name"], p.get("version") or "-", ", ".join(p.get("templates", [])) or "-",
             ", ".join(p.get("hooks", [])) or "-", "; ".join(p.get("problems", [])) or "ok") for p in plugins]
    _emit({"plugins": plugins}, args.format,
          format_table(("plugin", "version", "templates", "hooks", "status"), rows))
    return 0


def _bench_model(args: argparse.Namespace) -> int:
    """``autoopt bench --model NAME``: the end-to-end comparison of autoopt.nn.e2e (GPU), or on a machine
    without one, the same code path on a tiny config of the family, labelled as such."""
    from autoopt.planning.catalog import model_names

    if args.model not in model_names():
        raise UsageError(f"bench: --model must be a catalog model ({', '.join(model_names())}), got {args.model!r}")
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"bench --model needs torch and transformers ({exc.name} is missing)") from None
    from autoopt.nn.e2e import run

    gpu = torch.cuda.is_available()
    if gpu:
        result = run(args.model, profile=_profile(args.profile))
    else:
        print("autoopt: no CUDA GPU: running a tiny config of the same family on the CPU (the code path only; "
              "its times say nothing about the real model)", file=sys.stderr)
        result = run(args.model, device="cpu", tiny=True, variants=("eager", "optimize"), prefill=((1, 32),),
                     decode_batches=(1,), new_tokens=8, prompts=4, reps=1)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    rows = [(v, json.dumps(r["prefill_ms"]), json.dumps(r["decode_ms_per_token"]),
             json.dumps(r.get("graphed_decode_ms_per_step", {})), *_agreement_cells(r))
            for v, r in result["variants"].items()]
    from autoopt.report import format_table

    title = f"{args.model} end to end (measured)" + ("" if gpu else " - tiny config on the CPU")
    headers = ("variant", "prefill ms", "decode ms/token", "CUDA-graph ms/step", "top-1 vs eager", "rel err")
    _emit(result, args.format, format_table(headers, rows, title=title))
    return 0


def _agreement_cells(row: dict[str, Any]) -> tuple[str, str]:
    """top-1 and relative error vs eager (eager-mode variants), else the greedy-token agreement."""
    agree = row.get("agreement_vs_eager")
    if agree is None:
        tokens = row.get("decode_token_agreement_vs_eager", {})
        return f"tokens {min(tokens.values()):.3f}" if tokens else "-", "-"
    return f"{agree['top1_agreement']:.3f}", f"{agree['rel_err']:.2e}"


def cmd_bench(args: argparse.Namespace) -> int:
    if args.model:
        if args.gpus is not None or args.ray is not None:
            raise UsageError("bench: --gpus and --ray spread --op/--suite benchmarks, not --model")
        if args.top != 1:
            raise UsageError("bench: --top picks configs per op for --op/--suite; --model runs the model's own plan")
        return _bench_model(args)
    from autoopt.backend import bench
    from autoopt.kernels.ops import OpSpec, parse_shape
    from autoopt.kernels.suite import suite

    if args.op:
        if not args.shape:
            raise UsageError("--op needs --shape")
        ops = [OpSpec(kind=args.op.lower(), shape=parse_shape(args.shape), dtype=args.dtype)]
    else:
        ops = [op for _, op in suite(args.suite or "llm", args.dtype)]
    if not 1 <= args.top <= 50:
        raise UsageError(f"bench: --top must be in 1..50, got {args.top}")
    for target in (args.out, args.plot):
        if target and not Path(target).resolve().parent.is_dir():
            raise UsageError(f"cannot write {target!r}: its folder does not exist")
    rows, gpu, data = _bench_fleet(args, ops) if _fleet_wanted(args, "bench") else _bench_here(args, ops)
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
    _emit(data, args.format, bench.format_table(rows))
    return 0


def _bench_here(args: argparse.Namespace, ops: list[Any]) -> tuple[list[Any], Any, dict[str, Any]]:
    """(rows, GPU, data) of the recommended configs benchmarked in this process."""
    from autoopt.backend import bench
    from autoopt.search.ranking import predict_config, validate_config

    prof = _profile(args.profile)
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


def cmd_recommend(args: argparse.Namespace) -> int:
    from autoopt.planning.recommendation import recommend

    prof = _profile(args.profile)
    kwargs: dict[str, Any] = {"batch": args.batch, "phase": args.phase, "preference": args.preference,
                              "compare_wfc": True,  # an engineer reads the search beside the DP
                              "cuda_graphs": args.cuda_graphs}
    for key in ("context", "prompt_len", "gen_len", "weight_dtype", "kv_dtype", "runtime", "tensor_parallel",
                "pipeline_parallel"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    if args.format == "args" and args.runtime is None:
        raise UsageError("recommend: --format args needs --runtime (vllm, sglang, llama.cpp, transformers, "
                         "autoopt)")
    rec = recommend(prof, args.model, **kwargs)
    if args.format == "args":
        from autoopt.runtimes.export import export, format_args

        exported = export(rec.to_dict(), args.runtime, model_id=args.model_id, profile=prof.to_dict())
        print(format_args(exported))
        return 0
    data = rec.to_dict()
    text = rec.explain()
    if args.runtime is not None and rec.fits:
        from autoopt.runtimes.export import export, format_args

        data["runtime_args"] = export(data, args.runtime, model_id=args.model_id, profile=prof.to_dict())
        text += f"\nRun it with {args.runtime}:\n  {format_args(data['runtime_args'])}"
    _emit(data, args.format, text)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """``autoopt tune``: measure a few configs per op on this GPU (or a fleet's) and keep the winners in the store."""
    from autoopt.tuning import campaign

    if args.trials < 1 or args.trials > 10_000:
        raise UsageError(f"tune: --trials must be in 1..10000, got {args.trials}")
    if args.seconds is not None and not 0 < args.seconds <= 86_400:
        raise UsageError(f"tune: --seconds must be in (0, 86400], got {args.seconds}")
    chosen = [bool(args.op), bool(args.suite), bool(args.model)]
    if sum(chosen) != 1:
        raise UsageError("tune: name exactly one of OP (with --shape), --suite NAME or --model NAME")
    if _fleet_wanted(args, "tune"):
        return _tune_fleet(args)
    prof = _profile(args.profile)
    ops = _tune_ops(args, prof)
    progress = _TuneProgress(len(ops) * args.trials, fmt=args.format)
    try:
        done = campaign.tune_ops(prof, ops, budget_trials=args.trials, budget_s=args.seconds,
                                 use_store=not args.no_store, on_trial=progress.trial)
    finally:
        progress.close()
    data = {"profile": prof.name, "gpu": prof.gpu.name if prof.gpu else None, "ops": [t.to_dict() for t in done]}
    if args.format != "jsonl":
        _emit(data, args.format, _tune_table(done))
    return 0


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
    return campaign.model_ops(prof or _profile(args.profile), args.model, batch=args.batch, context=args.context)


def _fleet_wanted(args: argparse.Namespace, command: str) -> bool:
    """Whether --gpus or --ray asks for a fleet run (refusing the combinations that make no sense)."""
    if args.gpus is None and args.ray is None:
        return False
    if args.gpus is not None and args.ray is not None:
        raise UsageError(f"{command}: give --gpus (GPUs of this host) or --ray (every GPU of a Ray cluster), "
                         f"not both")
    if args.gpus is not None and args.profile:
        raise UsageError(f"{command}: --gpus runs on each GPU as detected; drop --profile (with --ray it names "
                         f"what GPU-less workers predict for)")
    return True


def _tune_fleet(args: argparse.Namespace) -> int:
    """``autoopt tune ... --gpus|--ray``: the same tuning, its evaluations spread over a fleet."""
    from autoopt.fleet import jobs

    ops = _tune_ops(args, None)
    with jobs.open_fleet(mode="tune", gpus=args.gpus, ray=args.ray, profile=args.profile) as fleet:
        progress = _TuneProgress(len(ops) * args.trials * len(fleet.kinds()), fmt=args.format)
        try:
            done = jobs.tune(fleet, ops, budget_trials=args.trials, budget_s=args.seconds,
                             use_store=not args.no_store, on_trial=progress.trial)
        finally:
            progress.close()
    data = {"profile": args.profile, "gpu": ", ".join(d[0].gpu.name for d in fleet.kinds().values()),
            "devices": [d.to_dict() for d in fleet.devices], "ops": [t.to_dict() for t in done]}
    if args.format != "jsonl":
        _emit(data, args.format, _tune_table(done))
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


def cmd_store(args: argparse.Namespace) -> int:
    """``autoopt store list|show|export|import|prune``: the results store (see autoopt.results.store)."""
    import time

    from autoopt.report import format_table
    from autoopt.results import keys, transfer
    from autoopt.results import store as rstore

    action = args.store_command
    path = rstore.default_path()
    if path is None:
        if action in ("list", "show"):
            _emit({"path": None, "enabled": False, "groups": [], "rows": []}, args.format,
                  f"results store: off ({rstore.CACHE_ENV}=off)")
            return 0
        raise UsageError(f"store {action}: the results store is off ({rstore.CACHE_ENV}=off); unset it or set it "
                         f"to a folder")
    # reading never creates the file; import does
    st = rstore.ResultStore(path, create=True) if action == "import" or path.exists() else None

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))

    if action == "list":
        groups = st.summary() if st else []
        rows = [(g["gpu"] or "-", g["device"], g["triton"] or "-", g["torch"] or "-", g["op_label"], g["rows"],
                 g["measured"], g["failed"], g["stale"], "-" if g["best_us"] is None else f"{g['best_us']:.2f}",
                 when(g["newest"])) for g in groups]
        _emit({"path": str(path), "enabled": True, "groups": groups}, args.format, format_table(
            ("gpu", "device", "triton", "torch", "op", "rows", "measured", "failed", "stale", "best µs", "newest"),
            rows, title=f"results store {path}: {sum(g['rows'] for g in groups)} rows"))
    elif action == "show":
        from autoopt.kernels.ops import OpSpec, parse_shape

        op = OpSpec(kind=args.op.lower(), shape=parse_shape(args.shape), dtype=args.dtype, layout=args.layout)
        found = [rstore.ResultStore.view(r) for r in (st.rows(op=op) if st else [])]
        found.sort(key=lambda r: (r["stale"], r["label"] != "measured", r["us"] or 0.0))
        lines = [(r["id"], r["env"]["gpu"] or r["env"]["device"], r["env"]["triton"] or "-", r["label"],
                 "-" if r["us"] is None else f"{r['us']:.2f}",
                 "-" if r["max_error"] is None else f"{r['max_error']:.2g}", r["config"]["kernel"],
                 " ".join(f"{k}={v}" for k, v in r["config"]["config"].items()), r["config"]["path"],
                 "stale" if r["stale"] else "", when(r["measured_at"]), r["reason"].splitlines()[0][:60]
                 if r["reason"] else "") for r in found]
        _emit({"path": str(path), "op": op.to_dict(), "rows": found}, args.format, format_table(
            ("id", "gpu", "triton", "label", "µs", "max err", "kernel", "config", "path", "stale", "measured",
             "reason"), lines, title=f"{op.label()} in {path}: {len(lines)} rows"))
    elif action == "export":
        chosen = [r for r in (st.rows(device=args.device) if st else [])
                  if args.include_stale or not keys.is_stale(r)]
        if args.file == "-":
            sys.stdout.write(json.dumps(transfer.document(chosen), indent=1) + "\n")
        else:
            if not Path(args.file).resolve().parent.is_dir():
                raise UsageError(f"store export: cannot write {args.file!r}: its folder does not exist")
            transfer.export_file(chosen, args.file)
        print(f"autoopt: exported {len(chosen)} rows from {path}", file=sys.stderr)
    elif action == "import":
        assert st is not None
        summary = transfer.import_file(st, args.file)
        _refresh_snapshots(st)
        _emit({"path": str(path), **summary.to_dict()}, args.format,
              f"imported {args.file} into {path}: {summary.new} new, {summary.updated} updated, "
              f"{summary.unchanged} already there")
    else:  # prune
        days = args.older_than
        if days is not None and not days >= 0:  # `not >=` also refuses nan
            raise UsageError(f"store prune: --older-than must be a number of days >= 0, got {days}")
        if not (args.stale or days is not None or args.device):
            raise UsageError("store prune: say what to remove: --stale, --older-than DAYS and/or --device FP|NAME")
        n = st.prune(stale=args.stale, older_than_days=days, device=args.device, dry_run=args.dry_run) if st else 0
        if st is not None and n and not args.dry_run:
            _refresh_snapshots(st)
        _emit({"path": str(path), "removed": 0 if args.dry_run else n, "matched": n}, args.format,
              f"{'would remove' if args.dry_run else 'removed'} {n} rows from {path}")
    return 0


def _refresh_snapshots(store: Any) -> None:
    """After the store changed: rewrite its start-up snapshots (the next start-up reads them)."""
    from autoopt.results.lookup import refresh_snapshots

    store.close()  # ours is then not the connection that keeps the WAL alive (see refresh_snapshot)
    refresh_snapshots(store.path)


def _around(around: dict[str, list[list[Any]]]) -> str:
    """`` after X, before Y``: the most frequent kernels launched around a one-sided class."""
    parts = [f"{where} {around[key][0][0][:40]}" for key, where in (("before", "after"), ("after", "before"))
             if around.get(key)]
    return (": " + ", ".join(parts)) if parts else ""


def cmd_trace(args: argparse.Namespace) -> int:
    """``autoopt trace summary T`` / ``autoopt trace compare A B``: GPU time by op class, and the differences."""
    from autoopt.report import format_table
    from autoopt.trace import compare, summary_of

    if args.action == "summary":
        if len(args.traces) != 1:
            raise UsageError(f"trace summary takes one trace file, got {len(args.traces)}")
        s = summary_of(args.traces[0])
        rows = [(c, f"{us / s.steps:.1f}", f"{n / s.steps:.1f}", f"{100 * us / s.total_us:.1f}")
                for c, (us, n) in s.by_class.items()]
        _emit(s.to_dict(), args.format, format_table(("class", "us/step", "launches/step", "% of GPU time"), rows,
                                                      title=f"{args.traces[0]}: {s.steps} step(s), "
                                                            f"{s.total_us / s.steps:.1f} us/step (measured)"))
        return 0
    if len(args.traces) != 2:
        raise UsageError(f"trace compare takes two trace files (A B), got {len(args.traces)}")
    a, b = summary_of(args.traces[0]), summary_of(args.traces[1])
    data = compare(a, b)
    side_by_side = [(r["class"], r["a_us"], r["b_us"], r["ratio_b_over_a"] or "-", r["a_launches"],
                     r["b_launches"]) for r in data["classes"]]
    text = format_table(("class", "A us/step", "B us/step", "B/A", "A launches", "B launches"), side_by_side,
                        title=f"A {data['a_per_step_us']} us/step vs B {data['b_per_step_us']} us/step (measured)")
    text += "\n" + format_table(("kernel", "class", "A us", "B us", "delta"),
                                [(k["kernel"][:70], k["class"], k["a_us"], k["b_us"], k["delta_us"])
                                 for k in data["kernels_by_delta"]], title="kernels by delta per step")
    # fusion differences: one line per fused-kernel signature, then the classes only one side runs
    align = data["fusion_alignment"]
    how = (f"aligned on {align['anchors_per_step']} GEMM/attention/communication launches, {align['basis']}"
           if align["mode"] == "aligned segments" else f"class-level estimate: {align['reason']}")
    fused = [f for f in data["fusions"] if f["kind"] != "class only on one side"]
    ops_text = [" ".join(dict.fromkeys(f["ops"])) for f in fused]  # each op once, in the kernel name's order
    text += "\n" + (format_table(
        ("side", "fused ops", "its launches", "replaces (launches/step)", "launches saved/step", "us saved/step"),
        [(f["side"].upper(), o if len(o) <= 60 else o[:57] + "...", f["launches_per_step"],
          ", ".join(f"{n:.4g} {c}" for c, n in f["replaced"].items()) or "-", f["launches_saved_per_step"],
          f["us_saved_per_step"]) for f, o in zip(fused, ops_text, strict=True)],
        title=f"fusion differences per step ({how})") if fused else f"fusion differences per step ({how}): none")
    if align["mode"] == "aligned segments":
        text += "\nA - B per step: " + ", ".join(f"{k} {v:g} us" for k, v in align["a_minus_b_us"].items())
    only = [f"  {f['side'].upper()} {f['class']} ({f['us_per_step']:g} us, {f['launches_per_step']:g} launches)"
            + _around(f.get("around") or {}) for f in data["fusions"] if f["kind"] == "class only on one side"]
    if only:
        text += "\nclasses on one side only:\n" + "\n".join(only)
    if args.plot:
        from autoopt.report import plot_trace_classes

        plot_trace_classes(data, args.plot)
    _emit(data, args.format, text)
    return 0


def cmd_fleet(args: argparse.Namespace) -> int:
    """``autoopt fleet``: one inventory of this host's GPUs, or (``--ray``) of every node of a Ray cluster."""
    from autoopt.fleet.inventory import inventory
    from autoopt.report import format_table

    rows = inventory(use_ray=args.ray is not None, ray_address=None if args.ray in (None, "local") else args.ray,
                     measure=args.measure)
    table = [(r["host"], r.get("index", "-"), r["gpu"] or "(no GPU)", r.get("fingerprint", "-"),
              r.get("profile") or "-", r.get("driver") or "-",
              f"{r['memory_free_bytes'] / 2**30:.1f}/{r['memory_total_bytes'] / 2**30:.1f}"
              if r.get("memory_total_bytes") and r.get("memory_free_bytes") is not None else "-",
              r.get("measured_bandwidth_gbs") or "-") for r in rows]
    _emit({"hosts": sorted({r["host"] for r in rows}), "rows": rows}, args.format,
          format_table(("host", "gpu#", "gpu", "fingerprint", "profile", "driver", "free/total GiB", "copy GB/s"),
                       table, title="fleet inventory (detected on each host)"))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``autoopt check memory|pipeline|all``: autoopt's memory and step-time predictions against this GPU."""
    from autoopt.validation.run import CheckRun, run_checks
    from autoopt.validation.table import summary_table
    from autoopt.validation.workload import CheckOptions

    options = CheckOptions(model=args.model, layers=args.layers, pipeline_layers=args.pipeline_layers,
                           batch=args.batch, prompt_len=args.prompt_len, gen_len=args.gen_len, warmup=args.warmup,
                           reps_prefill=args.reps_prefill, reps_decode=args.reps_decode,
                           cuda_graphs=not args.no_cuda_graphs, seed=args.seed)
    out = Path(args.out) if args.out else None
    if out is not None and not out.resolve().parent.is_dir():
        raise UsageError(f"check: cannot write {args.out!r}: its folder does not exist")

    def write(run: CheckRun) -> None:  # also after the memory check: kept if the pipeline check dies
        if out is not None:
            out.write_text(json.dumps(run.to_dict(), indent=2) + "\n")

    profiles = {f"profile:{args.profile}": _profile(args.profile)} if args.profile else None
    run = run_checks(args.which, options, profiles=profiles, measure_profile=not args.no_measure_profile,
                     argv=sys.argv[1:], on_partial=write)
    write(run)
    if out is not None:
        print(f"wrote {out}", file=sys.stderr)
    data = run.to_dict()
    _emit(data, args.format, summary_table(data))
    return 1 if run.failed else 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``autoopt calibrate``: refit the cost model's constants for this GPU (see autoopt.tuning.calibrate)."""
    import time

    from autoopt.results import constants as stored
    from autoopt.tuning import calibrate as cal

    t0 = time.perf_counter()
    chosen = [args.from_store, args.sweep, args.show, args.reset]
    if sum(chosen) != 1:
        raise UsageError("calibrate: name exactly one of --from-store, --sweep, --show or --reset")
    if args.seconds is not None and (not args.sweep or not 0 < args.seconds <= cal.MAX_SECONDS):
        raise UsageError(f"calibrate: --seconds goes with --sweep and must be in (0, {cal.MAX_SECONDS:g}], "
                         f"got {args.seconds}")
    if (args.sweep or args.from_store) and not args.dry_run and stored.constants_dir() is None:
        raise UsageError("calibrate: the results cache is off (AUTOOPT_CACHE_DIR=off), so fitted constants cannot "
                         "be kept; pass --dry-run, or set AUTOOPT_CACHE_DIR to a folder")
    if args.sweep:
        cal.require_cuda()  # before detection: without a CUDA GPU, that is the one thing to say
    prof = _profile(args.profile)
    gpu = prof.gpu
    if gpu is None:
        raise UsageError("calibrate: no GPU in this profile; pass --profile NAME|FILE (see `autoopt profiles`)")
    if args.show or args.reset:
        path = stored.path_for(gpu)
        if path is None:
            _emit({"device": gpu.device_fingerprint, "gpu": gpu.name, "path": None, "stored": None}, args.format,
                  "calibrated constants are off (AUTOOPT_CACHE_DIR=off): the ranking uses the defaults")
            return 0
        if args.reset:
            removed = stored.remove(gpu)
            _emit({"device": gpu.device_fingerprint, "gpu": gpu.name, "removed": str(removed) if removed else None},
                  args.format, f"removed {removed}: {gpu.name} ranks with the default constants again" if removed
                  else f"no calibrated constants for {gpu.name} (device {gpu.device_fingerprint}) at {path}")
            return 0
        found = stored.load(gpu)
        data = {"device": gpu.device_fingerprint, "gpu": gpu.name, "path": str(path) if path else None,
                "stored": None if found is None else {**found.to_dict(), "changed": {
                    k: {"default": a, "calibrated": b} for k, (a, b) in found.changed().items()}}}
        text = (f"no calibrated constants for {gpu.name} (device {gpu.device_fingerprint}) at {path}: "
                f"the ranking uses the defaults" if found is None else _constants_text(found, path))
        _emit(data, args.format, text)
        return 0
    names = [n.strip() for n in args.names.split(",") if n.strip()] if args.names else None
    if args.sweep:
        def progress(label: str, c: dict[str, Any]) -> None:
            print(f"autoopt: calibrate: {label}: {c['measured']} of {c['evaluated']} measured "
                  f"({c['planned']} planned) in {c['seconds']:.1f} s", file=sys.stderr)

        samples = cal.sweep_samples(gpu, seconds=args.seconds or cal.DEFAULT_SECONDS, on_shape=progress)
    else:
        samples = cal.store_samples(gpu)
    done = cal.calibrate_device(gpu, samples, profile=prof.name, names=names, save=not args.dry_run, force=args.force,
                                started=t0)
    data = done.to_dict()
    _emit(data, args.format, _calibration_text(data))
    return 0


def _constants_text(found: Any, path: Any) -> str:
    import time

    from autoopt.report import format_table

    rows = [(k, f"{a:.4g}", f"{b:.4g}", f"{b / a:.3f}x" if a else "-") for k, (a, b) in found.changed().items()]
    cal = found.calibration
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(found.created_at)) if found.created_at else "?"
    head = f"calibrated constants of {found.gpu} (device {found.device}), {path}, written {when} UTC"
    if cal.get("heldout_before") and cal.get("heldout_after"):
        b, a = cal["heldout_before"], cal["heldout_after"]
        head += (f"\nfrom {cal.get('samples', '?')} samples ({cal.get('source', '?')}): held-out median rho "
                 f"{b['median_spearman']:.3f} -> {a['median_spearman']:.3f}, geomean top-1 "
                 f"{b['geomean_top1']:.3f} -> {a['geomean_top1']:.3f}")
    return format_table(("constant", "default", "calibrated", "ratio"), rows, title=head)


def _calibration_text(data: dict[str, Any]) -> str:
    from autoopt.report import format_table

    d, s, c = data["device"], data["samples"], data["calibration"]
    b, a = c["heldout_before"], c["heldout_after"]
    src = (f"a {s['elapsed_s']:.0f} s sweep ({s['evaluated']} configs timed)" if s["source"] == "sweep"
           else f"the results store ({s['store']})")
    lines = [f"Calibration of {d['name']} (device {d['fingerprint']}, profile {d['profile']}) from {src}: "
             f"{c['n_samples']} samples over {c['n_shapes']} shapes; fit {len(c['names'])} constants on "
             f"{c['n_train']} in {c['fit_seconds']:.1f} s, scored on {c['n_heldout']} held-out", "",
             format_table(("held-out configs", "median rho", "geomean top-1", "min top-1"), [
                 ("before (default constants)", f"{b['median_spearman']:.3f}", f"{b['geomean_top1']:.3f}",
                  f"{b['min_top1']:.3f}"),
                 ("after (calibrated)", f"{a['median_spearman']:.3f}", f"{a['geomean_top1']:.3f}",
                  f"{a['min_top1']:.3f}")]), "",
             format_table(("shape", "held-out", "rho before", "rho after", "top-1 before", "top-1 after"),
                          [(r["shape"], r["n"], f"{r['spearman_before']:.3f}", f"{r['spearman_after']:.3f}",
                            f"{r['top1_before']:.3f}", f"{r['top1_after']:.3f}") for r in c["per_shape"]]), "",
             format_table(("constant", "default", "calibrated"),
                          [(k, f"{v['before']:.4g}", f"{v['after']:.4g}") for k, v in c["changed"].items()]), ""]
    if data["saved"]:
        lines.append(f"wrote {data['saved']}: rank() uses these constants on this device "
                     f"(`autoopt calibrate --reset` removes them)")
    else:
        lines.append(f"not written: {data['not_saved']}")
    return "\n".join(lines)


# -- parser ------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autoopt", description="Hardware-aware kernel and model-plan recommendations.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log diagnostics to stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add_profile_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--profile", metavar="NAME|FILE",
                        help="a known profile (see `autoopt profiles`) or a saved profile file; default: detect")

    def add_fleet_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--gpus", metavar="all|0,1,3",
                        help="spread the evaluations over one worker process per GPU of this host")
        sp.add_argument("--ray", nargs="?", const="auto", metavar="auto|ADDRESS",
                        help="spread them over one actor per GPU of a Ray cluster (pip install 'autoopt[ray]')")

    sp = sub.add_parser("profile", help="detect (or load) a machine profile and show its recommendations")
    add_profile_arg(sp)
    sp.add_argument("--format", choices=FORMATS, default="table")
    sp.add_argument("--save", metavar="FILE", help="also write the profile to FILE (.json or .yaml)")
    sp.add_argument("--measure", action="store_true", help="measure copy bandwidth and bf16 matmul rate on the GPU")
    sp.add_argument("--model", help="model for the plan section (default llama-3-8b)")
    sp.add_argument("--no-recommend", action="store_true", help="only the profile, no recommendations")
    sp.set_defaults(func=cmd_profile)

    sp = sub.add_parser("profiles", help="list known hardware profiles")
    sp.add_argument("--format", choices=FORMATS, default="table")
    sp.set_defaults(func=cmd_profiles)

    sp = sub.add_parser("kernel", help="rank kernel configs for one op (cost model, no timing)")
    sp.add_argument("op", metavar="OP", help="gemm, gemv, silu_mul, add, rmsnorm, layernorm, softmax")
    sp.add_argument("--shape", required=True, help="e.g. 256,6144,4096 (M,N,K) or 4096,4096 (rows,N)")
    sp.add_argument("--dtype", default="bf16")
    sp.add_argument("--layout", default="nk", choices=("nk", "kn"))
    sp.add_argument("--top", type=int, default=5)
    sp.add_argument("--force", choices=("single", "looped"), help="force the norm/softmax approach")
    add_profile_arg(sp)
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_kernel)

    sp = sub.add_parser("plugins", help="list installed plugins and what each contributes")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_plugins)

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
    add_fleet_args(sp)
    sp.set_defaults(func=cmd_bench)

    sp = sub.add_parser("recommend", help="whole-model plan: kernels, quant format, memory, split")
    sp.add_argument("--model", required=True, help="catalog name (llama-3-8b, ...) or a config.json path")
    add_profile_arg(sp)
    sp.add_argument("--batch", type=int, default=1)
    sp.add_argument("--context", type=int)
    sp.add_argument("--prompt-len", dest="prompt_len", type=int)
    sp.add_argument("--gen-len", dest="gen_len", type=int)
    sp.add_argument("--phase", choices=("prefill", "decode", "both"), default="both")
    sp.add_argument("--weight-dtype", dest="weight_dtype")
    sp.add_argument("--kv-dtype", dest="kv_dtype")
    sp.add_argument("--preference", choices=("speed", "balanced", "quality"), default="balanced")
    sp.add_argument("--runtime", help="plan for this serving runtime's rules: vllm, sglang, llama.cpp, "
                    "transformers, autoopt (or a plugin's)")
    sp.add_argument("--tensor-parallel", dest="tensor_parallel", type=int, help="fix the tensor-parallel degree")
    sp.add_argument("--pipeline-parallel", dest="pipeline_parallel", type=int,
                    help="fix the pipeline-parallel degree")
    sp.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_true",
                    help="price decode steps as replayed from a CUDA graph (about 1 us a kernel, not a launch)")
    sp.add_argument("--model-id", dest="model_id", help="the checkpoint name the runtime loads (with --runtime)")
    sp.add_argument("--format", choices=(*FORMATS[:2], "args"), default="table",
                    help="args: the runtime's own arguments, ready to paste (needs --runtime)")
    sp.set_defaults(func=cmd_recommend)

    sp = sub.add_parser("tune", help="measure a few configs per op on this GPU; keep the winners")
    sp.add_argument("op", metavar="OP", nargs="?", help="gemm, gemv, silu_mul, add, rmsnorm, layernorm, softmax")
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

    sp = sub.add_parser("store", help="the results store: list, show, export, import, prune measured results")
    ss = sp.add_subparsers(dest="store_command", metavar="{list,show,export,import,prune}", parser_class=_Parser,
                           required=True)
    st = ss.add_parser("list", help="one line per device and op: rows, failures, stale rows, best time")
    st.add_argument("--format", choices=FORMATS[:2], default="table")
    st = ss.add_parser("show", help="every stored row of one op")
    st.add_argument("--op", required=True, help="gemm, gemv, silu_mul, add, rmsnorm, layernorm, softmax")
    st.add_argument("--shape", required=True, help="e.g. 256,6144,4096 (M,N,K) or 4096,4096 (rows,N)")
    st.add_argument("--dtype", default="bf16")
    st.add_argument("--layout", default="nk", choices=("nk", "kn"))
    st.add_argument("--format", choices=FORMATS[:2], default="table")
    st = ss.add_parser("export", help="write rows as JSON (the shipped-results format) to FILE, - for stdout")
    st.add_argument("file", metavar="FILE")
    st.add_argument("--device", metavar="FP|NAME", help="only this device (fingerprint or GPU name)")
    st.add_argument("--include-stale", action="store_true", help="also rows of changed kernels or another triton")
    st = ss.add_parser("import", help="add the rows of an exported JSON file (idempotent)")
    st.add_argument("file", metavar="FILE")
    st.add_argument("--format", choices=FORMATS[:2], default="table")
    st = ss.add_parser("prune", help="remove rows that meet every given criterion")
    st.add_argument("--stale", action="store_true", help="kernel source changed or not the installed triton")
    st.add_argument("--older-than", dest="older_than", type=float, metavar="DAYS", help="measured over DAYS ago")
    st.add_argument("--device", metavar="FP|NAME", help="rows of this device (fingerprint or GPU name)")
    st.add_argument("--dry-run", dest="dry_run", action="store_true", help="only count")
    st.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_store)

    sp = sub.add_parser("fleet", help="inventory of every GPU of this host, or of a Ray cluster (--ray)")
    sp.add_argument("--ray", nargs="?", const="auto", help="a Ray cluster: auto, an address, or local (start one)")
    sp.add_argument("--measure", action="store_true", help="also time copy bandwidth on each GPU")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_fleet)

    sp = sub.add_parser("trace", help="profiler traces: GPU time by op class (summary), two runs side by side "
                        "with fusion differences (compare)")
    sp.add_argument("action", choices=("summary", "compare"), metavar="summary|compare")
    sp.add_argument("traces", nargs="+", metavar="TRACE", help="Chrome/Perfetto trace JSON (.json or .json.gz)")
    sp.add_argument("--plot", help="compare: write a stacked bar chart per class (PNG)")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_trace)

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

    sp = sub.add_parser("calibrate", help="refit the cost model's constants for this GPU from measured timings")
    sp.add_argument("--from-store", dest="from_store", action="store_true",
                    help="fit on this device's measured rows in the results store")
    sp.add_argument("--sweep", action="store_true", help="time a short sweep of GEMM configs here (CUDA GPU), then fit")
    sp.add_argument("--show", action="store_true", help="print this device's stored constants")
    sp.add_argument("--reset", action="store_true", help="remove this device's stored constants")
    sp.add_argument("--seconds", type=float, help="time budget of --sweep in seconds (default 150, at most 150)")
    sp.add_argument("--names", help="comma-separated constants to fit (default: the committed calibration's nine)")
    sp.add_argument("--dry-run", dest="dry_run", action="store_true", help="fit and report, write nothing")
    sp.add_argument("--force", action="store_true", help="write the constants even if they rank no better")
    add_profile_arg(sp)
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_calibrate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                            format="autoopt: %(levelname)s: %(name)s: %(message)s")
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(args.func(args) or 0)
    except (UsageError, AutooptError) as exc:
        print(f"autoopt: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("autoopt: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line, unless asked for the traceback
        if os.environ.get("AUTOOPT_DEBUG"):
            raise
        print(f"autoopt: internal error: {type(exc).__name__}: {exc} (set AUTOOPT_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1

