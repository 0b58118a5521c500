"""The compile-ahead pool: off where nothing compiles, and queues each config once."""

from __future__ import annotations

from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.tuning import precompile
from autoopt.tuning.precompile import Precompiler, default_precompiler

OP = OpSpec(kind="gemm", shape=(64, 64, 64))
CFG = KernelConfig(kernel="gemm", params={"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8,
                                          "SPLIT_K": 1, "num_warps": 4, "num_stages": 2})


def test_no_pool_without_a_cuda_gpu_or_under_the_interpreter():
    assert default_precompiler() is None  # CI: CPU only, TRITON_INTERPRET=1


class _Executor:
    def __init__(self):
        self.jobs = []

    def submit(self, fn, *args):
        from concurrent.futures import Future

        self.jobs.append((fn, args))
        f = Future()
        f.set_result(None)
        return f


def test_each_config_of_an_op_is_queued_once(monkeypatch):
    pool = Precompiler(workers=1)
    fake = _Executor()
    monkeypatch.setattr(pool, "_executor", lambda: fake)
    assert pool.submit(OP, [CFG, CFG]) == 1
    assert pool.submit(OP, [CFG]) == 0
    assert pool.submit(OpSpec(kind="gemm", shape=(128, 64, 64)), [CFG]) == 1
    assert [args[1]["config"] for _, args in fake.jobs] == [dict(CFG.params)] * 2 and pool.failures() == []


def test_a_failed_compile_is_a_reason_not_an_exception():
    # here it fails at the first CUDA allocation; on a GPU the unknown kernel is named instead
    bad = KernelConfig(kernel="no-such-kernel", params={"BLOCK_M": 16})
    reason = precompile._compile(OP.to_dict(), bad.to_dict())
    assert isinstance(reason, str) and ("no-such-kernel" in reason or "CUDA" in reason)


def test_the_pool_is_half_the_cores_at_most_eight_unless_autoopt_precompile_workers_says(monkeypatch):
    monkeypatch.delenv("AUTOOPT_PRECOMPILE_WORKERS", raising=False)
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 64)
    assert Precompiler().workers == 8
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 6)
    assert Precompiler().workers == 3
    monkeypatch.setenv("AUTOOPT_PRECOMPILE_WORKERS", "24")
    assert Precompiler().workers == 24
    monkeypatch.setenv("AUTOOPT_PRECOMPILE_WORKERS", "lots")  # not a positive integer: the default
    assert Precompiler().workers == 3
