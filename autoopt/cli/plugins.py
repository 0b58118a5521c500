"""``autoopt plugins``: the installed plugins, what each contributes, and any problem found loading it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from autoopt.cli._common import FORMATS, emit

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers


def register(sub: Subparsers) -> None:
    """Add ``plugins``."""
    sp = sub.add_parser("plugins", help="list installed plugins and what each contributes")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_plugins)


def cmd_plugins(args: argparse.Namespace) -> int:
    """``autoopt plugins``: one line per plugin (the built-in one included)."""
    from autoopt.plugins.manager import list_plugins
    from autoopt.report import format_table

    plugins = list_plugins()
    rows = [(p["name"], p.get("version") or "-", ", ".join(p.get("templates", [])) or "-",
             ", ".join(p.get("hooks", [])) or "-", "; ".join(p.get("problems", [])) or "ok") for p in plugins]
    emit({"plugins": plugins}, args.format,
         format_table(("plugin", "version", "templates", "hooks", "status"), rows))
    return 0
