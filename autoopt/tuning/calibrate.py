"""Calibrate the cost model for this GPU: what ``autoopt calibrate`` runs.

Samples (``(gpu, op, config, measured_us)``) come from one of two places:

- :func:`store_samples`: every ``measured`` row of this device in the user's results store that is
  not stale (kernel source unchanged, the installed triton) and that today's templates still accept;
  one sample per (op, config), the newest measurement;
- :func:`sweep_samples`: a short sweep on this CUDA GPU. For the 12 Llama-3-8B projection GEMMs
  (:data:`~autoopt.kernels.suite.LLAMA3_8B_PROJECTIONS` at M = 16, 256, 4096) it times the ranking's
  top :data:`TOP` configs and a stratified spread of :data:`SPREAD` more across each shape's whole
  valid space (one config per band of predicted time, the same seeded pick across shapes where they
  share configs, so one compile serves several shapes), shape after shape, each given an equal share
  of what is left of the time budget. Every config goes through :func:`autoopt.backend.runner.evaluate`
  (validate, poison, float64 reference, then ``do_bench`` with short windows); compiles run ahead in
  worker processes (:mod:`autoopt.tuning.precompile`). Every evaluated row is written to the results
  store, like a tuning trial.

:func:`calibrate_device` fits the constants (:func:`autoopt.search.calibration.calibrate`: held-out
split per shape, fit near each shape's best, score before and after on the held-out configs) and
keeps them for the device (:mod:`autoopt.results.constants`), where ``rank()`` picks them up. It
refuses when the samples are too few (:data:`MIN_SAMPLES` over :data:`MIN_SHAPES` shapes) and keeps
the constants only when they rank the held-out configs better (:attr:`CalibrationReport.better`).
"""

from __future__ import annotations

import hashlib
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError, BackendError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import DEFAULT_CONSTANTS
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.suite import LLAMA3_8B_PROJECTIONS
from autoopt.results import constants as stored
from autoopt.results import keys
from autoopt.results.store import ResultStore, default_path, open_default
from autoopt.search.calibration import DEFAULT_NAMES, CalibrationReport, Sample, calibrate

log = get_logger(__name__)

__all__ = ["DEFAULT_SECONDS", "MAX_SECONDS", "MIN_PER_SHAPE", "MIN_SAMPLES", "MIN_SHAPES", "SPREAD", "TOP",
           "DeviceCalibration", "SampleSet", "calibrate_device", "plan_sweep", "store_samples", "sweep_ops",
           "sweep_samples"]

#: the sweep's time budget (s) by default, and the most it may be given: with start-up (~10 s), the
#: fit (<= FIT_SECONDS) and scoring, the whole command stays under 3 minutes on one GPU
DEFAULT_SECONDS = 150.0
MAX_SECONDS = 150.0
#: the fit stops after this long (it converges in ~10 s for ~480 samples on one core), and sooner when
#: the whole command would otherwise pass TOTAL_SECONDS
FIT_SECONDS, TOTAL_SECONDS = 20.0, 175.0
#: per shape: the ranking's top configs, then one config from each of this many bands of predicted time.
#: On an H100 a timed config costs ~65 ms once compiled (48 per shape took 41 s for all 12 shapes), so
#: 160 per shape is about what 150 s holds; with less time each shape stops at its share, and the
#: bands' order (see plan_sweep) keeps what was timed spread over the whole space.
TOP, SPREAD = 8, 152
#: M of the swept GEMMs (decode, small and large prefill batches)
SWEEP_MS = (16, 256, 4096)
#: do_bench windows (ms): short, since the sweep orders configs, and 2% noise does not reorder many
WARMUP_MS, REP_MS = 5, 25
#: the least a calibration is fitted on: samples, shapes, and samples of a shape for it to count
MIN_SAMPLES, MIN_SHAPES, MIN_PER_SHAPE = 30, 3, 4
#: runner labels the store keeps (``predicted``/``checked`` are not measurements of this GPU)
_STORED = ("measured", "rejected", "withheld")

Evaluate = Callable[[OpSpec, KernelConfig], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class SampleSet:
    """Samples for a calibration and where they came from (``store`` or ``sweep``)."""

    source: str
    samples: tuple[Sample, ...]
    #: reason -> rows or configs left out
    skipped: dict[str, int] = field(default_factory=dict)
    #: what the source did: the store's path and rows; the sweep's time, evaluations and outcomes
    detail: dict[str, Any] = field(default_factory=dict)
    #: software that measured them (torch, triton, CUDA, Python), when known
    versions: dict[str, str] = field(default_factory=dict)

    def per_shape(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, op, _, _ in self.samples:
            out[op.label()] = out.get(op.label(), 0) + 1
        return out

    @property
    def usable_shapes(self) -> int:
        """Shapes with at least :data:`MIN_PER_SHAPE` samples (a shape needs a few to split and score)."""
        return sum(1 for n in self.per_shape().values() if n >= MIN_PER_SHAPE)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "samples": len(self.samples), "shapes": len(self.per_shape()),
                "usable_shapes": self.usable_shapes, "per_shape": self.per_shape(), "skipped": dict(self.skipped),
                **self.detail}


# -- samples from the results store ---------------------------------------------------------------

def store_samples(gpu: GPUProfile, *, store: ResultStore | None = None) -> SampleSet:
    """Every usable ``measured`` row of ``gpu``'s device in ``store`` (default: the user store, not created)."""
    from autoopt.search.ranking import validate_config

    own = store is None
    path = None
    if store is None:
        path = default_path()
        store = open_default(create=False)
    else:
        path = store.path
    detail: dict[str, Any] = {"store": str(path) if path is not None else None, "device": gpu.device_fingerprint}
    if store is None:
        return SampleSet(source="store", samples=(), detail={**detail, "rows": 0})
    try:
        rows = store.rows(device=gpu.device_fingerprint, labels=["measured"])
    finally:
        if own:
            store.close()
    skipped: dict[str, int] = {}

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    newest: dict[tuple[Any, ...], Any] = {}
    for row in rows:
        if row.env.device != gpu.device_fingerprint:
            skip("another device of the same name")
        elif row.us is None or not math.isfinite(row.us) or row.us <= 0:
            skip("no time")
        elif keys.is_stale(row):
            skip("stale (kernel source changed or another triton)")
        else:
            k = (row.op, row.config.key())
            if k in newest:
                skip("older measurement of the same config")
                if row.measured_at <= newest[k].measured_at:
                    continue
            newest[k] = row
    samples: list[Sample] = []
    for row in newest.values():
        problems = validate_config(gpu, row.op, row.config)
        if problems:
            skip("refused by today's templates")
            continue
        samples.append((gpu, row.op, row.config, float(row.us)))
    samples.sort(key=lambda s: (s[1].kind, s[1].shape, s[1].dtype, s[1].layout, s[3], repr(s[2].key())))
    return SampleSet(source="store", samples=tuple(samples), skipped=skipped, detail={**detail, "rows": len(rows)})


# -- the sweep ---------------------------------------------------------------------------------

def sweep_ops(dtype: str = "bf16") -> list[tuple[str, OpSpec]]:
    """The swept GEMMs: Llama-3-8B's four projections at M = 16, 256 and 4096."""
    return [(f"{name} M={m}", OpSpec(kind="gemm", shape=(m, n, k), dtype=dtype))
            for m in SWEEP_MS for name, (n, k) in LLAMA3_8B_PROJECTIONS.items()]


def _spread_order(n: int) -> list[int]:
    """0..n-1 in van der Corput order (0, n/2, n/4, 3n/4, ...): any prefix covers the range evenly."""
    def radical(i: int) -> float:
        out, base = 0.0, 0.5
        while i:
            out += base * (i & 1)
            i >>= 1
            base /= 2
        return out
    return sorted(range(n), key=radical)


def _pick_order(seed: int, config: KernelConfig) -> bytes:
    """A seeded pseudo-random order of configs that is the same for every shape (so the bands of
    different shapes pick the same config where they share one, and one compile serves them all)."""
    text = f"{seed}|{config.kernel}|{config.path}|{sorted(config.params.items())}"
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


def plan_sweep(gpu: GPUProfile, op: OpSpec, *, top: int = TOP, spread: int = SPREAD, seed: int = 0
               ) -> list[KernelConfig]:
    """The configs the sweep times for ``op``, in the order it times them: the default model's top
    ``top``, then one seeded pick from each of ``spread`` bands of the rest of the valid space (sorted by
    predicted time), the bands in an order whose every prefix spans the space."""
    from autoopt.search.ranking import rank

    ranked = [c.config for c in rank(gpu, op, top=top, measured=False, calibrated=False).candidates]
    seen = {c.key() for c in ranked}
    space = [c.config for c in rank(gpu, op, top=1_000_000, exhaustive=True, measured=False,
                                    calibrated=False).candidates if c.config.key() not in seen]
    bands = max(0, min(spread, len(space)))
    picks: list[KernelConfig] = []
    for b in range(bands):
        band = space[b * len(space) // bands:(b + 1) * len(space) // bands]
        if band:
            picks.append(min(band, key=lambda c: _pick_order(seed, c)))
    return ranked + [picks[i] for i in _spread_order(len(picks))]


def require_cuda() -> None:
    """BackendError unless kernels can be timed here (torch sees a CUDA GPU, no Triton interpreter)."""
    try:
        import torch
    except ImportError:
        raise BackendError("calibrate --sweep times kernels and needs torch and triton "
                           "(pip install 'autoopt[gpu]'); --from-store fits on stored timings") from None
    from autoopt.backend.runner import interpreter_active

    if interpreter_active():
        raise BackendError("calibrate --sweep times kernels on a CUDA GPU, but TRITON_INTERPRET is on here "
                           "(CPU interpreter: no timings)")
    if not torch.cuda.is_available():
        raise BackendError(f"calibrate --sweep times kernels on a CUDA GPU and torch {torch.__version__} sees "
                           f"none here; --from-store fits on timings already in the results store")


def _runner(gpu: GPUProfile) -> Evaluate:
    from autoopt.backend import runner
    from autoopt.search.ranking import predict_config, validate_config

    def evaluate(op: OpSpec, config: KernelConfig) -> Any:
        return runner.evaluate(op, config, gpu=gpu, validate=lambda o, c: validate_config(gpu, o, c),
                               predict=lambda o, c: predict_config(gpu, o, c, calibrated=False).us,
                               warmup_ms=WARMUP_MS, rep_ms=REP_MS)
    return evaluate


def _versions() -> dict[str, str]:
    """What a sample records when no evaluation said: installed versions, read without importing."""
    out = {"python": platform.python_version()}
    for dist in ("torch", "triton"):
        v = keys.installed_version(dist)
        if v:
            out[dist] = v
    return out


def sweep_samples(gpu: GPUProfile, *, seconds: float = DEFAULT_SECONDS, seed: int = 0,
                  ops: Sequence[tuple[str, OpSpec]] | None = None, top: int = TOP, spread: int = SPREAD,
                  store: ResultStore | bool = True, evaluate: Evaluate | None = None, precompile: bool = True,
                  on_shape: Callable[[str, dict[str, Any]], None] | None = None) -> SampleSet:
    """Time a stratified sample of each op's configs on this GPU within ``seconds`` (see the module doc).

    ``store``: True, the user store (none when switched off); False, none; or a store. ``evaluate``:
    a stand-in for the runner (tests); without one a CUDA GPU is required (BackendError).
    ``on_shape(label, counts)`` is called as each op finishes.
    """
    if not (isinstance(seconds, (int, float)) and 0 < seconds <= MAX_SECONDS):
        raise AutooptError(f"sweep seconds must be in (0, {MAX_SECONDS:g}], got {seconds!r}")
    t0 = time.perf_counter()
    deadline = t0 + seconds
    real = evaluate is None
    if real:
        require_cuda()
    run = evaluate or _runner(gpu)
    todo = list(ops) if ops is not None else sweep_ops()
    plans = [(label, op, plan_sweep(gpu, op, top=top, spread=spread, seed=seed)) for label, op in todo]
    ahead = None
    if real and precompile:
        from autoopt.tuning.precompile import default_precompiler

        ahead = default_precompiler()
        if ahead is not None:
            for _, op, configs in plans:
                ahead.submit(op, configs)
    db = (open_default() if store is True else None) if isinstance(store, bool) else store
    from autoopt.backend.registry import KERNELS
    from autoopt.results.lookup import default_lookup

    memory = default_lookup()
    samples: list[Sample] = []
    counts = {"evaluated": 0, "measured": 0, "rejected": 0, "withheld": 0, "other": 0}
    per_shape: dict[str, dict[str, Any]] = {}
    versions: dict[str, str] = {}
    stored_rows = 0
    try:
        for i, (label, op, configs) in enumerate(plans):
            start = time.perf_counter()
            share = (deadline - start) / (len(plans) - i)
            mine: dict[str, Any] = {"planned": len(configs), "evaluated": 0, "measured": 0}
            for config in configs:
                now = time.perf_counter()
                if now >= deadline or now - start >= share:
                    break
                res = run(op, config)
                mine["evaluated"] += 1
                counts["evaluated"] += 1
                outcome = res.label if res.label in counts else "other"
                counts[outcome] += 1
                if not versions and getattr(res, "versions", None):
                    versions = dict(res.versions)
                if res.label == "measured" and res.us is not None and res.us > 0:
                    mine["measured"] += 1
                    samples.append((gpu, op, config, float(res.us)))
                if res.label in _STORED and config.kernel in KERNELS:
                    row = keys.make_result(gpu, op, config, label=res.label,
                                           kernel_module=KERNELS[config.kernel].module,
                                           us=res.us if res.label != "rejected" else None,
                                           max_error=getattr(res, "rel_err", None), reason=getattr(res, "reason", ""))
                    if db is not None:
                        db.put(row)
                        stored_rows += 1
                    memory.remember(row)
            mine["seconds"] = round(time.perf_counter() - start, 2)
            per_shape[label] = mine
            if on_shape is not None:
                on_shape(label, mine)
    finally:
        if ahead is not None:
            ahead.close()
        if db is not None and store is True:
            db.close()
            if stored_rows:
                from autoopt.results.lookup import refresh_snapshots

                refresh_snapshots(db.path)  # the next start-up reads the new winners without SQLite
    detail = {"seconds_budget": seconds, "elapsed_s": round(time.perf_counter() - t0, 2), **counts,
              "stored_rows": stored_rows, "store": str(db.path) if db is not None else None,
              "top": top, "spread": spread, "seed": seed, "warmup_ms": WARMUP_MS, "rep_ms": REP_MS,
              "sweep": per_shape}
    return SampleSet(source="sweep", samples=tuple(samples), detail=detail, versions=versions or _versions())


# -- the calibration -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceCalibration:
    """One device's calibration: its samples, the fit's report, and where the constants went."""

    gpu: GPUProfile
    profile: str
    samples: SampleSet
    report: CalibrationReport
    saved: str | None = None
    #: why the constants were not written (dry run, or the fit did not rank the held-out configs better)
    not_saved: str = ""
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        g = self.gpu
        versions = {**_versions(), **self.samples.versions, "autoopt": keys.autoopt_version()}
        return {
            "device": {"name": g.name, "fingerprint": g.device_fingerprint, "profile": self.profile,
                       "driver": g.driver_version or "", "cc": f"{g.cc_major}.{g.cc_minor}", "sms": g.sm_count,
                       "memory_bytes": g.memory_total_bytes},
            "versions": versions,
            "samples": self.samples.to_dict(),
            "calibration": self.report.to_dict(),
            "saved": self.saved, "not_saved": self.not_saved, "elapsed_s": round(self.elapsed_s, 2),
        }


def check_enough(samples: SampleSet) -> None:
    """AutooptError (one line: found vs needed) when there is too little to fit and score on."""
    n, shapes = len(samples.samples), samples.usable_shapes
    if n >= MIN_SAMPLES and shapes >= MIN_SHAPES:
        return
    where = {"store": f"in the results store ({samples.detail.get('store') or 'off'})",
             "sweep": "from the sweep"}.get(samples.source, "")
    skipped = ", ".join(f"{k} {why}" for why, k in samples.skipped.items())
    raise AutooptError(
        f"calibrate: found {n} measured samples over {shapes} shapes (with >= {MIN_PER_SHAPE} each) {where}"
        f"{f' (left out: {skipped})' if skipped else ''}; need at least {MIN_SAMPLES} samples over "
        f"{MIN_SHAPES} shapes (measure more: `autoopt tune --suite llm` or `autoopt calibrate --sweep` on this GPU)")


def calibrate_device(gpu: GPUProfile, samples: SampleSet, *, profile: str = "", names: Sequence[str] | None = None,
                     save: bool = True, force: bool = False, fit_seconds: float | None = FIT_SECONDS,
                     started: float | None = None) -> DeviceCalibration:
    """Fit ``gpu``'s constants to ``samples`` from the defaults and keep them when they rank the held-out
    configs better (``force``: keep them anyway; ``save=False``: never). ``started``: when the command
    began (``time.perf_counter()``), so the fit ends in time for the whole to stay under
    :data:`TOTAL_SECONDS`. AutooptError when the samples are too few."""
    t0 = started if started is not None else time.perf_counter()
    check_enough(samples)
    counts = samples.per_shape()
    usable = [s for s in samples.samples if counts.get(s[1].label(), 0) >= MIN_PER_SHAPE]
    if fit_seconds is not None:
        fit_seconds = max(5.0, min(fit_seconds, TOTAL_SECONDS - (time.perf_counter() - t0)))
    report = calibrate(usable, start=DEFAULT_CONSTANTS, names=list(names) if names else DEFAULT_NAMES,
                       max_seconds=fit_seconds)
    saved: Path | None = None
    why = ""
    if not save:
        why = "dry run"
    elif not report.better and not force:
        why = ("the fitted constants do not rank the held-out configs better than the defaults (median rho "
               f"{report.before.median_spearman:.3f} -> {report.after.median_spearman:.3f}, geomean top-1 "
               f"{report.before.geomean_top1:.3f} -> {report.after.geomean_top1:.3f}); stored constants, if any, "
               "are kept (--force writes them anyway)")
    else:
        summary = {"source": samples.source, "samples": report.n_samples, "shapes": report.n_shapes,
                   "n_train": report.n_train, "n_heldout": report.n_heldout,
                   "heldout_before": report.to_dict()["heldout_before"],
                   "heldout_after": report.to_dict()["heldout_after"], "versions": samples.versions}
        saved = stored.save(gpu, report.constants, fitted=report.names, calibration=summary)
    return DeviceCalibration(gpu=gpu, profile=profile, samples=samples, report=report,
                             saved=str(saved) if saved is not None else None, not_saved=why,
                             elapsed_s=time.perf_counter() - t0)
