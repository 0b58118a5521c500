"""runner.evaluate's contract: reject before launch, poison and check, predict without a GPU.

Kernels run under Triton's CPU interpreter here (tests/conftest.py switches it
on when the machine has no NVIDIA device); the launch is replaced by
deliberately faulty ones to prove the checks catch them.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from autoopt.backend import bench, registry, runner  # noqa: E402
from autoopt.backend.runner import Result, evaluate, floor_us  # noqa: E402
from autoopt.errors import BackendError  # noqa: E402
from autoopt.hardware.profile import GPUProfile  # noqa: E402
from autoopt.kernels.config import KernelConfig  # noqa: E402
from autoopt.kernels.ops import OpSpec  # noqa: E402

OP = OpSpec(kind="add", shape=(4, 64), dtype="fp32")
CFG = KernelConfig(kernel="add", params=dict(BLOCK_SIZE=128, num_warps=4))
H100 = GPUProfile(name="H100", cc_major=9, cc_minor=0, mem_bandwidth_gbs=3350.0,
                  peak_tflops={"bf16": 989.0, "fp32": 67.0, "tf32": 494.0})


def fake_prepare(write):
    """A stand-in for registry.prepare whose launch writes ``write(out, ref)``."""
    def prepare(inputs, config, out, op=None):
        ref = registry.reference(inputs, op)

        def run():
            write(out, ref)
        return run
    return prepare


def test_validate_rejection_never_launches(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(registry, "prepare", lambda *a, **k: calls.append(a))
    res = evaluate(OP, CFG, validate=lambda op, cfg: ["BLOCK_SIZE too small", "smem over limit"])
    assert res.label == "rejected"
    assert res.reason == "BLOCK_SIZE too small; smem over limit"
    assert calls == []


def test_kernel_that_cannot_serve_the_op_is_rejected_before_launch(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(registry, "prepare", lambda *a, **k: calls.append(a))
    res = evaluate(OP, KernelConfig(kernel="gemv", params=dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=16)))
    assert res.label == "rejected" and res.reason == "kernel 'gemv' serves gemv, not 'add'"
    assert calls == []


def test_valid_config_is_checked_with_its_error() -> None:
    res = evaluate(OP, CFG, validate=lambda op, cfg: [])
    assert res.label in ("checked", "measured")
    assert res.rel_err is not None and res.rel_err < 1e-6


def test_poison_catches_a_kernel_that_writes_half_the_output(monkeypatch) -> None:
    def half(out, ref):
        flat, src = out.view(-1), ref.reshape(-1)
        flat[: flat.numel() // 2] = src[: flat.numel() // 2].to(out.dtype)
    monkeypatch.setattr(registry, "prepare", fake_prepare(half))
    res = evaluate(OP, CFG)
    assert res.label == "rejected"
    assert res.reason.startswith("128 of 256 output elements are NaN/inf")


def test_a_single_nan_never_passes(monkeypatch) -> None:
    def one_nan(out, ref):
        out.copy_(ref.to(out.dtype))
        out[3, 17] = float("nan")
    monkeypatch.setattr(registry, "prepare", fake_prepare(one_nan))
    res = evaluate(OP, CFG)
    assert res.label == "rejected" and res.reason.startswith("1 of 256")


def test_wrong_values_are_rejected_with_the_error(monkeypatch) -> None:
    monkeypatch.setattr(registry, "prepare", fake_prepare(lambda out, ref: out.copy_((ref * 1.01).to(out.dtype))))
    res = evaluate(OP, CFG)
    assert res.label == "rejected"
    assert res.rel_err == pytest.approx(0.01, rel=1e-3)
    assert "relative error 0.01 > 0.0001" in res.reason


def test_launch_error_is_a_rejection_not_a_crash(monkeypatch) -> None:
    def boom(inputs, config, out, op=None):
        raise RuntimeError("PTX assembly failed")
    monkeypatch.setattr(registry, "prepare", boom)
    res = evaluate(OP, CFG)
    assert res.label == "rejected" and "RuntimeError: PTX assembly failed" in res.reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_gpu_or_interpreter_the_answer_is_predicted_and_nothing_runs(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    calls = []
    monkeypatch.setattr(registry, "prepare", lambda *a, **k: calls.append(a))
    res = evaluate(OP, CFG, gpu=H100, predict=lambda op, cfg: 2.0)
    assert res.label == "predicted" and res.us == 2.0
    assert res.gbs == pytest.approx(OP.min_bytes / 2e-6 / 1e9)
    assert calls == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_gpu_and_cost_model_no_time_is_invented(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    res = evaluate(OP, CFG)
    assert res.label == "predicted" and res.us is None and "no cost model" in res.reason


def test_floor_is_the_larger_of_compute_and_memory_time() -> None:
    gemm = OpSpec(kind="gemm", shape=(4096, 4096, 4096), dtype="bf16")
    # 2*4096^3 FLOP at 989 TFLOP/s = 138.97 us; 3*4096^2*2 B at 3350 GB/s = 30.05 us
    assert floor_us(gemm, H100) == pytest.approx(2 * 4096 ** 3 / 989e12 * 1e6)
    rms = OpSpec(kind="rmsnorm", shape=(4096, 4096), dtype="bf16")
    assert floor_us(rms, H100) == pytest.approx(rms.min_bytes / 3350e9 * 1e6)
    assert floor_us(rms, None) is None


def test_fp32_matmul_floor_uses_the_tf32_peak() -> None:
    op = OpSpec(kind="gemm", shape=(4096, 4096, 4096), dtype="fp32")
    assert floor_us(op, H100) == pytest.approx(op.flops / 494e12 * 1e6)


def test_result_round_trips_through_dict() -> None:
    res = Result(op=OP, config=CFG, label="measured", us=12.5, tflops=0.1, gbs=2000.0, roofline_pct=71.2,
                 rel_err=1.5e-7, device="NVIDIA H100", versions={"triton": "3.6.0"})
    again = Result.from_dict(res.to_dict())
    assert again == res


def test_tolerance_by_dtype_and_tf32_matmul() -> None:
    assert registry.tolerance(OpSpec(kind="add", shape=(4, 4), dtype="fp32")) == 1e-4
    assert registry.tolerance(OpSpec(kind="gemm", shape=(4, 4, 4), dtype="fp32")) == 5e-3
    assert registry.tolerance(OpSpec(kind="gemm", shape=(4, 4, 4), dtype="bf16")) == 1.5e-2
    assert registry.tolerance(OpSpec(kind="gemm", shape=(4, 4, 4), dtype="fp8")) == 6e-2


def test_inputs_are_random_and_seeded() -> None:
    op = OpSpec(kind="gemm", shape=(8, 16, 32), dtype="fp16", layout="kn")
    a, b, c = (registry.make_inputs(op, "cpu", s) for s in (0, 0, 1))
    assert set(a) == {"a", "w_kn"} and a["w_kn"].shape == (32, 16)
    assert torch.equal(a["a"], b["a"]) and not torch.equal(a["a"], c["a"])
    assert int((a["a"] == 0).sum()) == 0


def test_run_bench_reports_one_row_per_case_in_order() -> None:
    other = KernelConfig(kernel="add", params=dict(BLOCK_SIZE=64, num_warps=2))
    rows = bench.run_bench([(OP, CFG), (OP, other)], H100, progress=False)
    assert [r.config for r in rows] == [CFG, other]
    if torch.cuda.is_available():  # PyTorch timed beside ours, same timer
        assert all(r.torch_us > 0 and r.ratio == pytest.approx(r.torch_us / r.result.us) for r in rows)
    else:  # nothing is ever timed on a CPU
        assert all(r.torch_us is None and r.ratio is None for r in rows)
    table = bench.format_table(rows)
    assert "4x64" in table and "BLOCK_SIZE=64" in table


def test_torch_is_timed_once_per_op_for_all_its_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[OpSpec] = []
    monkeypatch.setattr(bench, "_TORCH_US", {})
    monkeypatch.setattr(bench, "_time_torch", lambda op, *a: timed.append(op) or 12.5)
    other = OpSpec(kind="add", shape=(4, 128), dtype="fp32")
    got = [bench._torch_us(op, 0, 25, 100) for op in (OP, OP, other, OP)]
    assert got == [12.5] * 4 and timed == [OP, other]
    assert bench._torch_us(OP, 1, 25, 100) == 12.5 and len(timed) == 3  # another seed: other tensors


def test_roofline_png_needs_timed_rows(tmp_path) -> None:
    from autoopt.backend.plot import roofline_png

    with pytest.raises(BackendError, match=r"no row has a time|needs matplotlib"):
        roofline_png([], H100, tmp_path / "r.png")


def test_roofline_png_writes_an_image(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from autoopt.backend.plot import roofline_png

    res = Result(op=OpSpec(kind="gemm", shape=(256, 4096, 4096), dtype="bf16"), config=CFG, label="measured",
                 us=40.0, tflops=214.7, gbs=950.0, roofline_pct=30.0)
    unmeasured = Result(op=res.op, config=CFG, label="measured")  # no time: left out, not an error
    path = roofline_png([res, unmeasured], H100, tmp_path / "r.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert int.from_bytes(data[16:20], "big") == 1440 and int.from_bytes(data[20:24], "big") == 1080


def test_gemm_tma_refuses_gpus_without_tma() -> None:
    from autoopt.backend.kernels.gemm_tma import tma_support

    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        assert "compute capability >= 9.0" in tma_support("cuda")
    assert tma_support("cpu") is None  # the interpreter emulates descriptors


def test_cache_keeps_the_last_four_ops_least_recently_used_out_first() -> None:
    runner._CACHE.clear()
    for n in (16, 32, 48, 64, 16, 80):  # 16 is used again, so 32 is the oldest when 80 comes
        evaluate(OpSpec(kind="add", shape=(2, n), dtype="fp32"), CFG)
    assert [k[1] for k in runner._CACHE] == [(2, 48), (2, 64), (2, 16), (2, 80)]


def test_phase_clock_counts_a_set_up_for_a_new_op_and_none_for_another_config_of_it() -> None:
    runner._CACHE.clear()
    op = OpSpec(kind="add", shape=(2, 96), dtype="fp32")
    before = runner.phase_seconds()
    evaluate(op, CFG)
    first = runner.phase_seconds()
    evaluate(op, KernelConfig(kernel="add", params=dict(BLOCK_SIZE=64, num_warps=4)))
    second = runner.phase_seconds()
    assert first["setups"] - before.get("setups", 0.0) == 1 and second["setups"] == first["setups"]
    for phase in ("setup", "bind", "first", "check"):  # the interpreter neither copies nor times
        assert second[phase] > first[phase] - 1e-9 and first[phase] > before.get(phase, 0.0)
    assert set(second) <= {*runner.PHASES, "setups"}


def test_cache_over_its_byte_budget_keeps_only_the_newest_op(monkeypatch: pytest.MonkeyPatch) -> None:
    runner._CACHE.clear()
    monkeypatch.setattr(runner, "CACHE_MAX_BYTES", 3 * 2 * 64 * 4)  # one (2, 64) fp32 add's x, y and ref
    for n in (64, 64 + 1):
        evaluate(OpSpec(kind="add", shape=(2, n), dtype="fp32"), CFG)
    assert [k[1] for k in runner._CACHE] == [(2, 65)]


def test_a_many_launch_kernel_is_timed_from_a_cuda_graph_and_the_rest_per_call(monkeypatch) -> None:
    import triton.testing

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: 0.5)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", lambda fn, **kw: 0.07)
    assert registry.KERNELS["fused_moe"].graph_timed and not registry.KERNELS["gemm"].graph_timed
    assert runner._time_us(lambda: None, registry.KERNELS["fused_moe"].graph_timed, 25, 100) == pytest.approx(70.0)
    assert runner._time_us(lambda: None, registry.KERNELS["gemm"].graph_timed, 25, 100) == pytest.approx(500.0)


def test_a_decode_gemv_is_timed_from_a_graph_over_copies_and_the_fused_moe_over_one():
    assert registry.KERNELS["quant_gemv"].graph_timed and registry.KERNELS["quant_gemv"].rotate_inputs
    assert registry.KERNELS["fused_moe"].graph_timed and not registry.KERNELS["fused_moe"].rotate_inputs


@pytest.mark.parametrize("nbytes,l2,copies", [
    (8_650_752, 50 << 20, 19),        # Llama-3-8B o at int4 (+ x): 3 x 50 MiB over 8.65 MB
    (60_817_408, 50 << 20, 3),        # gate_up
    (1 << 30, 50 << 20, 1),           # a weight past the L2 already
    (8_650_752, None, 19),            # no L2 in the profile: 50 MiB assumed
    (100 << 20, 10 << 30, 40),        # copies capped by bytes (4 GiB together)
    (1 << 10, 50 << 20, 64),          # and by count
])
def test_rotation_takes_copies_past_three_l2s_within_its_caps(nbytes, l2, copies):
    assert runner.rotation_copies(nbytes, l2) == copies


def test_the_rotated_launchers_each_write_the_right_result_in_turn(monkeypatch):
    # the quant GEMV bound to copies of its inputs, called through the cycling launcher (interpreter on a CPU)
    op = OpSpec(kind="gemv", shape=(1, 64, 256), dtype="fp16", weight="int4")
    cfg = KernelConfig(kernel="quant_gemv", params=dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=128, SPLIT_K=1,
                                                      num_warps=2, num_stages=2))
    inputs = registry.make_inputs(op, "cpu", 0)
    ref = registry.reference(inputs, op).float()
    outs = []
    alloc = registry.alloc_out
    monkeypatch.setattr(registry, "alloc_out", lambda *a: outs.append(alloc(*a).fill_(float("nan"))) or outs[-1])
    gpu = GPUProfile(name="tiny-L2", cc_major=9, cc_minor=0, l2_bytes=64 << 10)
    launchers = runner._launchers_on_copies(op, cfg, inputs, "cpu", gpu)
    n = runner.rotation_copies(runner._tensor_bytes(*inputs.values()), gpu.l2_bytes)
    assert len(launchers) == len(outs) == n - 1 >= 1
    calls = []
    cycle = runner.cycling([lambda: calls.append("first"), *launchers])
    for _ in range(n):
        cycle()
    assert calls == ["first"]  # each copy's launcher ran once in between
    for out in outs:
        assert float((out.float() - ref).norm() / ref.norm()) < registry.tolerance(op)
