"""``autoopt fleet``: one inventory of this host's GPUs, or (``--ray``) of every node of a Ray cluster."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from autoopt.cli._common import FORMATS, emit

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers


def register(sub: Subparsers) -> None:
    """Add ``fleet``."""
    sp = sub.add_parser("fleet", help="inventory of every GPU of this host, or of a Ray cluster (--ray)")
    sp.add_argument("--ray", nargs="?", const="auto", help="a Ray cluster: auto, an address, or local (start one)")
    sp.add_argument("--measure", action="store_true", help="also time copy bandwidth on each GPU")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_fleet)


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
    emit({"hosts": sorted({r["host"] for r in rows}), "rows": rows}, args.format,
         format_table(("host", "gpu#", "gpu", "fingerprint", "profile", "driver", "free/total GiB", "copy GB/s"),
                      table, title="fleet inventory (detected on each host)"))
    return 0
