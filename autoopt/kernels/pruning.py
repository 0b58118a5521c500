"""Branch and bound for ranking: the bounded-space protocol and the per-GPU tables behind it.

Ranking every config of an op costs ~15-50 us per config in Python (validate +
predict), ~100 ms for a 2000-config GEMM space. A template can instead describe
its space as a tree whose every node carries a *lower bound* of the predicted
time of all configs beneath it; :func:`autoopt.ranking.rank` then pops nodes
best-bound first and stops once the next bound exceeds the k-th best prediction
found. The result equals the exhaustive top-k (same order, same tie-breaks) as
long as every bound is a true lower bound (``rank(..., exhaustive=True)`` keeps
the old path; tests/test_rank_pruning.py compares the two).

Protocol: a template may define ``bounded_space(gpu, op) -> BoundedSpace | None``
(``None``: rank this op exhaustively). Its nodes are ``(bound_us, item)`` where
``item`` is a :class:`~autoopt.config.KernelConfig` that passes the template's
``validate`` (a leaf, predicted with ``predict``) or a zero-argument callable
returning more ``(bound_us, item)`` pairs. The space also reports how many
configs the template's ``space`` would emit and how many (and why) its
``validate`` would reject, so a pruned :class:`~autoopt.ranking.Ranking` says
the same as an exhaustive one.

Shape-independent work (resources, occupancy, hard constraints, per-iteration
MMA time) goes in per-(GPU, dtype, constants) tables, built on a template's first
op on that GPU and reused by every later op (:func:`cached`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoopt.kernels.gpu_key import gpu_key

__all__ = ["RELATIVE_SLACK", "BoundedSpace", "Tally", "cached", "count_rejection", "gpu_key", "rule_of"]

#: a node is pruned only when its bound exceeds the k-th best by this relative margin: the
#: bounds repeat the cost model's float expressions but may round differently in the last bits
#: (~1e-15 relative per operation); 1e-9 is far above that and far below any real difference.
RELATIVE_SLACK = 1e-9

_TABLES: dict[Hashable, Any] = {}
_TABLES_MAX = 512


def cached(key: Hashable, build: Callable[[], Any]) -> Any:
    """The table stored under ``key``, built by ``build()`` on first use (bounded, process-wide)."""
    try:
        return _TABLES[key]
    except KeyError:
        pass
    value = build()
    if len(_TABLES) >= _TABLES_MAX:
        _TABLES.clear()
    _TABLES[key] = value
    return value


def clear_tables() -> None:
    from autoopt.kernels import gpu_key as keys

    _TABLES.clear()
    keys._KEY_CACHE.clear()


_DIGITS = re.compile(r"\d+")
_RULES: dict[str, str] = {}


def rule_of(reason: str) -> str:
    """A rejection reason with its numbers masked, so one rule counts once (``smem # B > opt-in # B``).
    Memoized: the per-GPU tables ask for the same few hundred messages ~1000 times per cold start."""
    rule = _RULES.get(reason)
    if rule is None:
        if len(_RULES) > 4096:
            _RULES.clear()
        rule = _RULES[reason] = _DIGITS.sub("#", reason)
    return rule


def count_rejection(rules: Counter, examples: dict[str, str], problem: str, times: int = 1) -> None:
    """Count ``problem``'s rule (:func:`rule_of`) ``times`` times, keeping the first message per rule."""
    rule = rule_of(problem)
    rules[rule] += times
    examples.setdefault(rule, problem)


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundedSpace:
    """One template's space for one op as bounded nodes, plus what ``space``/``validate`` would report."""

    #: configs ``space`` emits for the op.
    considered: int
    #: of those, configs ``validate`` rejects.
    rejected: int
    #: kernel name -> Counter of rejection rules (:func:`rule_of` of the first problem).
    reasons: Mapping[str, Counter] = field(default_factory=dict)
    #: rule -> the first full message seen for it.
    examples: Mapping[str, str] = field(default_factory=dict)
    #: (lower bound in us, node): a valid KernelConfig or a callable returning more such pairs.
    roots: list[tuple[float, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Tally:
    """What a ``bounded_space`` counts while it walks its space, so its :class:`BoundedSpace` reports
    what ``space``/``validate`` would: configs emitted, configs rejected, and why (mutable: one walk)."""

    considered: int = 0
    rejected: int = 0
    #: kernel name -> Counter of rejection rules; a kernel appears only once it has a rejection.
    reasons: dict[str, Counter] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def reject(self, kernel: str, problem: str) -> None:
        """One config of ``kernel`` rejected with ``problem`` (validate's first)."""
        self.rejected += 1
        count_rejection(self.reasons.setdefault(kernel, Counter()), self.examples, problem)

    def reject_counted(self, kernel: str, rejected: int, rules: Iterable[tuple[str, int]],
                       examples: Iterable[tuple[str, str]], times: int) -> None:
        """``rejected`` configs of ``kernel`` whose rules a table already counted (``rules``: rule ->
        count, ``examples``: rule -> first message), each count standing ``times`` times in the space."""
        self.rejected += rejected
        counter = self.reasons.setdefault(kernel, Counter())
        for rule, n in rules:
            counter[rule] += n * times
        for rule, msg in examples:
            self.examples.setdefault(rule, msg)

    def space(self, roots: list[tuple[float, Any]]) -> BoundedSpace:
        """The :class:`BoundedSpace` of these counts and ``roots``."""
        return BoundedSpace(considered=self.considered, rejected=self.rejected, reasons=self.reasons,
                            examples=self.examples, roots=roots)
