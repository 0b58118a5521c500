"""Fuzzed op descriptions: rank returns valid, sorted configs or raises a typed autoopt error, nothing else."""

from __future__ import annotations

from _fuzz import budget
from hypothesis import given
from hypothesis import strategies as st

from autoopt.errors import AutooptError
from autoopt.hardware.library import load_profile
from autoopt.kernels.ops import OP_KINDS
from autoopt.plugins.manager import get_plugin_manager
from autoopt.search.ranking import Ranking, rank, validate_config

GPUS = {name: load_profile(name).gpu for name in ("h100-sxm", "a100-sxm-80gb", "stress-12kb", "mi300x", "b200")}
DIMS = st.one_of(st.sampled_from([1, 2, 7, 16, 17, 127, 4096, 4097, 131072, 2**31 - 1, 2**31, 2**40, 0, -1]),
                 st.integers(min_value=1, max_value=70000))
JUNK = st.one_of(st.none(), st.text(max_size=5), st.floats(), st.booleans(), st.lists(st.integers(), max_size=2))
POSITIVE = st.one_of(st.sampled_from([1, 2, 7, 16, 17, 127, 4096, 4097, 131072, 2**20]),
                    st.integers(min_value=1, max_value=70000))
PLAUSIBLE = st.sampled_from(sorted(OP_KINDS)).flatmap(lambda kind: st.fixed_dictionaries({
    "kind": st.just(kind),
    "shape": st.lists(POSITIVE, min_size=len(OP_KINDS[kind][0]), max_size=len(OP_KINDS[kind][0])),
    "dtype": st.sampled_from(OP_KINDS[kind][1]),
}))
OPS = st.one_of(
    PLAUSIBLE,
    PLAUSIBLE,
    st.fixed_dictionaries({
        "kind": st.one_of(st.sampled_from(sorted(OP_KINDS)), st.text(max_size=6)),
        "shape": st.one_of(st.lists(DIMS, min_size=0, max_size=4), st.text(max_size=8), JUNK),
        "dtype": st.one_of(st.sampled_from(["bf16", "fp16", "fp8", "fp32", "fp4", "int8", "float16"]),
                           st.text(max_size=4)),
    }),
    st.dictionaries(st.text(max_size=6), JUNK, max_size=3),
    JUNK,
)


@budget(60)
@given(op=OPS, gpu=st.sampled_from(sorted(GPUS)))
def test_rank_yields_valid_sorted_configs_or_a_typed_error(op, gpu):
    g = GPUS[gpu]
    problems = get_plugin_manager().problems
    try:
        r = rank(g, op, top=3)
    except AutooptError as exc:
        assert str(exc)  # a message saying what was wrong
        return
    finally:  # built-in templates never emit a config the GPU cannot run
        assert [p for p in problems if p.plugin == "builtin"] == []
    assert isinstance(r, Ranking) and 1 <= len(r.candidates) <= 3
    times = [c.predicted_us for c in r.candidates]
    assert times == sorted(times) and all(t > 0 for t in times)
    for c in r.candidates:
        assert validate_config(g, r.op, c.config) == []
        assert 0 <= c.roofline_pct <= 100 and c.bound in ("compute", "memory", "latency")
