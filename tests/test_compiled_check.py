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
    with pytest.raises(ValueError, match=r"differ from eager's by 1 \(> 0.25, and past it > 2.0 x the model's own "
                                         r"noise [0-9.e-]+ or > 0.75; NaN: False\): not timed"):
        checked_prefill_ms(model, broken, 1, 16, "cpu", 1)


def test_a_matching_prefill_is_timed_with_its_check(model):
    ms, check = checked_prefill_ms(model, model.forward, 1, 16, "cpu", 1)
    assert ms > 0 and check["ok"] and check["rel_err"] == 0.0


def test_a_last_bit_nudge_moves_every_nonzero_element_to_a_neighbour_and_keeps_zeros():
    from autoopt.nn.e2e import ulp_nudged

    t = torch.tensor([1.0, -2.5, 0.0, 3e-3, 1024.0], dtype=torch.bfloat16)
    got = ulp_nudged(t)
    moved = (got.view(torch.int16).int() - t.view(torch.int16).int()).tolist()
    assert moved[2] == 0 and got[2] == 0
    assert all(abs(d) == 1 for i, d in enumerate(moved) if i != 2)
    assert torch.equal(torch.sign(got), torch.sign(t))


def test_past_the_tolerance_a_forward_within_twice_the_models_own_noise_passes(model, monkeypatch):
    from autoopt.nn import e2e

    monkeypatch.setattr(e2e, "eager_noise", lambda *a, **k: 0.2)

    def off(**kw):
        out = model.forward(**kw)
        return _with_logits(out, out.logits * 1.3)
    check = compiled_vs_eager(model, off, model.config.vocab_size, 1, 16, "cpu")
    assert check["rel_err"] == pytest.approx(0.3, rel=1e-3) and check["eager_noise_rel_err"] == 0.2 and check["ok"]


def test_past_the_tolerance_a_forward_beyond_twice_the_models_own_noise_fails_saying_both(model, monkeypatch):
    from autoopt.nn import e2e

    monkeypatch.setattr(e2e, "eager_noise", lambda *a, **k: 0.1)

    def off(**kw):
        out = model.forward(**kw)
        return _with_logits(out, out.logits * 1.3)
    with pytest.raises(ValueError, match=r"by 0\.3 .*> 2\.0 x the model's own noise 0\.1 or > 0\.75"):
        checked_prefill_ms(model, off, 1, 16, "cpu", 1)


def test_however_noisy_the_model_a_forward_that_lost_its_output_fails(model, monkeypatch):
    from autoopt.nn import e2e

    monkeypatch.setattr(e2e, "eager_noise", lambda *a, **k: 0.9)

    def lost(**kw):
        out = model.forward(**kw)
        return _with_logits(out, torch.zeros_like(out.logits))
    check = compiled_vs_eager(model, lost, model.config.vocab_size, 1, 16, "cpu")
    assert check["rel_err"] == 1.0 and not check["ok"]


def test_the_models_noise_is_measured_only_past_the_fixed_tolerance(model, monkeypatch):
    from autoopt.nn import e2e

    monkeypatch.setattr(e2e, "eager_noise", lambda *a, **k: pytest.fail("noise measured inside the tolerance"))
    assert compiled_vs_eager(model, model.forward, model.config.vocab_size, 1, 16, "cpu")["ok"]


def test_a_tiny_fp32_models_own_noise_is_small_and_positive(model):
    from autoopt.nn.e2e import eager_noise

    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model.forward(input_ids=ids, logits_to_keep=1).logits[:, -1].float()
    assert 0 < eager_noise(model, ids, ref) < 1e-3


def test_a_forward_inside_a_noisy_models_noise_passes_up_to_the_cap(model, monkeypatch):
    # fp8 Llama-3-8B on the H200: compiled 0.384 from eager, eager 0.531 from its own last-bit nudge
    from autoopt.nn import e2e

    monkeypatch.setattr(e2e, "eager_noise", lambda *a, **k: 0.531)

    def scaled(f):
        def fwd(**kw):
            out = model.forward(**kw)
            return _with_logits(out, out.logits * f)
        return fwd
    assert compiled_vs_eager(model, scaled(1.384), model.config.vocab_size, 1, 16, "cpu")["ok"]
    assert not compiled_vs_eager(model, scaled(1.8), model.config.vocab_size, 1, 16, "cpu")["ok"]
