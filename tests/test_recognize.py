"""recognize(): one module, one typed match; and how optimize()'s walk moves between autoopt.nn's modules.

The trace: a *stay* is a maximal run of Python call/return events during which one ``autoopt.nn`` module
is in control: the module of the innermost frame on the stack that belongs to ``autoopt.nn`` (frames of
torch, transformers and the standard library are transparent: control stays with the ``autoopt.nn`` code
that called them). A *return* is a stay in a module that control had already been in and left. The
*walk's* stays keep only the modules that decide and make replacements, ``optimize``, ``recognize`` and
``build``; the data types (``match``), the replacement classes (``modules``), the check's numerics
(``compare``), the kernel choices (``dispatch``) and the report rows (``report``) are transparent there.

On the tiny Llama (2 layers), ``check=False``, before this design (402f920): the walk made 147 stays in
optimize and recognize, 145 returns, 73 of the stays in recognize (3 to 5 per module: once per kind the
module might be); all of autoopt.nn, 551 stays in 5 modules, 546 returns. With ``check=True`` the check's
samples and tolerances came from recognize too: 97 stays there. Now: 18 stays in recognize, one per
module recognised, with or without the check; the tests below hold the walk's pattern per module.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_optimize import build

from autoopt.nn.build import BUILDERS
from autoopt.nn.match import Context, DenseMatch, GatedMLPMatch, NoMatch, NormMatch, PlainMLPMatch, QKVMatch, Replacing
from autoopt.nn.optimize import optimize
from autoopt.nn.recognize import recognize

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
    #: ``id()`` of each module passed to ``recognize()``, in order
    recognized: list[int] = field(default_factory=list)

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
        if event == "call" and frame.f_code is recognize.__code__:
            out.recognized.append(id(frame.f_locals["m"]))
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


#: the walk's modules (see the module docstring); walk_stays() treats the others as transparent.
WALK = ("optimize", "recognize", "build")


def walk_stays(stays: list[str]) -> list[str]:
    out: list[str] = []
    for module in stays:
        if module in WALK and (not out or out[-1] != module):
            out.append(module)
    return out


# -- the walk: recognize once per module -------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_walk() -> Trace:
    model = build("llama")
    return trace(lambda: optimize(model, check=False))


def test_recognize_sees_each_module_the_walk_reaches_once(llama_walk):
    placed = [p for p in llama_walk.per_step if p.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj")]
    assert len(llama_walk.per_step) == 24 and len(placed) == 6  # q/k/v: put in place under their attention
    assert len(llama_walk.recognized) == len(set(llama_walk.recognized)) == 24 - 6 == 18


def test_each_module_takes_one_of_four_fixed_walks(llama_walk):
    # no more than 3 returns per module, none of them to recognize: before, 3 to 5 stays in recognize per module
    walks = {
        "optimize recognize optimize": {"model", "model.embed_tokens", "model.layers", "model.layers.0",
                                        "model.layers.1", "model.rotary_emb"},
        "optimize recognize optimize build optimize": {
            *(f"model.layers.{i}.{m}" for i in (0, 1) for m in ("self_attn", "self_attn.o_proj", "input_layernorm",
                                                                 "post_attention_layernorm")),
            "model.norm", "lm_head"},
        "optimize recognize optimize build optimize build optimize": {"model.layers.0.mlp", "model.layers.1.mlp"},
        "optimize": {f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "k_proj", "v_proj")},
    }
    got: dict[str, set[str]] = {}
    for path, stays in llama_walk.per_step.items():
        got.setdefault(" ".join(walk_stays(stays)), set()).add(path)
    assert got == walks


def test_the_whole_walk_returns_to_recognize_only_for_the_next_module(llama_walk):
    stays = walk_stays(llama_walk.stays)
    assert (len(stays), Trace.returns(stays), stays.count("recognize")) == (65, 62, 18)  # before: 147, 145, 73


def test_the_check_takes_nothing_from_recognize():
    model = build("llama", num_hidden_layers=1)
    got = trace(lambda: optimize(model))  # check=True: samples, tolerances, errors come from autoopt.nn.compare
    assert walk_stays(got.stays).count("recognize") == len(got.recognized) == 12  # one per module, as without
    assert "compare" in got.stays


# -- recognize(): one module, one match --------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    return build("llama")


@pytest.fixture(scope="module")
def neox():
    return build("gpt_neox")


def test_llama_mlp_is_a_gated_mlp_match_with_its_down_proj_inside(llama):
    got = recognize(llama.model.layers[0].mlp, context=Context(path="model.layers.0.mlp"))
    assert got == GatedMLPMatch(activation="silu", hidden=64, intermediate=128, has_bias=False, linear_op=True,
                                down=DenseMatch(in_features=128, out_features=64, has_bias=False))


def test_llama_norm_is_an_rms_norm_match_with_its_eps(llama):
    got = recognize(llama.model.layers[0].input_layernorm, context=Context())
    assert got == NormMatch(kind="rms_norm", features=64, eps=1e-6, unit_offset=False, has_bias=False)


def test_llama_attention_is_a_qkv_match_saying_the_attention_stays(llama):
    got = recognize(llama.model.layers[0].self_attn, context=Context(path="model.layers.0.self_attn"))
    assert got == QKVMatch(attention="", in_features=64, out_features=(64, 32, 32), has_bias=False)
    assert got.attention.startswith("attention stays the model's own (sdpa)")


def test_llama_projections_and_lm_head_are_dense_matches(llama):
    o_proj = recognize(llama.model.layers[0].self_attn.o_proj, context=Context())
    lm_head = recognize(llama.lm_head, context=Context(path="lm_head"))
    assert o_proj == DenseMatch(in_features=64, out_features=64, has_bias=False)
    assert lm_head == DenseMatch(in_features=64, out_features=128, has_bias=False)


def test_llama_containers_are_descended_into_and_the_embedding_is_kept(llama):
    assert recognize(llama.model.layers[0], context=Context()) == NoMatch(kind="module", reason="", descend=True)
    assert recognize(llama.model.embed_tokens, context=Context()) == NoMatch(
        kind="other", reason="Embedding: no autoopt kernel for it")


def test_qwen2_attention_is_a_qkv_match_with_biases():
    got = recognize(build("qwen2").model.layers[0].self_attn, context=Context())
    assert got == QKVMatch(attention="", in_features=64, out_features=(64, 32, 32), has_bias=True)


def test_gpt_neox_mlp_is_a_plain_mlp_match_under_its_own_child_names(neox):
    got = recognize(neox.gpt_neox.layers[0].mlp, context=Context())
    assert got == PlainMLPMatch(activation="gelu", fc1_name="dense_h_to_4h", fc2_name="dense_4h_to_h", hidden=64,
                                intermediate=128, out_features=64, fc1_bias=True, fc2_bias=True,
                                fc2=DenseMatch(in_features=128, out_features=64, has_bias=True))
    assert (got.fc1_name, got.fc2_name) == ("dense_h_to_4h", "dense_4h_to_h")  # not compared by ==


def test_gpt_neox_attention_is_kept_and_its_fused_query_key_value_is_a_dense_match(neox):
    attention = neox.gpt_neox.layers[0].attention
    got = recognize(attention, context=Context())
    assert isinstance(got, NoMatch) and (got.kind, got.descend, got.qkv) == ("attention", True, None)
    assert recognize(attention.query_key_value, context=Context()) == DenseMatch(in_features=64, out_features=192,
                                                                                 has_bias=True)


def test_gpt_neox_layer_norm_is_a_norm_match_with_a_bias(neox):
    got = recognize(neox.gpt_neox.layers[0].input_layernorm, context=Context())
    assert got == NormMatch(kind="layer_norm", features=64, eps=1e-5, unit_offset=False, has_bias=True)


def test_a_no_match_carries_the_reason_the_report_shows():
    model = build("llama")
    paths = {"model.layers.0.mlp": model.model.layers[0].mlp, "model.norm": model.model.norm}
    said = {p: recognize(m, context=Context(path=p, ops=("linear",))) for p, m in paths.items()}
    report = optimize(model, ops=["linear"], check=False)
    assert {p: (report.row(p).kind, report.row(p).status, report.row(p).reason) for p in paths} == {
        p: (m.kind, m.status, m.reason) for p, m in said.items()}
    assert said["model.layers.0.mlp"] == NoMatch(kind="gated_mlp", reason="gated_mlp not in ops=", descend=True)
    assert said["model.norm"] == NoMatch(kind="rms_norm", reason="rms_norm not in ops=", shape="64")


def test_a_skip_pattern_is_a_skipped_no_match(llama):
    got = recognize(llama.lm_head, context=Context(path="lm_head", skip=("model.*", "lm_*")))
    assert got == NoMatch(kind="linear", reason="matches skip= pattern 'lm_*'", status="skipped")


def test_a_projection_already_replaced_elsewhere_keeps_q_k_v_apart(llama):
    attention = llama.model.layers[0].self_attn
    got = recognize(attention, context=Context(path="attn", replaced={id(attention.k_proj)}))
    assert isinstance(got, NoMatch) and got.kind == "attention" and got.descend
    assert got.qkv == "attn.k_proj is shared with another module; q/k/v are tried one by one"


def test_equal_matches_are_one_check_and_child_names_do_not_count(llama, neox):
    first, second = (recognize(layer.mlp, context=Context()) for layer in llama.model.layers)
    assert first == second and hash(first) == hash(second)  # one check serves both layers
    plain = recognize(neox.gpt_neox.layers[0].mlp, context=Context())
    assert isinstance(plain, PlainMLPMatch) and dataclasses.replace(plain, fc1_name="c_fc") == plain


def test_every_replacing_match_kind_has_a_builder():
    assert set(BUILDERS) == set(typing.get_args(Replacing))
