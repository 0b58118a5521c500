"""A local pool: one worker process per GPU, evaluating (op, config) items from a queue.

Each worker is a *spawned* process pinned to its device with ``CUDA_VISIBLE_DEVICES`` (set in the
child before torch loads), so a kernel that hangs or crashes one GPU's worker cannot take the others
down. The parent hands each worker one item at a time, so it always knows what is in flight:

- a worker that dies (segfault, OOM kill, any exit) is restarted and its in-flight item retried once,
  then recorded as ``failed`` with the reason read from the exit (signal name or exit code);
- an item that runs past ``timeout_s`` has its worker killed and is recorded ``failed`` (a retry
  would hang again);
- the first result for an item wins; a late duplicate (a worker that finished just before it was
  killed) is dropped and counted. Only the parent sees results, so only it writes the store;
- an idle worker takes the costliest waiting item of the ops it evaluated last, else the costliest
  waiting item it may run (longest-processing-time-first, see :mod:`autoopt.fleet.cost`), retries
  before all; an item with a ``kind`` (a GPU's device fingerprint) goes only to a worker of that
  kind, any of them. Staying on an op reuses the worker's inputs and float64 reference for it: on
  the 2 x H200, a config of a new op took 1.1 s against 0.35 s for one more config of the op just
  evaluated (benchmarks/results/h200x2/fleet_scaling_lpt.json), and plain LPT, which interleaves
  ops of similar cost, made 2 workers do 23 % more work than 1. A worker is taken to hold its last
  ``WARM_OPS`` ops, as the runner caches them: the tuner's searches then stay on the worker that
  evaluated them last instead of making every worker set up every op.

:func:`run_pool` evaluates a fixed list; :class:`LocalPool` takes items as they come (``submit`` from
any thread, ``poll`` from one) for the tuner, whose next proposals depend on the last results.

Workers run ``evaluator`` ("module:function", called with the item's op and config dicts and the
device), by default :func:`autoopt.fleet.worker.evaluate_item`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

from autoopt._log import get_logger
from autoopt.backend.runner import PHASES
from autoopt.errors import AutooptError

__all__ = ["WARM_OPS", "Backlog", "Dispatcher", "Item", "LocalPool", "Outcome", "PoolStats", "op_key", "remember",
           "run_pool"]

log = get_logger(__name__)
DEFAULT_EVALUATOR = "autoopt.fleet.worker:evaluate_item"
#: restarts one device's worker may need before the pool gives that device up
MAX_RESTARTS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One evaluation: an op and a config (plain dicts, as ``OpSpec``/``KernelConfig.to_dict`` give)."""

    id: int
    op: Mapping[str, Any]
    config: Mapping[str, Any]
    #: the known profile to predict for where a worker has no GPU (predicted mode); None: its own GPU
    profile: str | None = None
    #: only a worker of this kind (a GPU's device fingerprint) takes it, any of them; None: any worker
    kind: str | None = None
    #: estimated seconds (:func:`autoopt.fleet.cost.estimated_cost`): the costliest waiting item goes first
    cost: float = 0.0
    #: only this device's worker takes it while that worker lives (a search kept on one GPU, where its op's
    #: inputs and reference are); None: any worker. The local pool honours it; a Ray pool does not
    device: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What became of one item: the worker's result dict, or ``failed`` and why."""

    item: int
    device: str
    status: str  # "done" | "failed"
    result: Mapping[str, Any] | None = None
    reason: str = ""
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"item": self.item, "device": self.device, "status": self.status,
                "result": dict(self.result) if self.result else None, "reason": self.reason,
                "attempts": self.attempts}


@dataclass(slots=True)
class PoolStats:
    """Counts over a run (for reports and the fault tests), and where each worker's seconds went: ``busy_s``
    sums its evaluations' own seconds (``eval_s``), ``compile_s`` the part of them spent in Triton's
    compiler (a compile, or a load from Triton's disk cache; GPU workers only), so a sweep's wall time
    splits into compiling, the rest of the evaluations, and waiting (start-up, the searches' turns)."""

    restarts: int = 0
    retries: int = 0
    timeouts: int = 0
    duplicates_dropped: int = 0
    per_device: dict[str, int] = field(default_factory=dict)
    busy_s: dict[str, float] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    #: per device, its evaluations' seconds by the runner's phases (``autoopt.backend.runner.PHASES``) and
    #: its count of input set-ups (``setups``)
    phase_s: dict[str, dict[str, float]] = field(default_factory=dict)
    #: per device, the seconds from spawning its worker to the worker starting its first item (its first
    #: answer's ``boot_s``; a restarted worker's boot is not counted again)
    boot_s: dict[str, float] = field(default_factory=dict)

    def add_seconds(self, device: str, result: Mapping[str, Any] | None) -> None:
        """Count an answered evaluation's own seconds (its ``eval_s``, ``compile_s`` and ``phase_s``, where
        given)."""
        for key, total in (("eval_s", self.busy_s), ("compile_s", self.compile_s)):
            value = (result or {}).get(key)
            if _is_number(value):
                total[device] = total.get(device, 0.0) + float(value)
        boot = (result or {}).get("boot_s")
        if _is_number(boot) and device not in self.boot_s:
            self.boot_s[device] = float(boot)
        phases = (result or {}).get("phase_s")
        if isinstance(phases, Mapping):
            mine = self.phase_s.setdefault(device, {})
            for name, value in phases.items():
                if isinstance(name, str) and _is_number(value):
                    mine[name] = mine.get(name, 0.0) + float(value)

    def utilisation(self, wall_s: float) -> str:
        """One line: evaluations, and per device its busy seconds (of them compiling) against ``wall_s``."""
        n = sum(self.per_device.values())
        parts = []
        for device in sorted(self.per_device):
            busy = self.busy_s.get(device, 0.0)
            comp = f", {self.compile_s[device]:.1f} s compiling" if device in self.compile_s else ""
            comp += f", up after {self.boot_s[device]:.1f} s" if device in self.boot_s else ""
            pct = 100.0 * busy / wall_s if wall_s > 0 else 0.0
            parts.append(f"{device} {self.per_device[device]} in {busy:.1f} s ({pct:.0f} %{comp}"
                         f"{self._phases(device)})")
        return f"{n} evaluations in {wall_s:.1f} s: " + "; ".join(parts)

    def _phases(self, device: str) -> str:
        """``; setup 2.1 s x5, first 1.0 s, ...``: the device's seconds by phase, in the runner's order."""
        mine = self.phase_s.get(device)
        if not mine:
            return ""
        order = sorted(mine, key=lambda k: (PHASES.index(k) if k in PHASES else len(PHASES), k))
        shown = [f"{k} {mine[k]:.1f} s" + (f" x{int(mine['setups'])}" if k == "setup" and "setups" in mine else "")
                 for k in order if k != "setups"]
        return "; " + ", ".join(shown)



def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Dispatcher(Protocol):
    """What the fleet's jobs need of a pool (local processes or Ray actors)."""

    stats: PoolStats

    def submit(self, item: Item) -> None: ...

    def poll(self, wait_s: float = 0.1) -> list[Outcome]: ...

    def close(self) -> None: ...


def op_key(op: Mapping[str, Any]) -> str:
    """One string per distinct op dict: which op a worker has its inputs and reference for."""
    return json.dumps(op, sort_keys=True, default=str)


#: ops a worker is taken to hold inputs and references for: the runner keeps its last
#: ``autoopt.backend.runner.CACHE_OPS`` (the same number; tests/test_fleet_cli.py checks)
WARM_OPS = 4


def remember(warm: list[str], key: str) -> None:
    """Move ``key`` to the most recent end of a worker's ``warm`` list, keeping the last WARM_OPS."""
    if key in warm:
        warm.remove(key)
    warm.append(key)
    del warm[:-WARM_OPS]


class Backlog:
    """Items waiting for a worker (thread-safe): a worker takes the retry waiting longest, else the
    costliest item of its kind (LPT), the earliest submitted among equals."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._items: list[tuple[Item, int, int, str]] = []  # (item, attempt, sequence, op_key)

    def push(self, item: Item, attempt: int = 1) -> None:
        key = op_key(item.op)  # once per push, not once per waiting item on every take
        with self._lock:
            self._items.append((item, attempt, next(self._seq), key))

    def take(self, kind: str | None, warm: Sequence[str] = (), *, device: str | None = None,
             live: Container[str] = ()) -> tuple[Item, int] | None:
        """The next (item, attempt) for the worker of ``device`` (None: pins ignored), of ``kind``, that
        holds the ops ``warm`` (their :func:`op_key`, most recent last), or None when none may go to it:
        a retry first, then the costliest item of the most recent warm op that has one, then the costliest
        of all. An item pinned to another device goes to it only while that device is not ``live``. One
        pass over the waiting items."""
        rank = {key: i + 1 for i, key in enumerate(warm)}
        with self._lock:
            fits = [e for e in self._items if (e[0].kind is None or e[0].kind == kind)
                    and (device is None or e[0].device in (None, device) or e[0].device not in live)]
            if not fits:
                return None
            best = max(fits, key=lambda e: (e[1] > 1, rank.get(e[3], 0), e[0].cost if e[1] == 1 else 0.0, -e[2]))
            self._items.remove(best)
            return best[0], best[1]

    def drop(self, stranded: Callable[[Item], bool]) -> list[tuple[Item, int]]:
        """Remove and return the entries ``stranded`` says no worker can take any more."""
        with self._lock:
            out = [(e[0], e[1]) for e in self._items if stranded(e[0])]
            self._items = [e for e in self._items if not stranded(e[0])]
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def settle(outcomes: dict[int, Outcome], stats: PoolStats, on_outcome: Callable[[Outcome], None] | None
           ) -> Callable[[Outcome], None]:
    """The one place an outcome is recorded (pool and Ray backend): the first for an item wins, a
    later one is dropped and counted."""
    def finish(o: Outcome) -> None:
        if o.item in outcomes:
            stats.duplicates_dropped += 1
            return
        outcomes[o.item] = o
        stats.per_device[o.device] = stats.per_device.get(o.device, 0) + 1
        stats.add_seconds(o.device, o.result)
        if on_outcome is not None:
            on_outcome(o)
    return finish


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        sig = signal.Signals(-exitcode).name
        what = {"SIGSEGV": "segfault", "SIGKILL": "killed (SIGKILL: the OOM killer or a user)",
                "SIGABRT": "aborted", "SIGBUS": "bus error"}.get(sig, "killed")
        return f"worker {what} ({sig})"
    return f"worker exited with code {exitcode}"


#: seconds a worker asked to stop has to exit before it is killed
STOP_GRACE_S = 2.0


class _Worker:
    """One device's worker process and the parent's end of its own pipe. Each worker has its own
    channel: a worker killed mid-write (SIGKILL, a segfault) can only break its own pipe, which goes
    with it, never a queue the other workers share (a shared queue's lock would stay held)."""

    def __init__(self, ctx: Any, device: str, evaluator: str, threads: int = 0) -> None:
        from autoopt.fleet.worker import worker_main

        self.device, self.threads = device, threads
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=worker_main, args=(device, child, evaluator, threads, time.time()),
                                daemon=True, name=f"autoopt-fleet-{device}")
        self.proc.start()
        child.close()
        self.item: Item | None = None
        self.warm: list[str] = []  # op_keys of the last WARM_OPS ops it was given, most recent last
        self.started = 0.0
        self.broken = False

    def give(self, item: Item) -> None:
        self.item, self.started = item, time.monotonic()
        remember(self.warm, op_key(item.op))
        try:
            self.conn.send((item.id, dict(item.op), dict(item.config), item.profile))
        except OSError:
            self.broken = True

    def alive(self) -> bool:
        return not self.broken and self.proc.is_alive()

    def ask_stop(self) -> None:
        """Tell the worker to exit after its item (it tears down its CUDA context on its own)."""
        if self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)

    def reap(self, deadline: float) -> None:
        """Wait for the exit asked for until ``deadline`` (``time.monotonic``), then kill."""
        self.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=2)
        self.conn.close()


class LocalPool:
    """One spawned worker per device, fed from a :class:`Backlog`. ``submit`` may be called from any
    thread; ``poll`` (which assigns, collects, polices) from one only. ``kinds`` maps a device to its
    kind (items with a kind go to those devices only)."""

    def __init__(self, devices: Sequence[str], *, evaluator: str = DEFAULT_EVALUATOR, timeout_s: float = 300.0,
                 kinds: Mapping[str, str] | None = None) -> None:
        if not devices:
            raise AutooptError("fleet: no devices to run on (pass --gpus all, or a list such as 0,1)")
        self.evaluator, self.timeout_s = evaluator, timeout_s
        self.kinds: dict[str, str | None] = {d: (kinds or {}).get(d) for d in devices}
        self.outcomes: dict[int, Outcome] = {}
        self.stats = PoolStats(per_device={d: 0 for d in devices})
        self._ctx = mp.get_context("spawn")
        # each worker's share of the host's cores for torch's CPU work (drawing inputs, dtype conversions):
        # every process's thread pool sized to all cores oversubscribes them when the workers set up at once
        threads = max(1, (os.cpu_count() or 1) // len(devices))
        self._workers = {d: _Worker(self._ctx, d, evaluator, threads) for d in devices}
        self._backlog = Backlog()
        self._attempts: dict[int, int] = {}
        self._restarts = {d: 0 for d in devices}
        self._fresh: list[Outcome] = []
        self._finish = settle(self.outcomes, self.stats, self._fresh.append)
        # a submit from another thread wakes a poll waiting on the workers' pipes, so an idle worker
        # gets a search's next proposal in microseconds, not at the end of the poll's wait (up to
        # 0.1 s a trial: in benchmarks/fleet_tune_sim.py, 60.8 s instead of 52.6 s for one worker with one
        # search; benchmarks/results/fleet_tune_sim.json, "variants")
        # (one message at most waits in the pipe: thousands of submits before a poll must not fill it)
        self._wake_r, self._wake_w = mp_connection.Pipe(duplex=False)
        self._wake_lock = threading.Lock()
        self._wake_sent = False

    def submit(self, item: Item) -> None:
        if item.kind is not None and item.kind not in self.kinds.values():
            raise AutooptError(f"fleet: no worker of kind {item.kind} for item {item.id}")
        if item.device is not None and item.device not in self.kinds:
            raise AutooptError(f"fleet: no worker of device {item.device} for item {item.id}")
        self._backlog.push(item)
        with self._wake_lock:
            if not self._wake_sent:
                self._wake_sent = True
                with contextlib.suppress(OSError):
                    self._wake_w.send_bytes(b"")

    def poll(self, wait_s: float = 0.1) -> list[Outcome]:
        """Hand out waiting items, collect answers (waiting up to ``wait_s``), police the workers; the
        outcomes settled by this call."""
        _assign(self._workers, self.kinds, self._backlog, self._attempts, self.outcomes)
        _drain(self._workers, self._attempts, self._finish, wait_s, self._wake_r)
        with self._wake_lock:  # the next submit may wake the next poll
            while self._wake_r.poll():
                self._wake_r.recv_bytes()
            self._wake_sent = False
        _police(self._ctx, self._workers, self.evaluator, self._backlog, self._attempts, self._restarts,
                self.stats, self._finish, self.timeout_s)
        self._strand()
        out = list(self._fresh)
        self._fresh.clear()
        return out

    def _strand(self) -> None:
        """Fail waiting items that no live worker can take (every worker of their kind gave up)."""
        live = {self.kinds[d] for d, w in self._workers.items() if w.alive() or w.item is not None}
        if not len(self._backlog):
            return
        for item, attempt in self._backlog.drop(lambda i: (i.kind not in live) if i.kind else not live):
            self._finish(Outcome(item=item.id, device="-", status="failed", reason="every worker gave up",
                                 attempts=attempt))

    def close(self) -> None:
        # every worker is asked first, then all are awaited together: a GPU worker's exit tears down its CUDA
        # context, and awaited one by one the workers' exits added up at the end of every sweep
        for w in self._workers.values():
            w.ask_stop()
        deadline = time.monotonic() + STOP_GRACE_S
        for w in self._workers.values():
            w.reap(deadline)
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_pool(items: Sequence[Item], devices: Sequence[str], *, evaluator: str = DEFAULT_EVALUATOR,
             timeout_s: float = 300.0, on_outcome: Callable[[Outcome], None] | None = None,
             kinds: Mapping[str, str] | None = None) -> tuple[list[Outcome], PoolStats]:
    """Evaluate ``items`` on one worker per device; every item ends ``done`` or ``failed`` exactly once."""
    if len({i.id for i in items}) != len(items):
        raise AutooptError("fleet: item ids must be unique")
    with LocalPool(devices, evaluator=evaluator, timeout_s=timeout_s, kinds=kinds) as pool:
        return drain(pool, items, wait_s=0.1, on_outcome=on_outcome), pool.stats


def drain(pool: Dispatcher, items: Sequence[Item], *, wait_s: float,
          on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Submit ``items`` and poll until each has its outcome (passed to ``on_outcome`` as it comes); the
    outcomes in item order. Shared by the local pool and the Ray backend."""
    for item in items:
        pool.submit(item)
    got: dict[int, Outcome] = {}
    while len(got) < len(items):
        for o in pool.poll(wait_s):
            got.setdefault(o.item, o)
            if on_outcome is not None:
                on_outcome(o)
    return [got[i.id] for i in items]


def _assign(workers: dict[str, _Worker], kinds: Mapping[str, str | None], backlog: Backlog,
            attempts: dict[int, int], outcomes: Mapping[int, Outcome]) -> None:
    live = {d for d, w in workers.items() if w.alive()}
    for device, w in workers.items():
        while w.item is None and w.alive():
            taken = backlog.take(kinds[device], w.warm, device=device, live=live)
            if taken is None:
                break
            item, attempt = taken
            if item.id in outcomes:  # a late result already settled it
                continue
            attempts[item.id] = attempt
            w.give(item)


def _drain(workers: dict[str, _Worker], attempts: Mapping[int, int], finish: Callable[[Outcome], None],
           wait_s: float, wake: mp_connection.Connection | None = None) -> None:
    """Every answer waiting on any worker's pipe (waits up to ``wait_s`` for the first, or for a
    message on ``wake``: new work to hand out)."""
    by_conn = {w.conn: w for w in workers.values() if not w.broken}
    for conn in mp_connection.wait([*by_conn, *([wake] if wake is not None else [])], timeout=wait_s):
        if conn is wake:  # new work: the caller empties the pipe
            continue
        w = by_conn[conn]
        while True:
            try:
                if not w.conn.poll():
                    break
                device, item_id, ok, payload = w.conn.recv()
            except (EOFError, OSError, ValueError):  # the worker died (possibly mid-message)
                w.broken = True
                break
            if w.item is not None and w.item.id == item_id:
                w.item = None
            finish(Outcome(item=item_id, device=device, status="done" if ok else "failed",
                           result=payload if ok else None, reason="" if ok else str(payload),
                           attempts=attempts.get(item_id, 1)))


def _police(ctx: Any, workers: dict[str, _Worker], evaluator: str, backlog: Backlog, attempts: dict[int, int],
            restarts: dict[str, int], stats: PoolStats, finish: Callable[[Outcome], None], timeout_s: float) -> None:
    """Kill workers past their item's timeout; restart dead ones and retry (or fail) their item."""
    now = time.monotonic()
    for device, w in list(workers.items()):
        timed_out = w.item is not None and w.proc.is_alive() and now - w.started > timeout_s
        if timed_out or (w.broken and w.proc.is_alive()):
            w.proc.kill()
        if timed_out or w.broken:
            w.proc.join(timeout=5)
        if w.proc.is_alive():
            continue
        item = w.item
        if item is not None:
            if timed_out:
                stats.timeouts += 1
                finish(Outcome(item=item.id, device=device, status="failed", attempts=attempts[item.id],
                               reason=f"timeout: no result after {timeout_s:g} s (worker killed)"))
            elif attempts[item.id] < 2:
                stats.retries += 1
                backlog.push(item, attempts[item.id] + 1)
            else:
                finish(Outcome(item=item.id, device=device, status="failed", attempts=attempts[item.id],
                               reason=_exit_reason(w.proc.exitcode)))
            w.item = None
        if restarts[device] >= MAX_RESTARTS:
            continue
        restarts[device] += 1
        stats.restarts += 1
        log.warning("fleet: restarting the worker of device %s (%s)", device, _exit_reason(w.proc.exitcode))
        w.conn.close()
        workers[device] = _Worker(ctx, device, evaluator, w.threads)
