"""Calibrated cost-model constants, one JSON file per device, beside the results store.

``autoopt calibrate`` fits :class:`~autoopt.kernels.constants.CostConstants` to timings measured on one
GPU model and keeps them here; :func:`autoopt.search.ranking.rank` applies them on that device when
no constants were chosen explicitly. Where: ``<store folder>/constants/<device fingerprint>.json``
(the store folder is :func:`autoopt.results.store.default_path`'s parent; ``AUTOOPT_CACHE_DIR=off``
switches this off too). The device fingerprint (:attr:`GPUProfile.device_fingerprint`: name,
capability, SMs, memory) leaves out driver and software: the constants describe the silicon.

The file (``FORMAT``, version :data:`VERSION`)::

    {"format": "autoopt-cost-constants", "version": 1, "device": "<fingerprint>", "gpu": "NVIDIA H100 ...",
     "created_at": 1764000000.0, "autoopt_version": "0.2.0",
     "fitted": ["tc_efficiency", ...],          # the names the fit moved
     "constants": {"tc_efficiency": 0.81, ...},  # every constant of the fitted set
     "calibration": {...}}                       # what the fit reported (free-form, for people)

Writes go to a temporary file in the same folder and are renamed over the old one (``os.replace``),
so a reader sees the old file or the new one, never half of one. The explicit reader
(:func:`read_file`, :func:`load`) refuses anything else with a :class:`StoreError`: not a regular
file, larger than :data:`MAX_BYTES`, not UTF-8 JSON, another format or version, another device,
an unknown constant name, a value that is not a finite number > 0 (fractions at most 1). A
constant a newer autoopt added and the file lacks keeps this version's default.

:func:`calibrated_constants` is the start-up lookup the ranking calls: cached per profile object
(one dict probe warm, ~0.3 µs), never raises, never imports torch; a bad file is logged once and
ignored. Like the results lookup, it reads ``AUTOOPT_CACHE_DIR`` once per profile object: after
changing it, call :func:`clear_cache`.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from autoopt._files import write_atomic
from autoopt._log import get_logger
from autoopt.errors import StoreError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.constants import DEFAULT_CONSTANTS, FRACTIONS, CostConstants
from autoopt.results.location import CACHE_ENV, CONSTANTS_FOLDER, default_path

log = get_logger(__name__)

__all__ = ["FOLDER", "FORMAT", "MAX_BYTES", "VERSION", "StoredConstants", "calibrated_constants", "clear_cache",
           "constants_dir", "load", "parse", "path_for", "read_file", "remove", "save"]

FORMAT = "autoopt-cost-constants"
VERSION = 1
#: the folder beside the results store that holds one file per device
FOLDER = CONSTANTS_FOLDER
#: a constants file is ~2 KB; anything far larger is not one (and is not read into memory)
MAX_BYTES = 256 << 10
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
_NAMES = frozenset(f.name for f in fields(CostConstants))


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredConstants:
    """One device's calibrated constants as read from (or written to) its file."""

    device: str
    gpu: str
    constants: CostConstants
    fitted: tuple[str, ...] = ()
    created_at: float = 0.0
    autoopt_version: str = ""
    calibration: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""

    def changed(self) -> dict[str, tuple[float, float]]:
        """name -> (default, calibrated) for every constant that differs from this version's defaults."""
        base, mine = DEFAULT_CONSTANTS.to_dict(), self.constants.to_dict()
        return {k: (base[k], v) for k, v in mine.items() if v != base[k]}

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "device": self.device, "gpu": self.gpu,
                "created_at": self.created_at, "autoopt_version": self.autoopt_version,
                "fitted": list(self.fitted), "constants": self.constants.to_dict(),
                "calibration": dict(self.calibration)}


# -- where -------------------------------------------------------------------------------

def constants_dir() -> Path | None:
    """The folder of per-device constants files, or None when the cache is off (``AUTOOPT_CACHE_DIR=off``).

    StoreError when ``AUTOOPT_CACHE_DIR`` names something that is not a folder."""
    store = default_path()
    return None if store is None else store.parent / FOLDER


def _fingerprint(device: GPUProfile | str) -> str:
    fp = device.device_fingerprint if isinstance(device, GPUProfile) else str(device)
    if not _FINGERPRINT.match(fp):
        raise StoreError(f"{fp!r} is not a device fingerprint (16 lowercase hex digits, "
                         f"GPUProfile.device_fingerprint)")
    return fp


def path_for(device: GPUProfile | str) -> Path | None:
    """The constants file of ``device`` (a GPU profile or its device fingerprint); None when the cache is off."""
    folder = constants_dir()
    return None if folder is None else folder / f"{_fingerprint(device)}.json"


# -- read ----------------------------------------------------------------------------------

def _number(name: str, value: Any, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise StoreError(f"must be a finite number > 0, got {value!r}", source=source, field=f"constants.{name}")
    if name in FRACTIONS and value > 1.0:
        raise StoreError(f"is a fraction and must be at most 1, got {value!r}", source=source,
                         field=f"constants.{name}")
    return float(value)


def parse(data: Any, *, source: str = "<constants>", device: str | None = None) -> StoredConstants:
    """Check a decoded constants document (see the module doc); StoreError naming what is wrong."""
    if not isinstance(data, Mapping):
        raise StoreError(f"expected a JSON object, got {type(data).__name__}", source=source)
    if data.get("format") != FORMAT:
        raise StoreError(f"is not an autoopt constants file (format {data.get('format')!r}, expected {FORMAT!r})",
                         source=source)
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise StoreError(f"has no readable version ({version!r})", source=source)
    if version > VERSION:
        raise StoreError(f"was written by a newer autoopt (version {version}; this one reads version {VERSION}): "
                         f"upgrade autoopt or run `autoopt calibrate --reset`", source=source)
    if version != VERSION:
        raise StoreError(f"has version {version}, this autoopt reads version {VERSION}", source=source)
    fp = data.get("device")
    if not isinstance(fp, str) or not _FINGERPRINT.match(fp):
        raise StoreError(f"expected a device fingerprint (16 hex digits), got {fp!r}", source=source,
                         field="device")
    if device is not None and fp != device:
        raise StoreError(f"holds the constants of device {fp}, not of {device} (a file renamed or copied?)",
                         source=source, field="device")
    raw = data.get("constants")
    if not isinstance(raw, Mapping) or not raw:
        raise StoreError("expected a non-empty object of constants", source=source, field="constants")
    unknown = sorted(str(k) for k in raw if k not in _NAMES)
    if unknown:
        raise StoreError(f"unknown constant name(s) {unknown} (known: {', '.join(sorted(_NAMES))})",
                         source=source, field="constants")
    values = {str(k): _number(str(k), v, source) for k, v in raw.items()}
    fitted = data.get("fitted", [])
    if not isinstance(fitted, list) or not all(isinstance(n, str) and n in _NAMES for n in fitted):
        raise StoreError(f"expected a list of constant names, got {fitted!r}", source=source, field="fitted")
    created = data.get("created_at", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
        raise StoreError(f"expected seconds since 1970, got {created!r}", source=source, field="created_at")
    gpu, version_text = data.get("gpu", ""), data.get("autoopt_version", "")
    if not isinstance(gpu, str) or not isinstance(version_text, str):
        raise StoreError("gpu and autoopt_version must be strings", source=source)
    calibration = data.get("calibration", {})
    if not isinstance(calibration, Mapping):
        raise StoreError(f"expected an object, got {type(calibration).__name__}", source=source, field="calibration")
    return StoredConstants(device=fp, gpu=gpu, constants=CostConstants(**{**DEFAULT_CONSTANTS.to_dict(), **values}),
                           fitted=tuple(fitted), created_at=float(created), autoopt_version=version_text,
                           calibration=dict(calibration), path=source)


def read_file(path: str | os.PathLike[str], *, device: str | None = None) -> StoredConstants:
    """Read and check one constants file; StoreError for anything but a valid one (``device``: the
    fingerprint it must belong to)."""
    p = Path(path)
    source = str(p)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise StoreError("no such file", source=source) from None
    except OSError as exc:
        raise StoreError(f"cannot read the constants file: {exc.strerror or exc}", source=source) from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError("is not a regular file, so it cannot be a constants file", source=source)
    if st.st_size > MAX_BYTES:
        raise StoreError(f"is {st.st_size} bytes; a constants file is at most {MAX_BYTES} (move it away)",
                         source=source)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise StoreError(f"cannot read the constants file: {exc.strerror or exc}", source=source) from None
    if len(raw) > MAX_BYTES:  # grew between the stat and the read
        raise StoreError(f"is larger than {MAX_BYTES} bytes (move it away)", source=source)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreError(f"is not UTF-8 JSON ({type(exc).__name__}: {str(exc)[:120]})", source=source) from None
    return parse(data, source=source, device=device)


def load(gpu: GPUProfile | str) -> StoredConstants | None:
    """The stored constants of ``gpu``'s device, None when it has none (or the cache is off); StoreError
    when its file is unusable."""
    path = path_for(gpu)
    if path is None or not os.path.lexists(path):
        return None
    return read_file(path, device=_fingerprint(gpu))


# -- write ---------------------------------------------------------------------------------

def save(gpu: GPUProfile, consts: CostConstants, *, fitted: Iterable[str] = (),
         calibration: Mapping[str, Any] | None = None) -> Path:
    """Keep ``consts`` as the calibrated constants of ``gpu``'s device (atomically); returns the file.

    StoreError when the cache is off or the file cannot be written."""

    from autoopt.results import keys

    path = path_for(gpu)
    if path is None:
        raise StoreError(f"the results cache is off ({CACHE_ENV}=off): calibrated constants cannot be kept; "
                         f"unset it or set it to a folder")
    record = StoredConstants(device=gpu.device_fingerprint, gpu=gpu.name, constants=consts, fitted=tuple(fitted),
                             created_at=time.time(), autoopt_version=keys.autoopt_version(),
                             calibration=dict(calibration or {}))
    # what is written must read back: the same checks as the reader, before anything touches the disk
    parse(json.loads(json.dumps(record.to_dict())), source=str(path), device=record.device)
    text = json.dumps(record.to_dict(), indent=1, sort_keys=False) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as exc:
        raise StoreError(f"cannot write the constants file: {exc.strerror or exc}", source=str(path)) from None
    clear_cache()
    return path


def remove(gpu: GPUProfile | str) -> Path | None:
    """Delete ``gpu``'s stored constants; returns the file removed, None when there was none."""
    path = path_for(gpu)
    if path is None or not os.path.lexists(path):
        return None
    if path.is_dir() and not path.is_symlink():
        raise StoreError("is a folder, not a constants file: remove it by hand", source=str(path))
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot remove the constants file: {exc.strerror or exc}", source=str(path)) from None
    clear_cache()
    return path


# -- the start-up lookup -----------------------------------------------------------------------

_lock = threading.Lock()
#: id(profile) -> (profile, constants or None): the warm path is one dict probe (rank() pays it per call)
_by_object: dict[int, tuple[GPUProfile, CostConstants | None]] = {}
#: (AUTOOPT_CACHE_DIR, device fingerprint) -> constants or None: one file read per device
_by_device: dict[tuple[str | None, str], CostConstants | None] = {}
#: files already warned about (a bad file is logged once per process, then ignored)
_warned: set[str] = set()


def _quiet_load(gpu: GPUProfile) -> CostConstants | None:
    try:
        found = load(gpu)
    except StoreError as exc:
        text = str(exc)
        if text not in _warned:
            _warned.add(text)
            log.warning("calibrated constants ignored (the ranking uses the defaults): %s", exc)
        return None
    except Exception as exc:  # start-up must not fail because a cache did
        text = f"{type(exc).__name__}: {exc}"
        if text not in _warned:
            _warned.add(text)
            log.warning("calibrated constants ignored: %s", text)
        return None
    return None if found is None else found.constants


def calibrated_constants(gpu: GPUProfile) -> CostConstants | None:
    """The calibrated constants stored for ``gpu``'s device, or None. Never raises (a bad file is logged
    once and ignored). Cached per process and profile object, like the results lookup: a file written by
    another process is seen by the next one; :func:`save`/:func:`remove` in this process, and
    :func:`clear_cache` after changing ``AUTOOPT_CACHE_DIR``, make it look again."""
    hit = _by_object.get(id(gpu))
    if hit is not None and hit[0] is gpu:
        return hit[1]
    env = os.environ.get(CACHE_ENV)
    with _lock:
        try:
            fp = gpu.device_fingerprint
        except Exception:  # not a usable profile: nothing to look up
            return None
        if (env, fp) in _by_device:
            consts = _by_device[(env, fp)]
        else:
            consts = _by_device[(env, fp)] = _quiet_load(gpu)
        if len(_by_object) > 256:
            _by_object.clear()
        _by_object[id(gpu)] = (gpu, consts)
    return consts


def clear_cache() -> None:
    """Forget what :func:`calibrated_constants` read (after a file changed or ``AUTOOPT_CACHE_DIR`` did)."""
    with _lock:
        _by_object.clear()
        _by_device.clear()
        _warned.clear()
