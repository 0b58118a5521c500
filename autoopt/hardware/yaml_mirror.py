"""The package's own YAML (known-hardware profiles, the model catalog), already parsed: a JSON mirror.

Importing PyYAML costs ~15-20 ms (its pure-Python reader, scanner and resolver compile their
regular expressions at import) of a cold ``recommend()`` on a 2-core box, more than parsing the two
small files it is needed for. So each shipped YAML data set has a mirror beside it: the exact text
of every file and what the safe loader made of it. A file whose text is exactly the text in the
mirror gets the mirrored data (the same objects PyYAML would return: the mirror keeps only files
whose data JSON carries exactly, checked when it is written); any other text -- an edited file, a
user's own -- is parsed as YAML, so a stale mirror costs time, never correctness.

The mirror (``FORMAT``, :data:`VERSION`)::

    {"format": "autoopt-yaml-mirror", "version": 1,
     "files": {"h100-sxm.yaml": {"text": "<the file's text>", "data": <what yaml.safe_load returns>}}}

It is read only after it is found to be a regular file of at most :data:`MAX_BYTES`; an unreadable
or foreign one is logged once and ignored. ``benchmarks/regen_startup_cache.py`` rewrites the
mirrors with the rank cache (:func:`write`).
"""

from __future__ import annotations

import stat
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from autoopt._files import write_atomic
from autoopt._log import get_logger

log = get_logger(__name__)

__all__ = ["FORMAT", "MAX_BYTES", "VERSION", "clear_cache", "load", "write"]

FORMAT = "autoopt-yaml-mirror"
VERSION = 1
#: the mirrors are ~30-80 KB; far larger is not one of ours (and is not read into memory)
MAX_BYTES = 4 << 20

_lock = threading.Lock()
#: mirror path -> its files (name -> {"text", "data"}); None: absent or unusable
_mirrors: dict[Path, Mapping[str, Any] | None] = {}


def clear_cache() -> None:
    """Forget the mirrors read (after rewriting one in this process)."""
    with _lock:
        _mirrors.clear()


def _read(mirror: Path) -> Mapping[str, Any] | None:
    import json

    try:
        st = mirror.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("YAML mirror %s ignored: %s", mirror, exc.strerror or exc)
        return None
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "not a regular file"
    elif st.st_size > MAX_BYTES:
        problem = f"{st.st_size} bytes, more than a mirror holds ({MAX_BYTES})"
    else:
        try:
            with mirror.open("rb") as fh:
                doc = json.loads(fh.read(MAX_BYTES + 1).decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError: ValueErrors
            doc, problem = None, f"unreadable ({type(exc).__name__})"
        if problem is None:
            if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION \
                    or not isinstance(doc.get("files"), dict):
                problem = f"not a version-{VERSION} {FORMAT} document"
            else:
                return doc["files"]
    log.warning("YAML mirror %s ignored (the YAML is parsed instead): %s", mirror, problem)
    return None


def load(text: str, name: str, mirror: Path) -> Any | None:
    """What ``yaml.safe_load(text)`` returns for the file called ``name``, from ``mirror`` when it holds
    exactly this text for that name; None when it does not (parse the YAML)."""
    with _lock:
        if mirror in _mirrors:
            files = _mirrors[mirror]
        else:
            files = _mirrors[mirror] = _read(mirror)
    entry = files.get(name) if files is not None else None
    if not isinstance(entry, dict) or entry.get("text") != text:
        return None
    return entry.get("data")


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == 1.0 == True`` is not good enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def write(files: Iterable[Path], mirror: Path) -> Path:
    """Parse each YAML file with PyYAML's safe loader and write ``mirror`` (atomically); returns it.
    A file whose data JSON cannot carry exactly (dates, non-string keys, sets) is left out and parsed
    as YAML when loaded."""
    import json

    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(files, key=lambda p: p.name):
        text = path.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=loader)
        try:
            carried = json.loads(json.dumps(data))
        except (TypeError, ValueError):
            carried = None
        if carried is None or not _same(carried, data):
            log.info("%s left out of %s: its data does not survive JSON exactly", path, mirror.name)
            continue
        out[path.name] = {"text": text, "data": data}
    doc = {"format": FORMAT, "version": VERSION, "files": out}
    write_atomic(mirror, json.dumps(doc, indent=0) + "\n")
    clear_cache()
    return mirror
