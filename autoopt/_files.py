"""Writing a file so that a reader sees the old one or the new one, never half of one.

Every store autoopt keeps (results, constants, winners, the rank cache, the profile mirror, the runtimes'
config files) is written through :func:`write_atomic`: a temporary file in the same folder, flushed and
synced, then renamed over the target (``os.replace``, atomic on POSIX). A killed process leaves the old file
intact and at most a ``.NAME.*.tmp`` beside it; a failure removes the temporary file and raises the OSError.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) atomically; OSError as raised."""
    import tempfile  # here, not at import: tempfile (shutil, bz2, lzma, random) is ~5 ms of a cold recommend()

    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
