"""Tuning many ops against the results store: what ``autoopt.tune`` and ``autoopt tune`` run.

For each op: configs the store already knows to fail here are never retried, a measured winner
already in the store is kept unless tuning beats it, and every trial (measured, rejected or wrong)
is written to the store as it finishes, so an interrupted campaign keeps what it measured. The
winner is also remembered in memory, so ``rank()`` in this process sees it at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError, BackendError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.suite import suite
from autoopt.results import keys
from autoopt.results.lookup import default_lookup, refresh_snapshots
from autoopt.results.store import ResultStore, open_default
from autoopt.tuning import tuner
from autoopt.tuning.tuner import Trial, TuneResult

log = get_logger(__name__)

__all__ = ["TunedOp", "keep", "known", "model_ops", "suite_ops", "tune", "tune_op", "tune_ops"]

#: labels the store keeps as known failures of a config here (never retried)
_FAILED = ("rejected", "withheld")


@dataclass(frozen=True, slots=True, kw_only=True)
class TunedOp:
    """One op of a campaign: its name, the tuning result and the store's previous winner (µs)."""

    name: str
    result: TuneResult
    previous_us: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "previous_best_us": self.previous_us, **self.result.to_dict()}


def suite_ops(name: str, dtype: str = "bf16") -> list[tuple[str, OpSpec]]:
    """(label, op) of a named op suite (``autoopt.kernels.suite``)."""
    return list(suite(name, dtype))


def model_ops(profile: HardwareProfile, model: Any, *, batch: int = 1, context: int | None = None
              ) -> list[tuple[str, OpSpec]]:
    """The distinct ops of ``model``'s plan on ``profile`` that a template serves (attention and
    ops priced by the roofline only have nothing to tune), in plan order."""
    from autoopt.planning.recommendation import recommend

    kwargs: dict[str, Any] = {"batch": batch}
    if context is not None:
        kwargs["context"] = context
    rec = recommend(profile, model, **kwargs)
    seen: dict[tuple[Any, ...], tuple[str, OpSpec]] = {}
    for choice in rec.ops:
        if choice.source == "roofline":
            continue
        op = OpSpec(kind=choice.kind, shape=tuple(choice.shape), dtype=choice.dtype)
        seen.setdefault((op.kind, op.shape, op.dtype), (f"{choice.phase}:{choice.name}", op))
    return list(seen.values())


def _require_gpu() -> None:
    """Tuning times kernels: refuse up front on a machine where the runner could only predict."""
    try:
        import torch
    except ImportError:
        raise BackendError("tuning needs torch and triton (pip install 'autoopt[gpu]')") from None
    if not torch.cuda.is_available():
        raise BackendError(f"tuning times kernels on a CUDA GPU and torch {torch.__version__} sees none here; "
                           "`autoopt kernel` ranks without timing")


def _row(gpu: GPUProfile, op: OpSpec, trial: Trial) -> Any:
    from autoopt.backend.registry import KERNELS

    entry = KERNELS.get(trial.config.kernel)
    if entry is None:  # a plugin's kernel with no backend entry cannot have been measured
        return None
    label = trial.label if trial.label in ("measured", *_FAILED) else None
    if label is None:
        return None
    return keys.make_result(gpu, op, trial.config, label=label, kernel_module=entry.module, us=trial.us,
                            max_error=trial.rel_err, reason=trial.reason)


def known(store: ResultStore | None, gpu: GPUProfile, op: OpSpec) -> tuple[list[tuple[Any, ...]], float | None]:
    """What ``store`` already knows of ``op`` on ``gpu``: the keys of configs that failed here (never
    retried) and the current measured winner's time (None: none, or stale)."""
    if store is None:
        return [], None
    key = keys.current_key(gpu, op)
    prev = store.best(key)
    return ([row.config.key() for row in store.failed(key).values()],
            prev.us if prev is not None and not keys.is_stale(prev) else None)


def keep(gpu: GPUProfile, op: OpSpec, trial: Trial, store: ResultStore | None) -> None:
    """Write ``trial`` (run on ``gpu``) to ``store`` and remember a measured one in this process."""
    row = _row(gpu, op, trial)
    if row is not None:
        if store is not None:
            store.put(row)
        default_lookup().remember(row)


def tune_op(gpu: GPUProfile, op: OpSpec, *, name: str = "", budget_trials: int = 8, budget_s: float | None = None,
            store: ResultStore | None = None, on_trial: Callable[[str, Trial], None] | None = None) -> TunedOp:
    """Tune one op, reading known failures from and writing every trial to ``store`` (None: no store)."""
    failed, previous = known(store, gpu, op)

    def record(trial: Trial) -> None:
        keep(gpu, op, trial, store)
        if on_trial is not None:
            on_trial(name or op.label(), trial)

    result = tuner.tune(gpu, op, budget_trials=budget_trials, budget_s=budget_s, failed=failed, on_trial=record)
    return TunedOp(name=name or op.label(), result=result, previous_us=previous)


def tune_ops(target: GPUProfile | HardwareProfile, ops: Iterable[tuple[str, OpSpec]] | Sequence[OpSpec], *,
             budget_trials: int = 8, budget_s: float | None = None, use_store: bool = True,
             on_trial: Callable[[str, Trial], None] | None = None) -> list[TunedOp]:
    """Tune each op on this machine's GPU (``target`` describes it) with the default results store."""
    gpu = target.gpu if isinstance(target, HardwareProfile) else target
    if not isinstance(gpu, GPUProfile):
        raise AutooptError("tune needs a GPU profile; this profile has none")
    _require_gpu()
    named = [(o.label(), o) if isinstance(o, OpSpec) else (str(o[0]), o[1]) for o in ops]
    store = open_default() if use_store else None
    try:
        return [tune_op(gpu, op, name=name, budget_trials=budget_trials, budget_s=budget_s, store=store,
                        on_trial=on_trial) for name, op in named]
    finally:
        if store is not None:
            store.close()
            # the first start-up after tuning reads the new winners without opening SQLite
            refresh_snapshots(store.path, also=[keys.env_key(gpu)])


def tune(target: GPUProfile | HardwareProfile, op: OpSpec | Mapping[str, Any], *, budget_trials: int = 8,
         budget_s: float | None = None, use_store: bool = True) -> TuneResult:
    """``autoopt.tune``: tune one op on this machine's GPU and keep what was measured.

    Known failures in the results store are skipped, every trial is stored, and the winner is
    what ``rank()``/``recommend()`` use from then on, in this process and the next.
    BackendError without a CUDA GPU; AutooptError for a bad op or budget.
    """
    spec = op if isinstance(op, OpSpec) else OpSpec.from_dict(op)
    return tune_ops(target, [("", spec)], budget_trials=budget_trials, budget_s=budget_s,
                    use_store=use_store)[0].result
