"""Where this machine's results cache lives: the folder of the results store and the calibrated constants.

Kept apart from :mod:`autoopt.results.store` so that the start-up lookups (calibrated constants,
measured winners) can find the folder, and find it empty, without importing SQLite and the store
(~5 ms of a cold ``recommend()`` on a 2-core box).
"""

from __future__ import annotations

import os
from pathlib import Path

from autoopt.errors import StoreError

__all__ = ["CACHE_ENV", "CONSTANTS_FOLDER", "FILE_NAME", "RANKS_FOLDER", "SHIPPED_DIR", "WINNERS_FOLDER",
           "default_path"]

CACHE_ENV = "AUTOOPT_CACHE_DIR"
FILE_NAME = "results.sqlite3"
#: the folder, next to the store, of per-device calibrated constants (:mod:`autoopt.results.constants`)
CONSTANTS_FOLDER = "constants"
#: the folder, next to the store, of the start-up snapshots of its winners (:mod:`autoopt.results.winners`)
WINNERS_FOLDER = "winners"
#: the folder, next to the store, of this machine's learned rank answers (:mod:`autoopt.search.rank_cache`)
RANKS_FOLDER = "ranks"
#: the shipped result sets (package data): every ``*.json`` here, in the export format
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"


def default_path() -> Path | None:
    """Where the user store lives, or None when ``AUTOOPT_CACHE_DIR=off`` switches it off or no home folder can
    be found (no ``$HOME``, ``$XDG_CACHE_HOME`` or password entry: the cache is optional, logged once)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        folder = Path(value).expanduser()
        if folder.exists() and not folder.is_dir():
            raise StoreError(f"{CACHE_ENV}={value!r} is not a folder; set it to a folder or to 'off'")
        return folder / FILE_NAME
    linux = _linux_cache_dir()
    if linux is not None:
        return Path(linux) / "autoopt" / FILE_NAME
    try:
        return _platform_cache_dir() / FILE_NAME
    except (RuntimeError, KeyError, OSError) as exc:  # platformdirs 4 / Path.home() with no home to expand
        _no_home(exc)
        return None


def _platform_cache_dir() -> Path:
    """platformdirs' cache folder for autoopt (``~/.cache/autoopt`` when platformdirs is missing)."""
    try:
        import platformdirs
    except ImportError:  # a dependency, but a broken environment should still have a cache
        return Path.home() / ".cache" / "autoopt"
    return Path(platformdirs.user_cache_dir("autoopt"))


_warned_no_home = False


def _no_home(exc: BaseException) -> None:
    """One log line for a process whose cache folder cannot be placed."""
    global _warned_no_home
    if not _warned_no_home:
        _warned_no_home = True
        from autoopt._log import get_logger

        get_logger(__name__).warning("no results cache: no home folder to put it in (%s); set %s=/some/dir to "
                                     "keep one", exc, CACHE_ENV)


def _linux_cache_dir() -> str | None:
    """``platformdirs.user_cache_dir()`` without ``appname`` on plain Linux, computed without importing
    platformdirs (which imports tempfile, shutil, bz2, lzma, random: ~8 ms of a cold ``recommend()`` on
    a 2-core box). Only the case every platformdirs release (3.x, 4.x) answers alike: ``$XDG_CACHE_HOME``
    when it is an absolute path, else ``~/.cache`` with an absolute ``$HOME``, or with ``$HOME`` unset the
    account's home from the password database (what ``os.path.expanduser`` reads; CI runners and
    services often start without ``$HOME``). None for anything else (other systems, Android, a relative
    or blank ``$XDG_CACHE_HOME`` or ``$HOME``): ask platformdirs. tests/test_rank_cache.py checks the
    two agree."""
    import sys

    if sys.platform != "linux" or hasattr(sys, "getandroidapilevel") or os.environ.get("ANDROID_DATA"):
        return None
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg is not None:
        return xdg if os.path.isabs(xdg) else None
    home = os.environ.get("HOME")
    if home is not None and not os.path.isabs(home):
        return None
    cache = os.path.expanduser("~/.cache")  # with $HOME unset: pwd.getpwuid(os.getuid()).pw_dir
    return cache if os.path.isabs(cache) else None
