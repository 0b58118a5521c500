"""The same evaluations on a Ray cluster: one actor per GPU (``num_gpus=1``), results gathered here.

Ray pins each actor to its GPU (it sets ``CUDA_VISIBLE_DEVICES`` for the actor's process), so the
actor calls the evaluator with device ``"0"`` as a local worker does; on a cluster without GPUs (CI)
each actor takes one CPU and evaluates in predicted or interpreter mode. The driver keeps one item in
flight per actor and applies the local pool's rules: an actor that dies is replaced and its item
retried once, then failed with the reason; an item past ``timeout_s`` has its actor killed and is
failed; an exception in the evaluator fails the item only; an idle actor takes the costliest item of
its kind waiting (LPT, :class:`~autoopt.fleet.pool.Backlog`). Each actor says what it is
(``describe``: its node and GPU, or on a CPU actor the ``profile`` it stands for), which
:attr:`RayPool.kinds` routes by. Ray is optional (``pip install 'autoopt[ray]'``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError
from autoopt.fleet.pool import DEFAULT_EVALUATOR, Backlog, Item, Outcome, PoolStats, drain, op_key, remember, settle

__all__ = ["RayPool", "run_ray"]

log = get_logger(__name__)
#: how long a poll waits while an actor is idle (an item submitted meanwhile waits at most this)
IDLE_WAIT_S = 0.01


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise AutooptError("--ray needs Ray, which is not installed: pip install 'autoopt[ray]' "
                           "(or pip install ray)") from None
    return ray


class _Actor:
    """The Ray actor body: the worker's evaluator, called per item."""

    def __init__(self, evaluator: str, device: str) -> None:
        from autoopt.fleet.worker import load_evaluator

        self.fn = load_evaluator(evaluator)
        self.device = device

    def run(self, op: dict[str, Any], config: dict[str, Any], profile: str | None) -> dict[str, Any]:
        return dict(self.fn(op, config, device=self.device, profile=profile))

    def where(self) -> str:
        import ray

        ctx = ray.get_runtime_context()
        gpus = ctx.get_accelerator_ids().get("GPU", [])
        return f"{ctx.get_node_id()[:8]}:{'gpu' + ','.join(gpus) if gpus else self.device}"

    def describe(self, profile: str | None) -> dict[str, Any]:
        """Its name, and the GPU it evaluates on (detected; on a CPU actor, ``profile``'s; else None)."""
        import ray

        from autoopt.fleet.worker import worker_gpu

        stands_for = None if ray.get_runtime_context().get_accelerator_ids().get("GPU") else profile
        gpu = worker_gpu(self.device, stands_for) if stands_for or self.device.isdigit() else None
        return {"name": self.where(), "gpu": gpu.to_dict() if gpu else None, "profile": stands_for,
                "kind": gpu.device_fingerprint if gpu else None}


class RayPool:
    """One actor per GPU of the cluster (per CPU where it has none; ``workers`` overrides), fed from a
    :class:`Backlog`. ``submit`` from any thread, ``poll`` from one. ``described[slot]`` is what the
    actor of that slot said of itself (``describe``); ``kinds[slot]`` its kind."""

    def __init__(self, *, address: str | None = None, evaluator: str = DEFAULT_EVALUATOR, timeout_s: float = 300.0,
                 workers: int | None = None, profile: str | None = None) -> None:
        self._ray = _ray()
        self._started = not self._ray.is_initialized()
        if self._started:
            self._ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.evaluator, self.timeout_s, self.profile = evaluator, timeout_s, profile
        self.outcomes: dict[int, Outcome] = {}
        self.stats = PoolStats(per_device={})
        self._backlog = Backlog()
        self._warm: dict[int, list[str]] = {}  # slot -> op_keys of its last items (see Backlog.take)
        self._flight: dict[Any, tuple[int, Item, int, float]] = {}  # ref -> (slot, item, attempt, start)
        self._fresh: list[Outcome] = []
        self._finish = settle(self.outcomes, self.stats, self._fresh.append)
        try:
            self._start(workers)
        except BaseException:
            self.close()
            raise

    def _start(self, workers: int | None) -> None:
        resources = self._ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        n = workers or gpus or max(1, int(resources.get("CPU", 1)))
        self._gpus = gpus > 0
        self._remote = (self._ray.remote(num_gpus=1, num_cpus=0)(_Actor) if self._gpus
                        else self._ray.remote(num_cpus=1)(_Actor))
        self._actors = [self._spawn(k) for k in range(n)]
        self.described: list[dict[str, Any]] = self._ray.get([a.describe.remote(self.profile) for a in self._actors])
        self.kinds: list[str | None] = [d["kind"] for d in self.described]

    def _spawn(self, slot: int) -> Any:
        return self._remote.remote(self.evaluator, "0" if self._gpus else f"cpu{slot}")

    def _replace(self, slot: int) -> None:
        """A fresh actor in ``slot`` (after a death or a timeout kill); it may land on another node."""
        self._actors[slot] = self._spawn(slot)
        self._warm.pop(slot, None)  # a fresh process holds no op's inputs
        self.described[slot] = self._ray.get(self._actors[slot].describe.remote(self.profile))
        self.kinds[slot] = self.described[slot]["kind"]
        self.stats.restarts += 1

    def submit(self, item: Item) -> None:
        if item.kind is not None and item.kind not in self.kinds:
            raise AutooptError(f"fleet: no Ray actor of kind {item.kind} for item {item.id}")
        self._backlog.push(item)

    def poll(self, wait_s: float = 0.1) -> list[Outcome]:
        """Hand out waiting items, collect one answer (waiting up to ``wait_s``), kill overdue actors.
        While an actor is idle the wait is cut to ``IDLE_WAIT_S``: a search's next proposal, submitted
        from another thread, cannot interrupt ``ray.wait`` (the local pool has a wake-up pipe instead)."""
        self._assign()
        if len(self._flight) < len(self._actors):
            wait_s = min(wait_s, IDLE_WAIT_S)
        if self._flight:
            ready, _ = self._ray.wait(list(self._flight), num_returns=1, timeout=wait_s)
            for ref in ready:
                self._collect(ref)
        else:
            time.sleep(wait_s)
        self._police()
        out = list(self._fresh)
        self._fresh.clear()
        return out

    def _assign(self) -> None:
        busy = {slot for slot, *_ in self._flight.values()}
        for slot, actor in enumerate(self._actors):
            taken = None if slot in busy else self._backlog.take(self.kinds[slot], self._warm.get(slot, ()))
            if taken is not None:
                item, attempt = taken
                remember(self._warm.setdefault(slot, []), op_key(item.op))
                ref = actor.run.remote(dict(item.op), dict(item.config), item.profile)
                self._flight[ref] = (slot, item, attempt, time.monotonic())

    def _collect(self, ref: Any) -> None:
        ray = self._ray
        slot, item, attempt, _ = self._flight.pop(ref)
        name = self.described[slot]["name"]
        try:
            self._finish(Outcome(item=item.id, device=name, status="done", result=ray.get(ref), attempts=attempt))
        except ray.exceptions.RayActorError as exc:  # the actor's process died
            self._replace(slot)
            if attempt < 2:
                self.stats.retries += 1
                self._backlog.push(item, attempt + 1)
            else:
                self._finish(Outcome(item=item.id, device=name, status="failed", attempts=attempt,
                                     reason=f"worker died: {str(exc).splitlines()[0][:200]}"))
        except ray.exceptions.RayTaskError as exc:  # the evaluator raised: the item fails, the actor lives
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            self._finish(Outcome(item=item.id, device=name, status="failed", attempts=attempt,
                                 reason=f"{type(cause).__name__}: {cause}"))

    def _police(self) -> None:
        now = time.monotonic()
        for ref, (slot, item, attempt, start) in list(self._flight.items()):
            if now - start > self.timeout_s:
                self._flight.pop(ref)
                name = self.described[slot]["name"]
                self._ray.kill(self._actors[slot])
                self._replace(slot)
                self.stats.timeouts += 1
                self._finish(Outcome(item=item.id, device=name, status="failed", attempts=attempt,
                                     reason=f"timeout: no result after {self.timeout_s:g} s (worker killed)"))

    def close(self) -> None:
        for a in getattr(self, "_actors", []):
            self._ray.kill(a)
        self._actors = []
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()


def run_ray(items: Sequence[Item], *, address: str | None = None, evaluator: str = DEFAULT_EVALUATOR,
            timeout_s: float = 300.0, workers: int | None = None,
            on_outcome: Callable[[Outcome], None] | None = None) -> tuple[list[Outcome], PoolStats]:
    """Evaluate ``items`` on a Ray cluster (``address``: "auto", an address, or None to start a local
    one); every item ends ``done`` or ``failed`` exactly once, here."""
    pool = RayPool(address=address, evaluator=evaluator, timeout_s=timeout_s, workers=workers)
    try:
        return drain(pool, items, wait_s=0.2, on_outcome=on_outcome), pool.stats
    finally:
        pool.close()
