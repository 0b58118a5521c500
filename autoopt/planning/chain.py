"""Per-layer plan over a chain of layers: pick one state per layer, paying transition costs.

A :class:`ChainProblem` has, for each stage (layer), the cost of each candidate
state and, between neighbouring stages, the cost of going from one state to the
next (a layout or precision change; ``inf`` forbids the pair). Two solvers:

- :func:`solve_dp`: Viterbi dynamic programming, exact, ``O(stages x states^2)``.
- :func:`solve_wfc`: the hw-wfc seed's wave-function-collapse search: collapse the
  bottleneck stage first, then always the lowest-entropy stage (Boltzmann entropy
  of its states' costs given collapsed neighbours), choose its cheapest state,
  propagate arc consistency along the chain (drop states with no finite transition
  to a neighbour's remaining states), and backtrack on an empty domain. A
  heuristic: its cost is never below the DP's; it is kept for comparison.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError

__all__ = ["ChainProblem", "ChainSolution", "solve_dp", "solve_wfc"]

log = get_logger(__name__)
INF = math.inf


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainProblem:
    """Stages in order; ``unary[i][s]`` and ``transition[i][a][b]`` (stage i state a -> stage i+1 state b)."""

    stages: tuple[str, ...]
    states: tuple[tuple[str, ...], ...]
    unary: tuple[tuple[float, ...], ...]
    transition: tuple[tuple[tuple[float, ...], ...], ...]

    def __post_init__(self) -> None:
        n = len(self.stages)
        if n == 0:
            raise AutooptError("a chain problem needs at least one stage")
        if len(self.states) != n or len(self.unary) != n or len(self.transition) != n - 1:
            raise AutooptError(f"chain problem sizes disagree: {n} stages, {len(self.states)} state lists, "
                               f"{len(self.unary)} unary lists, {len(self.transition)} transition matrices "
                               f"(expected {n}, {n}, {n - 1})")
        for i, (st, u) in enumerate(zip(self.states, self.unary, strict=True)):
            if not st or len(st) != len(u):
                raise AutooptError(f"stage {i} ({self.stages[i]}): {len(st)} states but {len(u)} costs")
        for i, t in enumerate(self.transition):
            if len(t) != len(self.states[i]) or any(len(row) != len(self.states[i + 1]) for row in t):
                raise AutooptError(f"transition {i}->{i + 1} is not a {len(self.states[i])}x"
                                   f"{len(self.states[i + 1])} matrix")

    def cost(self, assignment: tuple[int, ...]) -> float:
        total = sum(self.unary[i][s] for i, s in enumerate(assignment))
        return total + sum(self.transition[i][assignment[i]][assignment[i + 1]] for i in range(len(assignment) - 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainSolution:
    """One state per stage, its total cost, and what finding it took."""

    solver: str
    assignment: tuple[int, ...]
    labels: tuple[str, ...]
    cost: float
    elapsed_s: float
    steps: int = 0
    backtracks: int = 0
    exact: bool = False

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.cost)

    def to_dict(self) -> dict[str, Any]:
        return {"solver": self.solver, "exact": self.exact, "cost": self.cost if self.feasible else None,
                "feasible": self.feasible, "elapsed_s": self.elapsed_s, "steps": self.steps,
                "backtracks": self.backtracks, "labels": list(self.labels)}


def _solution(problem: ChainProblem, solver: str, assignment: tuple[int, ...], t0: float, *, steps: int,
              backtracks: int = 0, exact: bool = False) -> ChainSolution:
    labels = tuple(problem.states[i][s] for i, s in enumerate(assignment))
    return ChainSolution(solver=solver, assignment=assignment, labels=labels, cost=problem.cost(assignment),
                         elapsed_s=time.perf_counter() - t0, steps=steps, backtracks=backtracks, exact=exact)


def solve_dp(problem: ChainProblem) -> ChainSolution:
    """Exact minimum-cost assignment by Viterbi DP (ties: lowest state index)."""
    t0 = time.perf_counter()
    best = list(problem.unary[0])
    back: list[list[int]] = []
    steps = 0
    for i in range(1, len(problem.stages)):
        trans, unary = problem.transition[i - 1], problem.unary[i]
        nxt, arg = [], []
        for b, u in enumerate(unary):
            cb, ab = INF, 0
            for a, ca in enumerate(best):
                c = ca + trans[a][b]
                if c < cb:
                    cb, ab = c, a
            steps += len(best)
            nxt.append(cb + u)
            arg.append(ab)
        best = nxt
        back.append(arg)
    s = min(range(len(best)), key=lambda k: best[k])
    path = [s]
    for arg in reversed(back):
        s = arg[s]
        path.append(s)
    return _solution(problem, "dp", tuple(reversed(path)), t0, steps=steps, exact=True)


def _entropy(costs: list[float], temperature: float) -> float:
    lo = min(costs)
    w = [math.exp(-(c - lo) / temperature) for c in costs]
    z = sum(w)
    return -sum(x / z * math.log(x / z) for x in w if x > 0)


def solve_wfc(problem: ChainProblem, *, max_backtracks: int = 10_000) -> ChainSolution:
    """Wave-function-collapse search (see module docstring); infeasible -> cost ``inf``."""
    t0 = time.perf_counter()
    n = len(problem.stages)
    spreads = [max(f) - min(f) for f in ([c for c in u if math.isfinite(c)] for u in problem.unary) if f]
    temperature = (sum(spreads) / len(spreads)) if spreads and sum(spreads) > 0 else 1.0
    # Domains are frozensets, so a snapshot before a decision is a cheap list copy.
    domains: list[frozenset[int]] = [frozenset(s for s, c in enumerate(u) if math.isfinite(c))
                                     for u in problem.unary]
    chosen: list[int | None] = [None] * n
    steps = backtracks = 0

    def eff(i: int, s: int) -> float:
        c = problem.unary[i][s]
        if i > 0 and chosen[i - 1] is not None:
            c += problem.transition[i - 1][chosen[i - 1]][s]  # type: ignore[index]
        if i < n - 1 and chosen[i + 1] is not None:
            c += problem.transition[i][s][chosen[i + 1]]  # type: ignore[index]
        return c

    def propagate(doms: list[frozenset[int]], start: int) -> bool:
        """Arc consistency outward from ``start`` (in place); False on an empty domain."""
        queue = [start]
        while queue:
            i = queue.pop()
            for j in (i - 1, i + 1):
                if not 0 <= j < n:
                    continue
                if j < i:
                    t = problem.transition[j]
                    keep = frozenset(a for a in doms[j] if any(math.isfinite(t[a][b]) for b in doms[i]))
                else:
                    t = problem.transition[i]
                    keep = frozenset(b for b in doms[j] if any(math.isfinite(t[a][b]) for a in doms[i]))
                if keep != doms[j]:
                    if not keep:
                        return False
                    doms[j] = keep
                    queue.append(j)
        return True

    for i in range(n):
        if not domains[i] or not propagate(domains, i):
            return ChainSolution(solver="wfc", assignment=(), labels=(), cost=INF,
                                 elapsed_s=time.perf_counter() - t0)
    # Lowest-entropy selection through a heap with lazy invalidation: a stage's key only
    # changes when a neighbour collapses or its domain shrinks.
    version = [0] * n
    heap: list[tuple[float, float, int, int]] = []

    def push(k: int) -> None:
        if chosen[k] is None:
            costs = [eff(k, s) for s in domains[k]]
            heapq.heappush(heap, (_entropy(costs, temperature), -min(costs), k, version[k]))

    def invalidate(ks: Iterable[int]) -> None:
        for k in ks:
            if 0 <= k < n:
                version[k] += 1
                push(k)

    def try_place(i: int, alts: list[int], snap: list[frozenset[int]]) -> bool:
        nonlocal domains, steps
        while alts:
            s = alts.pop(0)
            steps += 1
            trial = list(snap)
            trial[i] = frozenset((s,))
            if propagate(trial, i):
                changed = [k for k in range(n) if trial[k] is not domains[k]]
                domains = trial
                chosen[i] = s
                stack.append((i, alts, snap))
                invalidate(set(changed) | {i - 1, i + 1})
                return True
        return False

    # Decision stack: (stage, remaining alternatives, domains before the choice).
    stack: list[tuple[int, list[int], list[frozenset[int]]]] = []
    open_ = set(range(n))
    for k in range(n):
        push(k)
    # Bottleneck first: the stage whose cheapest state costs the most.
    nxt = max(open_, key=lambda k: (min(problem.unary[k][s] for s in domains[k]), -k))
    while open_:
        if nxt in open_:
            i = nxt
        else:
            while True:
                _, _, i, ver = heapq.heappop(heap)
                if i in open_ and ver == version[i]:
                    break
        nxt = -1
        alts = sorted(domains[i], key=lambda s: (eff(i, s), s))
        if try_place(i, alts, list(domains)):
            open_.discard(i)
            continue
        placed = False
        while not placed:
            if not stack or backtracks >= max_backtracks:
                return ChainSolution(solver="wfc", assignment=(), labels=(), cost=INF,
                                     elapsed_s=time.perf_counter() - t0, steps=steps, backtracks=backtracks)
            backtracks += 1
            j, j_alts, j_snap = stack.pop()
            chosen[j] = None
            open_.add(j)
            domains = list(j_snap)
            placed = try_place(j, j_alts, j_snap)
            if placed:
                open_.discard(j)
        # Keys of every open stage may have changed with the undo: rebuild the heap.
        heap.clear()
        invalidate(open_)
    assignment = tuple(int(c) for c in chosen)  # type: ignore[arg-type]
    return _solution(problem, "wfc", assignment, t0, steps=steps, backtracks=backtracks)
