"""Where a trace spends GPU time, and how two traces of the same model differ.

:func:`summarize` reduces a trace (:mod:`autoopt.trace.reader`) to time and launches per op class and
per profiler step, the top kernels, and the fused kernels Inductor's names describe. :func:`compare`
lines two summaries up class by class (per step, so traces of different lengths compare), ranks
kernels by their time delta, and reports fusion differences: classes one side runs and the other
does not, launch-count imbalances, and each fused kernel of one side with the separate launches of
the same op classes on the other side it replaces.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoopt.errors import TraceError
from autoopt.trace.classify import CLASSES, _short, classify, inductor_ops
from autoopt.trace.reader import TraceEvents

__all__ = ["TraceSummary", "compare", "layer_period", "summarize"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSummary:
    """One trace, reduced: GPU time and launches per class, in total and per step (microseconds)."""

    source: str
    steps: int
    kernels: int
    total_us: float
    by_class: Mapping[str, tuple[float, int]]          # class -> (us, launches)
    top: tuple[tuple[str, str, float, int], ...]       # (short name, class, us, launches)
    fused: tuple[tuple[str, tuple[str, ...], float, int], ...] = field(default_factory=tuple)
    #: repeating layers found in one step (the period of the kernel sequence), and one layer's median time
    layers_per_step: int | None = None
    layer_us: float | None = None

    @property
    def other_share(self) -> float:
        return self.by_class.get("other", (0.0, 0))[0] / self.total_us if self.total_us else 0.0

    def per_step(self, cls: str) -> tuple[float, float]:
        us, n = self.by_class.get(cls, (0.0, 0))
        return us / self.steps, n / self.steps

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "steps": self.steps, "kernels": self.kernels,
                "total_us": round(self.total_us, 3), "per_step_us": round(self.total_us / self.steps, 3),
                "other_share": round(self.other_share, 5),
                "by_class": {c: {"us": round(us, 3), "launches": n, "share": round(us / self.total_us, 5)}
                             for c, (us, n) in self.by_class.items()},
                "top": [{"kernel": k, "class": c, "us": round(us, 3), "launches": n} for k, c, us, n in self.top],
                "fused": [{"kernel": k, "ops": list(ops), "us": round(us, 3), "launches": n}
                          for k, ops, us, n in self.fused],
                "layers_per_step": self.layers_per_step,
                "layer_us": None if self.layer_us is None else round(self.layer_us, 3),
                "label": "measured (profiler trace)"}


def _first_step(ev: TraceEvents) -> tuple[int, int]:
    """Index range of the kernels that start inside the first profiler step (all of them without steps)."""
    steps = sorted((a for a in ev.annotations if a.name.startswith("ProfilerStep#") and not a.gpu),
                   key=lambda a: a.ts)
    if not steps:
        return 0, len(ev.seq)
    lo, hi = steps[0].ts, steps[0].ts + steps[0].dur
    idx = [k for k in range(len(ev.seq)) if lo <= ev.ts[k] <= hi]
    return (idx[0], idx[-1] + 1) if idx else (0, len(ev.seq))


def layer_period(ev: TraceEvents, anchors: frozenset[int] = frozenset()) -> tuple[int, int, float] | None:
    """(layers, kernels per layer, median layer time) of the first step.

    With ``anchors`` (name indices of attention kernels: a transformer layer calls attention once),
    each anchor launch starts a layer, whenever the step has at least 4. Otherwise the period of the
    kernel sequence: a kernel launched once per layer repeats at a constant gap, and the gap that
    covers most of the step is the layer. The period alone misreads compiled models: Inductor's
    kernels of real Llama-3-8B traces repeat every 4 layers (prefill) or 2 (decode), not every one.
    None when nothing repeats at least 4 times."""
    lo, hi = _first_step(ev)
    seq = ev.seq[lo:hi]
    starts = [k for k, i in enumerate(seq) if i in anchors]
    if len(starts) >= 4:
        times = sorted(sum(ev.dur[lo + a:lo + b]) for a, b in itertools.pairwise([*starts, len(seq)]))
        gaps = sorted(b - a for a, b in itertools.pairwise(starts))
        return len(starts), gaps[len(gaps) // 2], times[len(times) // 2]
    positions: dict[int, list[int]] = defaultdict(list)
    for k, i in enumerate(seq):
        positions[i].append(k)
    candidates = set()
    for pos in positions.values():
        if len(pos) >= 4:
            gaps = [b - a for a, b in itertools.pairwise(pos)]
            gap = max(set(gaps), key=gaps.count)
            if gap >= 2 and gaps.count(gap) >= 0.9 * len(gaps):
                candidates.add(gap)
    # the smallest gap at which the whole sequence repeats (a kernel launched twice per layer repeats at
    # half the layer, but the sequence does not)
    n = len(seq)
    period = next((g for g in sorted(candidates) if n // g >= 4
                   and sum(seq[k] == seq[k + g] for k in range(n - g)) >= 0.9 * (n - g)), None)
    if period is None:
        return None
    times = sorted(sum(ev.dur[lo + s:lo + s + period]) for s in range(0, n - period + 1, period))
    return n // period, period, times[len(times) // 2]


def _steps(ev: TraceEvents) -> int:
    return max(1, sum(1 for a in ev.annotations if a.name.startswith("ProfilerStep#") and not a.gpu))


def summarize(ev: TraceEvents, *, rules: Iterable[tuple[str, str]] | None = None, top: int = 15) -> TraceSummary:
    """Time and launches by class (every kernel in exactly one class, so the classes sum to the total)."""
    rule_t = tuple(rules) if rules is not None else None
    cls_of = [classify(n, c, rule_t) for n, c in zip(ev.names, ev.categories, strict=True)]
    per_name_us = [0.0] * len(ev.names)
    per_name_n = [0] * len(ev.names)
    for i, d in zip(ev.seq, ev.dur, strict=True):
        per_name_us[i] += d
        per_name_n[i] += 1
    by_class: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_short: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    fused: dict[str, list[Any]] = {}
    for i, name in enumerate(ev.names):
        acc = by_class[cls_of[i]]
        acc[0] += per_name_us[i]
        acc[1] += per_name_n[i]
        s = by_short[(_short(name), cls_of[i])]
        s[0] += per_name_us[i]
        s[1] += per_name_n[i]
        ops = inductor_ops(name)
        if len(ops) > 1:
            fused[name] = [ops, per_name_us[i], per_name_n[i]]
    ranked = sorted(by_short.items(), key=lambda kv: -kv[1][0])[:top]
    period = layer_period(ev, frozenset(i for i, c in enumerate(cls_of) if c == "attention"))
    return TraceSummary(
        source=ev.source, steps=_steps(ev), kernels=len(ev.seq), total_us=float(sum(ev.dur)),
        by_class={c: (by_class[c][0], int(by_class[c][1])) for c in CLASSES if c in by_class},
        top=tuple((k, c, v[0], int(v[1])) for (k, c), v in ranked),
        fused=tuple(sorted(((k, v[0], v[1], int(v[2])) for k, v in fused.items()), key=lambda t: -t[2])),
        layers_per_step=period[0] if period else None, layer_us=period[2] if period else None)


def compare(a: TraceSummary, b: TraceSummary, *, top: int = 10) -> dict[str, Any]:
    """``a`` against ``b``, per step: classes side by side, kernels by delta, fusion differences."""
    if a.layers_per_step and b.layers_per_step and a.layers_per_step != b.layers_per_step:
        raise TraceError(f"the traces repeat {a.layers_per_step} and {b.layers_per_step} layers per step: "
                         "different models (compare two runs of the same model)", source=f"{a.source}, {b.source}")
    classes = [c for c in CLASSES if c in a.by_class or c in b.by_class]
    rows = []
    for c in classes:
        (ua, na), (ub, nb) = a.per_step(c), b.per_step(c)
        row = {"class": c, "a_us": round(ua, 3), "b_us": round(ub, 3),
               "ratio_b_over_a": round(ub / ua, 3) if ua else None,
               "a_launches": round(na, 2), "b_launches": round(nb, 2)}
        layers = a.layers_per_step or b.layers_per_step
        if layers:  # launch-count imbalance per layer
            row["a_launches_per_layer"] = round(na / layers, 2)
            row["b_launches_per_layer"] = round(nb / layers, 2)
        rows.append(row)
    return {"a": a.source, "b": b.source, "a_steps": a.steps, "b_steps": b.steps,
            "layers_per_step": a.layers_per_step or b.layers_per_step,
            "a_layer_us": a.layer_us, "b_layer_us": b.layer_us,
            "a_per_step_us": round(a.total_us / a.steps, 3), "b_per_step_us": round(b.total_us / b.steps, 3),
            "classes": rows, "kernels_by_delta": _kernel_deltas(a, b, top), "fusions": _fusions(a, b),
            "label": "measured (profiler traces)"}


def _kernel_deltas(a: TraceSummary, b: TraceSummary, top: int) -> list[dict[str, Any]]:
    da = {k: us / a.steps for k, _, us, _ in a.top}
    db = {k: us / b.steps for k, _, us, _ in b.top}
    cls = {k: c for k, c, _, _ in (*a.top, *b.top)}
    keys = sorted(set(da) | set(db), key=lambda k: -abs(db.get(k, 0.0) - da.get(k, 0.0)))[:top]
    return [{"kernel": k, "class": cls[k], "a_us": round(da.get(k, 0.0), 3), "b_us": round(db.get(k, 0.0), 3),
             "delta_us": round(db.get(k, 0.0) - da.get(k, 0.0), 3)} for k in keys]


def _fusions(a: TraceSummary, b: TraceSummary) -> list[dict[str, Any]]:
    """Classes on one side only; and each side's fused kernels against the other side's launches."""
    out: list[dict[str, Any]] = []
    for side, x, y in (("a", a, b), ("b", b, a)):
        for c in x.by_class:
            if c not in y.by_class and c != "other":
                us, n = x.per_step(c)
                out.append({"kind": "class only on one side", "side": side, "class": c, "us_per_step": round(us, 3),
                            "launches_per_step": round(n, 2)})
        # Inductor emits one copy of a kernel per call site (..._rsqrt_11, _12, _13): one entry per op list
        groups: dict[tuple[str, ...], list[Any]] = {}
        for name, ops, us, n in x.fused:
            g = groups.setdefault(tuple(ops), [name, 0.0, 0])
            g[1] += us
            g[2] += n
        for ops, (name, us, n) in groups.items():
            parts = sorted({classify(f"triton_poi_fused_{op}_0") for op in ops} - {"elementwise"} | {"elementwise"})
            other_n = sum(y.per_step(c)[1] for c in parts)
            mine_n = n / x.steps
            if other_n > mine_n:
                saved_us = sum(y.per_step(c)[0] for c in parts) - us / x.steps
                out.append({"kind": "fused kernel", "side": side, "kernel": name, "ops": list(ops),
                            "classes": parts, "launches_per_step": round(mine_n, 2),
                            "other_side_launches_per_step": round(other_n, 2),
                            "launches_saved_per_step": round(other_n - mine_n, 2),
                            "us_saved_per_step_upper_bound": round(saved_us, 3)})
    return out
