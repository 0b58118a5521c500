"""Fitting the cost model's constants to measured timings, and scoring a set of constants.

The search stage owns this (not the cost model) because a fit predicts each sample the way the
ranking does, through each config's template, exactly as :func:`autoopt.search.ranking.predict_config`.

- :func:`fit_constants`: coordinate search on mean squared log-error (the one-call fit);
- :func:`score`: per shape, Spearman rho between predicted and measured time and the top-1 ratio
  (best measured time over the measured time of the config the model ranks first);
- :func:`holdout_split`: a deterministic train / held-out split per shape;
- :func:`calibrate`: split, fit on the train half near each shape's best, score before and after on
  the held-out half: a :class:`CalibrationReport`. ``autoopt calibrate`` and
  ``benchmarks/calibrate.py`` are thin layers over it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import DEFAULT_CONSTANTS, FRACTIONS, CostConstants, constants, using
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.template import Prediction
from autoopt.search.ranking import _template_for, validate_config

log = get_logger(__name__)

__all__ = ["DEFAULT_NAMES", "GRID_SECTIONS", "TOLERANCE", "CalibrationReport", "Sample", "Score", "ShapeScore",
           "calibrate", "fit_constants", "grid_samples", "holdout_split", "score", "spearman", "train_subset"]

#: (gpu, op, config, measured_us): one checked timing.
Sample = tuple[GPUProfile, OpSpec, KernelConfig, float]

#: what a calibration fits by default: the constants the committed H200 calibration fitted
#: (benchmarks/calibrate.py). ``l2_bw_ratio`` is left out on purpose: free, it drifts to an
#: unphysical 17x DRAM; the stream constants need stream timings.
DEFAULT_NAMES: tuple[str, ...] = (
    "tc_efficiency", "dram_efficiency", "dram_latency_us", "launch_us", "iter_overhead_us", "overlap_exponent",
    "single_warpgroup_efficiency", "pointer_wgmma_efficiency", "narrow_wgmma_efficiency",
)
_NAMES = frozenset(f.name for f in fields(CostConstants))


# -- checks and predictors ---------------------------------------------------------------------

def _check_samples(samples: Sequence[Sample]) -> None:
    for i, s in enumerate(samples):
        if len(s) != 4 or not (isinstance(s[3], (int, float)) and not isinstance(s[3], bool)
                               and math.isfinite(s[3]) and s[3] > 0):
            raise AutooptError(f"sample {i}: expected (gpu, op, config, measured_us > 0), got {s!r}")


def _predictors(samples: Sequence[Sample]) -> list[Callable[[], Prediction]]:
    """One bound predictor per sample: validated once (the hard constraints do not depend on the
    constants), then the template's ``predict``, which reads whatever constants are in use."""
    out: list[Callable[[], Prediction]] = []
    for i, (gpu, op, config, _) in enumerate(samples):
        problems = validate_config(gpu, op, config)
        if problems:
            raise AutooptError(f"sample {i}: config {config.describe()} is invalid for {op.label()} on "
                               f"{gpu.name}: {problems[0]}")
        t = _template_for(config)
        assert t is not None  # validate_config found it
        out.append(partial(t.predict, gpu, op, config))
    return out


def _loss(preds: Sequence[Callable[[], Prediction]], measured: Sequence[float], consts: CostConstants) -> float:
    total = 0.0
    with using(consts):
        for predict, us in zip(preds, measured, strict=True):
            total += (math.log(predict().us) - math.log(us)) ** 2
    return total / len(preds)


def _check_names(names: Iterable[str] | None, what: str) -> list[str]:
    keys = list(names) if names is not None else [f.name for f in fields(CostConstants)]
    unknown = sorted(set(keys) - _NAMES)
    if unknown:
        raise AutooptError(f"{what}: unknown constants {unknown} (known: {', '.join(sorted(_NAMES))})")
    return keys


# -- the fit ---------------------------------------------------------------------------------

def fit_constants(samples: Sequence[Sample], *, start: CostConstants | None = None,
                  names: Sequence[str] | None = None, rounds: int = 8,
                  max_seconds: float | None = None) -> CostConstants:
    """Fit constants to measured timings: coordinate search on mean squared log-error.

    ``samples``: (gpu, op, config, measured_us). Each round tries multiplying
    every named constant by 1.5, 1.2, 1.05 and 1.01 (and their inverses),
    keeping any improvement, until a round improves nothing; fractions stay in
    (0, 1]. ``max_seconds``: stop early (between trials) once spent. Returns the
    best constants found.
    """
    if not samples:
        raise AutooptError("fit_constants needs at least one (gpu, op, config, measured_us) sample")
    _check_samples(samples)
    best = start or constants()
    keys = _check_names(names, "fit_constants")
    preds = _predictors(samples)
    measured = [float(s[3]) for s in samples]
    deadline = None if max_seconds is None else time.perf_counter() + max_seconds
    best_loss = _loss(preds, measured, best)
    for _ in range(rounds):
        improved = False
        for key in keys:
            for step in (1.5, 1.2, 1.05, 1.01):  # coarse to fine, both directions
                for factor in (step, 1 / step):
                    if deadline is not None and time.perf_counter() > deadline:
                        log.info("fit_constants: stopped at the %.0f s limit", max_seconds)
                        return best
                    value = getattr(best, key) * factor
                    if key in FRACTIONS:
                        value = min(value, 1.0)
                    trial = replace(best, **{key: value})
                    loss = _loss(preds, measured, trial)
                    if loss < best_loss - 1e-12:
                        best, best_loss, improved = trial, loss, True
        if not improved:
            break
    log.info("fit_constants: mean squared log-error %.4f over %d samples", best_loss, len(samples))
    return best


# -- scoring --------------------------------------------------------------------------------

def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (ties get their average rank); 0 when
    either has no spread."""
    if len(xs) != len(ys):
        raise AutooptError(f"spearman needs two sequences of one length, got {len(xs)} and {len(ys)}")
    if not xs:
        return 0.0

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):  # average ranks over ties
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                r[order[t]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (vx * vy) if vx and vy else 0.0


_GroupKey = tuple[str, str, tuple[int, ...], str, str, str, str]


def _group_key(s: Sample) -> _GroupKey:
    gpu, op = s[0], s[1]
    return (gpu.name, op.kind, tuple(op.shape), op.dtype, op.layout, op.out_dtype or "", op.weight or "")


def _groups(samples: Iterable[Sample]) -> dict[_GroupKey, list[Sample]]:
    """Samples by (GPU, op), in first-seen order, each group in the order given."""
    out: dict[_GroupKey, list[Sample]] = {}
    for s in samples:
        out.setdefault(_group_key(s), []).append(s)
    return out


def _labels(groups: Iterable[_GroupKey]) -> dict[_GroupKey, str]:
    """A short name per group: ``MxNxK`` where that is unambiguous, else the op's kind and dtype too,
    and the GPU when the samples span several."""
    keys = list(groups)
    short = {k: "x".join(map(str, k[2])) for k in keys}
    if len(set(short.values())) == len(keys):
        return short
    several_gpus = len({k[0] for k in keys}) > 1
    return {k: (f"{k[0]}: " if several_gpus else "") + f"{k[1]} {short[k]} {k[3]}"
            + (f" {k[4]}" if k[4] != "nk" else "") + (f"->{k[5]}" if k[5] else "") for k in keys}


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeScore:
    """One shape's score: Spearman rho between predicted and measured time over its samples, and the
    top-1 ratio: the best measured time over the measured time of the config the model ranks first
    (1.0: the model's pick is the fastest; 0.8: it runs 1.25x slower than the best)."""

    shape: str
    n: int
    spearman: float
    top1_ratio: float
    best_us: float
    picked_us: float

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "spearman": self.spearman, "top1_ratio": self.top1_ratio, "best_us": self.best_us,
                "picked_us": self.picked_us}


@dataclass(frozen=True, slots=True, kw_only=True)
class Score:
    """Per-shape scores and their summary: median rho, geometric-mean and worst top-1 ratio."""

    per_shape: tuple[ShapeScore, ...]
    median_spearman: float
    geomean_top1: float
    min_top1: float

    def shape(self, name: str) -> ShapeScore:
        return next(s for s in self.per_shape if s.shape == name)

    def to_dict(self) -> dict[str, Any]:
        return {"per_shape": {s.shape: s.to_dict() for s in self.per_shape},
                "median_spearman": self.median_spearman, "geomean_top1": self.geomean_top1,
                "min_top1": self.min_top1}


def _summary(per_shape: Sequence[ShapeScore]) -> Score:
    if not per_shape:
        raise AutooptError("score needs at least one shape with 2 or more samples")
    rhos = sorted(s.spearman for s in per_shape)
    ratios = [s.top1_ratio for s in per_shape]
    return Score(per_shape=tuple(per_shape), median_spearman=rhos[len(rhos) // 2],
                 geomean_top1=round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4), min_top1=min(ratios))


def _score_groups(groups: Mapping[_GroupKey, Sequence[Sample]], labels: Mapping[_GroupKey, str],
                  consts: CostConstants) -> Score:
    per_shape = []
    with using(consts):
        for key, samples in groups.items():
            if len(samples) < 2:
                continue
            pred = [p().us for p in _predictors(samples)]
            meas = [float(s[3]) for s in samples]
            best = min(meas)
            pick = meas[min(range(len(pred)), key=pred.__getitem__)]  # first of equal predictions
            per_shape.append(ShapeScore(shape=labels[key], n=len(samples), spearman=round(spearman(pred, meas), 4),
                                        top1_ratio=round(best / pick, 4), best_us=best, picked_us=pick))
    return _summary(per_shape)


def score(samples: Sequence[Sample], consts: CostConstants | None = None) -> Score:
    """How well ``consts`` (default: those in use) rank ``samples``, shape by shape (shapes with fewer
    than 2 samples are left out). The median of an even number of shapes is the upper one; values are
    rounded to 4 decimals (the summary is taken over the rounded values)."""
    _check_samples(samples)
    groups = _groups(samples)
    return _score_groups(groups, _labels(groups), consts or constants())


# -- the split and the calibration ---------------------------------------------------------------

def _config_order(s: Sample) -> str:
    return repr(s[2].key())


def holdout_split(samples: Sequence[Sample], *, holdout: float = 0.5,
                  stratify: bool = True) -> tuple[list[Sample], list[Sample]]:
    """(train, held-out): within each shape, an evenly spaced ``holdout`` share is held out.

    Deterministic: with ``stratify`` each shape's samples are first sorted by measured time (then by
    config), so both halves span the shape's fast and slow configs and the input order does not
    matter; without it they are taken in the order given (``benchmarks/calibrate.py``'s committed
    split: every second sample). Disjoint, and together they are ``samples``.
    """
    if not 0.0 < holdout < 1.0:
        raise AutooptError(f"holdout must be a fraction in (0, 1), got {holdout!r}")
    train: list[Sample] = []
    held: list[Sample] = []
    for group in _groups(samples).values():
        ordered = sorted(group, key=lambda s: (float(s[3]), _config_order(s))) if stratify else group
        for i, s in enumerate(ordered):
            (held if math.floor((i + 1) * holdout) > math.floor(i * holdout) else train).append(s)
    return train, held


#: how much worse than before a held-out measure may come out and still count as no worse (median rho
#: and geomean top-1 move by about this between two sweeps of one GPU)
TOLERANCE = 0.005


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationReport:
    """What :func:`calibrate` did: the fitted constants and the ranking quality before and after on the
    held-out samples (never seen by the fit)."""

    constants: CostConstants
    start: CostConstants
    names: tuple[str, ...]
    #: held-out score with the starting constants / with the fitted ones
    before: Score
    after: Score
    n_samples: int
    n_shapes: int
    n_train: int
    n_heldout: int
    fit_seconds: float
    #: mean squared log-error of the predictions on the training samples / on the held-out ones
    train_loss_before: float
    train_loss_after: float
    heldout_loss_before: float = 0.0
    heldout_loss_after: float = 0.0

    @property
    def better(self) -> bool:
        """Whether the fitted constants rank the held-out configs better: median rho or geomean top-1
        higher, and neither lower by more than :data:`TOLERANCE`. Only then are they worth keeping."""
        d_rho = self.after.median_spearman - self.before.median_spearman
        d_top = self.after.geomean_top1 - self.before.geomean_top1
        return d_rho >= -TOLERANCE and d_top >= -TOLERANCE and (d_rho > 0 or d_top > 0)

    def changed(self) -> dict[str, tuple[float, float]]:
        """name -> (start, fitted) of every constant the fit moved."""
        a, b = self.start.to_dict(), self.constants.to_dict()
        return {k: (a[k], b[k]) for k in b if b[k] != a[k]}

    def rows(self) -> list[dict[str, Any]]:
        """Per shape: held-out samples, rho and top-1 before and after."""
        after = {s.shape: s for s in self.after.per_shape}
        return [{"shape": s.shape, "n": s.n, "spearman_before": s.spearman,
                 "spearman_after": after[s.shape].spearman, "top1_before": s.top1_ratio,
                 "top1_after": after[s.shape].top1_ratio} for s in self.before.per_shape]

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names), "n_samples": self.n_samples, "n_shapes": self.n_shapes,
            "n_train": self.n_train, "n_heldout": self.n_heldout, "fit_seconds": round(self.fit_seconds, 2),
            "train_loss_before": round(self.train_loss_before, 5), "train_loss_after": round(self.train_loss_after, 5),
            "heldout_loss_before": round(self.heldout_loss_before, 5),
            "heldout_loss_after": round(self.heldout_loss_after, 5),
            "heldout_before": {k: v for k, v in self.before.to_dict().items() if k != "per_shape"},
            "heldout_after": {k: v for k, v in self.after.to_dict().items() if k != "per_shape"},
            "better": self.better, "per_shape": self.rows(),
            "changed": {k: {"before": a, "after": b} for k, (a, b) in self.changed().items()},
            "constants": self.constants.to_dict(), "start": self.start.to_dict(),
        }


def train_subset(train: Sequence[Sample], everything: Sequence[Sample], *, near: float | None = 1.5,
                 max_per_shape: int | None = None, max_train: int | None = None) -> list[Sample]:
    """The samples the fit sees: of ``train``, those within ``near`` x their shape's best measured time
    (the best of ``everything`` of that shape: where the ranking's decision is made; a uniform fit
    spends its accuracy on slow configs no ranking would pick), at most ``max_per_shape`` of each
    shape (evenly spaced), then at most about ``max_train`` in all (every n-th)."""
    best: dict[_GroupKey, float] = {}
    for s in everything:
        k = _group_key(s)
        best[k] = min(best.get(k, math.inf), float(s[3]))
    chosen: list[Sample] = []
    for key, group in _groups(train).items():
        keep = [s for s in group if near is None or float(s[3]) <= near * best.get(key, float(s[3]))]
        if max_per_shape is not None and len(keep) > max_per_shape:
            keep = [keep[i * len(keep) // max_per_shape] for i in range(max_per_shape)]
        chosen += keep
    if max_train is not None and max_train > 0:
        chosen = chosen[::max(1, len(chosen) // max_train)]
    return chosen


def calibrate(samples: Sequence[Sample], *, start: CostConstants | None = None,
              names: Sequence[str] | None = DEFAULT_NAMES, holdout: float = 0.5, stratify: bool = True,
              near: float | None = None, max_per_shape: int | None = 40, max_train: int | None = 480,
              rounds: int = 8, max_seconds: float | None = None) -> CalibrationReport:
    """Refit the cost model's constants to ``samples`` and score them on held-out samples.

    Each shape's samples are split by :func:`holdout_split` (``holdout``, ``stratify``); the fit
    (:func:`fit_constants` from ``start``, default: the defaults, moving ``names``) sees the train
    samples chosen by :func:`train_subset` (``near``, ``max_per_shape``, ``max_train``: ~480 samples fit
    in ~10 s on one core); both sets of constants are scored on the held-out samples.

    ``near`` defaults to None (fit on every train sample) here, where ``benchmarks/calibrate.py`` uses
    1.5: with a few dozen configs per shape (a sweep), fitting only the near-best ones leaves ~10 per
    shape for 9 constants. Replayed on the real H100 sweep and on subsamples of the H200 grid
    (48 and 128 configs per shape, from the defaults and from perturbed constants), fitting on all of
    them lifted held-out median rho by +0.008 and geomean top-1 by +0.017 on average, against +0.001
    and +0.009 for near-best only (and cut the held-out log error of the H100 sweep by a third).
    AutooptError when no shape has a held-out pair to score or nothing is left to fit on.
    """
    _check_samples(samples)
    begin = start or DEFAULT_CONSTANTS
    keys = _check_names(names, "calibrate")
    train, held = holdout_split(samples, holdout=holdout, stratify=stratify)
    fit_on = train_subset(train, samples, near=near, max_per_shape=max_per_shape, max_train=max_train)
    groups = {k: v for k, v in _groups(held).items() if len(v) >= 2}
    if not groups:
        raise AutooptError(f"calibrate: no shape has 2 held-out samples to score ({len(samples)} samples over "
                           f"{len(_groups(samples))} shapes)")
    if not fit_on:
        raise AutooptError(f"calibrate: no train sample left to fit on ({len(samples)} samples)")
    labels = _labels(_groups(samples))
    before = _score_groups(groups, labels, begin)
    preds = _predictors(fit_on)
    measured = [float(s[3]) for s in fit_on]
    loss0 = _loss(preds, measured, begin)
    t0 = time.perf_counter()
    fitted = fit_constants(fit_on, start=begin, names=keys, rounds=rounds, max_seconds=max_seconds)
    fit_s = time.perf_counter() - t0
    after = _score_groups(groups, labels, fitted)
    scored = [s for v in groups.values() for s in v]
    held_preds, held_us = _predictors(scored), [float(s[3]) for s in scored]
    return CalibrationReport(constants=fitted, start=begin, names=tuple(keys), before=before, after=after,
                             n_samples=len(samples), n_shapes=len(_groups(samples)), n_train=len(fit_on),
                             n_heldout=len(scored), fit_seconds=fit_s,
                             train_loss_before=loss0, train_loss_after=_loss(preds, measured, fitted),
                             heldout_loss_before=_loss(held_preds, held_us, begin),
                             heldout_loss_after=_loss(held_preds, held_us, fitted))


# -- measured grids (benchmarks/gemm_grid.py) ------------------------------------------------------

#: grid section -> (kernel, template)
GRID_SECTIONS = {"gemm": ("gemm", "gemm"), "gemm_tma": ("gemm_tma", "hopper-tma-gemm")}


def grid_samples(grid: Mapping[str, Any], gpu: GPUProfile, *, shapes: Iterable[str] | None = None) -> list[Sample]:
    """The ``measured`` rows of a GEMM grid file (``benchmarks/gemm_grid.py``) as samples on ``gpu``,
    in file order (sections, then shapes, then rows); configs the templates refuse are left out, since
    they are never ranked. ``shapes``: only these ``MxNxK`` keys."""
    import importlib

    from autoopt._paths import builtin_templates

    builtin_templates()
    matmul_path = importlib.import_module("autoopt.templates.gemm").matmul_path
    only = set(shapes) if shapes is not None else None
    dtype = grid.get("meta", {}).get("dtype", "bf16")
    out: list[Sample] = []
    for section, (kernel, template) in GRID_SECTIONS.items():
        for shape, entry in grid.get(section, {}).items():
            if only is not None and shape not in only:
                continue
            m, n, k = (int(x) for x in shape.split("x"))
            op = OpSpec(kind="gemm", shape=(m, n, k), dtype=dtype)
            for row in entry["configs"]:
                if row.get("label") != "measured":
                    continue
                params = row["config"]
                path = "tma_wgmma" if kernel == "gemm_tma" else matmul_path(gpu, params["BLOCK_M"],
                                                                            params["num_warps"])
                cfg = KernelConfig(kernel=kernel, params=params, path=path, template=template)
                if validate_config(gpu, op, cfg):
                    continue  # the model's hard constraints refuse it: it is never ranked
                out.append((gpu, op, cfg, float(row["us"])))
    return out
