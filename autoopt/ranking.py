"""Rank the kernel configs of every applicable template for one op on one GPU.

Each template enumerates its space; every config is checked (generic rules
here, then the template's ``validate``) and the valid ones are predicted by
the cost model and sorted fastest first. The full sorted list is cached per
(GPU content, op, template set, cost constants), so re-ranking an op costs a
dict lookup (``benchmarks/rank_speed.py`` measures both). A plugin template
that raises, emits something that is not a config, a config its GPU cannot
run, or a garbage prediction is reported through the plugin manager and
skipped (``strict=True``: :class:`~autoopt.errors.PluginError`).
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from . import constraints as C
from .choices import PathChoice, choose_path
from .config import Candidate, KernelConfig
from .cost import constants
from .errors import AutooptError, ConfigError, OpError, ProfileError
from .ops import OpSpec
from .plugins import BUILTIN, PluginManager, get_plugin_manager
from .profile import GPUProfile, HardwareProfile
from .template import Prediction, Template

__all__ = ["FORCE", "Ranking", "clear_cache", "predict_config", "rank", "validate_config"]

#: values of ``force``: the kernel variant suffix to keep (norm/softmax single-pass or looped).
FORCE = ("single", "looped")
_CACHE: dict[tuple[Any, ...], _Entry] = {}
_CACHE_MAX = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranking:
    """Valid configs for one op on one GPU, best first (predicted, never timed)."""

    op: OpSpec
    gpu: str
    candidates: tuple[Candidate, ...]
    considered: int
    rejected: int
    path: PathChoice
    elapsed_us: float
    templates: tuple[str, ...] = ()
    #: the most frequent rejection reasons with their counts.
    rejections: tuple[tuple[str, int], ...] = ()

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op.to_dict(), "gpu": self.gpu, "path": self.path.to_dict(),
                "templates": list(self.templates), "considered": self.considered, "rejected": self.rejected,
                "rejections": [{"reason": r, "count": n} for r, n in self.rejections],
                "elapsed_us": round(self.elapsed_us, 1),
                "candidates": [c.to_dict() for c in self.candidates]}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Entry:
    candidates: tuple[Candidate, ...]
    considered: int
    rejected: int
    path: PathChoice
    templates: tuple[str, ...]
    #: kernel name -> Counter of rejection rules (numbers masked); examples: rule -> first message.
    reasons: dict[str, Counter] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)


def clear_cache() -> None:
    _CACHE.clear()


# -- inputs -------------------------------------------------------------------------

def _gpu_of(gpu: Any) -> GPUProfile:
    if isinstance(gpu, HardwareProfile):
        if gpu.gpu is None:
            raise ProfileError(f"profile {gpu.name!r} has no GPU; rank needs a GPU profile")
        return gpu.gpu
    if not isinstance(gpu, GPUProfile):
        raise ProfileError(f"expected a GPUProfile or HardwareProfile, got {type(gpu).__name__}")
    return gpu


def _op_of(op: Any) -> OpSpec:
    if isinstance(op, OpSpec):
        return op
    if isinstance(op, Mapping):
        return OpSpec.from_dict(op)
    raise OpError(f"expected an OpSpec or a mapping with kind/shape/dtype, got {type(op).__name__}")


_GPU_KEY_FIELDS = ("name", "vendor", "arch", "cc_major", "cc_minor", "sm_count", "max_threads_per_sm",
                   "max_threads_per_block", "warp_size", "regs_per_sm", "regs_per_block", "max_regs_per_thread",
                   "smem_per_sm_bytes", "smem_per_block_bytes", "smem_per_block_optin_bytes", "l2_bytes",
                   "sm_clock_max_mhz", "mem_bandwidth_gbs", "measured_bandwidth_gbs")


def _gpu_key(gpu: GPUProfile) -> tuple[Any, ...]:
    """Everything about a GPU that templates and the cost model read (the cache's GPU fingerprint)."""
    return (tuple(getattr(gpu, f) for f in _GPU_KEY_FIELDS), tuple(sorted(gpu.peak_tflops.items())),
            tuple(sorted(gpu.measured_tflops.items())))


# -- checks shared by every template -----------------------------------------------

_PATH_NEEDS = {"wgmma": ("wgmma", "sm_90a"), "tma_wgmma": ("wgmma", "sm_90a"), "tma": ("tma", "sm_90+"),
               "fp4_cluster": ("tcgen05", "sm_100a/sm_103a (tcgen05)"), "mfma": ("mfma", "AMD CDNA")}


def generic_problems(gpu: GPUProfile, config: Any, template: Template) -> list[str]:
    """Rules any template's config must meet: a KernelConfig of this template, a path the GPU has,
    threads that fit a block."""
    if not isinstance(config, KernelConfig):
        return [f"emitted {type(config).__name__}, not a KernelConfig"]
    if config.template and config.template != template.name:
        return [f"config names template {config.template!r}, emitted by {template.name!r}"]
    need = _PATH_NEEDS.get(config.path)
    if need and not getattr(gpu.features, need[0]):
        return [f"path {config.path!r} needs {need[1]}; {gpu.arch or gpu.name} lacks {need[0]}"]
    return C.check_threads(C.limits(gpu), config.num_warps)


def _rule(reason: str) -> str:
    """A rejection reason with its numbers masked, so one rule counts once (``smem # B > opt-in # B``)."""
    return re.sub(r"\d+", "#", reason)


# -- ranking --------------------------------------------------------------------------

def _call(pm: PluginManager, t: Template, what: str, strict: bool, fn: Any, *args: Any) -> tuple[bool, Any]:
    """Call a template method; a plugin's exception is reported (a built-in's propagates: our bug)."""
    owner = pm.owner_of(t)
    if owner == BUILTIN:
        return True, fn(*args)
    try:
        return True, fn(*args)
    except Exception as exc:
        pm.report(owner, f"Template.{what} ({t.name})", f"raised {type(exc).__name__}: {exc}", strict=strict)
        return False, None


def _build(pm: PluginManager, gpu: GPUProfile, op: OpSpec, templates: Sequence[Template], strict: bool) -> _Entry:
    cands: list[tuple[float, int, tuple[Any, ...], Candidate]] = []
    considered = rejected = 0
    reasons: dict[str, Counter] = {}
    examples: dict[str, str] = {}
    used: list[str] = []
    for t in templates:
        ok, applies = _call(pm, t, "applies", strict, t.applies, gpu, op)
        if not ok or not applies:
            continue
        used.append(t.name)
        ok, space = _call(pm, t, "space", strict, lambda: list(t.space(gpu, op)))
        if not ok:
            continue
        for cfg in space:
            considered += 1
            problems = generic_problems(gpu, cfg, t)
            if problems:  # a template emitting an impossible config is a template bug: report it
                rejected += 1
                pm.report(pm.owner_of(t), f"Template.space ({t.name})", f"invalid config: {problems[0]}",
                          strict=strict)
                continue
            if not cfg.template:
                cfg = replace(cfg, template=t.name)
            ok, problems = _call(pm, t, "validate", strict, t.validate, gpu, op, cfg)
            if not ok:
                rejected += 1
                continue
            if problems:
                rejected += 1
                rule = _rule(problems[0])
                reasons.setdefault(cfg.kernel, Counter())[rule] += 1
                examples.setdefault(rule, problems[0])
                continue
            ok, pred = _call(pm, t, "predict", strict, t.predict, gpu, op, cfg)
            if not ok:
                continue
            if not isinstance(pred, Prediction) or not (isinstance(pred.us, (int, float))
                                                        and math.isfinite(pred.us) and pred.us > 0):
                pm.report(pm.owner_of(t), f"Template.predict ({t.name})",
                          f"returned {pred!r}, expected a Prediction with finite us > 0", strict=strict)
                continue
            cand = Candidate(config=cfg, predicted_us=float(pred.us), bound=pred.bound,
                             roofline_pct=pred.roofline_pct, reason=pred.reason, breakdown=dict(pred.breakdown))
            cands.append((cand.predicted_us, -t.priority, cfg.key(), cand))
    cands.sort(key=lambda x: x[:3])
    return _Entry(candidates=tuple(c for *_, c in cands), considered=considered, rejected=rejected,
                  path=choose_path(gpu, op, strict=strict), templates=tuple(used), reasons=reasons,
                  examples=examples)


def rank(gpu: GPUProfile | HardwareProfile, op: OpSpec | Mapping[str, Any], *, top: int = 5,
         templates: Sequence[Template] | None = None, strict: bool = False, force: str | None = None) -> Ranking:
    """The ``top`` fastest valid configs for ``op`` on ``gpu`` by the cost model.

    ``force``: ``"single"`` or ``"looped"`` keeps only that norm/softmax variant.
    Raises :class:`OpError` for a bad op, :class:`ConfigError` when no config is
    valid (with the most common reasons), :class:`PluginError` under ``strict``.
    """
    t0 = time.perf_counter()
    g = _gpu_of(gpu)
    o = _op_of(op)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise AutooptError(f"top must be a positive integer, got {top!r}")
    if force is not None and force not in FORCE:
        raise AutooptError(f"force must be one of {', '.join(FORCE)} (or None), got {force!r}")
    pm = get_plugin_manager(strict=strict)
    tpls = list(templates) if templates is not None else pm.templates(strict=strict)
    if templates is not None:
        bad = [t for t in tpls if not isinstance(t, Template)]
        if bad:
            raise AutooptError(f"templates must be Template instances, got {type(bad[0]).__name__}")
    key = (_gpu_key(g), o.kind, o.shape, o.dtype, o.layout, o.out_dtype, tuple(id(t) for t in tpls), constants())
    entry = None if strict else _CACHE.get(key)
    if entry is None:
        entry = _build(pm, g, o, tpls, strict)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = entry
    cands = entry.candidates
    reasons = Counter()
    for kernel, counter in entry.reasons.items():
        if force is None or kernel.endswith("_" + force):
            reasons.update(counter)
    if force is not None:
        if o.kind not in ("rmsnorm", "layernorm", "softmax"):
            raise AutooptError(f"force={force!r} applies to rmsnorm/layernorm/softmax, not {o.kind}")
        cands = tuple(c for c in cands if c.config.kernel.endswith("_" + force))
    if not cands:
        if not entry.templates:
            raise ConfigError(f"no template applies to {o.label()} on {g.name} ({g.arch or 'unknown arch'})")
        top3 = [entry.examples[r] for r, _ in reasons.most_common(3)]
        why = "; ".join(f"{ex} (x{n})" for ex, (_, n) in zip(top3, reasons.most_common(3))) or "no config emitted"
        what = f" with force={force!r}" if force else ""
        raise ConfigError(f"no valid config for {o.label()} on {g.name}{what}: {why}", reasons=tuple(top3))
    return Ranking(op=o, gpu=g.name, candidates=cands[:top], considered=entry.considered, rejected=entry.rejected,
                   path=entry.path, elapsed_us=(time.perf_counter() - t0) * 1e6, templates=entry.templates,
                   rejections=tuple((entry.examples[r], n) for r, n in reasons.most_common(5)))


# -- single configs (backend runner, calibration) -----------------------------------

def _template_for(config: KernelConfig) -> Template | None:
    tpls = get_plugin_manager().templates()
    for t in tpls:
        if t.name == config.template:
            return t
    if not config.template:  # fall back to the kernel name's template
        for t in tpls:
            if getattr(t, "kernel", None) == config.kernel:
                return t
    return None


def validate_config(gpu: GPUProfile | HardwareProfile, op: OpSpec | Mapping[str, Any],
                    config: KernelConfig) -> list[str]:
    """Hard-constraint violations of one config (empty: valid), by its template's rules."""
    g, o = _gpu_of(gpu), _op_of(op)
    t = _template_for(config)
    if t is None:
        return [f"unknown template {config.template!r} for kernel {config.kernel!r} (see `autoopt plugins`)"]
    if not t.applies(g, o):
        return [f"template {t.name!r} does not apply to {o.label()} on {g.name}"]
    return generic_problems(g, config, t) or list(t.validate(g, o, config))


def predict_config(gpu: GPUProfile | HardwareProfile, op: OpSpec | Mapping[str, Any],
                   config: KernelConfig) -> Prediction:
    """Cost-model prediction of one config; :class:`ConfigError` if it is not valid."""
    g, o = _gpu_of(gpu), _op_of(op)
    problems = validate_config(g, o, config)
    if problems:
        raise ConfigError(f"config {config.describe()} is invalid for {o.label()}: {problems[0]}",
                          reasons=tuple(problems))
    t = _template_for(config)
    assert t is not None
    return t.predict(g, o, config)
