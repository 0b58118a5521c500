"""The same evaluations on a Ray cluster: one actor per GPU (``num_gpus=1``), results gathered here.

Ray pins each actor to its GPU (it sets ``CUDA_VISIBLE_DEVICES`` for the actor's process), so the
actor calls the evaluator with device ``"0"`` as a local worker does; on a cluster without GPUs (CI)
each actor takes one CPU and evaluates in predicted or interpreter mode. The driver keeps one item in
flight per actor and applies the local pool's rules: an actor that dies is replaced and its item
retried once, then failed with the reason; an item past ``timeout_s`` has its actor killed and is
failed; an exception in the evaluator fails the item only. Ray is optional (``pip install
'autoopt[ray]'``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from autoopt.errors import AutooptError
from autoopt.fleet.pool import DEFAULT_EVALUATOR, Item, Outcome, PoolStats, settle

__all__ = ["run_ray"]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise AutooptError("fleet: --ray needs Ray: pip install 'autoopt[ray]' (or pip install ray)") from None
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


def run_ray(items: Sequence[Item], *, address: str | None = None, evaluator: str = DEFAULT_EVALUATOR,
            timeout_s: float = 300.0, workers: int | None = None,
            on_outcome: Callable[[Outcome], None] | None = None) -> tuple[list[Outcome], PoolStats]:
    """Evaluate ``items`` on a Ray cluster (``address``: "auto", an address, or None to start a local
    one); every item ends ``done`` or ``failed`` exactly once, here."""
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        return _run(ray, items, evaluator, timeout_s, workers, on_outcome)
    finally:
        if started:
            ray.shutdown()


def _run(ray: Any, items: Sequence[Item], evaluator: str, timeout_s: float, workers: int | None,
         on_outcome: Callable[[Outcome], None] | None) -> tuple[list[Outcome], PoolStats]:
    gpus = int(ray.cluster_resources().get("GPU", 0))
    n = workers or gpus or max(1, int(ray.cluster_resources().get("CPU", 1)))
    remote = ray.remote(num_gpus=1, num_cpus=0)(_Actor) if gpus else ray.remote(num_cpus=1)(_Actor)

    def spawn(k: int) -> Any:
        return remote.remote(evaluator, "0" if gpus else f"cpu{k}")

    actors = [spawn(k) for k in range(n)]
    names = [ray.get(a.where.remote()) for a in actors]
    pending: deque[tuple[Item, int]] = deque((i, 1) for i in items)
    flight: dict[Any, tuple[int, Item, int, float]] = {}  # ref -> (actor slot, item, attempt, start)
    outcomes: dict[int, Outcome] = {}
    stats = PoolStats(per_device={})
    finish = settle(outcomes, stats, on_outcome)

    while len(outcomes) < len(items):
        busy = {slot for slot, *_ in flight.values()}
        for slot in range(n):
            if slot not in busy and pending:
                item, attempt = pending.popleft()
                ref = actors[slot].run.remote(dict(item.op), dict(item.config), item.profile)
                flight[ref] = (slot, item, attempt, time.monotonic())
        ready, _ = ray.wait(list(flight), num_returns=1, timeout=0.2)
        for ref in ready:
            slot, item, attempt, _ = flight.pop(ref)
            try:
                finish(Outcome(item=item.id, device=names[slot], status="done", result=ray.get(ref),
                               attempts=attempt))
            except ray.exceptions.RayActorError as exc:  # the actor's process died
                actors[slot] = spawn(slot)
                names[slot] = ray.get(actors[slot].where.remote())
                stats.restarts += 1
                if attempt < 2:
                    stats.retries += 1
                    pending.appendleft((item, attempt + 1))
                else:
                    finish(Outcome(item=item.id, device=names[slot], status="failed", attempts=attempt,
                                   reason=f"worker died: {str(exc).splitlines()[0][:200]}"))
            except ray.exceptions.RayTaskError as exc:  # the evaluator raised: the item fails, the actor lives
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                finish(Outcome(item=item.id, device=names[slot], status="failed", attempts=attempt,
                               reason=f"{type(cause).__name__}: {cause}"))
        now = time.monotonic()
        for ref, (slot, item, attempt, start) in list(flight.items()):
            if now - start > timeout_s:
                flight.pop(ref)
                ray.kill(actors[slot])
                actors[slot] = spawn(slot)
                names[slot] = ray.get(actors[slot].where.remote())
                stats.timeouts += 1
                stats.restarts += 1
                finish(Outcome(item=item.id, device=names[slot], status="failed", attempts=attempt,
                               reason=f"timeout: no result after {timeout_s:g} s (worker killed)"))
    for a in actors:
        ray.kill(a)
    return [outcomes[i.id] for i in items], stats
