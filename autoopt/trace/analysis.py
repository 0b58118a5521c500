"""Where a trace spends GPU time, and how two traces of the same model differ.

:func:`summarize` reduces a trace (:mod:`autoopt.trace.reader`) to time and launches per op class and
per profiler step, the top kernels, the fused kernels Inductor's names describe, and the first step's
kernel sequence. :func:`compare` lines two summaries up class by class (per step, so traces of
different lengths compare), ranks kernels by their time delta, and reports fusion differences.

Fusions are attributed by alignment: two runs of one model launch the same GEMM, attention and
collective kernels in the same order (eager and torch.compile Llama-3-8B on the H100 and H200: 386
GEMMs and 32 attention calls per decode step on both sides), and a compiler fuses only what lies
between them. Those anchors cut each side's first step into segments; segment i of one side pairs
with segment i of the other, and a side that runs a fused kernel and fewer launches in a pair fused
the other side's kernels there: launches and time saved are the pair's difference, so each kernel's
time is credited at most once. When the anchor counts differ the report falls back to a labelled
class-level estimate (:func:`_class_level`).
"""

from __future__ import annotations

import itertools
from array import array
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoopt.errors import TraceError
from autoopt.trace.classify import CLASSES, _short, classify, inductor_ops
from autoopt.trace.reader import TraceEvents

__all__ = ["ANCHOR_CLASSES", "StepKernels", "TraceSummary", "compare", "layer_period", "summarize"]

#: the kernels both runs of one model launch alike and in the same order: the aligner's fixed points. On the
#: real Llama-3-8B traces eager and torch.compile launch the same 386 GEMMs + 32 attention calls per decode
#: step and 226 + 32 per prefill step (H100 and H200); Inductor fuses only the kernels between them
ANCHOR_CLASSES = frozenset({"gemm", "moe_gemm", "attention", "communication"})
#: the farthest apart two anchors a scheduler launches in swapped order: Inductor runs RoPE's inv_freq bmm
#: after the first layer's q projection, eager before it (1 GEMM apart in the real traces)
_SWAP_WINDOW = 8
#: how many pairs ahead a kernel run early may find the pair it belongs to: Inductor's RoPE on K runs 2
#: segments before eager's (after the K projection, not after V)
_MOVE_HOPS = 3


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StepKernels:
    """One profiler step's kernels in launch order (name index and microseconds per launch), with each
    name's class and fused-op signature: what :func:`compare` aligns. 12 bytes per launch."""

    names: tuple[str, ...]
    classes: tuple[str, ...]
    #: per name: the ops of a fused kernel (Inductor's name with its call-site number dropped, or a
    #: KNOWN_FUSED kernel), () for any other kernel
    fused_ops: tuple[tuple[str, ...], ...]
    seq: array
    dur: array

    @property
    def anchors(self) -> int:
        return sum(1 for i in self.seq if self.classes[i] in ANCHOR_CLASSES)

    def to_dict(self) -> dict[str, Any]:
        return {"kernels": len(self.seq), "anchors": self.anchors, "us": round(float(sum(self.dur)), 3)}


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
    #: the first profiler step's kernel sequence (the whole trace without step markers), for alignment
    step: StepKernels | None = None

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
                "first_step": None if self.step is None else self.step.to_dict(),
                "label": "measured (profiler trace)"}


def _first_step(ev: TraceEvents) -> tuple[int, int]:
    """Index range of the kernels that start inside the first profiler step (all of them without steps):
    from its start up to, not including, its end (where the next step's first kernel may start). The
    reader returns kernels sorted by start, so the range is two binary searches."""
    steps = sorted((a for a in ev.annotations if a.name.startswith("ProfilerStep#") and not a.gpu),
                   key=lambda a: a.ts)
    if not steps:
        return 0, len(ev.seq)
    lo, hi = bisect_left(ev.ts, steps[0].ts), bisect_left(ev.ts, steps[0].ts + steps[0].dur)
    return (lo, hi) if hi > lo else (0, len(ev.seq))


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
        ops = _fused_ops(name)
        if ops:
            fused[name] = [ops, per_name_us[i], per_name_n[i]]
    ranked = sorted(by_short.items(), key=lambda kv: -kv[1][0])[:top]
    period = layer_period(ev, frozenset(i for i, c in enumerate(cls_of) if c == "attention"))
    lo, hi = _first_step(ev)
    step = StepKernels(names=ev.names, classes=tuple(cls_of), fused_ops=tuple(_fused_ops(n) for n in ev.names),
                       seq=ev.seq[lo:hi], dur=ev.dur[lo:hi])
    return TraceSummary(
        source=ev.source, steps=_steps(ev), kernels=len(ev.seq), total_us=float(sum(ev.dur)),
        by_class={c: (by_class[c][0], int(by_class[c][1])) for c in CLASSES if c in by_class},
        top=tuple((k, c, v[0], int(v[1])) for (k, c), v in ranked),
        fused=tuple(sorted(((k, v[0], v[1], int(v[2])) for k, v in fused.items()), key=lambda t: -t[2])),
        layers_per_step=period[0] if period else None, layer_us=period[2] if period else None, step=step)


def _fused_ops(name: str) -> tuple[str, ...]:
    """A fused kernel's op signature (one op is no fusion), () for any other kernel."""
    ops = inductor_ops(name)
    return ops if len(ops) > 1 else ()


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
            "classes": rows, "kernels_by_delta": _kernel_deltas(a, b, top), **_fusions(a, b),
            "label": "measured (profiler traces)"}


def _kernel_deltas(a: TraceSummary, b: TraceSummary, top: int) -> list[dict[str, Any]]:
    da = {k: us / a.steps for k, _, us, _ in a.top}
    db = {k: us / b.steps for k, _, us, _ in b.top}
    cls = {k: c for k, c, _, _ in (*a.top, *b.top)}
    keys = sorted(set(da) | set(db), key=lambda k: -abs(db.get(k, 0.0) - da.get(k, 0.0)))[:top]
    return [{"kernel": k, "class": cls[k], "a_us": round(da.get(k, 0.0), 3), "b_us": round(db.get(k, 0.0), 3),
             "delta_us": round(db.get(k, 0.0) - da.get(k, 0.0), 3)} for k in keys]


def _fusions(a: TraceSummary, b: TraceSummary) -> dict[str, Any]:
    """``fusions``: classes one side runs and the other does not, and one entry per fused-kernel signature
    (side, ops, the kernels it replaced, launches and time saved per step); ``fusion_alignment``: how they
    were attributed, and the step's time difference split into anchors, fusions and the rest."""
    out = _one_side_classes(a, b)
    why = _unalignable(a, b)
    if why is None and a.step is not None and b.step is not None:
        entries, info = _aligned(a.step, b.step)
    else:
        entries = _class_level(a, b)
        info = {"mode": "class-level", "reason": why, "basis": "per-step averages over all profiler steps",
                "a_anchors_per_step": a.step.anchors if a.step else None,
                "b_anchors_per_step": b.step.anchors if b.step else None}
    return {"fusions": out + entries, "fusion_alignment": info}


def _one_side_classes(a: TraceSummary, b: TraceSummary) -> list[dict[str, Any]]:
    """Classes one side runs and the other does not, each with the kernels launched around it."""
    out: list[dict[str, Any]] = []
    for side, x, y in (("a", a, b), ("b", b, a)):
        for c in x.by_class:
            if c not in y.by_class and c != "other":
                us, n = x.per_step(c)
                out.append({"kind": "class only on one side", "side": side, "class": c, "us_per_step": round(us, 3),
                            "launches_per_step": round(n, 2), "around": _neighbours(x.step, c)})
    return out


def _neighbours(step: StepKernels | None, cls: str, top: int = 3) -> dict[str, list[list[Any]]]:
    """The kernels launched just before and just after each launch of class ``cls`` in the first step
    (short names with how often, most frequent first): where in the layer the class sits."""
    if step is None:
        return {}
    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    seq = step.seq
    for k, i in enumerate(seq):
        if step.classes[i] != cls:
            continue
        if k > 0 and step.classes[seq[k - 1]] != cls:
            before[_short(step.names[seq[k - 1]])] += 1
        if k + 1 < len(seq) and step.classes[seq[k + 1]] != cls:
            after[_short(step.names[seq[k + 1]])] += 1
    return {"before": [[n, c] for n, c in before.most_common(top)],
            "after": [[n, c] for n, c in after.most_common(top)]}


def _unalignable(a: TraceSummary, b: TraceSummary) -> str | None:
    """Why the two first steps cannot be cut into pairs of segments, or None when they can."""
    if a.step is None or b.step is None:
        return "a summary without its first step's kernel sequence: nothing to align"
    na, nb = a.step.anchors, b.step.anchors
    if na != nb:
        return (f"the first steps launch {na} (A) and {nb} (B) GEMM/attention/communication kernels, so the "
                "segments between them do not pair one to one (one side may have fused GEMMs, e.g. Q, K and V "
                "into one)")
    if na == 0:
        return "no GEMM, attention or communication kernel to align the steps on"
    return None


# -- alignment: anchors cut each first step into segments, paired in order ------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Cut:
    """One step cut at its anchors: their names in launch order, and the launch positions of the
    other kernels in each segment (segment i precedes anchor i; the last one follows the last anchor)."""

    anchors: tuple[str, ...]
    segments: tuple[tuple[int, ...], ...]


def _cut(step: StepKernels) -> _Cut:
    anchors: list[str] = []
    segments: list[list[int]] = [[]]
    for k, i in enumerate(step.seq):
        if step.classes[i] in ANCHOR_CLASSES:
            anchors.append(step.names[i])
            segments.append([])
        else:
            segments[-1].append(k)
    return _Cut(anchors=tuple(anchors), segments=tuple(tuple(s) for s in segments))


def _resync(a: Sequence[str], b: Sequence[str], i: int) -> int | None:
    """The end of the shortest run from ``i`` in which both sides launch the same anchors in another
    order (the same multiset of names), within :data:`_SWAP_WINDOW`; None when there is none."""
    diff: dict[str, int] = defaultdict(int)
    nonzero = 0
    for q in range(i, min(len(a), i + _SWAP_WINDOW)):
        for key, d in ((a[q], 1), (b[q], -1)):
            before = diff[key]
            diff[key] += d
            nonzero += (diff[key] != 0) - (before != 0)
        if nonzero == 0:
            return q + 1
    return None


def _hard_anchors(a: Sequence[str], b: Sequence[str]) -> list[bool]:
    """Per anchor position: whether it separates segments. An anchor inside a swapped run does not (the
    kernels around a swapped pair cannot be told apart); a different name that never resyncs is the
    same op run by another kernel (another GPU's cuBLAS pick) and still separates."""
    hard = [True] * len(a)
    i = 0
    while i < len(a):
        q = _resync(a, b, i) if a[i] != b[i] else None
        if q is None:
            i += 1
            continue
        hard[i:q] = [False] * (q - i)
        i = q
    return hard


Pair = tuple[list[int], list[int]]


def _pair_segments(ca: _Cut, cb: _Cut) -> list[Pair]:
    """Segment i of A with segment i of B, merged across anchors that are not hard."""
    hard = _hard_anchors(ca.anchors, cb.anchors)
    pairs: list[Pair] = [([], [])]
    for s, (sa, sb) in enumerate(zip(ca.segments, cb.segments, strict=True)):
        if s > 0 and hard[s - 1]:
            pairs.append(([], []))
        pairs[-1][0].extend(sa)
        pairs[-1][1].extend(sb)
    return pairs


def _has_fused(step: StepKernels, launches: Sequence[int]) -> bool:
    return any(step.fused_ops[step.seq[k]] for k in launches)


def _concat(pairs: Sequence[Pair]) -> Pair:
    return [k for p in pairs for k in p[0]], [k for p in pairs for k in p[1]]


def _target(pending: Sequence[Pair], i: int, merged: Sequence[Pair], sa: StepKernels, sb: StepKernels) -> int | None:
    """Where pair i's kernels belong when the compiler moved them across anchors: the index of a later pair
    (pairs between join too), -1 for the last pair already merged, None when they stay.

    - A side that launches fewer kernels here and none fused had them fused into a neighbour where it
      runs a fused kernel (the next first). Real traces: Inductor runs SiLU after the up-projection GEMM,
      fused with the mul there.
    - A side that launches more kernels here, fused ones among them, ran them early: they join the next
      pair (within :data:`_MOVE_HOPS`) where it fused the other side's kernels. Real decode traces:
      Inductor applies RoPE to K right after the K projection, eager after the V projection."""
    pair = pending[i]
    for j, step in ((0, sa), (1, sb)):
        mine, theirs, side = len(pair[j]), len(pair[1 - j]), "ab"[j]
        fused = _has_fused(step, pair[j])
        if mine < theirs and not fused:
            if i + 1 < len(pending) and _has_fused(step, pending[i + 1][j]):
                return i + 1
            if merged and _has_fused(step, merged[-1][j]):
                return -1
        if mine > theirs and fused:
            return next((k for k in range(i + 1, min(len(pending), i + 1 + _MOVE_HOPS))
                         if _fused_side(pending[k], sa, sb) == side), None)
    return None


def _regroup(pairs: list[Pair], sa: StepKernels, sb: StepKernels) -> list[Pair]:
    """The pairs, with kernels a compiler moved across anchors joined to the pair where it fused them."""
    pending = list(pairs)
    out: list[Pair] = []
    i = 0
    while i < len(pending):
        k = _target(pending, i, out, sa, sb)
        if k == -1:
            out[-1] = _concat([out[-1], pending[i]])
        elif k is not None:
            pending[k] = _concat(pending[i:k + 1])
            i = k
            continue
        else:
            out.append(pending[i])
        i += 1
    return out


def _us(step: StepKernels, launches: Sequence[int]) -> float:
    return float(sum(step.dur[k] for k in launches))


def _fused_side(pair: Pair, sa: StepKernels, sb: StepKernels) -> str | None:
    """The side that fused the other's kernels in this pair: it runs a fused kernel and fewer launches."""
    if len(pair[1]) < len(pair[0]) and _has_fused(sb, pair[1]):
        return "b"
    if len(pair[0]) < len(pair[1]) and _has_fused(sa, pair[0]):
        return "a"
    return None


def _credited_side(pair: Pair, sa: StepKernels, sb: StepKernels) -> str | None:
    """The side whose fused kernels this pair's difference is credited to: the one that fused (fewer
    launches), else the only side running fused kernels here, whose saving is then zero or negative (real
    compiled decode traces end each step with 32 ``add_copy_`` kernels writing the KV cache back, where
    eager runs 1 kernel); None when neither or both sides run fused kernels."""
    side = _fused_side(pair, sa, sb)
    if side is None and _has_fused(sa, pair[0]) != _has_fused(sb, pair[1]):
        side = "a" if _has_fused(sa, pair[0]) else "b"
    return side


@dataclass(slots=True)
class _Credit:
    """What one fused-kernel signature of one side is credited with, summed over its pairs."""

    launches: int = 0
    names: Counter[str] = field(default_factory=Counter)
    other_launches: float = 0.0
    replaced: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    saved_launches: float = 0.0
    saved_us: float = 0.0
    pairs: int = 0
    shared: int = 0
    shared_with: set[tuple[str, ...]] = field(default_factory=set)


def _credit(acc: dict[tuple[str, ...], _Credit], x: list[int], y: list[int], sx: StepKernels,
            sy: StepKernels) -> float:
    """Credit side x's fused kernels in one pair with y's kernels there; the time saved, returned.

    The pair's saving (y's launches and time minus x's) is exact; with several fused signatures in one
    pair it is split by their own time (the real decode traces run RoPE and the KV-cache write as 5
    Inductor kernels against 20 eager ones between the V projection and attention: no finer order to
    pair them by). Replaced kernels: y's, less those x still runs unfused (a memset on both sides)."""
    own: dict[tuple[str, ...], list[Any]] = {}
    for k in x:
        name = sx.names[sx.seq[k]]
        ops = sx.fused_ops[sx.seq[k]]
        if ops:
            g = own.setdefault(ops, [0.0, Counter()])
            g[0] += sx.dur[k]
            g[1][name] += 1
    kept = Counter((sx.names[sx.seq[k]], sx.classes[sx.seq[k]]) for k in x if not sx.fused_ops[sx.seq[k]])
    replaced = Counter((sy.names[sy.seq[k]], sy.classes[sy.seq[k]]) for k in y) - kept
    saved_us = _us(sy, y) - _us(sx, x)
    total = sum(g[0] for g in own.values())
    for ops, (us, names) in own.items():
        w = us / total if total > 0 else sum(names.values()) / sum(sum(g[1].values()) for g in own.values())
        c = acc.setdefault(ops, _Credit())
        c.launches += sum(names.values())
        c.names.update(names)
        c.other_launches += w * len(y)
        for key, n in replaced.items():
            c.replaced[key] += w * n
        c.saved_launches += w * (len(y) - len(x))
        c.saved_us += w * saved_us
        c.pairs += 1
        if len(own) > 1:
            c.shared += 1
            c.shared_with.update(o for o in own if o != ops)
    return saved_us


def _aligned(sa: StepKernels, sb: StepKernels) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Fusions of both sides from the paired segments of the two first steps (equal anchor counts)."""
    pairs = _regroup(_pair_segments(_cut(sa), _cut(sb)), sa, sb)
    credit: dict[str, dict[tuple[str, ...], _Credit]] = {"a": {}, "b": {}}
    saved = {"a": 0.0, "b": 0.0}
    unattributed = 0.0
    for pair in pairs:
        side = _credited_side(pair, sa, sb)
        if side == "b":
            saved["b"] += _credit(credit["b"], pair[1], pair[0], sb, sa)
        elif side == "a":
            saved["a"] += _credit(credit["a"], pair[0], pair[1], sa, sb)
        else:
            unattributed += _us(sa, pair[0]) - _us(sb, pair[1])
    entries = [_credit_entry(side, ops, c) for side in ("a", "b")
               for ops, c in sorted(credit[side].items(), key=lambda kv: -kv[1].saved_us)]
    entries += _uncredited(sa, sb, credit)
    step_a, step_b = float(sum(sa.dur)), float(sum(sb.dur))
    anchors_a = sum(d for i, d in zip(sa.seq, sa.dur, strict=True) if sa.classes[i] in ANCHOR_CLASSES)
    anchors_b = sum(d for i, d in zip(sb.seq, sb.dur, strict=True) if sb.classes[i] in ANCHOR_CLASSES)
    info = {"mode": "aligned segments", "basis": "first profiler step of each trace",
            "anchors_per_step": sa.anchors, "segment_pairs": len(pairs),
            "a_step_us": round(step_a, 3), "b_step_us": round(step_b, 3),
            # the step's time difference, accounted for: these four add up to a_step_us - b_step_us
            "a_minus_b_us": {"anchor kernels": round(anchors_a - anchors_b, 3),
                             "fused by B": round(saved["b"], 3), "fused by A": round(-saved["a"], 3) + 0.0,
                             "unattributed": round(unattributed, 3)}}
    return entries, info


def _credit_entry(side: str, ops: tuple[str, ...], c: _Credit) -> dict[str, Any]:
    by_class: dict[str, float] = defaultdict(float)
    by_kernel: dict[tuple[str, str], float] = defaultdict(float)
    for (name, cls), n in c.replaced.items():
        by_class[cls] += n
        by_kernel[(_short(name), cls)] += n
    return {"kind": "fused kernel", "side": side, "kernel": c.names.most_common(1)[0][0], "call_sites": len(c.names),
            "ops": list(ops), "classes": sorted(by_class), "launches_per_step": c.launches,
            "other_side_launches_per_step": round(c.other_launches, 2),
            "replaced": {cls: round(n, 2) for cls, n in sorted(by_class.items(), key=lambda kv: -kv[1])},
            "replaced_kernels": [{"kernel": k, "class": cls, "launches": round(n, 2)} for (k, cls), n
                                 in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:5]],
            "launches_saved_per_step": round(c.saved_launches, 2), "us_saved_per_step": round(c.saved_us, 3),
            "segment_pairs": c.pairs, "shared_pairs": c.shared,
            "shared_with": sorted("_".join(o) for o in c.shared_with),
            "attribution": "aligned segments of the first profiler step"}


def _uncredited(sa: StepKernels, sb: StepKernels,
                credit: Mapping[str, Mapping[tuple[str, ...], _Credit]]) -> list[dict[str, Any]]:
    """Fused signatures one first step runs, the other's does not, and no pair credits (each pair where
    they run has fused kernels on both sides): listed with nothing saved, so every fusion found is
    reported. A signature both steps run, uncredited, is no difference between them."""
    ops_a = {sa.fused_ops[i] for i in set(sa.seq)} - {()}
    ops_b = {sb.fused_ops[i] for i in set(sb.seq)} - {()}
    out = []
    for side, step, only in (("a", sa, ops_a - ops_b), ("b", sb, ops_b - ops_a)):
        seen: dict[tuple[str, ...], Counter[str]] = {}
        for i in step.seq:
            if step.fused_ops[i] in only and step.fused_ops[i] not in credit[side]:
                seen.setdefault(step.fused_ops[i], Counter())[step.names[i]] += 1
        out += [{"kind": "fused kernel", "side": side, "kernel": names.most_common(1)[0][0],
                 "call_sites": len(names), "ops": list(ops), "classes": [],
                 "launches_per_step": sum(names.values()), "other_side_launches_per_step": 0.0, "replaced": {},
                 "replaced_kernels": [], "launches_saved_per_step": 0.0, "us_saved_per_step": 0.0,
                 "segment_pairs": 0, "shared_pairs": 0, "shared_with": [],
                 "attribution": "aligned segments of the first profiler step: not credited (the other side "
                                "runs fused kernels in the same segments)"} for ops, names in seen.items()]
    return out


# -- fallback: class-level, each class's time credited at most once -----------------------------------------


def _parts(ops: tuple[str, ...]) -> list[str]:
    """The non-anchor classes a fused kernel's ops stand for (its casts and views: elementwise)."""
    found = {classify(f"triton_tem_fused_{op}_0") for op in ops} | {"elementwise"}
    return [c for c in CLASSES if c in found and c not in ANCHOR_CLASSES]


def _class_level(a: TraceSummary, b: TraceSummary) -> list[dict[str, Any]]:
    return [*_class_level_side("a", a, b), *_class_level_side("b", b, a)]


@dataclass(slots=True)
class _Tally:
    """A fused signature in the class-level estimate, per step: its own kernels, the other side's kernels
    of the classes it owns, and this side's kernels charged to it (its own, and unfused ones of its classes)."""

    names: Counter[str] = field(default_factory=Counter)
    us: float = 0.0
    n: float = 0.0
    other_us: float = 0.0
    other_n: float = 0.0
    charged_us: float = 0.0
    charged_n: float = 0.0
    replaced: dict[str, float] = field(default_factory=dict)


def _class_level_side(side: str, x: TraceSummary, y: TraceSummary) -> list[dict[str, Any]]:
    """Each fused signature of ``x`` against ``y``'s launches of the classes its ops stand for, per step.

    Without paired segments only classes can be matched, so each class goes to one signature (the one
    with most launches among those whose ops include it) and each kernel is counted once: y's kernels of
    an owned class, x's unfused ones of that class and x's fused ones (a signature that owns no class is
    charged to the owner of its first class, and credited nothing)."""
    sigs: dict[tuple[str, ...], _Tally] = defaultdict(_Tally)
    fused_in: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # class -> x's fused (us, launches)
    for name, ops, us, n in x.fused:
        t = sigs[tuple(ops)]
        t.names[name] += n
        t.us, t.n = t.us + us / x.steps, t.n + n / x.steps
        f = fused_in[classify(name)]
        f[0], f[1] = f[0] + us / x.steps, f[1] + n / x.steps
    parts = {ops: _parts(ops) for ops in sigs}
    owner = {c: max((o for o in sigs if c in parts[o]), key=lambda o: sigs[o].n)
             for c in {c for p in parts.values() for c in p}}
    for c, ops in owner.items():
        (yu, yn), (xu, xn), t = y.per_step(c), x.per_step(c), sigs[ops]
        t.other_us, t.other_n = t.other_us + yu, t.other_n + yn
        t.charged_us, t.charged_n = t.charged_us + xu - fused_in[c][0], t.charged_n + xn - fused_in[c][1]
        if yn:
            t.replaced[c] = round(yn, 2)
    owners = set(owner.values())
    for ops, t in sigs.items():
        payer = sigs[ops if ops in owners else owner[parts[ops][0]]]
        payer.charged_us, payer.charged_n = payer.charged_us + t.us, payer.charged_n + t.n
    return [_tally_entry(side, ops, t, None if ops in owners else owner[parts[ops][0]])
            for ops, t in sorted(sigs.items(), key=lambda kv: -kv[1].n)]


def _tally_entry(side: str, ops: tuple[str, ...], t: _Tally, payer: tuple[str, ...] | None) -> dict[str, Any]:
    return {"kind": "fused kernel (class-level estimate)", "side": side, "kernel": t.names.most_common(1)[0][0],
            "call_sites": len(t.names), "ops": list(ops), "classes": sorted(t.replaced),
            "launches_per_step": round(t.n, 2), "other_side_launches_per_step": round(t.other_n, 2),
            "replaced": t.replaced, "replaced_kernels": [],
            "launches_saved_per_step": 0.0 if payer else round(t.other_n - t.charged_n, 2),
            "us_saved_per_step": 0.0 if payer else round(t.other_us - t.charged_us, 3),
            **({"credited_to": "_".join(payer)} if payer else {}),
            "attribution": "class-level estimate (per-step averages): see fusion_alignment.reason"}
