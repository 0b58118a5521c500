"""What the verbs of the ``autoopt`` command share: the parser class and its usage error, the options
several verbs take (--profile, --gpus/--ray), the profile they run on, and the one way data reaches stdout.

Light on purpose: every verb module imports this one while ``autoopt --help`` builds the parser.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from typing import TypeAlias

    from autoopt.hardware.profile import HardwareProfile

EXIT_USAGE = 2
FORMATS = ("table", "json", "yaml")


class UsageError(Exception):
    """Bad command-line input that argparse itself would report."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are a :class:`UsageError` (one line, exit 2), not usage text and exit."""

    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
        sub = self.prog.removeprefix("autoopt").strip()
        raise UsageError(f"{sub}: {message}" if sub else message)


if TYPE_CHECKING:
    #: what ``Parser.add_subparsers`` returns: each verb module adds its commands to it
    Subparsers: TypeAlias = argparse._SubParsersAction[Parser]


def add_profile_arg(sp: argparse.ArgumentParser) -> None:
    """``--profile NAME|FILE``: which machine a verb works for (default: this one, detected)."""
    sp.add_argument("--profile", metavar="NAME|FILE",
                    help="a known profile (see `autoopt profiles`) or a saved profile file; default: detect")


def add_fleet_args(sp: argparse.ArgumentParser) -> None:
    """``--gpus`` / ``--ray``: spread a verb's evaluations over a fleet (see :func:`fleet_wanted`)."""
    sp.add_argument("--gpus", metavar="all|0,1,3",
                    help="spread the evaluations over one worker process per GPU of this host")
    sp.add_argument("--ray", nargs="?", const="auto", metavar="auto|ADDRESS",
                    help="spread them over one actor per GPU of a Ray cluster (pip install 'autoopt[ray]')")


def fleet_wanted(args: argparse.Namespace, command: str) -> bool:
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


def chosen_profile(arg: str | None, *, measure: bool = False) -> HardwareProfile:
    """The profile named by --profile (name or file), else the detected machine."""
    if arg:
        from autoopt.api import load_profile

        return load_profile(arg)
    from autoopt.hardware.detection import detect

    return detect(measure=measure)


def emit(data: Any, fmt: str, text: str | None = None) -> None:
    """Write a verb's answer to stdout: ``data`` as JSON or YAML, else ``text`` (the table; JSON without one)."""
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif fmt == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    else:
        sys.stdout.write((text if text is not None else json.dumps(data, indent=2)) + "\n")


def utc_minute(t: float) -> str:
    """A Unix time as ``YYYY-MM-DD HH:MM`` in UTC, as the tables show when something was measured or written."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))
