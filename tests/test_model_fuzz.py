"""Fuzzing ``from_hf_config`` (what ``recommend --model config.json`` reads): whatever the mutation of a
published config, the answer is a ModelSpec that round-trips, counts positive parameters and lists its
ops, or a ``ModelError`` -- never another exception."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from _fuzz import budget
from hypothesis import given
from hypothesis import strategies as st

from autoopt.errors import ModelError
from autoopt.planning.catalog import _entries
from autoopt.planning.model import ModelSpec, from_hf_config

#: the catalog's published configs: dense, GQA, sliding-window, MoE, MLA, plain-MLP, parallel-block
BASES: dict[str, dict[str, Any]] = {name: dict(entry["config"]) for name, entry in _entries().items()}

_junk = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**6, max_value=10**6),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                  st.lists(st.integers(min_value=-3, max_value=64), max_size=3), st.just({}))
_small = st.integers(min_value=1, max_value=70_000)


@st.composite
def mutated(draw) -> dict[str, Any]:
    data = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        key = draw(st.sampled_from(sorted(data)))
        op = draw(st.sampled_from(["drop", "junk", "resize"]))
        if op == "drop":
            data.pop(key, None)
        elif op == "junk":
            data[key] = draw(_junk)
        elif isinstance(data.get(key), int) and not isinstance(data[key], bool):
            data[key] = draw(_small)
    return data


@budget(150)
@given(mutated())
def test_a_mutated_config_is_a_sound_model_or_a_model_error(cfg):
    try:
        spec = from_hf_config(cfg, name="fuzz")
    except ModelError:
        return
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    assert spec.num_params > 0 and 0 < spec.active_params <= spec.num_params
    ops = spec.layer_ops(0, batch=1, q_len=1, context=16)
    assert ops and all(o.flops >= 0 and o.bytes > 0 and math.isfinite(o.flops) for o in ops)


# ----------------------------------------------------------------- what the fuzzer found, pinned

def test_a_width_given_as_a_list_is_a_model_error_naming_the_key():
    # found by the fuzzer: int() of a list deep in the MoE parse (a TypeError, not a ModelError)
    cfg = {**BASES["mixtral-8x7b"], "intermediate_size": [14336]}
    with pytest.raises(ModelError, match="must be a whole number") as err:
        from_hf_config(cfg)
    assert err.value.field == "intermediate_size"


def test_an_infinite_head_dim_is_a_model_error_naming_the_key():
    with pytest.raises(ModelError) as err:
        from_hf_config({**BASES["llama-3-8b"], "head_dim": float("inf")})
    assert err.value.field == "head_dim"


def test_a_flag_given_as_text_is_a_model_error_naming_the_key():
    with pytest.raises(ModelError, match="true or false") as err:
        from_hf_config({**BASES["llama-3-8b"], "tie_word_embeddings": "no"})
    assert err.value.field == "tie_word_embeddings"
