"""How optimize()'s walk moves between the modules of ``autoopt.nn``: traced on a tiny Llama.

A *stay* is a maximal run of Python call/return events during which one ``autoopt.nn`` module is in
control: the module of the innermost frame on the stack that belongs to ``autoopt.nn`` (frames of torch,
transformers and the standard library are transparent: control stays with the ``autoopt.nn`` code that
called them). A *return* is a stay in a module that control had already been in and left. Traced with
``check=False``: the check runs the replacements' kernels (``ops``, ``dispatch``), which is not the walk.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_optimize import build  # noqa: E402

from autoopt.nn.optimize import optimize  # noqa: E402

_NN = "autoopt.nn."


def _owner(frame: FrameType | None) -> str | None:
    """The ``autoopt.nn`` module in control at ``frame``: its own, or its nearest caller's in autoopt.nn."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(_NN):
            return name.removeprefix(_NN)
        frame = frame.f_back
    return None


@dataclass
class Trace:
    """The stays of one traced call, the whole of it and per module the walk steps on (``step``'s path)."""

    stays: list[str] = field(default_factory=list)
    per_step: dict[str, list[str]] = field(default_factory=dict)

    @staticmethod
    def returns(stays: list[str]) -> int:
        return len(stays) - len(set(stays))


def trace(fn: Callable[[], Any]) -> Trace:
    """Run ``fn`` under ``sys.setprofile`` and record the stays (see the module docstring)."""
    out = Trace()
    current: list[list[str]] = []  # the stays of the walk step in progress (a stack: steps do not nest, but be safe)

    def note(stays: list[str], module: str) -> None:
        if not stays or stays[-1] != module:
            stays.append(module)

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event not in ("call", "return"):
            return
        is_step = frame.f_code.co_name == "step" and frame.f_globals.get("__name__") == _NN + "optimize"
        if event == "call" and is_step:
            current.append(out.per_step.setdefault(frame.f_locals["path"], []))
        module = _owner(frame if event == "call" else frame.f_back)
        if module is not None:
            note(out.stays, module)
            if current:
                note(current[-1], module)
        if event == "return" and is_step:
            current.pop()

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return out


def test_before_the_walk_goes_back_to_recognize_once_per_kind_a_module_might_be():
    model = build("llama")
    got = trace(lambda: optimize(model, check=False))
    recognize_stays = {path: stays.count("recognize") for path, stays in got.per_step.items()}
    assert recognize_stays["model.layers.0.mlp"] == 5 and recognize_stays["model.norm"] == 5
    assert recognize_stays["lm_head"] == 4 and recognize_stays["model.layers.0.self_attn"] == 4
    assert got.stays.count("recognize") == 73
    assert (len(got.stays), len(set(got.stays)), Trace.returns(got.stays)) == (551, 5, 546)
