"""The standard LLM op suite and the bench's zero-timing choice of configs for it."""

import pytest

from autoopt.api import load_profile
from autoopt.backend.bench import recommended_cases
from autoopt.errors import OpError
from autoopt.kernels.suite import suite


def test_llm_suite_has_the_llama3_8b_prefill_and_decode_shapes():
    ops = [op for _, op in suite("llm")]
    gemms = {op.shape for op in ops if op.kind == "gemm"}
    assert (4096, 28672, 4096) in gemms and (256, 4096, 14336) in gemms and len(gemms) == 8
    assert {op.shape for op in ops if op.kind == "gemv"} >= {(1, 6144, 4096), (16, 4096, 14336)}
    assert 64 * 1024 * 1024 in {op.numel for op in ops if op.kind == "silu_mul"}
    assert {op.shape for op in ops if op.kind == "rmsnorm"} == {(4096, 4096), (16384, 8192)}


def test_unknown_suite_is_an_op_error():
    with pytest.raises(OpError, match="unknown suite"):
        suite("llm2")


def test_recommended_cases_take_the_rankings_top_config_for_every_op():
    gpu = load_profile("h100-sxm").gpu
    ops = [op for _, op in suite("quick")]
    cases = recommended_cases(gpu, ops)
    assert [op for op, _ in cases] == ops
    assert {cfg.kernel for _, cfg in cases} >= {"silu_mul", "rmsnorm_single"}
