"""Fuzzing ``HardwareProfile.from_dict`` (what ``--profile FILE`` and ``autoopt profile --save`` read back):
whatever the mutation of a profile detected on a real H100, the answer is a profile that round-trips
exactly, or a ``ProfileError`` naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from _fuzz import budget
from hypothesis import given
from hypothesis import strategies as st

from autoopt.errors import ProfileError
from autoopt.hardware.profile import HardwareProfile

#: `autoopt profile --save` on an H100 host (tests/fixtures/regen.py rebuilds it from the raw capture)
BASE: dict[str, Any] = json.loads((Path(__file__).parent / "fixtures" / "h100_profile.json").read_text())

_junk = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**12, max_value=10**12),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                  st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                       max_size=2))


def _leaves(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into nested dicts and lists."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    out = []
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_leaves(v, (*prefix, k)))
    return out


_PATHS = _leaves(BASE)


@st.composite
def mutated(draw) -> dict:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_PATHS))
        parent: Any = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict) and draw(st.booleans()):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(_junk)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced the parent
    return data


def _outcome(data: dict) -> HardwareProfile | ProfileError:
    try:
        return HardwareProfile.from_dict(data, source="fuzz.json")
    except ProfileError as exc:
        return exc


def test_the_captured_h100_profile_reads_back_as_itself():
    prof = HardwareProfile.from_dict(BASE)
    assert prof.gpus[0].sm_count == 132 and HardwareProfile.from_dict(prof.to_dict()) == prof


@budget(200)
@given(mutated())
def test_a_mutated_profile_round_trips_or_is_a_profile_error(data):
    outcome = _outcome(data)
    if isinstance(outcome, HardwareProfile):
        assert HardwareProfile.from_dict(outcome.to_dict()) == outcome
        assert json.loads(json.dumps(outcome.to_dict())) == outcome.to_dict()
    else:
        assert "fuzz.json" in str(outcome)
