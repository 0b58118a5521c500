"""Where ``@autoopt.autotune`` keeps the config it chose per tuning key, so a later process tunes nothing.

The autotuner needs two calls: ``get(key) -> record or None`` and ``put(key, record)`` (the
:class:`WinnerStore` protocol). A record is a JSON-able dict: the chosen config
(:func:`~autoopt.tuning.config_ranking.config_dict`), its median time in microseconds, and what
produced it. The key is a hex digest of everything the choice depends on (see
:func:`winner_key`), so a changed kernel source, GPU, driver, Triton version or config list
never reuses an old winner.

:class:`JsonWinnerStore` is the implementation until the SQLite results store
(:mod:`autoopt.results`) offers a lookup for it: one JSON object per file, keys to records,
rewritten whole through a temporary file and ``os.replace`` (atomic on POSIX), so a reader
never sees half a file and a writer killed mid-write leaves the old file. Two processes putting
at once can lose one of the two new records (last writer wins; the loser re-tunes next time),
never corrupt the file. A file that is not such an object is logged once and ignored, and is
replaced by the next put.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from autoopt._files import write_atomic
from autoopt._log import get_logger

log = get_logger(__name__)

__all__ = ["CACHE_DIR_ENV", "JsonWinnerStore", "WinnerStore", "default_path", "winner_key"]

#: environment variable naming the folder of autoopt's per-user caches.
CACHE_DIR_ENV = "AUTOOPT_CACHE_DIR"
#: bump when a record's layout changes: records of other versions are ignored.
RECORD_VERSION = 1


@runtime_checkable
class WinnerStore(Protocol):
    """What the autotuner persists winners through."""

    def get(self, key: str) -> Mapping[str, Any] | None:
        """The record stored under ``key``, or None."""

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """Store ``record`` under ``key`` (replacing any older one)."""


def default_path() -> Path:
    """``$AUTOOPT_CACHE_DIR/autotune.json``, else ``$XDG_CACHE_HOME/autoopt/...``, else ``~/.cache/autoopt/...``."""
    base = os.environ.get(CACHE_DIR_ENV)
    if base:
        return Path(base) / "autotune.json"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "autoopt" / "autotune.json"


def winner_key(*, kernel: str, source: str, key: Sequence[Any], device: str, triton: str,
               configs: Sequence[str], extra: Mapping[str, Any] | None = None) -> str:
    """Digest of what a tuning result depends on: the kernel's name and source, the tuning key's
    values (with the tensors' dtypes), the device fingerprint, the Triton version and the config
    list it was chosen from (a new config may be faster). ``repr`` of the key values, so 512 and
    512.0 stay different keys, as they are to Triton."""
    parts = {"kernel": kernel, "source": hashlib.sha256(source.encode()).hexdigest(),
             "key": [repr(v) for v in key], "device": device, "triton": triton,
             "configs": hashlib.sha256("\n".join(configs).encode()).hexdigest(), **(extra or {})}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


#: a winners file holds a few hundred bytes per tuned key; far more is not one of ours
MAX_FILE_BYTES = 64 << 20


class JsonWinnerStore:
    """Winners in one JSON file (see the module docstring for the write protocol)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self._lock = threading.Lock()
        self._warned = False

    def __repr__(self) -> str:
        return f"JsonWinnerStore({str(self.path)!r})"

    def _read(self) -> dict[str, Any]:
        import stat

        try:
            st = self.path.stat()
            if not stat.S_ISREG(st.st_mode):  # a FIFO or device here would block or never end
                self._warn(f"{self.path} is not a regular file; ignoring it")
                return {}
            if st.st_size > MAX_FILE_BYTES:
                self._warn(f"{self.path} is {st.st_size} bytes (at most {MAX_FILE_BYTES}); ignoring it")
                return {}
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            self._warn(f"cannot read {self.path}: {exc}")
            return {}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            self._warn(f"{self.path} is not JSON ({exc}); ignoring it")
            return {}
        if not isinstance(data, dict):
            self._warn(f"{self.path} holds a {type(data).__name__}, not an object; ignoring it")
            return {}
        return data

    def _warn(self, message: str) -> None:
        if not self._warned:
            log.warning("autotune store: %s", message)
            self._warned = True

    def get(self, key: str) -> Mapping[str, Any] | None:
        record = self._read().get(key)
        if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
            return None
        return record

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        with self._lock:
            data = self._read()
            data[key] = {**record, "version": RECORD_VERSION}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True))
            except OSError as exc:  # a read-only cache must not break the kernel: it re-tunes next time
                self._warn(f"cannot write {self.path}: {exc}")
