"""The check a benchmark makes before it reports a compiled forward's time: its logits against eager's."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from autoopt.nn.e2e import COMPILED_TOL, build_model, checked_prefill_ms, compiled_vs_eager  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model("llama-3-8b", dtype="fp32", device="cpu", tiny=True)


def _with_logits(out, logits):
    return types.SimpleNamespace(logits=logits, past_key_values=getattr(out, "past_key_values", None))


def test_a_forward_that_computes_what_eager_does_passes(model):
    check = compiled_vs_eager(model, model.forward, model.config.vocab_size, 1, 16, "cpu")
    assert (check["rel_err"], check["top1_agreement"], check["nan"], check["ok"]) == (0.0, 1.0, False, True)


def test_a_forward_that_lost_a_branch_fails(model):
    # what a graph that dropped a kernel's output returns: its time must not be reported
    def broken(**kw):
        out = model.forward(**kw)
        return _with_logits(out, torch.zeros_like(out.logits))
    check = compiled_vs_eager(model, broken, model.config.vocab_size, 1, 16, "cpu")
    assert check["rel_err"] == 1.0 and not check["ok"]


def test_rounding_below_the_tolerance_passes(model):
    def rounded(**kw):
        out = model.forward(**kw)
        return _with_logits(out, out.logits * (1 + COMPILED_TOL / 10))
    check = compiled_vs_eager(model, rounded, model.config.vocab_size, 1, 16, "cpu", use_cache=True)
    assert check["ok"] and check["rel_err"] == pytest.approx(COMPILED_TOL / 10, rel=1e-3)


def test_a_prefill_that_lost_its_output_is_not_timed(model):
    def broken(**kw):
        out = model.forward(**kw)
        return _with_logits(out, torch.zeros_like(out.logits))
    with pytest.raises(ValueError, match=r"differ from eager's by 1 \(> 0.25; NaN: False\): not timed"):
        checked_prefill_ms(model, broken, 1, 16, "cpu", 1)


def test_a_matching_prefill_is_timed_with_its_check(model):
    ms, check = checked_prefill_ms(model, model.forward, 1, 16, "cpu", 1)
    assert ms > 0 and check["ok"] and check["rel_err"] == 0.0
