"""The ``autoopt`` command line: a thin layer over the Python API.

Data goes to stdout, diagnostics to stderr. Bad input of any kind (an unknown
profile, a malformed shape, an unreadable file) is one line on stderr and exit
status 2, never a traceback.

One module per verb (or family of verbs): each adds its sub-commands to the parser
(``register``) and holds their handlers; :mod:`autoopt.cli._common` holds what they
share. ``autoopt --help`` loads every verb module, so at load time they import only
the standard library, ``_common`` and :mod:`autoopt.errors`; a handler imports what it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from autoopt.cli import (
    bench,
    calibrate,
    check,
    export,
    fleet,
    kernel,
    plugins,
    profile,
    recommend,
    store,
    trace,
    tune,
)
from autoopt.cli._common import EXIT_USAGE, Parser, UsageError
from autoopt.errors import AutooptError

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers

__all__ = ["build_parser", "main"]


class _Verb(Protocol):
    """A verb module: it adds its sub-commands, each with ``func`` set to its handler."""

    def register(self, sub: Subparsers) -> None: ...


#: the verb modules, in the order ``autoopt --help`` lists their commands
VERBS: tuple[_Verb, ...] = (profile, kernel, plugins, bench, recommend, export, tune, store, fleet, trace, check,
                            calibrate)


def build_parser() -> argparse.ArgumentParser:
    """The ``autoopt`` parser: the global options, then every verb's sub-commands."""
    p = Parser(prog="autoopt", description="Hardware-aware kernel and model-plan recommendations.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log diagnostics to stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for verb in VERBS:
        verb.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status: 0, 1 (a check failed, or a bug), 2 (bad input), 130 (interrupted)."""
    parser = build_parser()
    try:
        return _run(parser, argv)
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


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv``, set up logging (-v, -vv) and run the command's handler (no command: the help, exit 2)."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                        format="autoopt: %(levelname)s: %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(args.func(args) or 0)
