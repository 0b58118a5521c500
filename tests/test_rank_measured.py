"""rank() puts a measured winner first (labelled, with its source); a known profile finds it under any driver."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoopt.hardware.library import load_profile
from autoopt.kernels.ops import OpSpec
from autoopt.results import keys
from autoopt.results.lookup import ResultLookup, reset_default_lookup
from autoopt.search.ranking import rank

OP = OpSpec(kind="gemm", shape=(256, 6144, 4096), dtype="bf16")
H100 = load_profile("h100-sxm").gpu  # a known profile: no driver
DETECTED = replace(H100, driver_version="580.159.04")


@pytest.fixture
def memory(monkeypatch):
    """A fresh process-wide lookup with no user store and no shipped results."""
    fresh = ResultLookup(store_path=None, shipped_dir=None)
    monkeypatch.setattr("autoopt.results.lookup._default", fresh)
    yield fresh
    reset_default_lookup()


def _measured(gpu, config, us):
    return keys.make_result(gpu, OP, config, label="measured", kernel_module="autoopt.backend.kernels.gemm", us=us)


def test_without_measurements_the_best_is_the_cost_models_pick(memory):
    best = rank(H100, OP).best
    assert best.label == "predicted" and best.source == "predicted" and best.measured_us is None


def test_a_measured_winner_comes_first_with_its_time_and_source(memory):
    third = rank(H100, OP, top=3).candidates[2]
    memory.remember(_measured(H100, third.config, 21.5))
    ranking = rank(H100, OP, top=3)
    assert ranking.best.config == third.config
    assert ranking.best.to_dict()["label"] == "measured" and ranking.best.source == "measured:memory"
    assert ranking.best.measured_us == 21.5 and len(ranking.candidates) == 3


def test_a_known_profile_without_driver_finds_a_measurement_taken_under_a_driver(memory):
    second = rank(H100, OP, top=2).candidates[1]
    memory.remember(_measured(DETECTED, second.config, 30.0))
    assert rank(H100, OP).best.config == second.config


def test_a_measurement_under_another_driver_does_not_answer_a_detected_gpu(memory):
    second = rank(H100, OP, top=2).candidates[1]
    memory.remember(_measured(replace(H100, driver_version="550.54.14"), second.config, 30.0))
    assert rank(DETECTED, OP).best.config != second.config


def test_measured_false_ignores_the_store(memory):
    second = rank(H100, OP, top=2).candidates[1]
    memory.remember(_measured(H100, second.config, 30.0))
    assert rank(H100, OP, measured=False).best.label == "predicted"


def test_recommend_labels_an_op_measured_when_the_store_has_its_winner(memory, monkeypatch):
    from autoopt.hardware.library import load_profile as load
    from autoopt.kernels.config import KernelConfig
    from autoopt.planning import recommendation

    monkeypatch.setattr(recommendation, "_RANK_CACHE", {})
    profile = load("h100-sxm")
    before = recommendation.recommend(profile, "llama-3-8b")
    choice = next(c for c in before.ops if c.source == "rank" and c.kind == "gemm")
    op = OpSpec(kind=choice.kind, shape=tuple(choice.shape), dtype=choice.dtype)
    config = KernelConfig(kernel=choice.kernel, params=dict(choice.config), path=choice.path, template=choice.template)
    memory.remember(keys.make_result(profile.gpu, op, config, label="measured", us=choice.predicted_us * 1.1,
                                     kernel_module=f"autoopt.backend.kernels.{choice.kernel}"))
    monkeypatch.setattr(recommendation, "_RANK_CACHE", {})
    after = recommendation.recommend(profile, "llama-3-8b")
    got = next(c for c in after.ops if (c.phase, c.name, tuple(c.shape)) == (choice.phase, choice.name,
                                                                             tuple(choice.shape)))
    assert got.to_dict()["label"] == "measured" and got.source == "measured:memory"
    assert got.measured_us == pytest.approx(choice.predicted_us * 1.1, rel=1e-6)
