"""Results as JSON: ``autoopt store export/import``, and the format of the shipped result sets.

The format (version 1)::

    {
      "format": "autoopt-results",
      "version": 1,
      "exported_at": 1767225600.0,          # seconds since 1970 (optional)
      "autoopt_version": "0.2.0",           # who wrote it (optional)
      "rows": [ <StoredResult.to_dict()>, ... ]
    }

and each row::

    {"env": {"device": "<GPUProfile.device_fingerprint>", "gpu": "NVIDIA H200", "driver": "580.159.04",
             "torch": "2.11.0+cu130", "triton": "3.6.0"},
     "op": {"kind": "gemm", "shape": [256, 6144, 4096], "dtype": "bf16", "layout": "nk", "out_dtype": "bf16"},
     "config": {"kernel": "gemm", "path": "standard", "template": "gemm",
                "config": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}},
     "label": "measured", "us": 41.2, "max_error": 0.0031, "reason": "",
     "kernel_file": "backend/kernels/gemm.py", "kernel_hash": "<sha256 of that file>",
     "measured_at": 1767225600.0, "autoopt_version": "0.2.0"}

A file is read only after it is found to be a regular file of at most :data:`MAX_FILE_BYTES`; then
every row is checked (unknown, missing and ill-typed fields are a :class:`StoreError` naming the
file, the row's index in ``rows`` and the field) before any is stored, and the rows are stored in
one transaction. Importing is idempotent: a row already in the store (same identity, same or newer
``measured_at``) changes nothing.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt._files import write_atomic
from autoopt._log import get_logger
from autoopt.errors import StoreError
from autoopt.results import keys
from autoopt.results.records import StoredResult

if TYPE_CHECKING:  # the shipped results are read at start-up: SQLite is imported only by who imports a file
    from autoopt.results.store import PutSummary, ResultStore

log = get_logger(__name__)

__all__ = ["FORMAT", "FORMAT_VERSION", "MAX_FILE_BYTES", "document", "export_file", "import_file", "parse",
           "read_file"]

FORMAT = "autoopt-results"
FORMAT_VERSION = 1
#: a results file larger than this is refused unread (a million rows take ~600 MB of JSON; a team's
#: tuned set is thousands)
MAX_FILE_BYTES = 256 << 20
_TOP_FIELDS = ("format", "version", "exported_at", "autoopt_version", "rows")
_FORMAT_TEXT = json.dumps(FORMAT).encode()


def document(rows: Iterable[StoredResult]) -> dict[str, Any]:
    """The export document of ``rows``."""
    return {"format": FORMAT, "version": FORMAT_VERSION, "exported_at": round(time.time(), 3),
            "autoopt_version": keys.autoopt_version(), "rows": [r.to_dict() for r in rows]}


def parse(data: Any, *, source: str = "<data>", device: str | None = None,
          env: Mapping[str, str] | None = None) -> list[StoredResult]:
    """Every row of an export document, each checked; StoreError naming the row and field otherwise.
    With ``device``, only the rows measured on that device (``env.device``) are checked and returned,
    and with ``env`` only those whose environment has these values (``{"torch": "2.11.0", ...}``): a
    start-up lookup for one GPU and software stack does not pay for validating rows it can never use
    (157 rows of another torch: ~10 ms of a cold recommend() on a 2-core box)."""
    want = {**(env or {}), **({"device": device} if device is not None else {})}
    if not isinstance(data, Mapping):
        raise StoreError(f"expected a JSON object with \"format\": \"{FORMAT}\", got {type(data).__name__}",
                         source=source)
    for key in data:
        if key not in _TOP_FIELDS:
            raise StoreError(f"unknown field (known: {', '.join(_TOP_FIELDS)})", source=source, field=str(key))
    if data.get("format") != FORMAT:
        raise StoreError(f"expected \"{FORMAT}\", got {data.get('format')!r}: not an autoopt results file",
                         source=source, field="format")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise StoreError(f"expected an integer, got {version!r}", source=source, field="version")
    if version > FORMAT_VERSION:
        raise StoreError(f"format version {version} was written by a newer autoopt (this one reads "
                         f"version {FORMAT_VERSION}): upgrade autoopt", source=source, field="version")
    if version < 1:
        raise StoreError(f"format version {version} does not exist (this one reads {FORMAT_VERSION})",
                         source=source, field="version")
    rows = data.get("rows")
    if not isinstance(rows, list):
        raise StoreError(f"expected a list of rows, got {type(rows).__name__}", source=source, field="rows")
    out = []
    for i, raw in enumerate(rows):
        if want and not (isinstance(raw, Mapping) and isinstance(raw.get("env"), Mapping)
                         and all(raw["env"].get(k) == v for k, v in want.items())):
            continue
        try:
            out.append(StoredResult.from_dict(raw))
        except StoreError as exc:
            raise StoreError(_bare(exc), source=source, row=i, field=exc.field) from None
    return out


def _bare(exc: StoreError) -> str:
    """The message of ``exc`` without the "field '...': " prefix it was built with (it is re-added)."""
    text = str(exc)
    prefix = f"field '{exc.field}': " if exc.field else ""
    return text[len(prefix):] if prefix and text.startswith(prefix) else text


def read_file(path: str | os.PathLike[str], *, device: str | None = None,
              env: Mapping[str, str] | None = None) -> list[StoredResult]:
    """The rows of a results file, checked: a regular file, at most :data:`MAX_FILE_BYTES`, UTF-8 JSON
    in the format above. Anything else is a StoreError naming the file (and the row and field).
    ``device`` and ``env`` keep only that device's / environment's rows (see :func:`parse`); a results
    file whose text lacks one of them, written as :func:`export_file` writes it, is not decoded at all."""
    p = Path(path)
    source = str(p)
    try:
        st = p.stat()
    except OSError as exc:
        raise StoreError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, pipe or socket"
        raise StoreError(f"is {what}, not a results file", source=source)
    if st.st_size > MAX_FILE_BYTES:
        raise StoreError(f"is {st.st_size} bytes; a results file is at most {MAX_FILE_BYTES} bytes",
                         source=source)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)  # +1: a file that grew since the stat is still caught
    except OSError as exc:
        raise StoreError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if len(raw) > MAX_FILE_BYTES:
        raise StoreError(f"is over {MAX_FILE_BYTES} bytes; a results file is at most that", source=source)
    want = [*(env or {}).values(), *((device,) if device is not None else ())]
    if want and _FORMAT_TEXT in raw and any(json.dumps(v, ensure_ascii=False).encode() not in raw for v in want):
        # a results file (as export_file writes them) with a row of these values holds their JSON text:
        # none here, so nothing to decode (a shipped file of another GPU or torch costs a read, not a
        # ~1.5 ms parse). A file that does not even look like one is parsed, so its error is reported.
        return []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreError(f"is not UTF-8 text (byte {exc.start}): not a results file", source=source) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreError(f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                         source=source) from None
    except RecursionError:
        raise StoreError("is JSON nested too deeply to be a results file", source=source) from None
    return parse(data, source=source, device=device, env=env)


def import_file(store: ResultStore, path: str | os.PathLike[str]) -> PutSummary:
    """Check every row of a results file, then store them all in one transaction."""
    rows = read_file(path)
    summary = store.put_many(rows)
    log.info("imported %s: %s", path, summary.to_dict())
    return summary


def export_file(rows: Iterable[StoredResult], path: str | os.PathLike[str]) -> int:
    """Write ``rows`` as a results file; returns how many. Written to a temporary file in the same
    folder and renamed over ``path``, so a reader never sees half a file."""
    doc = document(rows)
    target = Path(path)
    try:
        write_atomic(target, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise StoreError(f"cannot write: {exc.strerror or exc}", source=str(target)) from None
    return len(doc["rows"])
