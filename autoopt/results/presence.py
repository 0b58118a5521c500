"""Whether the start-up lookups can find anything on this machine, answered without importing them.

A fresh install has measured nothing: no results store, no calibrated constants, and shipped result
sets (``results/shipped/``) measured on other GPUs or software. There the measured-winner lookup
(:mod:`autoopt.results.lookup`) and the calibrated-constants lookup (:mod:`autoopt.results.constants`)
can only answer None, and importing them (records, keys and their dataclasses) costs ~8 ms of a cold
``recommend()`` on the 2-core CI box, 8 % of its 100 ms budget. These checks cost a ``stat`` or two,
and one read of the shipped files' bytes per GPU and software stack.

Each answer is "may": True sends the caller to the real lookup, which decides (and reports a broken
file); False is given only when no layer can hold a row.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

from autoopt.errors import StoreError
from autoopt.results.location import CACHE_ENV, CONSTANTS_FOLDER, SHIPPED_DIR, default_path
from autoopt.results.versions import installed_version

__all__ = ["clear", "may_have_constants", "may_have_measured", "note_remembered", "remembered", "store_path"]

#: the JSON text of the export format's name (``autoopt.results.transfer.FORMAT``): a file without it
#: is not one export_file wrote, and only the real reader can say what it is
_FORMAT_TEXT = b'"autoopt-results"'
#: a shipped file larger than this is left to the real reader (which caps at 256 MiB and says so)
_MAX_SCAN_BYTES = 64 << 20

_lock = threading.Lock()
_remembered = False
_shipped: dict[tuple[Path, str, str, str], bool] = {}
#: the store's path per value of the variables that place it (default_path() costs ~35 us: Path
#: arithmetic, ``expanduser`` and a stat, twice per op of a cold recommend())
_paths: dict[tuple[str | None, ...], Path | None] = {}
_PLACING = (CACHE_ENV, "XDG_CACHE_HOME", "HOME")


def note_remembered() -> None:
    """A lookup in this process now holds rows in memory (called by ``ResultLookup.remember``)."""
    global _remembered
    _remembered = True


def remembered() -> bool:
    """Whether a lookup in this process holds rows in memory (they come before any file)."""
    return _remembered


def clear() -> None:
    """Forget the shipped-file answers and the in-memory flag (tests; after replacing shipped files)."""
    global _remembered
    with _lock:
        _remembered = False
        _shipped.clear()
        _paths.clear()


def store_path() -> Path | None:
    """default_path(), remembered per value of the variables it reads; StoreError as it raises it."""
    env = tuple(os.environ.get(name) for name in _PLACING)
    try:
        return _paths[env]
    except KeyError:
        pass
    path = default_path()  # raises for a bad AUTOOPT_CACHE_DIR: not remembered, asked again next time
    if len(_paths) > 16:
        _paths.clear()
    _paths[env] = path
    return path


def may_have_constants() -> bool:
    """False when no calibrated constants can exist: the cache is off, or its constants folder is absent."""
    try:
        store = store_path()
    except StoreError:  # a bad AUTOOPT_CACHE_DIR: the real lookup reports it
        return True
    return store is not None and os.path.isdir(store.parent / CONSTANTS_FOLDER)


def may_have_measured(device: str, shipped_dir: Path = SHIPPED_DIR) -> bool:
    """False when no layer of the measured-winner lookup can hold a row of device fingerprint ``device``
    here: nothing remembered in this process, no user store file, and no shipped file that holds this
    device's fingerprint together with the installed torch's and triton's versions."""
    if _remembered:
        return True
    try:
        store = store_path()
    except StoreError:
        return True
    if store is not None and os.path.exists(store):
        return True
    ident = (shipped_dir, device, installed_version("torch"), installed_version("triton"))
    with _lock:
        found = _shipped.get(ident)
        if found is None:
            found = _shipped[ident] = _shipped_mention(*ident)
    return found


def _shipped_mention(folder: Path, *values: str) -> bool:
    """Whether some ``*.json`` in ``folder`` may hold a row with all of ``values``: export_file writes
    each value's JSON text as it is (``ensure_ascii=False``), so a file that lacks one has no such row.
    A file that is not a plain, readable export counts as a maybe."""
    wanted = [json.dumps(v, ensure_ascii=False).encode() for v in values]
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return False
    for name in names:
        if not name.endswith(".json"):
            continue
        path = folder / name
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_SCAN_BYTES:
                return True
            raw = path.read_bytes()
        except OSError:
            return True
        if _FORMAT_TEXT not in raw or all(w in raw for w in wanted):
            return True
    return False
