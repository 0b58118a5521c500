"""The compiled path on a real GPU: correct, timed, and labelled ``measured``."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                 reason="needs a CUDA GPU and compiled Triton")]

from autoopt.backend.runner import evaluate  # noqa: E402
from autoopt.hardware.profile import GPUProfile  # noqa: E402
from autoopt.kernels.config import KernelConfig  # noqa: E402
from autoopt.kernels.ops import OpSpec  # noqa: E402

# H100 SXM datasheet: 3.35 TB/s HBM3, 989 dense bf16 TFLOP/s (H200: 4.8 TB/s, same compute)
GPU = GPUProfile(name="test", cc_major=9, cc_minor=0, mem_bandwidth_gbs=4800.0,
                 peak_tflops={"bf16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0})

CASES = [
    (OpSpec(kind="gemm", shape=(1000, 1500, 2048), dtype="bf16"),
     dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, SPLIT_K=1, num_warps=8, num_stages=3), "gemm"),
    (OpSpec(kind="gemm", shape=(16, 4096, 4096), dtype="bf16"),
     dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, SPLIT_K=4, num_warps=4, num_stages=4), "gemm"),
    (OpSpec(kind="gemm", shape=(256, 1024, 2048), dtype="fp8"),
     dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, num_warps=4, num_stages=3), "gemm"),
    (OpSpec(kind="gemm", shape=(300, 1000, 512), dtype="fp16", layout="kn"),
     dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, SPLIT_K=2, num_warps=4, num_stages=3), "gemm"),
    (OpSpec(kind="gemm", shape=(512, 1024, 1024), dtype="fp32"),
     dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, SPLIT_K=1, num_warps=4, num_stages=3), "gemm"),
    (OpSpec(kind="gemv", shape=(1, 4096, 4096), dtype="bf16"),
     dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3), "gemv"),
    (OpSpec(kind="gemv", shape=(7, 4096, 4096), dtype="bf16"),
     dict(BLOCK_M=8, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=3), "gemv"),
    (OpSpec(kind="silu_mul", shape=(4096, 14336), dtype="bf16"), dict(BLOCK_SIZE=4096, num_warps=8), "silu_mul"),
    (OpSpec(kind="add", shape=(1, 10_000_000), dtype="fp32"), dict(BLOCK_SIZE=2048, num_warps=8), "add"),
    (OpSpec(kind="rmsnorm", shape=(4096, 4096), dtype="bf16"), dict(BLOCK_N=4096, num_warps=8), "rmsnorm_single"),
    (OpSpec(kind="rmsnorm", shape=(1000, 8000), dtype="bf16"), dict(BLOCK_N=2048, num_warps=8), "rmsnorm_looped"),
    (OpSpec(kind="layernorm", shape=(1000, 4000), dtype="fp16"), dict(BLOCK_N=4096, num_warps=8), "layernorm_single"),
    (OpSpec(kind="layernorm", shape=(1000, 8000), dtype="bf16"), dict(BLOCK_N=1024, num_warps=4), "layernorm_looped"),
    (OpSpec(kind="softmax", shape=(64, 1000), dtype="fp32"),
     dict(BLOCK_N=1024, ROWS_PER_PROGRAM=4, num_warps=4), "softmax_single"),
    (OpSpec(kind="softmax", shape=(1000, 32000), dtype="bf16"), dict(BLOCK_N=2048, num_warps=8), "softmax_looped"),
    (OpSpec(kind="rmsnorm", shape=(64, 262144), dtype="bf16"), dict(BLOCK_N=16384, SPLIT_N=16, num_warps=8),
     "rmsnorm_coop"),
]


@pytest.mark.parametrize("op,params,kernel", CASES, ids=[f"{c[2]}-{c[0].label()}" for c in CASES])
def test_compiled_kernel_is_measured(op: OpSpec, params: dict, kernel: str) -> None:
    res = evaluate(op, KernelConfig(kernel=kernel, params=params), gpu=GPU, warmup_ms=5, rep_ms=20)
    assert res.label == "measured", res.reason
    assert res.us > 0 and 0 < res.roofline_pct <= 103


@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemm_tma_is_measured_on_hopper(layout: str) -> None:
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs sm_90+")
    op = OpSpec(kind="gemm", shape=(1000, 2048, 1024), dtype="bf16", layout=layout)
    cfg = KernelConfig(kernel="gemm_tma", params=dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                                                      num_warps=8, num_stages=3))
    res = evaluate(op, cfg, gpu=GPU, warmup_ms=5, rep_ms=20)
    assert res.label == "measured", res.reason


def test_gemm_tma_is_rejected_without_tma() -> None:
    if torch.cuda.get_device_capability() >= (9, 0):
        pytest.skip("this GPU has TMA")
    cfg = KernelConfig(kernel="gemm_tma", params=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4))
    res = evaluate(OpSpec(kind="gemm", shape=(64, 64, 64), dtype="bf16"), cfg)
    assert res.label == "rejected" and "compute capability >= 9.0" in res.reason


def test_rmsnorm_coop_gives_the_same_bits_every_launch() -> None:
    # its programs meet at atomic counters: a missing barrier would show as a result that moves between runs
    from autoopt.backend import registry

    op = OpSpec(kind="rmsnorm", shape=(256, 131072), dtype="bf16")
    cfg = KernelConfig(kernel="rmsnorm_coop", params=dict(BLOCK_N=8192, SPLIT_N=16, num_warps=4))
    inputs = registry.make_inputs(op, "cuda", seed=11)
    out = registry.alloc_out(op, "cuda")
    run = registry.prepare(inputs, cfg, out, op)
    run()
    first = out.clone()
    for _ in range(20):
        out.fill_(float("nan"))
        run()
        assert torch.equal(out, first)
