"""``autoopt tune|bench --gpus ...|--ray ...``: the tuner's and the bench's evaluations spread over a fleet.

:func:`open_fleet` starts one worker per device (:class:`~autoopt.fleet.pool.LocalPool` on this
host's ``--gpus``, or :class:`~autoopt.fleet.ray_backend.RayPool` on a Ray cluster). The work is
planned per GPU *kind* (device fingerprint): each kind's own profile ranks its configs, and each
(op, config) evaluation is an item that any device of that kind may take, costliest first (LPT,
:mod:`autoopt.fleet.cost`). Workers run the very evaluation of the serial path
(:func:`~autoopt.fleet.worker.tune_item`, :func:`~autoopt.fleet.worker.bench_item`), so a config gets
the same label either way. Results come back here; only this process writes the results store, each
row under the fingerprint of the GPU its worker detected.

- :func:`bench`: every kind's recommended configs at once, rows back in the serial order.
- :func:`tune`: one search per (op, kind), one per device in flight on threads of this process; a search
  proposes ``ceil(devices of its kind / ops)`` configs per round, so with at least as many ops as
  GPUs it is the serial search, proposal for proposal (with fewer, one op's round spans GPUs).
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt.backend.bench import BenchRow, recommended_cases
from autoopt.backend.runner import Result
from autoopt.errors import AutooptError
from autoopt.fleet.cost import estimated_cost
from autoopt.fleet.devices import Device, local_devices
from autoopt.fleet.pool import Dispatcher, Item, LocalPool, Outcome
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.results.lookup import refresh_snapshots
from autoopt.results.store import open_default
from autoopt.tuning import campaign, tuner
from autoopt.tuning.campaign import TunedOp
from autoopt.tuning.tuner import Prefetch, Trial

__all__ = ["DEFAULT_TIMEOUT_S", "Fleet", "FleetBenchRow", "bench", "open_fleet", "tune"]

log = get_logger(__name__)

#: an evaluation with no answer after this long has its worker killed and is recorded failed
DEFAULT_TIMEOUT_S = 300.0
EVALUATORS = {"tune": "autoopt.fleet.worker:tune_item", "bench": "autoopt.fleet.worker:bench_item"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """A started pool and the devices its workers evaluate on."""

    pool: Dispatcher
    devices: tuple[Device, ...]

    def kinds(self) -> dict[str, list[Device]]:
        """Devices by kind (device fingerprint), in device order."""
        out: dict[str, list[Device]] = {}
        for d in self.devices:
            out.setdefault(d.kind, []).append(d)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetBenchRow:
    """One bench row and where it ran: the worker's device and the GPU that worker detected."""

    row: BenchRow
    worker: str
    gpu: GPUProfile

    def to_dict(self) -> dict[str, Any]:
        return {**self.row.to_dict(), "worker": self.worker, "gpu": self.gpu.name,
                "fingerprint": self.gpu.device_fingerprint}


@contextmanager
def open_fleet(*, mode: str, gpus: str | None = None, ray: str | None = None, profile: str | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, evaluator: str | None = None) -> Iterator[Fleet]:
    """Workers for ``mode`` ("tune" or "bench") on this host's ``gpus`` ("all", "0,1,3"), or on the Ray
    cluster at ``ray`` ("auto", an address, "local" to start one; ``profile``: what a GPU-less actor
    stands for); stopped on exit. ``evaluator`` ("module:function") replaces the mode's own."""
    evaluator = evaluator or EVALUATORS[mode]
    if ray is not None:
        from autoopt.fleet.ray_backend import RayPool

        rpool = RayPool(address=None if ray == "local" else ray, evaluator=evaluator, timeout_s=timeout_s,
                        profile=profile)
        pool: Dispatcher = rpool
        try:
            devices = tuple(_ray_devices(rpool.described, profile))
        except BaseException:
            rpool.close()
            raise
    else:
        devices = tuple(local_devices("all" if gpus is None else gpus))
        pool = LocalPool([d.name for d in devices], evaluator=evaluator, timeout_s=timeout_s,
                         kinds={d.name: d.kind for d in devices})
    try:
        yield Fleet(pool=pool, devices=devices)
    finally:
        pool.close()


def _ray_devices(described: Sequence[Mapping[str, Any]], profile: str | None) -> Iterator[Device]:
    for d in described:
        if d["gpu"] is None:
            raise AutooptError("--ray: this Ray cluster has no GPUs; pass --profile NAME for its CPU workers to "
                               "predict for (see `autoopt profiles`)")
        yield Device(name=d["name"], gpu=GPUProfile.from_dict(d["gpu"]), profile=d["profile"])


def run_items(pool: Dispatcher, items: Sequence[Item], on_outcome: Callable[[Outcome], None] | None = None
              ) -> dict[int, Outcome]:
    """Submit ``items`` and wait for every outcome."""
    for item in items:
        pool.submit(item)
    done: dict[int, Outcome] = {}
    while len(done) < len(items):
        for o in pool.poll(0.1):
            done[o.item] = o
            if on_outcome is not None:
                on_outcome(o)
    return done


def _item(id_: int, op: OpSpec, config: KernelConfig, device: Device, pin: str | None = None) -> Item:
    o, c = op.to_dict(), config.to_dict()
    return Item(id=id_, op=o, config=c, profile=device.profile, kind=device.kind, cost=estimated_cost(o, c),
                device=pin)


#: GPUs that workers reported, by device fingerprint (parsed once)
_REPORTED: dict[str, GPUProfile] = {}


def _result(outcome: Outcome, op: OpSpec, config: KernelConfig, fallback: GPUProfile) -> tuple[Result, GPUProfile]:
    """The runner Result of an outcome and the GPU it ran on (a failed item: ``rejected``, with why)."""
    payload = outcome.result
    if outcome.status != "done" or payload is None:
        return Result(op=op, config=config, label="rejected", reason=f"fleet: {outcome.reason}",
                      device=outcome.device), fallback
    fp = str(payload.get("fingerprint", ""))
    if fp and fp not in _REPORTED:
        _REPORTED[fp] = GPUProfile.from_dict(payload["gpu"])
    gpu = _REPORTED.get(fp, fallback)
    if gpu.device_fingerprint != fallback.device_fingerprint:
        log.warning("fleet: worker %s is a %s, not the %s its kind says", outcome.device, gpu.name, fallback.name)
    return Result.from_dict(payload), gpu


def bench(fleet: Fleet, ops: Sequence[OpSpec], *, top: int = 1,
          on_row: Callable[[int, int, FleetBenchRow], None] | None = None) -> list[FleetBenchRow]:
    """Each kind's ``top`` recommended configs per op (its own ranking), benchmarked on the fleet; rows
    in the serial order, kind by kind. ``on_row(done, total, row)`` sees each row as it lands."""
    cases = [(dev, op, cfg) for devs in fleet.kinds().values() for dev in devs[:1]
             for op, cfg in recommended_cases(dev.gpu, ops, top=top)]
    items = [_item(k, op, cfg, dev) for k, (dev, op, cfg) in enumerate(cases)]
    rows: dict[int, FleetBenchRow] = {}

    def land(o: Outcome) -> None:
        dev, op, cfg = cases[o.item]
        res, gpu = _result(o, op, cfg, dev.gpu)
        p = o.result or {}
        rows[o.item] = FleetBenchRow(row=BenchRow(result=res, torch_us=p.get("torch_us"),
                                                  ratio=p.get("ratio_vs_torch")), worker=o.device, gpu=gpu)
        if on_row is not None:
            on_row(len(rows), len(items), rows[o.item])

    run_items(fleet.pool, items, land)
    return [rows[k] for k in range(len(items))]


class _Exchange:
    """Search threads hand items to the pool and wait for their outcomes; the calling thread alone
    drives the pool (:meth:`pump`)."""

    def __init__(self, pool: Dispatcher) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, Future[Outcome]] = {}
        self._stopped: BaseException | None = None

    def evaluate(self, op: OpSpec, configs: Sequence[KernelConfig], device: Device,
                 pin: str | None = None) -> list[Outcome]:
        futures = []
        with self._lock:
            if self._stopped is not None:
                raise AutooptError(f"fleet stopped: {self._stopped!r}")
            for cfg in configs:
                self._next += 1
                futures.append(self._waiting.setdefault(self._next, Future()))
                self._pool.submit(_item(self._next, op, cfg, device, pin))
        return [f.result() for f in futures]

    def pump(self, finished: Callable[[], bool]) -> None:
        try:
            while not finished():
                for o in self._pool.poll(0.1):
                    with self._lock:
                        waiter = self._waiting.pop(o.item, None)
                    if waiter is not None:
                        waiter.set_result(o)
        except BaseException as exc:  # a search thread must not wait for ever on a stopped pool
            with self._lock:
                self._stopped = exc
                for f in self._waiting.values():
                    f.set_exception(AutooptError(f"fleet stopped: {exc!r}"))
                self._waiting.clear()
            raise


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    name: str
    op: OpSpec
    device: Device  # the first device of its kind: its GPU ranks the configs
    width: int  # proposals per round


def tune(fleet: Fleet, ops: Sequence[tuple[str, OpSpec]], *, budget_trials: int = 8, budget_s: float | None = None,
         use_store: bool = True, on_trial: Callable[[str, Trial], None] | None = None) -> list[TunedOp]:
    """Tune every op on every GPU kind of the fleet (as ``campaign.tune_ops`` does on one GPU), writing
    every trial to the results store from this process only, in (kind, op) order."""
    kinds = fleet.kinds()
    tag = len(kinds) > 1
    jobs = [_Job(name=f"{name} @ {devs[0].gpu.name}" if tag else name, op=op, device=devs[0],
                 width=math.ceil(len(devs) / len(ops))) for devs in kinds.values() for name, op in ops]
    exchange = _Exchange(fleet.pool)
    lock = threading.Lock()

    def report(name: str, trial: Trial) -> None:
        if on_trial is not None:
            with lock:
                on_trial(name, trial)

    store = open_default() if use_store else None
    done: dict[int, TunedOp] = {}

    def lane(queue: deque[int], pin: str | None) -> None:
        while True:
            with lock:
                if not queue:
                    return
                k = queue.popleft()
            done[k] = _tune_job(jobs[k], exchange, store, budget_trials, budget_s, report, pin, rankings[k].result())

    try:
        lanes = _lanes(kinds, jobs)
        ranker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autoopt-rank")
        try:
            rankings = _rank_ahead(ranker, jobs, lanes)
            with ThreadPoolExecutor(max_workers=len(lanes)) as threads:
                futures = [threads.submit(lane, queue, pin) for queue, pin in lanes]
                exchange.pump(lambda: all(f.done() for f in futures))
        finally:
            ranker.shutdown(cancel_futures=True)
        for f in futures:
            f.result()
        return [done[k] for k in range(len(jobs))]
    finally:
        if store is not None:
            store.close()
            refresh_snapshots(store.path)  # the next start-up reads the new winners without SQLite


def _rank_ahead(ranker: ThreadPoolExecutor, jobs: Sequence[_Job], lanes: Sequence[tuple[deque[int], str | None]]
                ) -> dict[int, Future[tuner.Ranking]]:
    """Each job's :func:`~autoopt.tuning.tuner.ranking`, made on one thread in the order the lanes will take
    the jobs, while the GPUs run the earlier ones. Made by a lane as it took its next op, the exhaustive
    ranking held that lane's GPU idle: 0.29 s of the parent's CPU an op on a four-H200 host (py-spy of Mixtral
    TP8's 18-op sweep: 5.2 s on this thread; the lanes themselves 0.7 s each, the rest waiting on their GPU)."""
    order = dict.fromkeys(k for queue, _ in lanes for k in queue)  # lanes of a kind share one queue
    return {k: ranker.submit(tuner.ranking, jobs[k].device.gpu, jobs[k].op) for k in order}


def _lanes(kinds: Mapping[str, list[Device]], jobs: Sequence[_Job]) -> list[tuple[deque[int], str | None]]:
    """The searches that run at once, as (their kind's shared queue of job indices, the device they keep
    to): per kind, :func:`_searches` of them, its costliest ops first (longest-processing-time-first at the
    op level), each search kept on one device of the kind. On four H200s, Mixtral TP8's 18-op sweep with
    any worker taking any search's next trial spent 108 s of evaluation (wall 48.0 s) against 63 s for the
    same trials on one GPU: a trial that lands on a worker without its op's inputs and reference pays their
    set-up. Kept to one device: 93 s (wall 34.4 s; benchmarks/results/h200/moe_tune_scaling_fleet.json,
    moe_tune_scaling_pinned.json). A round that spans GPUs (fewer ops than devices) is not kept to one."""
    out: list[tuple[deque[int], str | None]] = []
    for kind, devs in kinds.items():
        mine = [k for k, j in enumerate(jobs) if j.device.kind == kind]
        if not mine:
            continue
        mine.sort(key=lambda k: -estimated_cost(jobs[k].op.to_dict(), {}))
        queue = deque(mine)
        spans = jobs[mine[0]].width > 1
        n = _searches(len(mine), len(devs))
        out += [(queue, None if spans else devs[i % len(devs)].name) for i in range(n)]
    return out


def _searches(jobs: int, devices: int) -> int:
    """How many searches run at once: one per device, so each device keeps to the ops of its own search
    (inputs and references made once, see :mod:`autoopt.fleet.pool`), and two on a single device, so
    it is not idle while a search picks its next proposal. In ``benchmarks/fleet_tune_sim.py`` (the
    2 x H200's trial and set-up costs on CPU stand-ins) one search more than devices made the ops
    wander between the two workers: 1.53x over one device, against 1.97x with one per device
    (benchmarks/results/fleet_tune_sim.json, "variants")."""
    return max(1, min(jobs, max(2, devices)))


def _tune_job(job: _Job, exchange: _Exchange, store: Any, budget_trials: int, budget_s: float | None,
              report: Callable[[str, Trial], None], pin: str | None = None,
              ranked: tuner.Ranking | None = None) -> TunedOp:
    """One op's search on one kind: proposals evaluated on the fleet (on device ``pin`` when given), each
    trial kept as it lands."""
    gpu = job.device.gpu
    failed, previous = campaign.known(store, gpu, job.op)
    ran_on: dict[tuple[Any, ...], GPUProfile] = {}

    def evaluate_many(op: OpSpec, configs: Sequence[KernelConfig]) -> list[Result]:
        results = []
        for cfg, o in zip(configs, exchange.evaluate(op, configs, job.device, pin), strict=True):
            res, ran_on[cfg.key()] = _result(o, op, cfg, gpu)
            results.append(res)
        return results

    def record(trial: Trial) -> None:
        campaign.keep(ran_on.get(trial.config.key(), gpu), job.op, trial, store)
        report(job.name, trial)

    result = tuner.tune(gpu, job.op, budget_trials=budget_trials, budget_s=budget_s, failed=failed,
                        on_trial=record, evaluate_many=evaluate_many, batch=job.width, prefetch=_ahead(),
                        ranked=ranked)
    return TunedOp(name=job.name, result=result, previous_us=previous)


def _ahead() -> Prefetch | bool:
    """The compile-ahead pool's ``submit`` for a fleet's searches (``AUTOOPT_PRECOMPILE=0`` turns it off, as it
    does on one GPU). Each GPU worker otherwise compiles its trials' kernels itself, serially, and every worker
    compiles the kernels the others compile too: with an empty Triton cache Mixtral TP8's 18-M sweep took 86.4 s
    on two H200s without it and 42.7 s with it, against 61.4 s on one GPU, whose tuner compiles ahead in the same
    pool (h200/moe_tune_scaling_x2_cold.json, one call); again 43.5 against 61.7 s, with a pool of 16 instead of 8
    45.0 s (_x2_ahead.json). The one run against it (H100, 49.6 s against 37.9 s,
    h100/moe_tune_scaling_ahead.json) found the kernels already compiled."""
    if os.environ.get("AUTOOPT_PRECOMPILE") == "0":
        return False
    from autoopt.tuning.precompile import default_precompiler

    pool = default_precompiler()
    return pool.submit if pool is not None else False
