"""Budgeted tuning of one op: propose with the cost model, measure through the runner, keep the best.

The loop (propose -> evaluate -> keep or drop):

1. **Seeds**: the cost model's top pick, plus the best-predicted config of each other kernel
   family whose prediction is close to it (the model's error is larger *between* families, e.g.
   TMA vs pointer GEMM, than within one), at most :data:`SEEDS` of them.
2. **Neighbours**: once a config has been measured best, every valid config of the same kernel
   that differs from it in one knob joins the pool (the template's own space, so each is valid).
3. **Choice**: the next trial is the pool's config with the lowest *corrected* prediction:
   prediction x the smallest measured/predicted ratio seen so far for its kernel (the most
   optimistic correction the evidence allows), or for an unseen kernel, the smallest ratio of any
   kernel x :data:`UNSEEN_KERNEL_DISCOUNT`.
4. **Stop** when the trial or time budget is spent, or when no config left can beat the best
   measured by more than the run-to-run noise, even under that optimistic correction and the
   model's usual spread (:data:`SPREAD`).

Every trial goes through :func:`autoopt.backend.runner.evaluate` (validate -> poison -> reference
-> do_bench); only ``measured`` trials (output matched the reference, time above the physical
floor) can win. Rejected or wrong configs are reported to ``remember`` with their reason so a
store never offers them again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.config import Candidate, KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.template import Template

log = get_logger(__name__)

__all__ = ["NOISE", "SEEDS", "Trial", "TuneResult", "neighbours", "runner_evaluate", "tune"]

#: run-to-run spread of do_bench medians for one config on the H200 (same process, same inputs):
#: about 1-2 % for kernels over 50 us, more for short ones (benchmarks/results/h200/ranking_*).
NOISE = 0.02
#: at most this many seeds (top pick + best of other kernel families) before neighbours.
SEEDS = 3
#: a family whose best prediction is within this factor of the top pick is seeded.
SEED_WINDOW = 1.35
#: an unmeasured kernel family may beat its prediction by this much more than measured ones did.
UNSEEN_KERNEL_DISCOUNT = 0.85
#: how much faster than its corrected prediction an untried config may still turn out: the spread
#: of measured/predicted ratios among a shape's top-20 predicted configs on the H200 grid
#: (benchmarks/results/h200_gemm_grid.json). The tuner stops only when no config could win even so.
SPREAD = 0.10
#: how many of the ranking's configs stay in the pool (beyond neighbours).
POOL = 24
#: do_bench windows for tuning (ms): short, since a tuning budget is about a second per shape;
#: 40 ms is still >60 repetitions of the largest Llama-3-8B projection (~600 us on an H100).
WARMUP_MS, REP_MS = 10, 40

Evaluate = Callable[[OpSpec, KernelConfig], Any]
#: evaluate_many(op, configs): the runner Results of several configs evaluated at once (the fleet's GPUs)
EvaluateMany = Callable[[OpSpec, Sequence[KernelConfig]], Sequence[Any]]
#: prefetch(op, configs): start compiling configs the search will likely try (see precompile.py)
Prefetch = Callable[[OpSpec, Sequence[KernelConfig]], Any]
#: how many proposals are handed to the prefetcher at the start, and per new best
PREFETCH_START, PREFETCH_NEIGHBOURS = 12, 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """One evaluated config: what was predicted, what the runner said, and why it was tried."""

    config: KernelConfig
    source: str  # "seed" | "neighbour" | "ranking"
    predicted_us: float
    label: str  # runner labels: measured, predicted, rejected, withheld, checked
    us: float | None = None
    rel_err: float | None = None
    reason: str = ""
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.label == "measured" and self.us is not None

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "source": self.source,
                "predicted_us": round(self.predicted_us, 4), "label": self.label,
                "measured_us": None if self.us is None else round(self.us, 4),
                "rel_err": None if self.rel_err is None else float(f"{self.rel_err:.4g}"),
                "reason": self.reason, "wall_s": round(self.wall_s, 4)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        return cls(config=KernelConfig.from_dict(data["config"]), source=str(data["source"]),
                   predicted_us=float(data["predicted_us"]), label=str(data["label"]),
                   us=None if data.get("measured_us") is None else float(data["measured_us"]),
                   rel_err=None if data.get("rel_err") is None else float(data["rel_err"]),
                   reason=str(data.get("reason", "")), wall_s=float(data.get("wall_s", 0.0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneResult:
    """What tuning one op found: every trial in order, the winner, and why it stopped."""

    op: OpSpec
    gpu: str
    trials: tuple[Trial, ...]
    stopped: str  # "converged" | "trials" | "seconds" | "exhausted"
    elapsed_s: float
    skipped: tuple[str, ...] = field(default=())  # configs not retried (known failures)

    @property
    def best(self) -> Trial | None:
        """The fastest trial whose output matched the reference (None when none did)."""
        ok = [t for t in self.trials if t.ok]
        return min(ok, key=lambda t: t.us or math.inf) if ok else None

    @property
    def zero_shot(self) -> Trial | None:
        """The cost model's own top pick, as measured (the first trial)."""
        return self.trials[0] if self.trials else None

    @property
    def gain(self) -> float | None:
        """Zero-shot time over tuned time (>= 1: tuning helped); None unless both were measured."""
        best, zs = self.best, self.zero_shot
        if best is None or zs is None or not zs.ok or not best.us or not zs.us:
            return None
        return zs.us / best.us

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"op": self.op.to_dict(), "gpu": self.gpu, "stopped": self.stopped,
                "elapsed_s": round(self.elapsed_s, 3), "trials": [t.to_dict() for t in self.trials],
                "best": None if best is None else best.to_dict(),
                "gain_over_zero_shot": None if self.gain is None else round(self.gain, 4),
                "skipped": list(self.skipped)}


def neighbours(config: KernelConfig, pool: Iterable[KernelConfig]) -> list[KernelConfig]:
    """Configs of ``pool`` with the same kernel and path family that differ from ``config`` in one knob."""
    out = []
    for other in pool:
        if other.kernel != config.kernel or set(other.params) != set(config.params):
            continue
        diff = [k for k in config.params if config.params[k] != other.params[k]]
        if len(diff) == 1:
            out.append(other)
    return out


def _seeds(ranked: list[Candidate]) -> list[Candidate]:
    """The top pick, then the best of each other kernel whose prediction is close to it."""
    top = ranked[0]
    seeds, kernels = [top], {top.config.kernel}
    for cand in ranked[1:]:
        if len(seeds) >= SEEDS or cand.predicted_us > top.predicted_us * SEED_WINDOW:
            break
        if cand.config.kernel not in kernels:
            seeds.append(cand)
            kernels.add(cand.config.kernel)
    if len(seeds) < 2 and len(ranked) > 1:  # one family only: measure its runner-up as well
        seeds.append(ranked[1])
    return seeds


class _Search:
    """The pool of proposals and what the measurements so far say about the model's error."""

    def __init__(self, ranked: list[Candidate], space: list[Candidate], failed: set[tuple[Any, ...]]) -> None:
        self.predicted = {c.config.key(): c for c in space}
        self.predicted.update({c.config.key(): c for c in ranked})
        self.failed = failed
        self.tried: set[tuple[Any, ...]] = set()
        self.ratios: dict[str, list[float]] = {}
        self.queue: list[tuple[Candidate, str]] = [(c, "seed") for c in _seeds(ranked)]
        self.pool: dict[tuple[Any, ...], tuple[Candidate, str]] = {
            c.config.key(): (c, "ranking") for c in ranked[:POOL]}

    def open(self, key: tuple[Any, ...]) -> bool:
        return key not in self.tried and key not in self.failed

    def corrected(self, cand: Candidate) -> float:
        """Prediction x the most optimistic measured/predicted ratio the evidence allows."""
        seen = self.ratios.get(cand.config.kernel)
        if seen:
            return cand.predicted_us * min(seen)
        every = [r for rs in self.ratios.values() for r in rs]
        return cand.predicted_us * (min(every) * UNSEEN_KERNEL_DISCOUNT if every else 1.0)

    def record(self, trial: Trial, best: Trial | None) -> None:
        if trial.ok and trial.us and trial.predicted_us > 0:
            self.ratios.setdefault(trial.config.kernel, []).append(trial.us / trial.predicted_us)
        if trial.ok and best is trial:
            configs = [c.config for c in self.predicted.values()]
            for nb in neighbours(trial.config, configs):
                self.pool.setdefault(nb.key(), (self.predicted[nb.key()], "neighbour"))

    def likely(self, n: int) -> list[KernelConfig]:
        """The ``n`` open proposals the search would take next (queue first, then by corrected prediction)."""
        queued = [c.config for c, _ in self.queue if self.open(c.config.key())]
        ranked = sorted((self.corrected(c), i, c.config) for i, (k, (c, _)) in enumerate(self.pool.items())
                        if self.open(k))
        return [*queued, *(cfg for _, _, cfg in ranked)][:n]

    def next(self, best: Trial | None, noise: float) -> tuple[Candidate, str] | None:
        while self.queue:
            cand, source = self.queue.pop(0)
            if self.open(cand.config.key()):
                return cand, source
        options = [(self.corrected(c), c, s) for k, (c, s) in self.pool.items() if self.open(k)]
        if not options:
            return None
        score, cand, source = min(options, key=lambda o: o[0])
        if best is not None and best.us is not None and score * (1.0 - SPREAD) >= best.us * (1.0 - noise):
            return None  # nothing left can beat the best by more than the noise
        return cand, source


def _gpu_of(target: GPUProfile | HardwareProfile) -> GPUProfile:
    if isinstance(target, HardwareProfile):
        if target.gpu is None:
            raise AutooptError(f"profile {target.name!r} has no GPU; tune needs a GPU profile")
        return target.gpu
    if not isinstance(target, GPUProfile):
        raise AutooptError(f"tune needs a HardwareProfile or GPUProfile, got {type(target).__name__}")
    return target


def _check_budget(budget_trials: int, budget_s: float | None) -> None:
    if isinstance(budget_trials, bool) or not isinstance(budget_trials, int) or not 1 <= budget_trials <= 10_000:
        raise AutooptError(f"budget_trials must be an integer in 1..10000, got {budget_trials!r}")
    if budget_s is not None and not (isinstance(budget_s, (int, float)) and 0 < budget_s <= 86_400):
        raise AutooptError(f"budget_s must be a number of seconds in (0, 86400] or None, got {budget_s!r}")


def runner_evaluate(gpu: GPUProfile) -> Evaluate:
    """The tuner's default evaluation: the backend runner with short do_bench windows (also what a
    fleet worker runs for a tuning item, so both paths label a config alike)."""
    from autoopt.backend import runner
    from autoopt.search.ranking import predict_config, validate_config

    def evaluate(op: OpSpec, config: KernelConfig) -> Any:
        return runner.evaluate(op, config, gpu=gpu, validate=lambda o, c: validate_config(gpu, o, c),
                               predict=lambda o, c: predict_config(gpu, o, c).us,
                               warmup_ms=WARMUP_MS, rep_ms=REP_MS)
    return evaluate


#: what a search starts from: rank()'s first POOL candidates and its exhaustive order of the whole space
Ranking = tuple[list[Candidate], list[Candidate]]


def ranking(gpu: GPUProfile, op: OpSpec, templates: Sequence[Template] | None = None) -> Ranking:
    """The two rank() calls a search starts from. The exhaustive one prices every config of the space (0.2 s
    for a fused-MoE op's 1776 on a 2-core box), so a fleet makes them ahead (``autoopt.fleet.jobs``)."""
    from autoopt.search.ranking import rank

    return (list(rank(gpu, op, top=POOL, templates=templates).candidates),
            list(rank(gpu, op, top=100_000, exhaustive=True, templates=templates).candidates))


def tune(target: GPUProfile | HardwareProfile, op: OpSpec | Mapping[str, Any], *, budget_trials: int = 8,
         budget_s: float | None = None, noise: float = NOISE, evaluate: Evaluate | None = None,
         failed: Iterable[tuple[Any, ...]] = (), on_trial: Callable[[Trial], None] | None = None,
         templates: Sequence[Template] | None = None, prefetch: Prefetch | bool = True,
         evaluate_many: EvaluateMany | None = None, batch: int = 1, ranked: Ranking | None = None) -> TuneResult:
    """Tune ``op`` on ``target`` within ``budget_trials`` evaluations (and ``budget_s`` seconds).

    ``evaluate(op, config)`` returns a runner ``Result`` (default: the backend runner with short
    do_bench windows). ``failed`` holds ``KernelConfig.key()`` of configs known to fail here,
    which are never retried. ``on_trial`` sees each trial as it finishes (progress, JSON lines,
    the results store). ``templates`` restricts the search (default: every installed one).
    ``prefetch`` compiles likely proposals ahead in worker processes (``True``: the default pool,
    only with the real runner on a CUDA GPU; ``False``: off; or a callable).
    ``evaluate_many(op, configs)`` evaluates up to ``batch`` proposals at once (the fleet's GPUs);
    with ``batch=1`` the search is the serial one, proposal for proposal. ``ranked``: :func:`ranking`'s
    answer for this op made ahead (by default it is made here).
    Raises :class:`AutooptError` for a bad budget, op or profile.
    """
    gpu = _gpu_of(target)
    o = op if isinstance(op, OpSpec) else OpSpec.from_dict(op)
    _check_budget(budget_trials, budget_s)
    t0 = time.perf_counter()
    first, space = ranked if ranked is not None else ranking(gpu, o, templates)
    search = _Search(first, space, set(failed))
    run = evaluate or runner_evaluate(gpu)
    many = evaluate_many or (lambda op_, cfgs: [run(op_, c) for c in cfgs])
    ahead = _prefetcher(prefetch, real_runner=evaluate is None and evaluate_many is None)
    if ahead is not None:
        ahead(o, search.likely(PREFETCH_START))
    trials: list[Trial] = []
    best: Trial | None = None
    stopped = "trials"
    while len(trials) < budget_trials:
        if budget_s is not None and time.perf_counter() - t0 >= budget_s:
            stopped = "seconds"
            break
        picks = _proposals(search, best, noise, min(max(1, batch), budget_trials - len(trials)))
        if not picks:
            stopped = "converged" if best is not None else "exhausted"
            break
        for trial in _evaluate(many, o, picks):
            trials.append(trial)
            improved = trial.ok and (best is None or (trial.us or math.inf) < (best.us or math.inf))
            if improved:
                best = trial
            search.record(trial, best)
            if improved and ahead is not None:
                ahead(o, search.likely(PREFETCH_NEIGHBOURS))
            if on_trial is not None:
                on_trial(trial)
    skipped = tuple(" ".join(map(str, k[:2])) for k in search.failed if k in search.predicted)
    return TuneResult(op=o, gpu=gpu.name, trials=tuple(trials), stopped=stopped,
                      elapsed_s=time.perf_counter() - t0, skipped=skipped)


def _proposals(search: _Search, best: Trial | None, noise: float, n: int) -> list[tuple[Candidate, str]]:
    """The next ``n`` proposals (fewer when the search is done), each marked tried as it is taken."""
    picks: list[tuple[Candidate, str]] = []
    while len(picks) < n:
        nxt = search.next(best, noise)
        if nxt is None:
            break
        search.tried.add(nxt[0].config.key())
        picks.append(nxt)
    return picks


def _prefetcher(prefetch: Prefetch | bool, *, real_runner: bool) -> Prefetch | None:
    if callable(prefetch):
        return prefetch
    if not prefetch or not real_runner:
        return None
    from autoopt.tuning.precompile import default_precompiler

    pool = default_precompiler()
    return pool.submit if pool is not None else None


def _evaluate(many: EvaluateMany, op: OpSpec, picks: Sequence[tuple[Candidate, str]]) -> list[Trial]:
    """Trials of ``picks``, evaluated together (one at a time on the serial path)."""
    t = time.perf_counter()
    results = list(many(op, [cand.config for cand, _ in picks]))
    wall = (time.perf_counter() - t) / len(picks)
    trials = []
    for (cand, source), res in zip(picks, results, strict=True):
        log.info("%s %s: %s %s", op.label(), cand.config.describe(), res.label, res.us)
        trials.append(Trial(config=cand.config, source=source, predicted_us=cand.predicted_us, label=res.label,
                            us=res.us if res.label == "measured" else None, rel_err=res.rel_err,
                            reason=res.reason, wall_s=wall))
    return trials
