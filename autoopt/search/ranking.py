"""Rank the kernel configs of every applicable template for one op on one GPU.

By default templates that describe their space with lower bounds
(``bounded_space``, see :mod:`autoopt.pruning`; every built-in does) are searched
by branch and bound: nodes are expanded best bound first and configs predicted
until the next bound exceeds the k-th best prediction, which gives exactly the
exhaustive top-k (same order, same tie-breaks) in ~1 ms instead of ~100 ms for a
2000-config GEMM space. Other templates, and ``exhaustive=True``, enumerate the
space; every config is checked (generic rules here, then the template's
``validate``) and the valid ones are predicted and sorted fastest first. Results
are cached per (GPU content, op, template set, cost constants), so re-ranking an
op costs a dict lookup (``benchmarks/rank_speed.py`` measures both). A plugin template
that raises, emits something that is not a config, a config its GPU cannot
run, or a garbage prediction is reported through the plugin manager and
skipped (``strict=True``: :class:`~autoopt.errors.PluginError`).
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoopt.errors import AutooptError, ConfigError, OpError, ProfileError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.choices import PathChoice
from autoopt.kernels.config import Candidate, KernelConfig
from autoopt.kernels.cost import CostConstants, constants, explicit, using
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.pruning import RELATIVE_SLACK, BoundedSpace, clear_tables, gpu_key, rule_of
from autoopt.kernels.template import Prediction, Template
from autoopt.plugins.choices import choose_path
from autoopt.plugins.manager import BUILTIN, PluginManager, get_plugin_manager, on_reset

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
    #: None: every valid config (exhaustive); else the exact top ``k`` (branch and bound).
    k: int | None = None


@on_reset
def clear_cache() -> None:
    """Forget cached rankings and the per-GPU tables of the templates (also on a plugin-manager reset)."""
    _CACHE.clear()
    clear_tables()


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


#: everything about a GPU that templates and the cost model read (the cache's GPU fingerprint).
_gpu_key = gpu_key


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


_rule = rule_of


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


def _applies(pm: PluginManager, t: Template, gpu: GPUProfile, op: OpSpec, strict: bool) -> tuple[bool, Any]:
    """``t.applies`` (a plugin's exception reported), and never for an op with a quantized weight
    unless the template reads packed weights (``Template.quantized_weights``): a template written
    before weights could be quantized would otherwise run its kernel on the wrong tensors."""
    if op.weight is not None and not t.quantized_weights:
        return True, False
    return _call(pm, t, "applies", strict, t.applies, gpu, op)


@dataclass(slots=True)
class _Acc:
    """What a build collects across templates: counts, rejection rules and examples, templates used."""

    considered: int = 0
    rejected: int = 0
    reasons: dict[str, Counter] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    used: list[str] = field(default_factory=list)

    def add_rejections(self, reasons: Mapping[str, Counter], examples: Mapping[str, str]) -> None:
        for kernel, counter in reasons.items():
            self.reasons.setdefault(kernel, Counter()).update(counter)
        for rule, msg in examples.items():
            self.examples.setdefault(rule, msg)


def _candidate(pm: PluginManager, t: Template, gpu: GPUProfile, op: OpSpec, cfg: KernelConfig,
               strict: bool, builtin: bool = False) -> tuple[float, int, tuple[Any, ...], Candidate] | None:
    """Predict one valid config; a plugin's garbage prediction is reported and dropped."""
    if builtin:  # a built-in's exception is our bug: let it propagate
        pred = t.predict(gpu, op, cfg)
    else:
        ok, pred = _call(pm, t, "predict", strict, t.predict, gpu, op, cfg)
        if not ok:
            return None
    if not isinstance(pred, Prediction) or not (isinstance(pred.us, (int, float))
                                                and math.isfinite(pred.us) and pred.us > 0):
        pm.report(pm.owner_of(t), f"Template.predict ({t.name})",
                  f"returned {pred!r}, expected a Prediction with finite us > 0", strict=strict)
        return None
    cand = Candidate(config=cfg, predicted_us=float(pred.us), bound=pred.bound,
                     roofline_pct=pred.roofline_pct, reason=pred.reason, breakdown=dict(pred.breakdown))
    return (cand.predicted_us, -t.priority, cfg.key(), cand)


def _exhaustive(pm: PluginManager, gpu: GPUProfile, op: OpSpec, t: Template, strict: bool,
                acc: _Acc) -> list[tuple[float, int, tuple[Any, ...], Candidate]]:
    """Validate and predict every config ``t`` emits for ``op`` (its applies() already passed)."""
    cands: list[tuple[float, int, tuple[Any, ...], Candidate]] = []
    ok, space = _call(pm, t, "space", strict, lambda: list(t.space(gpu, op)))
    if not ok:
        return cands
    for cfg in space:
        acc.considered += 1
        problems = generic_problems(gpu, cfg, t)
        if problems:  # a template emitting an impossible config is a template bug: report it
            acc.rejected += 1
            pm.report(pm.owner_of(t), f"Template.space ({t.name})", f"invalid config: {problems[0]}",
                      strict=strict)
            continue
        if not cfg.template:
            cfg = replace(cfg, template=t.name)
        ok, problems = _call(pm, t, "validate", strict, t.validate, gpu, op, cfg)
        if not ok:
            acc.rejected += 1
            continue
        if problems:
            acc.rejected += 1
            rule = _rule(problems[0])
            acc.reasons.setdefault(cfg.kernel, Counter())[rule] += 1
            acc.examples.setdefault(rule, problems[0])
            continue
        c = _candidate(pm, t, gpu, op, cfg, strict)
        if c is not None:
            cands.append(c)
    return cands


def _build(pm: PluginManager, gpu: GPUProfile, op: OpSpec, templates: Sequence[Template],
           strict: bool) -> _Entry:
    """Every valid config of every applicable template, predicted and sorted (the exhaustive ranking)."""
    acc = _Acc()
    cands: list[tuple[float, int, tuple[Any, ...], Candidate]] = []
    for t in templates:
        ok, applies = _applies(pm, t, gpu, op, strict)
        if not ok or not applies:
            continue
        acc.used.append(t.name)
        cands += _exhaustive(pm, gpu, op, t, strict, acc)
    cands.sort(key=_ORDER)
    return _Entry(candidates=tuple(c for *_, c in cands), considered=acc.considered, rejected=acc.rejected,
                  path=choose_path(gpu, op, strict=strict), templates=tuple(acc.used), reasons=acc.reasons,
                  examples=acc.examples, k=None)


def _ORDER(c: tuple[float, int, tuple[Any, ...], Candidate]) -> tuple[float, int, tuple[Any, ...]]:
    """Ranking order: predicted time, then higher template priority, then the config's key."""
    return c[:3]


def _build_pruned(pm: PluginManager, gpu: GPUProfile, op: OpSpec, templates: Sequence[Template], strict: bool,
                  k: int, force: str | None) -> _Entry:
    """The exact top ``k`` by branch and bound (see :mod:`autoopt.pruning`).

    Templates with ``bounded_space`` contribute bounded nodes to one best-first
    heap; the others are ranked exhaustively and their candidates seed the top-k.
    A node is expanded or predicted only while its lower bound is within
    :data:`RELATIVE_SLACK` of the k-th best prediction, so every config left out
    is predicted slower than k configs that are in, and ties are all evaluated.
    """
    acc = _Acc()
    best: list[tuple[float, int, tuple[Any, ...], Candidate]] = []
    heap: list[tuple[float, int, int, Any]] = []
    suffix = "_" + force if force else None

    def offer(c: tuple[float, int, tuple[Any, ...], Candidate] | None) -> float:
        if c is not None and (suffix is None or c[3].config.kernel.endswith(suffix)):
            bisect.insort(best, c, key=_ORDER)
            if len(best) > k:
                best.pop()
        return best[-1][0] * (1.0 + RELATIVE_SLACK) if len(best) >= k else math.inf

    limit = math.inf
    for ti, t in enumerate(templates):
        ok, applies = _applies(pm, t, gpu, op, strict)
        if not ok or not applies:
            continue
        acc.used.append(t.name)
        space = None
        method = getattr(t, "bounded_space", None)
        if method is not None:
            ok, space = _call(pm, t, "bounded_space", strict, method, gpu, op)
            if ok and space is not None and not isinstance(space, BoundedSpace):
                pm.report(pm.owner_of(t), f"Template.bounded_space ({t.name})",
                          f"returned {type(space).__name__}, expected a BoundedSpace or None", strict=strict)
                space = None
        if space is None:  # no bounds (or a failing plugin): rank this template exhaustively
            for c in _exhaustive(pm, gpu, op, t, strict, acc):
                limit = offer(c)
            continue
        acc.considered += space.considered
        acc.rejected += space.rejected
        acc.add_rejections(space.reasons, space.examples)
        heap.extend((b, len(heap), ti, node) for b, node in space.roots)
    heapq.heapify(heap)
    seq = len(heap)
    builtins = [pm.owner_of(t) == BUILTIN for t in templates]
    while heap:
        b, _, ti, node = heapq.heappop(heap)
        if b > limit:
            break
        t = templates[ti]
        builtin = builtins[ti]
        if isinstance(node, KernelConfig):
            if suffix is not None and not node.kernel.endswith(suffix):
                continue
            if not builtin:  # a plugin's leaves are held to the same rules as its space()
                problems = generic_problems(gpu, node, t) or list(t.validate(gpu, op, node))
                if problems:
                    pm.report(pm.owner_of(t), f"Template.bounded_space ({t.name})",
                              f"invalid config: {problems[0]}", strict=strict)
                    continue
            limit = offer(_candidate(pm, t, gpu, op, node, strict, builtin))
            continue
        ok, children = (True, node()) if builtin else _call(pm, t, "bounded_space", strict, node)
        if not ok:
            continue
        for cb, child in children:
            if cb <= limit:
                heapq.heappush(heap, (cb, seq, ti, child))
                seq += 1
    return _Entry(candidates=tuple(c for *_, c in best), considered=acc.considered, rejected=acc.rejected,
                  path=choose_path(gpu, op, strict=strict), templates=tuple(acc.used), reasons=acc.reasons,
                  examples=acc.examples, k=k)


def rank(gpu: GPUProfile | HardwareProfile, op: OpSpec | Mapping[str, Any], *, top: int = 5,
         templates: Sequence[Template] | None = None, strict: bool = False, force: str | None = None,
         exhaustive: bool = False, measured: bool = True, calibrated: bool = True) -> Ranking:
    """The ``top`` fastest valid configs for ``op`` on ``gpu`` by the cost model.

    With ``measured`` (the default) a winner measured before on this device and software stack
    (the results store: in-memory, user store, shipped results) comes first, labelled
    ``measured`` with its source; the rest stay in predicted order.

    By default templates that describe their space with lower bounds (see
    :mod:`autoopt.pruning`) are searched by branch and bound: the same top ``top``
    in the same order as predicting every config, in a fraction of the time.
    ``exhaustive=True`` validates and predicts every config (calibration, tests).
    ``force``: ``"single"`` or ``"looped"`` keeps only that norm/softmax variant.
    With ``calibrated`` (the default), unless constants were chosen explicitly
    (:func:`~autoopt.kernels.cost.using`), the constants ``autoopt calibrate`` stored
    for this device are used (:mod:`autoopt.results.constants`); ``calibrated=False``
    ranks with the defaults.
    Raises :class:`OpError` for a bad op, :class:`ConfigError` when no config is
    valid (with the most common reasons), :class:`PluginError` under ``strict``.
    """
    device = _calibrated(gpu) if calibrated else None
    if device is not None:
        with using(device):
            return rank(gpu, op, top=top, templates=templates, strict=strict, force=force, exhaustive=exhaustive,
                        measured=measured, calibrated=False)
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
    key = (gpu_key(g), o.kind, o.shape, o.dtype, o.layout, o.out_dtype, o.weight, o.moe_gemm,
           tuple(id(t) for t in tpls), constants())
    entry = None if strict else _CACHE.get(key)  # an exhaustive entry serves every top and force
    if entry is None and not exhaustive:
        entry = None if strict else _CACHE.get((key, force))
        if entry is not None and entry.k is not None and entry.k < top and len(entry.candidates) >= entry.k:
            entry = None  # built for fewer candidates than asked for now
        if entry is None:
            entry = _build_pruned(pm, g, o, tpls, strict, top, force)
            _store((key, force), entry)
    if entry is None:
        entry = _build(pm, g, o, tpls, strict)
        _store(key, entry)
    cands = entry.candidates
    reasons: Counter[str] = Counter()
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
        why = "; ".join(f"{ex} (x{n})" for ex, (_, n) in zip(top3, reasons.most_common(3), strict=True))
        why = why or "no config emitted"
        what = f" with force={force!r}" if force else ""
        raise ConfigError(f"no valid config for {o.label()} on {g.name}{what}: {why}", reasons=tuple(top3))
    if measured:
        cands = _with_measured(g, o, cands, force)
    return Ranking(op=o, gpu=g.name, candidates=cands[:top], considered=entry.considered, rejected=entry.rejected,
                   path=entry.path, elapsed_us=(time.perf_counter() - t0) * 1e6, templates=entry.templates,
                   rejections=tuple((entry.examples[r], n) for r, n in reasons.most_common(5)))


_device_constants: Callable[[GPUProfile], CostConstants | None] | None = None


def _calibrated(gpu: Any) -> CostConstants | None:
    """The calibrated constants stored for ``gpu``'s device when no constants were chosen explicitly."""
    global _device_constants
    if explicit():
        return None
    g = gpu.gpu if isinstance(gpu, HardwareProfile) else gpu
    if not isinstance(g, GPUProfile):
        return None  # rank() reports the bad argument
    if _device_constants is None:
        from autoopt.results.constants import calibrated_constants

        _device_constants = calibrated_constants
    return _device_constants(g)


def _with_measured(gpu: GPUProfile, op: OpSpec, cands: tuple[Candidate, ...], force: str | None
                   ) -> tuple[Candidate, ...]:
    """``cands`` with the results store's measured winner for ``op`` first (unchanged when there is none)."""
    from autoopt.results.lookup import lookup

    hit = lookup(gpu, op)
    if hit is None:
        return cands
    config = hit.result.config
    if force is not None and not config.kernel.endswith("_" + force):
        return cands
    same = next((c for c in cands if c.config.key() == config.key()), None)
    if same is None:
        try:
            pred = predict_config(gpu, op, config)
        except AutooptError:  # no longer valid under today's templates: ignore the old winner
            return cands
        same = Candidate(config=config, predicted_us=pred.us, bound=pred.bound, roofline_pct=pred.roofline_pct,
                         reason=pred.reason, breakdown=pred.breakdown)
    winner = replace(same, measured_us=hit.result.us, source=hit.label)
    return (winner, *(c for c in cands if c.config.key() != config.key()))


def _store(key: Any, entry: _Entry) -> None:
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = entry


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
    if not (t.applies(g, o) and (o.weight is None or t.quantized_weights)):
        return [f"template {t.name!r} does not apply to {o.label()} on {g.name}"]
    return generic_problems(g, config, t) or list(t.validate(g, o, config))


def predict_config(gpu: GPUProfile | HardwareProfile, op: OpSpec | Mapping[str, Any],
                   config: KernelConfig, *, calibrated: bool = True) -> Prediction:
    """Cost-model prediction of one config; :class:`ConfigError` if it is not valid.
    ``calibrated``: as for :func:`rank`."""
    device = _calibrated(gpu) if calibrated else None
    if device is not None:
        with using(device):
            return predict_config(gpu, op, config, calibrated=False)
    g, o = _gpu_of(gpu), _op_of(op)
    problems = validate_config(g, o, config)
    if problems:
        raise ConfigError(f"config {config.describe()} is invalid for {o.label()}: {problems[0]}",
                          reasons=tuple(problems))
    t = _template_for(config)
    assert t is not None
    return t.predict(g, o, config)
