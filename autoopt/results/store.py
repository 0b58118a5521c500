"""The user's results store: one SQLite file that several tuning processes share safely.

Where: ``platformdirs.user_cache_dir("autoopt")/results.sqlite3``; ``AUTOOPT_CACHE_DIR=/some/dir``
puts it in that folder and ``AUTOOPT_CACHE_DIR=off`` switches it off (lookups miss, ``put`` is not
called: :func:`open_default` returns None).

Schema (version 1; :data:`SCHEMA_SQL`): ``meta(key, value)`` holds ``schema`` and who created the
file, the header's ``application_id`` marks the file as autoopt's, and ``results`` holds one row
per (environment, op, kernel source hash, config) -- a UNIQUE constraint, so a duplicate cannot
exist whatever the writers do.

Concurrency and crashes:

* WAL journal: readers never block writers or each other; writers queue on SQLite's lock, waiting
  up to ``busy_timeout`` (30 s) rather than failing.
* Every write is one short ``BEGIN IMMEDIATE`` transaction (the write lock is taken up front, so a
  transaction never has to upgrade a read lock -- the upgrade is what fails with SQLITE_BUSY in WAL
  regardless of the timeout). An import is one transaction: all of it or none.
* ``INSERT ... ON CONFLICT DO UPDATE ... WHERE excluded.measured_at > results.measured_at``: of two
  writes of one key the newer measurement wins, whichever commits last, and an equal or older one
  changes nothing -- so racing writers converge on the same row and importing a file twice adds
  nothing. An update keeps the row's id.
* ``synchronous=NORMAL``. The target is SIGKILL of a process (or a crash), not power loss. In WAL
  mode a transaction is committed once its frames, commit marker included, are ``write()``-n to the
  ``-wal`` file; ``write()`` hands them to the kernel's page cache, which outlives the process, and
  the next opener replays the WAL. So every commit that returned survives SIGKILL at any point --
  mid-transaction (the partial frames have no commit marker and are ignored), mid-checkpoint (the
  WAL is only reset after a complete checkpoint, so it is replayed again). ``FULL`` adds an fsync per
  commit, which buys durability across power loss / OS crash for the last transactions; ``NORMAL``
  in WAL still never corrupts the file on power loss (it may lose the last commits before the last
  checkpoint). A lost row is re-measured by the next tuning run, so that fsync per put is not worth it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import StoreError
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.results import keys
from autoopt.results.location import CACHE_ENV, FILE_NAME, default_path
from autoopt.results.records import (
    FAILED_LABELS,
    LABELS,
    WINNER_LABEL,
    EnvKey,
    ResultKey,
    StoredResult,
    config_key,
    op_columns,
    op_from_columns,
)

log = get_logger(__name__)

__all__ = ["APPLICATION_ID", "CACHE_ENV", "FILE_NAME", "SCHEMA_SQL", "SCHEMA_VERSION", "PutSummary", "ResultStore",
           "default_path", "open_default"]

SCHEMA_VERSION = 1
#: the SQLite header's application_id: "aoRS" (autoopt results store), so `file` and we can tell it apart
APPLICATION_ID = 0x616F5253
BUSY_TIMEOUT_S = 30.0
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: ON CONFLICT ... DO UPDATE ... WHERE (upsert) arrived in SQLite 3.24 (2018)
_MIN_SQLITE = (3, 24, 0)

_ENV_COLS = ("device", "gpu", "driver", "torch", "triton")
_OP_COLS = ("kind", "shape", "dtype", "layout", "out_dtype")
_UNIQUE = ("device", "driver", "torch", "triton", *_OP_COLS, "kernel_hash", "config_key")
_COLS = (*_ENV_COLS, *_OP_COLS, "kernel", "path", "template", "params", "config_key", "kernel_file",
         "kernel_hash", "label", "us", "max_error", "reason", "measured_at", "autoopt_version")
_LABEL_SQL = ", ".join(f"'{label}'" for label in LABELS)

SCHEMA_SQL = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE results (
        id INTEGER PRIMARY KEY,
        device TEXT NOT NULL,          -- GPUProfile.device_fingerprint (name, CC, SMs, memory)
        gpu TEXT NOT NULL,             -- the device's name, for people
        driver TEXT NOT NULL,
        torch TEXT NOT NULL,           -- installed versions; '' = not installed
        triton TEXT NOT NULL,
        kind TEXT NOT NULL,
        shape TEXT NOT NULL,           -- '256,6144,4096'
        dtype TEXT NOT NULL,
        layout TEXT NOT NULL,
        out_dtype TEXT NOT NULL,
        kernel TEXT NOT NULL,
        path TEXT NOT NULL,
        template TEXT NOT NULL,
        params TEXT NOT NULL,          -- JSON object, sorted keys
        config_key TEXT NOT NULL,      -- canonical JSON of kernel, path, params
        kernel_file TEXT NOT NULL,     -- relative to the autoopt package (absolute outside it)
        kernel_hash TEXT NOT NULL,     -- sha256 of kernel_file when measured
        label TEXT NOT NULL CHECK (label IN ({_LABEL_SQL})),
        us REAL,
        max_error REAL,
        reason TEXT NOT NULL,
        measured_at REAL NOT NULL,     -- seconds since 1970, UTC
        autoopt_version TEXT NOT NULL,
        UNIQUE ({", ".join(_UNIQUE)})
    )""",
)

_UPSERT = (f"INSERT INTO results ({', '.join(_COLS)}) VALUES ({', '.join('?' for _ in _COLS)}) "
           f"ON CONFLICT ({', '.join(_UNIQUE)}) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in _COLS if c not in _UNIQUE)
           + " WHERE excluded.measured_at > results.measured_at")
_FIND = f"SELECT id, measured_at FROM results WHERE {' AND '.join(f'{c} = ?' for c in _UNIQUE)}"
_SELECT = f"SELECT id, {', '.join(_COLS)} FROM results"
#: a key whose driver is "" (a known profile loaded by name) matches rows of any driver
_KEY_WHERE = " AND ".join(["device = ?", "(driver = ? OR ? = '')",
                           *(f"{c} = ?" for c in ("torch", "triton", *_OP_COLS))])

#: connections a forked child inherited: never used (SQLite forbids it) and never closed (closing
#: could drop the parent's POSIX locks on the file), only kept from the garbage collector
_inherited: list[sqlite3.Connection] = []


def open_default(*, create: bool = True) -> ResultStore | None:
    """The user store (created when ``create``), or None when it is switched off (or absent and not created)."""
    path = default_path()
    if path is None or (not create and not path.exists()):
        return None
    return ResultStore(path, create=create)


@dataclass(frozen=True, slots=True, kw_only=True)
class PutSummary:
    """What a batch write did: rows added, rows replaced by a newer measurement, rows already there."""

    new: int = 0
    updated: int = 0
    unchanged: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"new": self.new, "updated": self.updated, "unchanged": self.unchanged}


def _check_file(path: Path) -> bool:
    """True when ``path`` holds an SQLite file, False when it is absent or empty; StoreError otherwise."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreError(f"cannot read the results store: {exc.strerror or exc}", source=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError("is not a regular file, so it cannot be a results store", source=str(path))
    if st.st_size == 0:
        return False
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise StoreError(f"cannot read the results store: {exc.strerror or exc}", source=str(path)) from None
    if head != _SQLITE_MAGIC:
        raise StoreError("is not an SQLite database, so not an autoopt results store (move it away)",
                         source=str(path))
    return True


class _Locked(Exception):
    """Opening met a lock another process held; :meth:`ResultStore._connect` retries."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


class ResultStore:
    """One results store file: put rows, ask for the best and the failed configs of a key, prune.

    Safe to share between processes (see the module doc) and between threads of one process (one
    connection behind a lock). A forked child opens its own connection on first use.
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True,
                 busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise StoreError(f"SQLite {sqlite3.sqlite_version} is too old for the results store "
                             f"(needs {'.'.join(map(str, _MIN_SQLITE))} or newer)")
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()
        self._pid = os.getpid()
        if not _check_file(self.path):
            if not create and not self.path.exists():
                raise StoreError("no results store here (nothing measured yet?)", source=str(self.path))
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the store's folder: {exc.strerror or exc}",
                                 source=str(self.path)) from None
        self._conn: sqlite3.Connection | None = self._connect()

    # -- connection --------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """A prepared connection. Opening races other processes creating the store or switching it to WAL,
        and SQLite answers some of those races with an immediate "database is locked" that the busy
        handler never waits on (a journal-mode change, a read lock upgraded mid-check), seen here as 1 of
        8 writers failing to open on a loaded 2-core machine; so opening is retried, with jitter, until
        the busy timeout."""
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                return self._connect_once()
            except _Locked as exc:
                if time.monotonic() >= deadline:
                    raise self._error(exc.error) from None
                import random  # only on a retry: ~1.5 ms of a cold start-up lookup otherwise

                time.sleep(random.uniform(0.005, 0.05))

    def _connect_once(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: no implicit transactions; every write below says BEGIN IMMEDIATE
            conn = sqlite3.connect(str(self.path), timeout=self._busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the results store: {exc}", source=str(self.path)) from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            self._prepare(conn)
            conn.execute("PRAGMA synchronous = NORMAL")  # per connection; why NORMAL: module doc
        except StoreError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise _Locked(exc) from None
            raise self._error(exc) from None
        return conn

    @staticmethod
    def _header(conn: sqlite3.Connection) -> tuple[int, set[str]]:
        """(application_id, table names) read in one transaction: read apart, another process creating
        the store could commit between the two reads (seen: id 0 with the tables already there)."""
        conn.execute("BEGIN")
        try:
            app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.execute("COMMIT")
        return app_id, tables

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Check the file is an autoopt store of a schema we read; make a fresh file one."""
        app_id, tables = self._header(conn)
        if app_id == 0 and not tables:
            # WAL is persistent (set once, in the file); switching needs a moment alone with the file,
            # which the busy timeout waits for when several processes create the store at once
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("%s: SQLite refused WAL mode (journal_mode=%s; a network file system?): "
                            "concurrent writers will wait longer", self.path, mode)
            conn.execute("BEGIN IMMEDIATE")
            try:
                # another process may have created it between our look and our lock: look again
                if not conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    for sql in SCHEMA_SQL:
                        conn.execute(sql)
                    conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
                        ("schema", str(SCHEMA_VERSION)), ("created_by", f"autoopt {keys.autoopt_version()}"),
                        ("created_at", f"{time.time():.0f}")])
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            app_id, tables = self._header(conn)
        if app_id != APPLICATION_ID or not {"meta", "results"} <= tables:
            raise StoreError(f"is an SQLite database but not an autoopt results store (application_id "
                             f"{app_id:#x}, tables {sorted(tables) or 'none'}); move it away",
                             source=str(self.path))
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        try:
            schema = int(row[0]) if row else -1
        except ValueError:
            schema = -1
        if schema > SCHEMA_VERSION:
            raise StoreError(f"was written by a newer autoopt (schema {schema}; this one reads schema "
                             f"{SCHEMA_VERSION}): upgrade autoopt or point {CACHE_ENV} elsewhere",
                             source=str(self.path))
        if schema != SCHEMA_VERSION:
            raise StoreError(f"has no readable schema version ({row[0] if row else 'none'!r}); move it away",
                             source=str(self.path))
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")  # a store copied without its WAL setting

    def _error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreError(f"another process held the results store for over {self._busy_timeout_s:g} s "
                              f"({text})", source=str(self.path))
        return StoreError(f"the results store is corrupt or unreadable ({text}); move it away and autoopt "
                          f"starts a new one", source=str(self.path))

    @contextmanager
    def _cursor(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, with SQLite errors turned into StoreError."""
        with self._lock:
            if self._conn is None:
                raise StoreError("the results store is closed", source=str(self.path))
            if os.getpid() != self._pid:  # forked: the parent's connection is not ours to use
                _inherited.append(self._conn)
                self._pid = os.getpid()
                self._conn = self._connect()
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction: BEGIN IMMEDIATE ... COMMIT, rolled back on any error."""
        with self._cursor() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # a failed COMMIT (disk full) can leave it open too
                    conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and os.getpid() == self._pid:
                self._conn.close()
            self._conn = None

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResultStore({str(self.path)!r})"

    # -- writes ------------------------------------------------------------------------------

    @staticmethod
    def _values(row: StoredResult) -> tuple[Any, ...]:
        env, cfg = row.env, row.config
        return (env.device, env.gpu, env.driver, env.torch, env.triton, *op_columns(row.op), cfg.kernel,
                cfg.path, cfg.template, json.dumps(dict(sorted(cfg.params.items())), separators=(",", ":")),
                config_key(cfg), row.kernel_file, row.kernel_hash, row.label, row.us, row.max_error, row.reason,
                row.measured_at, row.autoopt_version)

    @staticmethod
    def _upsert(conn: sqlite3.Connection, row: StoredResult) -> tuple[int, str]:
        values = ResultStore._values(row)
        unique = tuple(values[_COLS.index(c)] for c in _UNIQUE)
        before = conn.execute(_FIND, unique).fetchone()
        cur = conn.execute(_UPSERT, values)
        if before is None:  # we hold the write lock: the upsert inserted, and lastrowid is its id
            return int(cur.lastrowid or 0), "new"
        return int(before[0]), "updated" if row.measured_at > before[1] else "unchanged"

    def put(self, row: StoredResult) -> int:
        """Store one row in its own transaction; returns its id. Of two rows with one identity the
        newer ``measured_at`` wins (an older or equal one changes nothing)."""
        row.check_not_future()
        with self._write() as conn:
            return self._upsert(conn, row)[0]

    def put_many(self, rows: Iterable[StoredResult]) -> PutSummary:
        """Store rows in one transaction (all or none), as :meth:`put` would one by one."""
        batch = list(rows)
        now = time.time()
        for row in batch:
            row.check_not_future(now)
        counts = {"new": 0, "updated": 0, "unchanged": 0}
        with self._write() as conn:
            for row in batch:
                counts[self._upsert(conn, row)[1]] += 1
        return PutSummary(**counts)

    # -- reads -------------------------------------------------------------------------------

    def _rows(self, where: str = "", params: Sequence[Any] = (), order: str = "id") -> list[StoredResult]:
        with self._cursor() as conn:
            raw = conn.execute(f"{_SELECT}{' WHERE ' + where if where else ''} ORDER BY {order}", params).fetchall()
        return [self._row(r) for r in raw]

    def _row(self, r: Sequence[Any]) -> StoredResult:
        v = dict(zip(("id", *_COLS), r, strict=True))
        try:
            params = json.loads(v["params"])
            return StoredResult(
                env=EnvKey(device=v["device"], gpu=v["gpu"], driver=v["driver"], torch=v["torch"],
                           triton=v["triton"]),
                op=op_from_columns(v["kind"], v["shape"], v["dtype"], v["layout"], v["out_dtype"]),
                config=KernelConfig(kernel=v["kernel"], params=params, path=v["path"], template=v["template"]),
                label=v["label"], us=v["us"], max_error=v["max_error"], reason=v["reason"],
                kernel_file=v["kernel_file"], kernel_hash=v["kernel_hash"], measured_at=v["measured_at"],
                autoopt_version=v["autoopt_version"], row_id=v["id"])
        except StoreError as exc:
            raise StoreError(f"row id {v['id']} is invalid: {exc}", source=str(self.path)) from None
        except Exception as exc:  # a hand-edited row: say which one
            raise StoreError(f"row id {v['id']} is invalid: {type(exc).__name__}: {exc}",
                             source=str(self.path)) from None

    @staticmethod
    def _key_params(key: ResultKey) -> tuple[str, ...]:
        e = key.env
        return (e.device, e.driver, e.driver, e.torch, e.triton, *op_columns(key.op))

    def rows(self, key: ResultKey | None = None, *, op: OpSpec | None = None, device: str | None = None,
             labels: Sequence[str] | None = None) -> list[StoredResult]:
        """Rows (stale ones included), oldest first: of one key, of one op in any environment, of one
        device (fingerprint or GPU name), of some labels; all of them with no filter."""
        where: list[str] = []
        params: list[Any] = []
        if key is not None:
            where.append(_KEY_WHERE)
            params += self._key_params(key)
        if op is not None:
            where.append(" AND ".join(f"{c} = ?" for c in _OP_COLS))
            params += op_columns(op)
        if device is not None:
            where.append("(device = ? OR lower(gpu) = lower(?))")
            params += (device, device)
        if labels is not None:
            where.append(f"label IN ({', '.join('?' for _ in labels)})")
            params += labels
        return self._rows(" AND ".join(where), params)

    def best(self, key: ResultKey) -> StoredResult | None:
        """The fastest ``measured`` row of ``key`` whose kernel source is unchanged, or None."""
        with self._cursor() as conn:
            raw = conn.execute(f"{_SELECT} WHERE {_KEY_WHERE} AND label = ? ORDER BY us, id",
                               (*self._key_params(key), WINNER_LABEL)).fetchall()
        for r in raw:  # fastest first; a stale one is kept but passed over
            row = self._row(r)
            if not keys.source_changed(row):
                return row
        return None

    def winners(self, device: str, torch: str, triton: str) -> list[StoredResult]:
        """Every ``measured`` row of one device fingerprint and torch/triton pair (any driver, any op, stale
        ones included), fastest first per op as :meth:`best` orders them: what the start-up winners
        snapshot (:mod:`autoopt.results.winners`) is built from, in one query."""
        return self._rows("device = ? AND torch = ? AND triton = ? AND label = ?",
                          (device, torch, triton, WINNER_LABEL), order="us, id")

    def failed(self, key: ResultKey) -> dict[str, StoredResult]:
        """Config key -> row of every config of ``key`` that failed (rejected, wrong, withheld) with the
        current kernel source: the tuner does not try these again (a changed kernel gets a new chance)."""
        return {row.config_key: row for row in self.rows(key, labels=FAILED_LABELS)
                if not keys.source_changed(row)}

    def tried(self, key: ResultKey) -> set[str]:
        """Config keys of ``key`` already evaluated with the current kernel source, whatever the outcome."""
        return {row.config_key for row in self.rows(key) if not keys.source_changed(row)}

    def count(self) -> int:
        with self._cursor() as conn:
            return int(conn.execute("SELECT count(*) FROM results").fetchone()[0])

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: ``"ok"``, or its findings one per line."""
        with self._cursor() as conn:
            return "\n".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check").fetchall())

    # -- prune -------------------------------------------------------------------------------

    def prune(self, *, stale: bool = False, older_than_days: float | None = None, device: str | None = None,
              dry_run: bool = False) -> int:
        """Delete the rows that meet every given criterion; returns how many (would) go.

        ``stale``: the kernel source changed or the row's triton is not the installed one (see
        :func:`keys.is_stale`); ``older_than_days``: measured more than that many days ago; ``device``:
        a device fingerprint or GPU name. At least one criterion is needed (no accidental wipe).
        """
        if not stale and older_than_days is None and device is None:
            raise StoreError("prune needs at least one of: stale, older_than_days, device")
        if older_than_days is not None and (not isinstance(older_than_days, (int, float))
                                            or isinstance(older_than_days, bool) or not older_than_days >= 0):
            raise StoreError(f"older_than_days must be a number >= 0, got {older_than_days!r}")
        where: list[str] = []
        params: list[Any] = []
        if older_than_days is not None:
            where.append("measured_at < ?")
            params.append(time.time() - older_than_days * 86_400.0)
        if device is not None:
            where.append("(device = ? OR lower(gpu) = lower(?))")
            params += (device, device)
        with self._write() as conn:
            sql = f"{_SELECT}{' WHERE ' + ' AND '.join(where) if where else ''}"
            ids = [r[0] for r in conn.execute(sql, params).fetchall()
                   if not stale or keys.is_stale(self._row(r))]
            if not dry_run:
                for i in range(0, len(ids), 500):  # SQLite caps the number of ? per statement
                    chunk = ids[i:i + 500]
                    conn.execute(f"DELETE FROM results WHERE id IN ({', '.join('?' for _ in chunk)})", chunk)
        return len(ids)

    # -- summaries (``autoopt store list/show``) ------------------------------------------------

    def summary(self) -> list[dict[str, Any]]:
        """One entry per (environment, op): row counts by outcome, stale rows, the best usable time."""
        groups: dict[ResultKey, dict[str, Any]] = {}
        for row in self.rows():
            g = groups.get(row.key)
            if g is None:
                g = groups[row.key] = {**row.env.to_dict(), "op": row.op.to_dict(), "op_label": row.op.label(),
                                       "rows": 0, "measured": 0, "failed": 0, "stale": 0, "best_us": None,
                                       "newest": row.measured_at}
            stale = keys.is_stale(row)
            g["rows"] += 1
            g["stale"] += stale
            g["newest"] = max(g["newest"], row.measured_at)
            if row.label == WINNER_LABEL:
                g["measured"] += 1
                if not stale and (g["best_us"] is None or (row.us or 0.0) < g["best_us"]):
                    g["best_us"] = row.us
            else:
                g["failed"] += 1
        return sorted(groups.values(), key=lambda g: (g["gpu"], g["device"], g["triton"], g["torch"], g["op_label"]))

    @staticmethod
    def view(row: StoredResult) -> dict[str, Any]:
        """A row as ``store show`` prints it: its id and whether it is stale here, then its fields."""
        return {"id": row.row_id, "stale": keys.is_stale(row), **row.to_dict()}
