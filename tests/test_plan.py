"""Per-layer plan: exact Viterbi DP and the WFC search on the same chains."""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest

from autoopt.errors import AutooptError
from autoopt.planning.chain import ChainProblem, solve_dp, solve_wfc

INF = math.inf


def chain(unary, trans):
    return ChainProblem(stages=tuple(f"l{i}" for i in range(len(unary))),
                        states=tuple(tuple(f"s{j}" for j in range(len(u))) for u in unary),
                        unary=tuple(map(tuple, unary)),
                        transition=tuple(tuple(map(tuple, t)) for t in trans))


def random_chain(rng, n, s, p_inf=0.0):
    unary = [[rng.uniform(0, 10) for _ in range(s)] for _ in range(n)]
    trans = [[[INF if rng.random() < p_inf else rng.uniform(0, 5) for _ in range(s)] for _ in range(s)]
             for _ in range(n - 1)]
    return chain(unary, trans)


def test_dp_equals_brute_force_on_small_chains():
    rng = random.Random(7)
    for _ in range(100):
        p = random_chain(rng, rng.randint(1, 5), rng.randint(1, 3), p_inf=0.2)
        best = min(p.cost(a) for a in itertools.product(*[range(len(s)) for s in p.states]))
        assert solve_dp(p).cost == best


def test_dp_cost_never_exceeds_wfc_on_the_same_chain_and_both_are_timed():
    rng = random.Random(11)
    for _ in range(30):
        p = random_chain(rng, 40, 4)
        t0 = time.perf_counter()
        dp = solve_dp(p)
        t1 = time.perf_counter()
        wfc = solve_wfc(p)
        t2 = time.perf_counter()
        assert dp.cost <= wfc.cost + 1e-9
        assert 0 < dp.elapsed_s <= t1 - t0 and 0 < wfc.elapsed_s <= t2 - t1
        assert dp.exact and not wfc.exact


def test_wfc_can_be_worse_than_dp():
    # Stage 1 is the bottleneck; its cheapest state (0) forces an expensive neighbour.
    p = chain([[0, 0], [10, 11], [0, 0]], [[[0, 0], [0, 0]], [[100, 100], [0, 0]]])
    assert solve_dp(p).cost == 11
    assert solve_wfc(p).cost == 110


def test_wfc_backtracks_out_of_a_dead_end():
    # Stage 0 (bottleneck) prefers state 0, which forbids every state of stage 1 except 0,
    # and stage 1 state 0 forbids all of stage 2: propagation empties a domain.
    p = chain([[10, 20], [0, 5], [0]], [[[0, INF], [INF, 0]], [[INF], [0]]])
    sol = solve_wfc(p)
    assert sol.feasible and sol.assignment == (1, 1, 0) and sol.cost == solve_dp(p).cost


def test_infeasible_chain_costs_infinity_for_both():
    p = chain([[0], [0]], [[[INF]]])
    assert not solve_dp(p).feasible and not solve_wfc(p).feasible


def test_malformed_problem_is_refused():
    with pytest.raises(AutooptError, match="transition"):
        chain([[0, 1], [0]], [[[0], [0], [0]]])
