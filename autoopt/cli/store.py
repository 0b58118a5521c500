"""``autoopt store list|show|export|import|prune``: the results store of measured timings
(see :mod:`autoopt.results.store`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from autoopt.cli._common import FORMATS, Parser, UsageError, emit, utc_minute

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers
    from autoopt.results.store import ResultStore


def register(sub: Subparsers) -> None:
    """Add ``store`` and its five actions."""
    sp = sub.add_parser("store", help="the results store: list, show, export, import, prune measured results")
    ss = sp.add_subparsers(dest="store_command", metavar="{list,show,export,import,prune}", parser_class=Parser,
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


def cmd_store(args: argparse.Namespace) -> int:
    """``autoopt store list|show|export|import|prune``: the results store (see autoopt.results.store)."""
    from autoopt.results import store as rstore

    action = args.store_command
    path = rstore.default_path()
    if path is None:
        if action in ("list", "show"):
            emit({"path": None, "enabled": False, "groups": [], "rows": []}, args.format,
                 f"results store: off ({rstore.CACHE_ENV}=off)")
            return 0
        raise UsageError(f"store {action}: the results store is off ({rstore.CACHE_ENV}=off); unset it or set it "
                         f"to a folder")
    # reading never creates the file; import does
    st = rstore.ResultStore(path, create=True) if action == "import" or path.exists() else None
    _ACTIONS[action](args, path, st)
    return 0


def _list(args: argparse.Namespace, path: Path, st: ResultStore | None) -> None:
    """``store list``: one line per device and op."""
    from autoopt.report import format_table

    groups = st.summary() if st else []
    rows = [(g["gpu"] or "-", g["device"], g["triton"] or "-", g["torch"] or "-", g["op_label"], g["rows"],
             g["measured"], g["failed"], g["stale"], "-" if g["best_us"] is None else f"{g['best_us']:.2f}",
             utc_minute(g["newest"])) for g in groups]
    emit({"path": str(path), "enabled": True, "groups": groups}, args.format, format_table(
        ("gpu", "device", "triton", "torch", "op", "rows", "measured", "failed", "stale", "best µs", "newest"),
        rows, title=f"results store {path}: {sum(g['rows'] for g in groups)} rows"))


def _show(args: argparse.Namespace, path: Path, st: ResultStore | None) -> None:
    """``store show``: every row of one op, fresh and measured first, fastest first."""
    from autoopt.kernels.ops import OpSpec, parse_shape
    from autoopt.report import format_table
    from autoopt.results.store import ResultStore

    op = OpSpec(kind=args.op.lower(), shape=parse_shape(args.shape), dtype=args.dtype, layout=args.layout)
    found = [ResultStore.view(r) for r in (st.rows(op=op) if st else [])]
    found.sort(key=lambda r: (r["stale"], r["label"] != "measured", r["us"] or 0.0))
    lines = [(r["id"], r["env"]["gpu"] or r["env"]["device"], r["env"]["triton"] or "-", r["label"],
              "-" if r["us"] is None else f"{r['us']:.2f}",
              "-" if r["max_error"] is None else f"{r['max_error']:.2g}", r["config"]["kernel"],
              " ".join(f"{k}={v}" for k, v in r["config"]["config"].items()), r["config"]["path"],
              "stale" if r["stale"] else "", utc_minute(r["measured_at"]), r["reason"].splitlines()[0][:60]
              if r["reason"] else "") for r in found]
    emit({"path": str(path), "op": op.to_dict(), "rows": found}, args.format, format_table(
        ("id", "gpu", "triton", "label", "µs", "max err", "kernel", "config", "path", "stale", "measured",
         "reason"), lines, title=f"{op.label()} in {path}: {len(lines)} rows"))


def _export(args: argparse.Namespace, path: Path, st: ResultStore | None) -> None:
    """``store export FILE``: the chosen rows in the shipped-results format, to FILE or stdout (``-``)."""
    from autoopt.results import keys, transfer

    chosen = [r for r in (st.rows(device=args.device) if st else [])
              if args.include_stale or not keys.is_stale(r)]
    if args.file == "-":
        sys.stdout.write(json.dumps(transfer.document(chosen), indent=1) + "\n")
    else:
        if not Path(args.file).resolve().parent.is_dir():
            raise UsageError(f"store export: cannot write {args.file!r}: its folder does not exist")
        transfer.export_file(chosen, args.file)
    print(f"autoopt: exported {len(chosen)} rows from {path}", file=sys.stderr)


def _import(args: argparse.Namespace, path: Path, st: ResultStore | None) -> None:
    """``store import FILE``: add an exported file's rows (idempotent), then refresh the start-up snapshots."""
    from autoopt.results import transfer

    assert st is not None
    summary = transfer.import_file(st, args.file)
    _refresh_snapshots(st)
    emit({"path": str(path), **summary.to_dict()}, args.format,
         f"imported {args.file} into {path}: {summary.new} new, {summary.updated} updated, "
         f"{summary.unchanged} already there")


def _prune(args: argparse.Namespace, path: Path, st: ResultStore | None) -> None:
    """``store prune``: remove (or with --dry-run, count) the rows that meet every given criterion."""
    days = args.older_than
    if days is not None and not days >= 0:  # `not >=` also refuses nan
        raise UsageError(f"store prune: --older-than must be a number of days >= 0, got {days}")
    if not (args.stale or days is not None or args.device):
        raise UsageError("store prune: say what to remove: --stale, --older-than DAYS and/or --device FP|NAME")
    n = st.prune(stale=args.stale, older_than_days=days, device=args.device, dry_run=args.dry_run) if st else 0
    if st is not None and n and not args.dry_run:
        _refresh_snapshots(st)
    emit({"path": str(path), "removed": 0 if args.dry_run else n, "matched": n}, args.format,
         f"{'would remove' if args.dry_run else 'removed'} {n} rows from {path}")


_ACTIONS: dict[str, Callable[[argparse.Namespace, Path, ResultStore | None], None]] = {
    "list": _list, "show": _show, "export": _export, "import": _import, "prune": _prune}


def _refresh_snapshots(store: ResultStore) -> None:
    """After the store changed: rewrite its start-up snapshots (the next start-up reads them)."""
    from autoopt.results.lookup import refresh_snapshots

    store.close()  # ours is then not the connection that keeps the WAL alive (see refresh_snapshot)
    refresh_snapshots(store.path)
