"""The start-up lookup: the best known measured config of an op, from the nearest layer that has one.

Order: in-memory (rows this process measured and :meth:`ResultLookup.remember`-ed) -> the user store
(SQLite, see :mod:`autoopt.results.store`) -> the shipped result sets (package data, JSON in
``results/shipped/``) -> ``None``, and the caller falls back to the cost model. A hit's ``label``
says which layer answered (``measured:memory``, ``measured:store``, ``measured:shipped``).

Only ``measured`` rows of this exact environment (device fingerprint, driver, torch, triton) whose
kernel file still hashes as it did are answers (a profile that names no driver, such as a known
profile loaded by name, takes any driver's), so a changed kernel or another triton misses and
the old rows stay where they are, unused.

A lookup never imports torch or triton, never writes to the store, and never raises for a store it
cannot use: a corrupt or foreign store file is logged once and skipped (start-up must not fail
because a cache did). Warm, a lookup costs tens of microseconds (one indexed SQLite query or two dict
probes). The first lookup of an environment writes that environment's start-up snapshot into the
cache folder (:mod:`autoopt.results.winners`), which later processes answer from without SQLite.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt._log import get_logger
from autoopt.errors import StoreError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.ops import OpSpec
from autoopt.results import keys, presence, winners
from autoopt.results.location import SHIPPED_DIR, default_path
from autoopt.results.records import WINNER_LABEL, EnvKey, ResultKey, StoredResult

if TYPE_CHECKING:  # opened only when the user store exists: a machine that measured nothing never imports SQLite
    from autoopt.results.store import ResultStore

log = get_logger(__name__)

__all__ = ["LAYERS", "SHIPPED_DIR", "Hit", "ResultLookup", "default_lookup", "lookup", "refresh_snapshots",
           "reset_default_lookup"]

#: the layers, nearest first
LAYERS = ("memory", "store", "shipped")


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    """A lookup's answer: the winning row and the layer it came from."""

    result: StoredResult
    layer: str

    @property
    def label(self) -> str:
        """``measured:<layer>``: a real timing, and where it was found."""
        return f"{WINNER_LABEL}:{self.layer}"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "layer": self.layer, **self.result.to_dict()}


def _any_driver(key: ResultKey) -> ResultKey:
    """``key`` as a profile without a driver asks for it: a known profile (``--profile h100-sxm``)
    names no driver, and takes a measurement of that GPU model under any driver."""
    return ResultKey(env=replace(key.env, driver=""), op=key.op)


def _faster(a: StoredResult, b: StoredResult | None) -> bool:
    return b is None or (a.us or 0.0) < (b.us or 0.0)


class ResultLookup:
    """The layered lookup. ``store_path`` None: no user-store layer; ``shipped_dir`` None: no shipped layer.

    The store is opened on first use and never created here (a machine that has measured nothing
    has no file; a lookup looks again on later calls, one ``stat``). Thread-safe.
    """

    def __init__(self, *, store_path: str | os.PathLike[str] | None = None,
                 shipped_dir: str | os.PathLike[str] | None = SHIPPED_DIR) -> None:
        self.store_path = Path(store_path) if store_path is not None else None
        self.shipped_dir = Path(shipped_dir) if shipped_dir is not None else None
        self._lock = threading.Lock()
        self._memory: dict[ResultKey, StoredResult] = {}
        self._store: ResultStore | None = None
        self._store_broken = False
        #: per (device fingerprint, torch, triton), the shipped rows measured there (read on first lookup)
        self._shipped: dict[tuple[str, str, str], dict[ResultKey, list[StoredResult]]] = {}
        #: the environments whose start-up snapshot this lookup has written (or tried to)
        self._snapped: set[tuple[str, str, str]] = set()

    @classmethod
    def default(cls) -> ResultLookup:
        """The user store at its default place (none when ``AUTOOPT_CACHE_DIR=off`` or unusable) and
        the package's shipped result sets."""
        try:
            path = default_path()
        except StoreError as exc:
            log.warning("results store not used: %s", exc)
            path = None
        return cls(store_path=path)

    # -- layers ------------------------------------------------------------------------------

    def remember(self, row: StoredResult) -> None:
        """Keep a row measured in this process as the in-memory answer for its key (the fastest of
        those remembered). Only ``measured`` rows can answer; others are ignored."""
        if row.label != WINNER_LABEL:
            return
        presence.note_remembered()
        with self._lock:
            for key in (row.key, _any_driver(row.key)):
                if _faster(row, self._memory.get(key)):
                    self._memory[key] = row

    def _user_store(self) -> ResultStore | None:
        if self.store_path is None or self._store_broken:
            return None
        if self._store is None:
            if not self.store_path.exists():
                return None
            from autoopt.results.store import ResultStore

            try:
                self._store = ResultStore(self.store_path, create=False)
            except StoreError as exc:
                self._broken(exc)
                return None
        return self._store

    def _broken(self, exc: StoreError) -> None:
        log.warning("results store skipped for this run: %s", exc)
        self._store_broken = True
        if self._store is not None:
            self._store.close()
            self._store = None

    def _shipped_index(self, env: EnvKey) -> dict[ResultKey, list[StoredResult]]:
        """The shipped winners measured on ``env``'s device with its torch and triton (the only rows a key
        of ``env`` can match, under any driver); only those rows are validated, so the first start-up
        lookup pays for one GPU and software stack, not every shipped row."""
        ident = (env.device, env.torch, env.triton)
        index = self._shipped.get(ident)
        if index is None:
            from autoopt.results.transfer import read_file

            index = {}
            files = sorted(self.shipped_dir.glob("*.json")) if self.shipped_dir and self.shipped_dir.is_dir() else []
            for path in files:
                try:
                    rows = read_file(path, device=env.device, env={"torch": env.torch, "triton": env.triton})
                except StoreError as exc:  # package data a user edited: skip that file, keep the rest
                    log.warning("shipped results skipped: %s", exc)
                    continue
                for row in rows:
                    if row.label == WINNER_LABEL:
                        index.setdefault(row.key, []).append(row)
                        index.setdefault(_any_driver(row.key), []).append(row)
            for rows in index.values():
                rows.sort(key=lambda r: r.us or 0.0)
            self._shipped[ident] = index
        return index

    def _snapshot(self, env: EnvKey) -> None:
        """Write the start-up snapshot of ``env``'s store and shipped winners (:mod:`autoopt.results.winners`),
        once per environment and lookup: the next process answers from it without SQLite. Skipped when
        a commit lands while the store is read (the snapshot would not match its signature), and when
        there is nothing to snapshot."""
        ident = (env.device, env.torch, env.triton)
        if self.store_path is None or ident in self._snapped:
            return
        self._snapped.add(ident)
        before = winners.store_signature(self.store_path)
        shipped_sig = winners.shipped_signature(self.shipped_dir)
        store = self._user_store()
        stored: list[StoredResult] = []
        if store is not None:
            try:
                stored = store.winners(*ident)
            except StoreError as exc:
                self._broken(exc)
                return
        shipped = {id(r): r for k, rows in self._shipped_index(env).items() if not k.env.driver for r in rows}
        if (store is None and not shipped) or winners.store_signature(self.store_path) != before:
            return
        winners.write(self.store_path.parent, device=env.device, torch=env.torch, triton=env.triton, store=before,
                      shipped=shipped_sig, ops=winners.build(stored, shipped.values()))

    def refresh_snapshot(self, env: EnvKey) -> None:
        """Write ``env``'s start-up snapshot now, whether or not this lookup wrote it before: after a
        tuning run changed the store, so the next start-up reads the new winners without SQLite."""
        with self._lock:
            # when ours is the last connection to the store, closing it moves the WAL into the file; the
            # snapshot then signs the files as a later close leaves them, not as they are before it
            if self._store is not None:
                self._store.close()
                self._store = None
            self._snapped.discard((env.device, env.torch, env.triton))
            self._snapshot(env)

    # -- the lookup --------------------------------------------------------------------------

    def best(self, key: ResultKey) -> Hit | None:
        """The nearest layer's fastest usable ``measured`` row for ``key``, or None (use the cost model)."""
        with self._lock:
            row = self._memory.get(key)
            if row is not None and not keys.source_changed(row):
                return Hit(result=row, layer="memory")
            self._snapshot(key.env)
            store = self._user_store()
            if store is not None:
                try:
                    found = store.best(key)
                except StoreError as exc:
                    self._broken(exc)
                    found = None
                if found is not None:
                    return Hit(result=found, layer="store")
            for row in self._shipped_index(key.env).get(key, ()):
                if not keys.source_changed(row):
                    return Hit(result=row, layer="shipped")
        return None

    def lookup(self, gpu: GPUProfile, op: OpSpec) -> Hit | None:
        """:meth:`best` for ``op`` on ``gpu`` in this process's environment (installed torch/triton)."""
        return self.best(keys.current_key(gpu, op))

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def refresh_snapshots(store_path: str | os.PathLike[str], *, also: Iterable[EnvKey] = ()) -> int:
    """Rewrite the start-up snapshot of every environment that has one beside the store at
    ``store_path``, and write those of ``also`` (a tuning run's own GPU), after a command changed the
    store, so that the next start-up does not pay for opening SQLite once; returns how many."""
    path = Path(store_path)
    envs = dict.fromkeys(winners.snapshot_envs(path.parent))
    envs.update(dict.fromkeys((e.device, e.torch, e.triton) for e in also))
    if not envs:
        return 0
    found = ResultLookup(store_path=path)
    try:
        for device, torch, triton in envs:
            found.refresh_snapshot(EnvKey(device=device, torch=torch, triton=triton))
    finally:
        found.close()
    return len(envs)


_default: ResultLookup | None = None
_default_lock = threading.Lock()


def default_lookup() -> ResultLookup:
    """The process-wide lookup over the default store and the shipped results (made on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ResultLookup.default()
        return _default


def lookup(gpu: GPUProfile, op: OpSpec) -> Hit | None:
    """The best known measured config of ``op`` on ``gpu`` here, or None: the start-up entry point."""
    return default_lookup().lookup(gpu, op)


def reset_default_lookup() -> None:
    """Drop the process-wide lookup (after changing ``AUTOOPT_CACHE_DIR``, in tests)."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
        _default = None
