"""``@autoopt.autotune``: triton.autotune's drop-in that ranks the configs and times only the top k.

On a machine without CUDA the kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``,
set by tests/conftest.py, and here too, before triton is first imported). Timings come from a
``do_bench=`` override that counts its calls (interpreted times mean nothing), so "timed" below
means "handed to do_bench". Shapes are tiny: the interpreter runs every program in Python. Dots use
fp16/fp32 only (the interpreter's bf16 ``tl.dot`` is wrong in triton 3.9). The GPU comparison with
``triton.autotune`` is ``benchmarks/autotune_vs_triton.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import autoopt  # noqa: E402
from autoopt._paths import builtin_templates  # noqa: E402
from autoopt.errors import AutooptError, ConfigError  # noqa: E402
from autoopt.hardware.library import load_profile  # noqa: E402
from autoopt.hardware.profile import HardwareProfile  # noqa: E402
from autoopt.kernels.config import KernelConfig  # noqa: E402
from autoopt.kernels.ops import OpSpec  # noqa: E402
from autoopt.search.ranking import predict_config  # noqa: E402
from autoopt.tuning.autotune import TOP_K  # noqa: E402
from autoopt.tuning.config_ranking import generic_cost, rank_configs  # noqa: E402
from autoopt.tuning.winners import JsonWinnerStore, winner_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import tutorial_matmul as tm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROFILE = "h100-sxm"  # rankings are computed for this GPU whatever runs the kernels


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test writes the user's cache (store=True resolves under AUTOOPT_CACHE_DIR)."""
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", str(tmp_path / "cache"))


class Bench:
    """A do_bench that counts its calls, runs the kernel once, and makes later configs slower."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn: Any, quantiles: Any = None) -> list[float]:
        self.calls += 1
        fn()
        return [float(self.calls), 0.0, 0.0]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    tl.static_assert(BLOCK_SIZE <= 256, "BLOCK_SIZE must be <= 256 for this kernel")
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def wrong_at_64_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    if BLOCK_SIZE == 64:  # a config with a bug: subtracts
        tl.store(out_ptr + offs, x - y, mask=mask)
    else:
        tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def accumulate_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    acc = tl.load(out_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, acc + tl.load(x_ptr + offs, mask=mask), mask=mask)


def configs(*blocks: int, warps: tuple[int, ...] = (4,)) -> list[Any]:
    return [triton.Config({"BLOCK_SIZE": b}, num_warps=w) for b in blocks for w in warps]


def grid(n: int) -> Any:
    return lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)


def vectors(n: int) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g).to(DEVICE)
    y = torch.randn(n, generator=g).to(DEVICE)
    return x, y, torch.empty_like(x)


def add(kernel: Any, n: int) -> tuple[Any, Any, Any]:
    x, y, out = vectors(n)
    kernel[grid(n)](x, y, out, n)
    return x, y, out


# -- generic kernels -------------------------------------------------------------------------------

def test_vector_add_is_correct_and_only_top_k_configs_are_timed() -> None:
    bench = Bench()
    kernel = autoopt.autotune(configs=configs(32, 64, 128, 256, warps=(1, 2, 4)), key=["n"], do_bench=bench,
                              top_k=3, profile=PROFILE, store=False)(add_kernel)
    x, y, out = add(kernel, 3000)
    assert torch.allclose(out, x + y)
    t = kernel.last_tuning
    assert bench.calls == 3 and len(t.timed) == 3 and not t.skipped
    assert t.model == "generic" and len(t.ranked) == 12 and not t.from_store
    assert [r.index for r in t.ranked[:3]] == [tm.index for tm in t.timed]  # timed in rank order
    assert kernel.best_config is kernel.configs[t.chosen_index]
    assert len(kernel.cache) == 1 and len(kernel.configs_timings) == 3


def test_default_top_k_is_four_and_prune_configs_by_top_k_is_honoured() -> None:
    bench = Bench()
    kernel = autoopt.autotune(configs=configs(16, 32, 64, 128, 256), key=["n"], do_bench=bench, profile=PROFILE,
                              store=False)(add_kernel)
    add(kernel, 1000)
    assert bench.calls == TOP_K == 4
    bench2 = Bench()
    kernel2 = autoopt.autotune(configs=configs(16, 32, 64, 128, 256), key=["n"], do_bench=bench2, profile=PROFILE,
                               prune_configs_by={"top_k": 2}, store=False)(add_kernel)
    add(kernel2, 1000)
    assert bench2.calls == 2


def test_a_config_that_fails_to_compile_is_skipped_with_its_reason_and_replaced() -> None:
    bench = Bench()
    # the user's perf_model puts the largest blocks first: 1024 and 512 break the kernel's static_assert
    kernel = autoopt.autotune(configs=configs(64, 128, 256, 512, 1024), key=["n"], do_bench=bench, top_k=2,
                              prune_configs_by={"perf_model": lambda **kw: -kw["BLOCK_SIZE"]},
                              profile=PROFILE, store=False)(add_kernel)
    x, y, out = add(kernel, 2000)
    assert torch.allclose(out, x + y)
    t = kernel.last_tuning
    assert t.model == "perf_model"
    assert [s.label.split()[0] for s in t.skipped] == ["BLOCK_SIZE=1024", "BLOCK_SIZE=512"]
    assert all("BLOCK_SIZE must be <= 256" in s.reason for s in t.skipped)
    assert [tm.label.split()[0] for tm in t.timed] == ["BLOCK_SIZE=256", "BLOCK_SIZE=128"]
    assert bench.calls == 2  # failures never reach do_bench and do not use up top_k


def test_every_config_failing_raises_a_config_error_with_the_reasons() -> None:
    kernel = autoopt.autotune(configs=configs(512, 1024), key=["n"], do_bench=Bench(), profile=PROFILE,
                              store=False)(add_kernel)
    with pytest.raises(ConfigError, match=r"no config ran.*BLOCK_SIZE must be <= 256"):
        add(kernel, 1000)


def test_a_new_key_tunes_again_and_a_seen_key_does_not() -> None:
    bench = Bench()
    kernel = autoopt.autotune(configs=configs(32, 64, 128), key=["n"], do_bench=bench, top_k=2, profile=PROFILE,
                              store=False)(add_kernel)
    add(kernel, 1000)
    add(kernel, 2000)
    assert bench.calls == 4 and len(kernel.cache) == 2
    first = kernel.last_tuning
    x, y, out = add(kernel, 1000)
    assert bench.calls == 4 and kernel.last_tuning is first and torch.allclose(out, x + y)
    x16, y16, out16 = (v.half() for v in vectors(1000))
    kernel[grid(1000)](x16, y16, out16, 1000)  # same n, new dtype: a new key, as in Triton
    assert bench.calls == 6 and len(kernel.cache) == 3


def test_reference_check_rejects_a_wrong_config_before_it_is_timed() -> None:
    bench = Bench()
    kernel = autoopt.autotune(configs=configs(32, 64, 128), key=["n"], do_bench=bench, top_k=3, profile=PROFILE,
                              store=False, reference=lambda x, y, out, n: x + y, check="out_ptr")(wrong_at_64_kernel)
    x, y, out = add(kernel, 1000)
    t = kernel.last_tuning
    assert [s.label.split()[0] for s in t.skipped] == ["BLOCK_SIZE=64"]
    assert "wrong output: out_ptr differs" in t.skipped[0].reason
    assert bench.calls == 2 and "BLOCK_SIZE=64" not in t.chosen
    assert torch.allclose(out, x + y)


def test_reset_to_zero_and_config_pre_hooks_behave_as_in_triton() -> None:
    seen: list[int] = []
    cfgs = [triton.Config({"BLOCK_SIZE": b}, num_warps=4, pre_hook=lambda nargs, b=b: seen.append(b))
            for b in (32, 64, 128)]
    kernel = autoopt.autotune(configs=cfgs, key=["n"], do_bench=Bench(), reset_to_zero=["out_ptr"],
                              profile=PROFILE, store=False)(accumulate_kernel)
    n = 500
    x, out = torch.randn(n).to(DEVICE), torch.zeros(n).to(DEVICE)
    kernel[grid(n)](x, out, n)
    # every tuning run started from zero and the real launch after tuning added x once
    assert torch.allclose(out, x)
    assert set(seen) == {32, 64, 128} and seen[-1] == int(kernel.best_config.kwargs["BLOCK_SIZE"])


def test_restore_value_restores_inputs_after_each_tuning_run() -> None:
    kernel = autoopt.autotune(configs=configs(32, 64), key=["n"], do_bench=Bench(), restore_value=["out_ptr"],
                              profile=PROFILE, store=False)(accumulate_kernel)
    n = 300
    x, out = torch.randn(n).to(DEVICE), torch.ones(n).to(DEVICE)
    kernel[grid(n)](x, out, n)
    assert torch.allclose(out, 1 + x)


def test_without_a_gpu_profile_every_config_is_timed_in_the_given_order() -> None:
    bench = Bench()
    kernel = autoopt.autotune(configs=configs(32, 64, 128, 256, 16), key=["n"], do_bench=bench,
                              profile=HardwareProfile(name="cpu-only"), store=False)(add_kernel)
    add(kernel, 700)
    assert kernel.last_tuning.model == "none" and bench.calls == 5
    assert [t.index for t in kernel.last_tuning.timed] == [0, 1, 2, 3, 4]


# -- persistence ---------------------------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, os, sys
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, sys.argv[2])
    import torch, triton, triton.language as tl
    import autoopt

    calls = []
    def bench(fn, quantiles=None):
        calls.append(1)
        fn()
        return [float(len(calls)), 0.0, 0.0]

    @autoopt.autotune(configs=[triton.Config({"BLOCK_SIZE": b}, num_warps=w) for b in (32, 64, 128) for w in (1, 4)],
                      key=["n"], do_bench=bench, top_k=3, profile="h100-sxm", store=sys.argv[1])
    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    n = 999
    x, y = torch.randn(n), torch.randn(n)
    out = torch.empty_like(x)
    add[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n)
    t = add.last_tuning
    print(json.dumps({"calls": len(calls), "from_store": t.from_store, "chosen": t.chosen,
                      "ok": bool(torch.allclose(out, x + y))}))
""")


def _child(store: Path) -> dict[str, Any]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(store), str(ROOT)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_winner_is_persisted_and_a_second_process_times_nothing(tmp_path: Path) -> None:
    store = tmp_path / "winners.json"
    first = _child(store)
    assert first["calls"] == 3 and not first["from_store"] and first["ok"]
    assert len(json.loads(store.read_text())) == 1
    second = _child(store)
    assert second == {**first, "calls": 0, "from_store": True}


def test_a_stored_winner_is_found_in_process_and_misses_when_the_configs_change(tmp_path: Path) -> None:
    store = JsonWinnerStore(tmp_path / "w.json")

    def tuned(blocks: tuple[int, ...], bench: Bench) -> Any:
        kernel = autoopt.autotune(configs=configs(*blocks), key=["n"], do_bench=bench, top_k=2, profile=PROFILE,
                                  store=store)(add_kernel)
        add(kernel, 800)
        return kernel

    a, b, c = Bench(), Bench(), Bench()
    first = tuned((32, 64, 128), a)
    again = tuned((32, 64, 128), b)
    assert a.calls == 2 and b.calls == 0 and again.last_tuning.from_store
    assert again.best_config.kwargs == first.best_config.kwargs
    tuned((32, 64, 128, 256), c)  # a new config list may hold a faster config: tuned again
    assert c.calls == 2


def test_json_store_survives_a_corrupt_file_and_writes_atomically(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "w.json"
    path.parent.mkdir()
    path.write_text("{not json")
    store = JsonWinnerStore(path)
    assert store.get("k") is None
    store.put("k", {"config": {"kwargs": {"BLOCK_SIZE": 64}}, "us": 1.0})
    assert store.get("k")["us"] == 1.0
    assert [p.name for p in path.parent.iterdir()] == ["w.json"]  # no temporary file left behind


def test_winner_key_depends_on_source_key_device_triton_and_configs() -> None:
    base = dict(kernel="k", source="src", key=(512, "torch.float16"), device="abc", triton="3.6.0",
                configs=["BLOCK_SIZE=64"])
    ref = winner_key(**base)  # type: ignore[arg-type]
    for field, value in (("source", "src2"), ("key", (512.0, "torch.float16")), ("device", "def"),
                         ("triton", "3.9.0"), ("configs", ["BLOCK_SIZE=128"])):
        assert winner_key(**{**base, field: value}) != ref, field  # type: ignore[arg-type]


# -- the matmul: autoopt's gemm model ----------------------------------------------------------------

def _gemm_config(gpu: Any, cfg: Any) -> KernelConfig:
    builtin_templates()  # autoopt.templates without an install (PYTHONPATH=.)
    from autoopt.templates.gemm import matmul_path

    kw = cfg.kwargs
    return KernelConfig(kernel="gemm", template="gemm", path=matmul_path(gpu, kw["BLOCK_SIZE_M"], cfg.num_warps),
                        params={"BLOCK_M": kw["BLOCK_SIZE_M"], "BLOCK_N": kw["BLOCK_SIZE_N"],
                                "BLOCK_K": kw["BLOCK_SIZE_K"], "GROUP_M": kw["GROUP_SIZE_M"], "SPLIT_K": 1,
                                "num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def _matmul_args(m: int, n: int, k: int, dtype: Any) -> tuple[Any, ...]:
    a = torch.randn(m, k, dtype=dtype).to(DEVICE)
    b = torch.randn(k, n, dtype=dtype).to(DEVICE)
    c = torch.empty(m, n, dtype=torch.float16, device=DEVICE)
    return a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1)


@pytest.mark.parametrize("shape", [(512, 512, 512), (4096, 4096, 4096), (256, 6144, 4096)])
def test_matmul_is_ranked_by_the_gemm_model_in_predict_config_order(shape: tuple[int, int, int]) -> None:
    kernel = tm.autotuned(autoopt.autotune, profile=PROFILE, store=False)
    ranking = kernel.rank(*_matmul_args(*shape, torch.float16), ACTIVATION="")  # ranks only: no kernel runs
    gpu = load_profile(PROFILE).gpu
    op = OpSpec(kind="gemm", shape=shape, dtype="fp16", layout="kn")
    predicted = {}
    for i, cfg in enumerate(kernel.configs):
        with contextlib.suppress(ConfigError):  # rejected by autoopt's rules
            predicted[i] = predict_config(gpu, op, _gemm_config(gpu, cfg)).us
    assert ranking.model == "gemm" and ranking.op == op.label()
    valid = [r for r in ranking.order if r.model == "gemm"]
    assert [r.index for r in valid] == sorted(predicted, key=lambda i: (predicted[i], i))
    assert [r.score for r in valid] == pytest.approx([predicted[r.index] for r in valid])
    # configs autoopt's rules reject (here: shared memory over the H100's 227 KB) come after every valid one
    rejected = [r for r in ranking.order if not r.valid]
    assert ranking.order[: len(valid)] == tuple(valid) and len(valid) + len(rejected) == 16
    assert all("gemm model rejects it" in r.reason for r in rejected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_tutorial_matmul_tunes_at_a_tiny_shape_and_is_correct(dtype: Any) -> None:
    bench = Bench()
    kernel = tm.autotuned(autoopt.autotune, do_bench=bench, profile=PROFILE, store=False, top_k=2,
                          reference=lambda a, b, c, *rest, **kw: (a.float() @ b.float()).half(), check="c_ptr",
                          atol=3e-2)
    m, n, k = 32, 48, 40
    a, b = torch.randn(m, k, dtype=dtype).to(DEVICE), torch.randn(k, n, dtype=dtype).to(DEVICE)
    c = tm.matmul(kernel, a, b)
    assert torch.allclose(c.float(), a.float() @ b.float(), atol=3e-2, rtol=1e-2)
    t = kernel.last_tuning
    assert t.model == "gemm" and bench.calls == 2 and not t.skipped
    assert t.op == f"gemm[32x48x40] {'fp16' if dtype == torch.float16 else 'fp32'}"


def test_gemv_and_row_reduction_kernels_are_ranked_by_their_templates() -> None:
    gpu = load_profile(PROFILE).gpu
    x = torch.empty(4, dtype=torch.float16)
    gemv = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=4, num_stages=s)
            for n in (64, 128) for k in (128, 256) for s in (1, 3)]
    ranking = rank_configs(gemv, {"x_ptr": x, "M": 1, "N": 4096, "K": 4096}, gpu=gpu, kernel="gemv_kernel",
                           key_names=["M", "N", "K"])
    assert ranking.model == "gemv" and ranking.op == "gemv[1x4096x4096] fp16"
    assert ranking.order[0].model == "gemv" and ranking.order[0].score is not None
    rows = [triton.Config({"BLOCK_SIZE": b}, num_warps=w) for b in (1024, 4096, 8192) for w in (4, 8)]
    ranking = rank_configs(rows, {"x_ptr": x, "n_rows": 4096, "n_cols": 4096}, gpu=gpu, kernel="softmax_kernel",
                           key_names=["n_cols"])
    assert ranking.model == "norm" and ranking.op == "softmax[4096x4096] fp16"
    # BLOCK_SIZE=4096 holds the row (single pass), 1024 loops over it, 8192 is mostly padding
    assert [r.label.split()[0] for r in ranking.order[:2]] == ["BLOCK_SIZE=4096"] * 2
    assert all(r.label.startswith("BLOCK_SIZE=8192") and not r.valid for r in ranking.order[-2:])


def test_generic_model_rejects_a_config_over_shared_memory_and_prefers_full_waves() -> None:
    gpu = load_profile(PROFILE).gpu
    args = {"M": 4096, "N": 4096, "K": 4096}
    big = triton.Config({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128}, num_warps=8, num_stages=4)
    score, why = generic_cost(big, args, ["M", "N", "K"], gpu, 2.0)
    assert score is None and "smem" in why
    # 1M elements: 1024-element programs are bandwidth-bound (a tie: kept in the given order); 64-element
    # ones are latency-bound (16k programs, too few in flight), worse with 4 warps (fewer fit an SM)
    order = rank_configs(configs(64, 1024, warps=(1, 4)), {"n_elements": 1 << 20}, gpu=gpu, kernel="add",
                         key_names=["n_elements"]).order
    assert [r.label.removesuffix(" num_stages=3") for r in order] == [
        "BLOCK_SIZE=1024 num_warps=1", "BLOCK_SIZE=1024 num_warps=4", "BLOCK_SIZE=64 num_warps=1",
        "BLOCK_SIZE=64 num_warps=4"]


# -- arguments ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(configs=[], key=["n"]), "non-empty list of triton.Config"),
    (dict(configs=configs(32), key="n"), "key must be a list of kernel argument names"),
    (dict(configs=configs(32), key=["n"], top_k=0), "top_k must be >= 1"),
    (dict(configs=configs(32), key=["n"], top_k=2.5), "top_k must be a positive integer"),
    (dict(configs=configs(32), key=["n"], prune_configs_by={"topk": 2}), "unknown keys \\['topk'\\]"),
    (dict(configs=configs(32), key=["n"], reference=lambda *a: a[0]), "needs check="),
    (dict(configs=[{"BLOCK_SIZE": 32}], key=["n"]), "must be triton.Config objects"),
])
def test_bad_decorator_arguments_raise_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        autoopt.autotune(**kwargs)
    assert isinstance(err.value, AutooptError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("kwargs, name", [
    (dict(key=["n_elements"]), "key names 'n_elements'"),
    (dict(key=["n"], reset_to_zero=["out"]), "reset_to_zero names 'out'"),
    (dict(key=["n"], restore_value=["x"]), "restore_value names 'x'"),
    (dict(key=["n"], reference=lambda *a: a[0], check="output"), "check names 'output'"),
])
def test_an_unknown_argument_name_is_refused_with_the_kernels_arguments(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}, which is not an argument of the kernel; its arguments are "
                                          "x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE"):
        autoopt.autotune(configs=configs(32), **kwargs)(add_kernel)


def test_autotune_is_public_and_lazy() -> None:
    assert "autotune" in autoopt.__all__
    assert autoopt.autotune is sys.modules["autoopt.tuning.autotune"].autotune


def test_a_winners_path_that_is_a_fifo_or_huge_is_ignored_without_reading_it(tmp_path):
    import os

    from autoopt.tuning.winners import MAX_FILE_BYTES, JsonWinnerStore

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert JsonWinnerStore(fifo).get("k") is None
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    assert JsonWinnerStore(huge).get("k") is None
