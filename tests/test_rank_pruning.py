"""Branch-and-bound ranking picks exactly what predicting every config picks.

The default ``rank()`` prunes with lower bounds (autoopt.pruning); ``exhaustive=True``
validates and predicts every config. They must agree on the top-k configs, their
order and ties, and on what the Ranking reports (configs considered, rejected, why).
"""

from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest
from _fuzz import budget
from hypothesis import given
from hypothesis import strategies as st

from autoopt.hardware.library import load_profile
from autoopt.kernels import cost
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import CostConstants, StreamBound, matmul_lower_bound, predict_matmul, using
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.pruning import BoundedSpace
from autoopt.kernels.suite import suite
from autoopt.plugins.manager import get_plugin_manager
from autoopt.search.ranking import clear_cache, rank

PROFILES = ("h100-sxm", "h200", "a100-sxm-80gb", "rtx-4090", "rtx-3060", "l4", "b200", "mi300x",
            "stress-12kb", "toy-64kb")
GPUS = {name: load_profile(name).gpu for name in PROFILES}
TEMPLATES = {t.name: t for t in get_plugin_manager().templates()}


def _with_dtype(op: OpSpec, dtype: str) -> OpSpec:
    return OpSpec(kind=op.kind, shape=op.shape, dtype=dtype)


def _ops(name: str) -> list[OpSpec]:
    """A suite's ops in bf16, plus its matmuls in fp8 and fp32."""
    ops = [op for _, op in suite(name)]
    return ops + [_with_dtype(op, d) for d in ("fp8", "fp32") for op in ops if op.is_matmul]


def _outcome(gpu, op, *, top=5, exhaustive, force=None):
    clear_cache()
    try:
        r = rank(gpu, op, top=top, exhaustive=exhaustive, force=force)
    except Exception as exc:  # no valid config (e.g. fp8 on sm_80): both must say the same
        return type(exc).__name__, str(exc)
    return ([(c.config.key(), c.predicted_us) for c in r.candidates], r.considered, r.rejected, r.rejections,
            r.templates, r.path)


def _assert_same(gpu, op, **kw):
    pruned = _outcome(gpu, op, exhaustive=False, **kw)
    full = _outcome(gpu, op, exhaustive=True, **kw)
    assert pruned == full, f"{op.label()} on {gpu.name}"


# -- the pruned top-k is the exhaustive top-k -------------------------------------------------

# one op per kernel family per profile keeps this a few seconds; the slow test below runs them all
_QUICK = [op for _, op in suite("quick")]
_SAMPLE = [(p, op) for i, p in enumerate(PROFILES) for op in _QUICK[i % 2::2]] + [
    ("h100-sxm", _with_dtype(_QUICK[0], "fp8")), ("h200", _with_dtype(_QUICK[2], "fp32")),
    ("b200", _with_dtype(_QUICK[3], "fp8")), ("mi300x", _with_dtype(_QUICK[1], "fp8")),
    ("rtx-3060", _with_dtype(_QUICK[0], "fp8")), ("l4", _with_dtype(_QUICK[3], "fp32"))]


@pytest.mark.parametrize(("profile", "op"), _SAMPLE, ids=lambda x: x if isinstance(x, str) else x.label())
def test_pruned_top5_equals_exhaustive_top5_with_the_same_report(profile, op):
    _assert_same(GPUS[profile], op)


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_pruned_equals_exhaustive_on_every_suite_op(profile):
    for op in _ops("llm") + _ops("quick"):
        _assert_same(GPUS[profile], op)


def test_every_builtin_template_answers_with_bounds():
    gpu = GPUS["h100-sxm"]
    ops = {"gemm": _QUICK[0], "hopper-tma-gemm": _QUICK[0], "gemv": _QUICK[3], "elementwise": _QUICK[4],
           "norm": _QUICK[5], "quant-gemv": replace(_QUICK[3], weight="int4"),
           "quant-gemv-swap": replace(_QUICK[3], shape=(8, *_QUICK[3].shape[1:]), weight="int4"),
           "quant-gemm": replace(_QUICK[0], weight="fp8"), "quant-dequant-cublas": replace(_QUICK[0], weight="int4"),
           "fused-moe-triton": OpSpec(kind="fused_moe", shape=(64, 8, 2, 14336, 4096))}
    assert set(ops) == set(TEMPLATES)
    for name, op in ops.items():
        space = TEMPLATES[name].bounded_space(gpu, op)
        assert isinstance(space, BoundedSpace) and space.roots
        assert space.considered == len(list(TEMPLATES[name].space(gpu, op)))


def test_pruned_ranking_predicts_a_few_configs_of_thousands(monkeypatch):
    import autoopt.search.ranking as ranking

    calls = []
    real = ranking._candidate
    monkeypatch.setattr(ranking, "_candidate", lambda *a: calls.append(a) or real(*a))
    clear_cache()
    r = rank(GPUS["h100-sxm"], _QUICK[0])
    assert r.considered == 1170 and len(calls) <= 40


def test_asking_for_more_candidates_than_cached_recomputes_them():
    gpu, op = GPUS["a100-sxm-80gb"], _QUICK[1]
    clear_cache()
    rank(gpu, op, top=2)
    more = [c.config.key() for c in rank(gpu, op, top=12).candidates]
    clear_cache()
    assert more == [c.config.key() for c in rank(gpu, op, top=12, exhaustive=True).candidates]


@pytest.mark.parametrize("force", ["single", "looped"])
def test_forced_norm_variant_is_the_exhaustive_one(force):
    _assert_same(GPUS["h100-sxm"], OpSpec(kind="rmsnorm", shape=(4096, 8192)), force=force, top=3)


def test_op_with_no_valid_config_fails_with_the_exhaustive_message():
    # fp8 needs sm_89+: every GEMM config of an A100 is rejected, with the same reasons either way
    _assert_same(GPUS["a100-sxm-80gb"], _with_dtype(_QUICK[0], "fp8"))


def test_refitted_constants_still_rank_exactly():
    consts = replace(cost.constants(), tc_efficiency=0.5, dram_latency_us=2.0, overlap_exponent=2.0,
                     l2_usable_fraction=0.9)
    with using(consts):
        _assert_same(GPUS["h100-sxm"], _QUICK[2])
        _assert_same(GPUS["l4"], _QUICK[0])


# -- the bounds are lower bounds -------------------------------------------------------------

def _leaves(children, ancestors=()):
    """Every leaf config of a bounded space, with the bounds of the nodes above it (and its own)."""
    for b, node in children:
        if isinstance(node, KernelConfig):
            yield node, (*ancestors, b)
        else:
            yield from _leaves(node(), (*ancestors, b))


_SHAPES = st.tuples(st.integers(1, 8192), st.integers(1, 8192), st.integers(1, 16000))  # < 2^40 elements
_CONSTS = st.fixed_dictionaries({f.name: st.floats(0.5, 2.0) for f in fields(CostConstants)})


def _scaled(factors: dict[str, float]) -> CostConstants:
    """Every constant scaled by 0.5-2x, as a refit might move them (fractions capped at 1 as fit_constants does)."""
    base = cost.constants()
    return replace(base, **{name: min(v, 1.0) if name.endswith(("efficiency", "fraction")) else v
                            for name, f in factors.items() for v in [getattr(base, name) * f]})


@budget(12)
@given(profile=st.sampled_from(PROFILES), shape=_SHAPES, dtype=st.sampled_from(["bf16", "fp8", "fp32"]),
       template=st.sampled_from(["gemm", "gemv", "hopper-tma-gemm"]), factors=_CONSTS, data=st.data())
def test_every_node_bound_is_at_most_every_prediction_below_it(profile, shape, dtype, template, factors,
                                                                data):
    gpu, t = GPUS[profile], TEMPLATES[template]
    m, n, k = shape
    gemv = template == "gemv" or (template == "gemm" and m <= 16)  # the gemm template serves gemv ops too
    op = OpSpec(kind="gemv" if gemv else "gemm", shape=(min(m, 16) if gemv else m, n, k), dtype=dtype)
    with using(_scaled(factors)):
        if not t.applies(gpu, op) or (space := t.bounded_space(gpu, op)) is None:
            return
        leaves = list(_leaves(space.roots))
        sample = data.draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=25)) if leaves else []
        for cfg, bounds in sample:
            assert t.validate(gpu, op, cfg) == []
            us = t.predict(gpu, op, cfg).us
            assert max(bounds) <= us * (1 + 1e-9), (cfg.describe(), bounds, us)


@budget(60)
@given(profile=st.sampled_from(PROFILES), shape=_SHAPES, bm=st.sampled_from([16, 32, 64, 128, 256]),
       bn=st.sampled_from([32, 64, 128, 256]), bk=st.sampled_from([32, 64, 128]),
       split=st.sampled_from([1, 2, 4]), warps=st.sampled_from([4, 8]), stages=st.integers(2, 6),
       group=st.sampled_from([1, 8]),
       persistent=st.booleans(), slack=st.tuples(st.floats(0.0, 1.0), st.integers(0, 4), st.integers(0, 3)),
       factors=_CONSTS)
def test_matmul_lower_bound_never_exceeds_predict_matmul(profile, shape, bm, bn, bk, split, warps, stages,
                                                         group, persistent, slack, factors):
    """With the config's own MMA time, occupancy and stages, and with any smaller MMA time, more
    CTAs per SM or more stages, the bound stays at most the prediction."""
    gpu = GPUS[profile]
    op = OpSpec(kind="gemm", shape=shape, dtype="bf16")
    mma = "wgmma" if gpu.features.wgmma else "mma_sync"
    cfg = KernelConfig(kernel="gemm", params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group,
                                              "SPLIT_K": 1 if persistent else split, "num_warps": warps,
                                              "num_stages": stages})
    smem, regs = stages * (bm + bn) * bk * 2, bm * bn / (warps * 32) + 32
    with using(_scaled(factors)):
        pred = predict_matmul(gpu, op, cfg, mma=mma, smem_bytes=smem, regs_per_thread=regs,
                              persistent=persistent)
        one_tile = predict_matmul(gpu, OpSpec(kind="gemm", shape=(bm, bn, bk), dtype="bf16"),
                                  replace(cfg, params={**cfg.params, "SPLIT_K": 1}), mma=mma, smem_bytes=smem,
                                  regs_per_thread=regs, persistent=persistent)
        t_comp, occ = one_tile.breakdown["compute_us"], int(pred.breakdown["ctas_per_sm"])
        kw = dict(block_m=bm, block_n=bn, block_k=bk, split_k=cfg["SPLIT_K"], persistent=persistent)
        exact = matmul_lower_bound(gpu, op, t_comp_us=t_comp, max_ctas_per_sm=occ, max_stages=stages, **kw)
        loose = matmul_lower_bound(gpu, op, t_comp_us=t_comp * slack[0], max_ctas_per_sm=occ + slack[1],
                                   max_stages=stages + slack[2], **kw)
    assert loose <= exact * (1 + 1e-9) and exact <= pred.us * (1 + 1e-9)
    assert math.isfinite(exact) and exact > 0


@budget(40)
@given(profile=st.sampled_from(PROFILES), rows=st.integers(1, 70000), n=st.integers(1, 140000),
       kind=st.sampled_from(["rmsnorm", "layernorm", "softmax"]), data=st.data())
def test_norm_bounds_are_at_most_the_prediction(profile, rows, n, kind, data):
    gpu, t = GPUS[profile], TEMPLATES["norm"]
    op = OpSpec(kind=kind, shape=(rows, n), dtype=data.draw(st.sampled_from(["bf16", "fp32"])))
    space = t.bounded_space(gpu, op)
    for b, cfg in data.draw(st.lists(st.sampled_from(space.roots), max_size=10)) if space.roots else []:
        assert b <= t.predict(gpu, op, cfg).us * (1 + 1e-9)


def test_stream_bound_equals_the_single_pass_prediction():
    gpu, t = GPUS["h100-sxm"], TEMPLATES["elementwise"]
    op = _QUICK[4]
    cfg = next(c for c in t.space(gpu, op) if not t.validate(gpu, op, c))
    pred = t.predict(gpu, op, cfg)
    bs, occ = cfg["BLOCK_SIZE"], int(pred.breakdown["ctas_per_sm"])
    b = StreamBound(gpu, op)(math.ceil(op.numel / bs), occ, 1, 2 * bs * 2, op.min_bytes)  # two bf16 inputs
    assert b == pytest.approx(pred.us, rel=1e-12)
