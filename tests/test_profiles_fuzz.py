"""Fuzzing ``parse_known``: whatever the text, the answer is a KnownDevice or a ProfileError."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from _fuzz import budget
from hypothesis import given
from hypothesis import strategies as st

from autoopt.errors import ProfileError
from autoopt.hardware.library import KnownDevice, get_known, parse_known

FUZZ = budget(200)

#: a valid file to mutate: the shipped H100 SXM profile (with an interconnect added so that
#: nested mapping is mutated too), as a plain dict.
BASE: dict[str, Any] = {k: v for k, v in get_known("h100-sxm").to_dict().items() if k != "path"}
BASE["interconnect"] = {"kind": "nvlink", "links": 18, "version": 4, "bandwidth_gbs": 450.0}


def _outcome(text: str) -> KnownDevice | ProfileError:
    try:
        return parse_known(text, source="fuzz.yaml")
    except ProfileError as exc:
        assert exc.source == "fuzz.yaml"
        return exc


# ----------------------------------------------------------------- (a) arbitrary text

@FUZZ
@given(st.text(max_size=400))
def test_arbitrary_text_is_a_device_or_a_profile_error(text):
    assert isinstance(_outcome(text), (KnownDevice, ProfileError))


_yaml_words = st.sampled_from(["name:", "gpu:", "  name: x", "  sm_count:", "count:", "- ", "[", "]", "{",
                               "}", ": ", "&a", "*a", "!!int", "!!binary", "!!python/tuple", "2001-13-45",
                               "0x10", "-1", ".inf", ".nan", "null", "~", "'", '"', "\n", "  ", "#", "|",
                               "peak_tflops: {", "fp8: 1", "aliases: [", "interconnect:", "kind: nvlink"])


@FUZZ
@given(st.lists(_yaml_words, max_size=40).map("".join))
def test_yaml_shaped_text_is_a_device_or_a_profile_error(text):
    assert isinstance(_outcome(text), (KnownDevice, ProfileError))


# ----------------------------------------------------------------- (b) mutated valid profiles

_junk = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**12, max_value=10**12),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                  st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                       max_size=2))


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into nested dicts (lists are leaves)."""
    out = []
    if isinstance(data, dict):
        for k, v in data.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    return out


_ALL_PATHS = _paths(BASE)


def _parent(data: dict, path: tuple) -> dict:
    for key in path[:-1]:
        data = data[key]
    return data


@st.composite
def mutated(draw) -> dict:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        path = draw(st.sampled_from(_ALL_PATHS))
        try:
            parent = _parent(data, path)
        except (KeyError, TypeError):
            continue  # an earlier mutation removed or replaced the parent
        if not isinstance(parent, dict):
            continue
        op = draw(st.sampled_from(["drop", "retype", "negate", "unknown"]))
        key = path[-1]
        if op == "drop":
            parent.pop(key, None)
        elif op == "retype":
            parent[key] = draw(_junk)
        elif op == "negate":
            value = parent.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                parent[key] = -value - 1
        else:
            parent[draw(st.text(min_size=1, max_size=10))] = draw(_junk)
    return data


@FUZZ
@given(mutated())
def test_mutated_profile_is_a_valid_device_or_a_profile_error(data):
    outcome = _outcome(yaml.safe_dump(data))
    assert isinstance(outcome, (KnownDevice, ProfileError))
    if isinstance(outcome, KnownDevice):
        # whatever was accepted is internally consistent and round-trips
        assert KnownDevice.from_dict(outcome.to_dict()) == outcome
        gpu = outcome.gpu
        if gpu.smem_per_block_optin_bytes is not None and gpu.smem_per_sm_bytes is not None:
            assert gpu.smem_per_block_optin_bytes <= gpu.smem_per_sm_bytes
        assert outcome.count >= 1
        outcome.to_profile()


@FUZZ
@given(mutated())
def test_mutated_profile_error_names_a_field_or_the_file(data):
    outcome = _outcome(yaml.safe_dump(data))
    if isinstance(outcome, ProfileError):
        assert outcome.field or "mapping" in str(outcome)


@FUZZ
@given(st.sampled_from(_ALL_PATHS), st.integers(min_value=1, max_value=10**9))
def test_negating_any_size_is_rejected_with_that_field(path, magnitude):
    data = copy.deepcopy(BASE)
    parent = _parent(data, path)
    value = parent[path[-1]]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    parent[path[-1]] = -magnitude
    outcome = _outcome(yaml.safe_dump(data))
    assert isinstance(outcome, ProfileError)
    assert outcome.field == ".".join(str(p) for p in path)


# ----------------------------------------------------------------- (c) bugs the fuzzers found

@pytest.mark.parametrize("key", ["memory_type", "arch", "generation"])
def test_a_blank_string_field_is_rejected_naming_it(key):
    # found by the mutation fuzzer: memory_type '' was accepted, then written back as "unset"
    data = copy.deepcopy(BASE)
    data["gpu"][key] = " " if key == "arch" else ""
    outcome = _outcome(yaml.safe_dump(data))
    assert isinstance(outcome, ProfileError)
    assert outcome.field == f"gpu.{key}"
    assert "leave the field out" in str(outcome)
