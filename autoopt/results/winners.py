"""The measured winners of one environment, snapshotted in the cache folder so start-up needs no SQLite.

On a tuned machine the first measured-winner lookup of a cold ``recommend()`` imports SQLite (with
``datetime``), the record types and the store, then opens the file: ~10 ms of the 100 ms a runtime's
start-up may take on the 2-core CI box. So the full lookup (:class:`autoopt.results.lookup.ResultLookup`)
writes, once it has read the store, one snapshot per (device fingerprint, torch, triton):
``<cache folder>/winners/<id>.json``, holding per op the rows its store and shipped layers could
answer with, nearest layer first and fastest first (per driver and kernel source, only the fastest
row: a slower one of the same source can never answer). :func:`answer` answers from it while the
files behind it are as they were when they were read:

* the store file's size and mtime, and the ``-wal`` file's size, mtime and 32-byte header, checked on
  every call (two ``stat`` calls). A commit by any process appends to the WAL, and a WAL restart
  rewrites the header's salts and checkpoint counter, so each commit changes one of these.
* the shipped result sets' names, sizes and mtimes, checked once per process: the full lookup also
  reads them once per process.

The commands that write the store (tuning, the fleet, ``calibrate --sweep``, ``store import`` and
``prune``) rewrite every existing snapshot as they finish (:func:`autoopt.results.lookup.refresh_snapshots`).
Anything else answers :data:`UNKNOWN`, and the caller asks the full lookup, which writes a fresh
snapshot: no snapshot yet, a stale or unreadable one, or rows remembered in this process (the
memory layer comes first). As in the full lookup, a row answers only while its kernel file hashes as
it did when the row was measured. What is left is a theoretical miss: two commits in one filesystem
timestamp tick that leave both files' sizes and the WAL header unchanged.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt._files import write_atomic
from autoopt._hash import sha256_hex
from autoopt._log import get_logger
from autoopt.errors import StoreError
from autoopt.results import presence
from autoopt.results.location import SHIPPED_DIR, WINNERS_FOLDER
from autoopt.results.sources import source_hash
from autoopt.results.versions import installed_version

if TYPE_CHECKING:
    from autoopt.hardware.profile import GPUProfile
    from autoopt.kernels.ops import OpSpec
    from autoopt.results.records import StoredResult

log = get_logger(__name__)

__all__ = ["FORMAT", "UNKNOWN", "VERSION", "Winner", "answer", "build", "clear", "op_key", "shipped_signature",
           "snapshot_envs", "snapshot_file", "store_signature", "write"]

FORMAT = "autoopt-winners"
VERSION = 1
#: a snapshot larger than this is not one we wrote (a store of 100 000 winners makes ~20 MB of rows,
#: but one environment's fastest row per op, driver and source is a few hundred bytes per op)
MAX_BYTES = 16 << 20
#: the WAL header: magic, format, page size, checkpoint sequence, two salts, two checksums
#: (https://www.sqlite.org/fileformat2.html#walformat)
_WAL_HEADER = 32

#: a row of a snapshot: layer, driver, kernel, path, params, us, kernel_file, kernel_hash
_Row = tuple[str, str, str, str, dict[str, Any], float, str, str]


class _Unknown:
    """The snapshot cannot answer: ask the full lookup."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class Winner:
    """A snapshot's answer for one op: the measured config and the layer it came from.

    A plain slotted class rather than a dataclass: this module is on the cold start-up path, and a
    frozen dataclass costs ~0.3 ms to create at import on the 2-core CI box.
    """

    __slots__ = ("kernel", "layer", "params", "path", "us")

    def __init__(self, *, kernel: str, path: str, params: Mapping[str, Any], us: float, layer: str) -> None:
        self.kernel, self.path, self.params, self.us, self.layer = kernel, path, dict(params), us, layer

    def config_key(self) -> tuple[Any, ...]:
        """The config's identity, as :meth:`autoopt.kernels.config.KernelConfig.key` gives it."""
        return (self.kernel, self.path, tuple(sorted(self.params.items())))

    @property
    def label(self) -> str:
        """``measured:<layer>``, as :attr:`autoopt.results.lookup.Hit.label`."""
        return f"measured:{self.layer}"

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "path": self.path, "params": dict(self.params), "us": self.us,
                "layer": self.layer}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Winner:
        return cls(kernel=data["kernel"], path=data["path"], params=data["params"], us=float(data["us"]),
                   layer=data["layer"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Winner) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.config_key(), self.us, self.layer))

    def __repr__(self) -> str:
        return f"Winner({self.label} {self.kernel} {self.params} {self.us:.3g} us)"


def op_key(op: OpSpec) -> str:
    """The op as the store keys it (``records.op_columns``: an unset out_dtype is the input dtype, a
    quantized weight joins the dtype)."""
    dtype = f"{op.dtype}+{op.weight}" if op.weight else op.dtype  # records.WEIGHT_SEP, without its import
    layout = op.layout if op.moe_gemm in (None, "both") else f"{op.layout}/{op.moe_gemm}"  # records.GEMM_SEP
    return f"{op.kind} {','.join(map(str, op.shape))} {dtype} {layout} {op.out_dtype or op.dtype}"


# -- signatures -----------------------------------------------------------------------------

def store_signature(store: Path) -> list[Any] | None:
    """What changes when any process commits to the store at ``store``: ``[size, mtime_ns, wal]``
    with ``wal`` None or ``[size, mtime_ns, header hex]``; None when there is no store file.
    An empty ``-wal`` (a reader has the store open) holds nothing and counts as none."""
    try:
        st = os.stat(store)
    except FileNotFoundError:
        return None
    wal: list[Any] | None = None
    try:
        ws = os.stat(f"{store}-wal")
        if ws.st_size > 0:
            with open(f"{store}-wal", "rb") as f:
                wal = [ws.st_size, ws.st_mtime_ns, f.read(_WAL_HEADER).hex()]
    except FileNotFoundError:
        pass
    return [st.st_size, st.st_mtime_ns, wal]


def shipped_signature(folder: Path | None) -> list[list[Any]]:
    """``[name, size, mtime_ns]`` of every ``*.json`` in the shipped folder, sorted by name."""
    if folder is None:
        return []
    try:
        entries = [(e.name, e.stat()) for e in os.scandir(folder) if e.name.endswith(".json")]
    except OSError:
        return []
    return sorted([name, st.st_size, st.st_mtime_ns] for name, st in entries)


def snapshot_file(folder: Path, device: str, torch: str, triton: str) -> Path:
    """Where the snapshot of one environment lives in the cache ``folder`` (the store's folder)."""
    name = sha256_hex(json.dumps([device, torch, triton]).encode())[:24]
    return folder / WINNERS_FOLDER / f"{name}.json"


# -- writing (by the full lookup) ------------------------------------------------------------

def build(store_rows: Iterable[StoredResult], shipped_rows: Iterable[StoredResult]) -> dict[str, list[_Row]]:
    """Per op, the rows a snapshot keeps: the store's, then the shipped sets', each fastest first, and of
    each (driver, kernel file, kernel hash) only the fastest (which shadows the rest: a lookup takes
    the first row of a matching driver whose source is unchanged)."""
    out: dict[str, list[_Row]] = {}
    seen: set[tuple[str, str, str, str, str]] = set()
    for layer, rows in (("store", store_rows), ("shipped", shipped_rows)):
        for row in sorted(rows, key=lambda r: (r.us or 0.0, r.row_id or 0)):
            key = op_key(row.op)
            ident = (layer, key, row.env.driver, row.kernel_file, row.kernel_hash)
            if ident in seen or row.us is None:
                continue
            seen.add(ident)
            c = row.config
            out.setdefault(key, []).append((layer, row.env.driver, c.kernel, c.path, dict(c.params), float(row.us),
                                            row.kernel_file, row.kernel_hash))
    return out


def write(folder: Path, *, device: str, torch: str, triton: str, store: list[Any] | None,
          shipped: list[list[Any]], ops: Mapping[str, list[_Row]]) -> Path | None:
    """Write one environment's snapshot into the cache ``folder`` (atomically: a reader sees the old file
    or the new one); returns its path, or None when it could not be written (logged, not raised: the
    snapshot only saves time)."""
    path = snapshot_file(folder, device, torch, triton)
    doc = {"format": FORMAT, "version": VERSION, "device": device, "torch": torch, "triton": triton,
           "store": store, "shipped": shipped, "ops": {k: [list(r) for r in v] for k, v in sorted(ops.items())}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(doc, separators=(",", ":")))
    except OSError as exc:
        log.debug("winners snapshot %s not written: %s", path, exc)
        return None
    return path


def snapshot_envs(folder: Path) -> list[tuple[str, str, str]]:
    """(device fingerprint, torch, triton) of every readable snapshot in the cache ``folder``: the
    environments whose start-ups read one, which a change to the store should rewrite."""
    out: list[tuple[str, str, str]] = []
    try:
        entries = sorted(os.scandir(folder / WINNERS_FOLDER), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        if not entry.name.endswith(".json"):
            continue
        try:
            if not entry.is_file(follow_symlinks=False) or entry.stat().st_size > MAX_BYTES:
                continue
            doc = json.loads(Path(entry.path).read_bytes())
            ident = (doc["device"], doc["torch"], doc["triton"])
        except (OSError, ValueError, RecursionError, KeyError, TypeError):
            continue
        if all(isinstance(v, str) for v in ident) and ident[0]:
            out.append(ident)
    return out


# -- reading (at start-up) -------------------------------------------------------------------

class _Snapshot:
    __slots__ = ("ops", "store")

    def __init__(self, store: list[Any] | None, ops: dict[str, list[_Row]]) -> None:
        self.store, self.ops = store, ops


_lock = threading.Lock()
#: per snapshot file, the last one read and checked (its shipped signature matched when read)
_loaded: dict[Path, _Snapshot] = {}
_shipped: dict[Path | None, list[list[Any]]] = {}


def clear() -> None:
    """Forget the snapshots read (tests; after replacing shipped files)."""
    with _lock:
        _loaded.clear()
        _shipped.clear()


def _shipped_now(folder: Path | None) -> list[list[Any]]:
    with _lock:
        found = _shipped.get(folder)
    if found is None:
        found = shipped_signature(folder)
        with _lock:
            _shipped[folder] = found
    return found


def _read(path: Path, ident: list[str], shipped: list[list[Any]]) -> _Snapshot | None:
    """The snapshot at ``path`` when it is one of ours for ``ident`` and ``shipped``; None otherwise."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    try:
        if (doc["format"], doc["version"]) != (FORMAT, VERSION) or doc["shipped"] != shipped \
                or [doc["device"], doc["torch"], doc["triton"]] != ident:
            return None
        ops = {str(k): [_row(r) for r in rows] for k, rows in doc["ops"].items()}
        return _Snapshot(doc["store"], ops)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.debug("winners snapshot %s ignored: %s", path, exc)
        return None


def _row(raw: Any) -> _Row:
    layer, driver, kernel, path, params, us, kernel_file, kernel_hash = raw
    if layer not in ("store", "shipped") or not isinstance(params, dict):
        raise ValueError(f"bad row {raw!r}")
    return (str(layer), str(driver), str(kernel), str(path), params, float(us), str(kernel_file), str(kernel_hash))


def _current(store: Path, ident: list[str], shipped_dir: Path | None) -> _Snapshot | None:
    """The snapshot of ``ident`` that matches the store's files now, or None."""
    now = store_signature(store)
    path = snapshot_file(store.parent, *ident)
    with _lock:
        snap = _loaded.get(path)
    if snap is not None and snap.store == now:
        return snap
    snap = _read(path, ident, _shipped_now(shipped_dir))
    if snap is None or snap.store != now:
        return None
    with _lock:
        if len(_loaded) > 16:
            _loaded.clear()
        _loaded[path] = snap
    return snap


def answer(gpu: GPUProfile, op: OpSpec, *, shipped_dir: Path | None = SHIPPED_DIR) -> Winner | _Unknown | None:
    """The measured winner the full lookup would give for ``op`` on ``gpu`` from its store and shipped
    layers, read from a current snapshot: a :class:`Winner`, None (no usable measured row), or
    :data:`UNKNOWN` (no current snapshot, or rows remembered in this process: ask the full lookup)."""
    if presence.remembered():
        return UNKNOWN
    try:
        store = presence.store_path()
    except StoreError:
        return UNKNOWN
    if store is None:
        return UNKNOWN
    ident = [gpu.device_fingerprint, installed_version("torch"), installed_version("triton")]
    snap = _current(store, ident, shipped_dir)
    if snap is None:
        return UNKNOWN
    driver = gpu.driver_version or ""
    for layer, row_driver, kernel, path, params, us, kernel_file, kernel_hash in snap.ops.get(op_key(op), ()):
        if driver and row_driver != driver:
            continue
        if source_hash(kernel_file) == kernel_hash:
            return Winner(kernel=kernel, path=path, params=params, us=us, layer=layer)
    return None
