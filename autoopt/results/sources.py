"""The identity of a kernel's source: the sha256 of the file a stored row names, read once per process.

A row is usable only while its kernel file still hashes as it did when the row was measured. Kept
apart from :mod:`autoopt.results.keys` (which builds the record types) so that the start-up winners
snapshot (:mod:`autoopt.results.winners`) can check its rows without importing them.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path, PurePosixPath

from autoopt._hash import sha256_hex

__all__ = ["MAX_SOURCE_BYTES", "PACKAGE_DIR", "clear", "hash_file", "resolve", "source_hash"]

#: the autoopt package folder: kernel files inside it are stored relative to it, so a row measured
#: in one installation matches the same file in another (a shipped or imported result set).
PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: a kernel source file larger than this is not a kernel file (and is not hashed).
MAX_SOURCE_BYTES = 4 << 20

_lock = threading.Lock()
_hashes: dict[str, str | None] = {}


def resolve(kernel_file: str) -> Path | None:
    """The file a row's ``kernel_file`` names, or None when it cannot name a kernel file.

    Relative names are inside the package folder and may not climb out of it (an imported row
    could otherwise make us read any file); absolute ones are taken as they are.
    """
    if os.path.isabs(kernel_file):
        return Path(kernel_file)
    rel = PurePosixPath(kernel_file)
    if ".." in rel.parts or not rel.parts:
        return None
    return PACKAGE_DIR.joinpath(*rel.parts)


def hash_file(path: Path) -> str | None:
    """sha256 of a regular ``.py`` file of sane size, None otherwise (a missing file: its rows are stale)."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE_BYTES or path.suffix != ".py":
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) > MAX_SOURCE_BYTES:  # grew between the stat and the read
        return None
    return sha256_hex(data)


def source_hash(kernel_file: str) -> str | None:
    """Current sha256 of a row's ``kernel_file`` (cached per process), None when it is gone or unreadable."""
    with _lock:
        if kernel_file in _hashes:
            return _hashes[kernel_file]
    path = resolve(kernel_file)
    digest = hash_file(path) if path is not None else None
    with _lock:
        _hashes[kernel_file] = digest
    return digest


def remember(kernel_file: str, digest: str) -> None:
    """Record the hash just computed for ``kernel_file`` (``keys.kernel_source`` read the file)."""
    with _lock:
        _hashes[kernel_file] = digest


def clear() -> None:
    """Forget the cached hashes (after editing a kernel)."""
    with _lock:
        _hashes.clear()
