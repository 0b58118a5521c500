"""Installed distributions' versions (torch, triton, ...), read without importing them or importlib.metadata.

The start-up lookups need torch's and triton's versions to know which measured rows apply here;
importing torch costs seconds and ``importlib.metadata`` ~25 ms, so the versions come from the
``*.dist-info``/``*.egg-info`` folder names on ``sys.path`` (one directory scan per process). Kept apart
from :mod:`autoopt.results.keys` so :mod:`autoopt.results.presence` can ask without importing the records.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

__all__ = ["clear", "installed_version"]

#: how much of a METADATA/PKG-INFO file is read for its Version: header (headers come first).
_MAX_METADATA_BYTES = 64 << 10

_lock = threading.Lock()
_versions: dict[str, str] | None = None


def _normal(name: str) -> str:
    """A distribution name as PEP 503 compares them: case-, dash-, dot- and underscore-blind."""
    return name.lower().replace("-", "_").replace(".", "_")


def _metadata_version(path: Path) -> str | None:
    """The ``Version:`` header of a METADATA/PKG-INFO file, read only when it is a small regular file."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return None
        with path.open("rb") as fh:
            head = fh.read(_MAX_METADATA_BYTES)
    except OSError:
        return None
    for line in head.decode("utf-8", "replace").splitlines():
        if not line.strip():
            break  # end of the headers
        if line.lower().startswith("version:"):
            return line.split(":", 1)[1].strip() or None
    return None


def _scan_installed() -> dict[str, str]:
    """Normalised distribution name -> version for every ``*.dist-info``/``*.egg-info`` on ``sys.path``.

    The first entry of ``sys.path`` that has a distribution wins, as it does for ``importlib.metadata``.
    Names like ``torch-2.13.0+cpu.dist-info`` carry the version (the wheel spec puts it there); an
    ``autoopt.egg-info`` without one has it read from its PKG-INFO.
    """
    found: dict[str, str] = {}
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            lower = name.lower()
            if lower.endswith(".dist-info"):
                stem, meta = name[: -len(".dist-info")], "METADATA"
            elif lower.endswith(".egg-info"):
                stem, meta = name[: -len(".egg-info")], "PKG-INFO"
            else:
                continue
            dist, _, rest = stem.partition("-")
            key = _normal(dist)
            if key in found:
                continue
            # egg-info names are name-version-pyX.Y: the version is the second part
            version = rest.split("-")[0] if rest else _metadata_version(Path(entry or ".", name, meta))
            if version:
                found[key] = version
    return found


def installed_version(dist: str) -> str:
    """Installed version of distribution ``dist`` (``""`` when absent), read from its metadata folder's name.

    Never imports the distribution; one directory scan per process (:func:`clear_caches` forgets it).
    """
    global _versions
    with _lock:
        if _versions is None:
            _versions = _scan_installed()
        return _versions.get(_normal(dist), "")


def clear() -> None:
    """Forget the scan (after installing or removing a distribution)."""
    global _versions
    with _lock:
        _versions = None
