"""Every backend kernel computes the right answer, through runner.evaluate (the GPU's own path).

On a machine without CUDA the kernels run under Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set here before any kernel module is imported; Triton
reads it when a ``@triton.jit`` function is decorated). With CUDA the same tests
run compiled. Shapes are tiny and ragged on purpose (M=3, N=50, K=40). Dots use
fp16/fp32 only: the interpreter's bf16 ``tl.dot`` is wrong in triton 3.9.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if not torch.cuda.is_available():
    # before triton's first import (tests/conftest.py normally did it already)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from autoopt.backend import registry  # noqa: E402
from autoopt.backend.runner import evaluate  # noqa: E402
from autoopt.kernels.config import KernelConfig  # noqa: E402
from autoopt.kernels.ops import OpSpec  # noqa: E402

OK = ("checked", "measured")


def gemm_cfg(kernel: str = "gemm", **kw: int) -> KernelConfig:
    params = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, SPLIT_K=1, num_warps=4, num_stages=2)
    if kernel == "gemm_tma":
        params.pop("SPLIT_K")
    params.update(kw)
    return KernelConfig(kernel=kernel, params=params)


def assert_correct(op: OpSpec, cfg: KernelConfig) -> None:
    res = evaluate(op, cfg, check_only=True)
    assert res.label in OK, res.reason
    assert res.rel_err is not None and res.rel_err <= registry.tolerance(op)
    assert res.us is None  # correctness only: never a CPU time


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_gemm_ragged_shape_is_correct(dtype: str) -> None:
    assert_correct(OpSpec(kind="gemm", shape=(3, 50, 40), dtype=dtype), gemm_cfg())


def test_gemm_multi_tile_group_ordering_is_correct() -> None:
    # 5 x 4 tiles with GROUP_M=2: the last group is ragged (one row of tiles)
    assert_correct(OpSpec(kind="gemm", shape=(70, 120, 48), dtype="fp16"), gemm_cfg(GROUP_M=2))


@pytest.mark.parametrize("split_k", [2, 3])
def test_gemm_split_k_sums_every_slice(split_k: int) -> None:
    # K=40 in BLOCK_K=16 tiles: 3 tiles over 2 or 3 slices, so some slices are partly empty
    assert_correct(OpSpec(kind="gemm", shape=(3, 50, 40), dtype="fp32"), gemm_cfg(SPLIT_K=split_k))


@pytest.mark.parametrize("split_k", [1, 2])
def test_gemm_layout_kn_is_correct(split_k: int) -> None:
    assert_correct(OpSpec(kind="gemm", shape=(3, 50, 40), dtype="fp16", layout="kn"), gemm_cfg(SPLIT_K=split_k))


def test_gemm_even_k_fast_path_is_correct() -> None:
    # K a multiple of BLOCK_K * SPLIT_K: the masks are compiled out
    assert_correct(OpSpec(kind="gemm", shape=(17, 33, 64), dtype="fp16"), gemm_cfg(SPLIT_K=2))


def test_gemm_fp8_writes_bf16_within_fp8_tolerance() -> None:
    op = OpSpec(kind="gemm", shape=(5, 48, 64), dtype="fp8")
    assert op.out_dtype == "bf16"
    assert_correct(op, gemm_cfg(BLOCK_K=32))


@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemm_tma_persistent_covers_every_tile(layout: str) -> None:
    # 3 x 2 = 6 tiles on a 4-program persistent grid under the interpreter: programs take 2 tiles
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("gemm_tma needs TMA (sm_90+)")
    op = OpSpec(kind="gemm", shape=(33, 48, 64), dtype="fp16", layout=layout)
    assert_correct(op, gemm_cfg("gemm_tma"))


@pytest.mark.parametrize("dtype", ["fp16", "fp32", "bf16"])
def test_gemv_single_row_is_correct(dtype: str) -> None:
    # M=1 takes the FMA path (no tl.dot), so bf16 is checkable under the interpreter too
    cfg = KernelConfig(kernel="gemv", params=dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=32, SPLIT_K=1,
                                                  num_warps=4, num_stages=2))
    assert_correct(OpSpec(kind="gemv", shape=(1, 50, 72), dtype=dtype), cfg)


@pytest.mark.parametrize("m,split_k,layout", [(1, 3, "nk"), (5, 1, "nk"), (5, 2, "kn"), (16, 2, "nk")])
def test_gemv_multi_row_split_k_and_layouts_are_correct(m: int, split_k: int, layout: str) -> None:
    bm = 1 if m == 1 else 16 if m > 8 else 8
    cfg = KernelConfig(kernel="gemv", params=dict(BLOCK_M=bm, BLOCK_N=16, BLOCK_K=32, SPLIT_K=split_k,
                                                  num_warps=4, num_stages=2))
    assert_correct(OpSpec(kind="gemv", shape=(m, 50, 72), dtype="fp16", layout=layout), cfg)


def test_gemv_block_m_below_m_is_rejected_not_run() -> None:
    cfg = KernelConfig(kernel="gemv", params=dict(BLOCK_M=2, BLOCK_N=16, BLOCK_K=32, SPLIT_K=1, num_warps=4))
    res = evaluate(OpSpec(kind="gemv", shape=(5, 50, 72), dtype="fp16"), cfg)
    assert res.label == "rejected" and "BLOCK_M=2 must be >= M=5" in res.reason


@pytest.mark.parametrize("kernel", ["silu_mul", "add"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32", "bf16"])
@pytest.mark.parametrize("shape,block", [((7, 100), 256), ((4, 64), 128)])
def test_elementwise_ragged_and_even_are_correct(kernel: str, dtype: str, shape: tuple[int, int],
                                                  block: int) -> None:
    cfg = KernelConfig(kernel=kernel, params=dict(BLOCK_SIZE=block, num_warps=4))
    assert_correct(OpSpec(kind=kernel, shape=shape, dtype=dtype), cfg)


def test_add_flat_shape_is_correct() -> None:
    op = OpSpec(kind="add", shape=(1000,), dtype="fp32")
    assert_correct(op, KernelConfig(kernel="add", params=dict(BLOCK_SIZE=256, num_warps=4)))


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32", "bf16"])
def test_single_pass_norms_are_correct(kind: str, dtype: str) -> None:
    # 5 rows, 2 per program: the last program has a padding row
    cfg = KernelConfig(kernel=f"{kind}_single", params=dict(BLOCK_N=128, ROWS_PER_PROGRAM=2, num_warps=4))
    assert_correct(OpSpec(kind=kind, shape=(5, 100), dtype=dtype), cfg)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32", "bf16"])
def test_looped_norms_stream_ragged_rows_correctly(kind: str, dtype: str) -> None:
    # N=100 in BLOCK_N=32 chunks: 4 chunks, the last one 4 wide
    cfg = KernelConfig(kernel=f"{kind}_looped", params=dict(BLOCK_N=32, num_warps=4))
    assert_correct(OpSpec(kind=kind, shape=(5, 100), dtype=dtype), cfg)


def test_layernorm_looped_keeps_precision_with_large_mean() -> None:
    # |mean| = 1000 >> std = 1: an unshifted one-pass variance would cancel in fp32
    op = OpSpec(kind="layernorm", shape=(3, 96), dtype="fp32")
    inputs = registry.make_inputs(op, "cuda" if torch.cuda.is_available() else "cpu", 1)
    inputs["x"] += 1000.0
    out = registry.alloc_out(op, inputs["x"].device)
    registry.launch(inputs, KernelConfig(kernel="layernorm_looped", params=dict(BLOCK_N=32, num_warps=4)), out, op)
    ref = registry.reference(inputs, op)
    err = float(torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref))
    assert err < 1e-4


def test_softmax_rows_sum_to_one() -> None:
    op = OpSpec(kind="softmax", shape=(4, 70), dtype="fp32")
    inputs = registry.make_inputs(op, "cuda" if torch.cuda.is_available() else "cpu", 2)
    out = registry.alloc_out(op, inputs["x"].device)
    registry.launch(inputs, KernelConfig(kernel="softmax_looped", params=dict(BLOCK_N=16, num_warps=4)), out, op)
    assert torch.allclose(out.sum(dim=-1).double().cpu(), torch.ones(4, dtype=torch.float64), atol=1e-5)


def test_single_pass_norm_with_short_block_is_rejected() -> None:
    cfg = KernelConfig(kernel="rmsnorm_single", params=dict(BLOCK_N=64, num_warps=4))
    res = evaluate(OpSpec(kind="rmsnorm", shape=(5, 100), dtype="fp32"), cfg)
    assert res.label == "rejected"
    assert "BLOCK_N=64 < N=100" in res.reason and "BLOCK_N=128" in res.reason


def test_split_k_gemv_refuses_a_strided_output_before_launch():
    import torch

    from autoopt.backend.kernels.gemv import gemv_prepare

    x = torch.randn(2, 64, dtype=torch.float16)
    w = torch.randn(32, 64, dtype=torch.float16)
    out = torch.empty(32, 2, dtype=torch.float16).t()  # [2, 32] view with strides (1, 2)
    params = {"BLOCK_M": 2, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 2, "num_warps": 1, "num_stages": 1}
    with pytest.raises(ValueError, match="contiguous output"):
        gemv_prepare(x, w, out, params)


@pytest.mark.parametrize("split_k,shape", [(2, (33, 48, 64)), (3, (70, 40, 80)), (4, (17, 32, 48))])
def test_gemm_tma_split_k_sums_every_slice_without_mixing_ragged_rows(split_k: int, shape: tuple) -> None:
    # M not a multiple of BLOCK_M: each slice's workspace rows are padded to M_PAD, so one slice's
    # ragged last tile never lands in the next slice; K=48 in 16-wide tiles over 4 slices leaves one empty
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("gemm_tma needs TMA (sm_90+)")
    assert_correct(OpSpec(kind="gemm", shape=shape, dtype="fp16"), gemm_cfg("gemm_tma", SPLIT_K=split_k))


@pytest.mark.parametrize("shape,block_n,split_n,stages", [((3, 1000), 64, 4, 2), ((4, 70), 16, 8, 1),
                                                          ((2, 4096), 256, 16, 1), ((2, 4096), 64, 4, 3)])
def test_rmsnorm_split_rows_matches_the_reference(shape: tuple, block_n: int, split_n: int, stages: int) -> None:
    # (4, 70) in 16-wide chunks over 8 programs: the last programs own no columns and add nothing
    cfg = KernelConfig(kernel="rmsnorm_split", params=dict(BLOCK_N=block_n, SPLIT_N=split_n, num_warps=4,
                                                           num_stages=stages))
    assert_correct(OpSpec(kind="rmsnorm", shape=shape, dtype="fp32"), cfg)


@pytest.mark.parametrize("shape,layout", [((33, 48, 64), "nk"), ((70, 40, 80), "kn"), ((16, 32, 256), "nk"),
                                          ((16, 32, 32), "nk")])
def test_gemm_tma_stream_k_hands_partial_tiles_to_their_finisher(shape: tuple, layout: str) -> None:
    # 4 programs under the interpreter: (33,48,64) gives each 1.5 tiles; (16,32,256) one tile over all
    # four programs; (16,32,32) two K-iterations over four programs, two of which get none
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("gemm_tma needs TMA (sm_90+)")
    assert_correct(OpSpec(kind="gemm", shape=shape, dtype="fp16", layout=layout),
                   gemm_cfg("gemm_tma", STREAM_K=1))


def test_gemm_tma_stream_k_flags_reset_so_a_second_launch_is_right_too() -> None:
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("gemm_tma needs TMA (sm_90+)")
    op = OpSpec(kind="gemm", shape=(33, 48, 64), dtype="fp16")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = registry.make_inputs(op, device, seed=3)
    out = registry.alloc_out(op, device)
    run = registry.prepare(inputs, gemm_cfg("gemm_tma", STREAM_K=1), out, op)
    want = registry.reference(inputs, op)
    for _ in range(2):
        out.zero_()
        run()
        assert torch.allclose(out.double(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape,block_n,split_n", [((3, 1000), 256, 4), ((4, 70), 16, 5), ((2, 4096), 1024, 4),
                                                   ((5, 777), 128, 7)])
def test_rmsnorm_coop_rows_split_in_one_launch_match_the_reference(shape: tuple, block_n: int,
                                                                      split_n: int) -> None:
    # on the CPU the interpreter runs the kernel's two halves as two launches (its programs run one
    # after another, so none could wait for a sibling); on a GPU it is one launch meeting at a counter
    cfg = KernelConfig(kernel="rmsnorm_coop", params=dict(BLOCK_N=block_n, SPLIT_N=split_n, num_warps=4))
    assert_correct(OpSpec(kind="rmsnorm", shape=shape, dtype="fp32"), cfg)


def test_rmsnorm_coop_refuses_chunks_that_miss_columns_before_launch() -> None:
    op = OpSpec(kind="rmsnorm", shape=(2, 1000), dtype="fp32")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = registry.make_inputs(op, device)
    cfg = KernelConfig(kernel="rmsnorm_coop", params=dict(BLOCK_N=128, SPLIT_N=4, num_warps=4))
    with pytest.raises(ValueError, match="must cover N=1000"):
        registry.prepare(inputs, cfg, registry.alloc_out(op, device), op)


def test_rmsnorm_coop_counters_are_zero_after_every_launch() -> None:
    # the counters are one buffer per device, reused by every launch: each launch must leave it zeroed
    from autoopt.backend.kernels.norm_coop import counters

    op = OpSpec(kind="rmsnorm", shape=(6, 3000), dtype="fp32")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = registry.make_inputs(op, device, seed=5)
    out = registry.alloc_out(op, device)
    run = registry.prepare(inputs, KernelConfig(kernel="rmsnorm_coop", params=dict(BLOCK_N=512, SPLIT_N=6,
                                                                                   num_warps=4)), out, op)
    want = registry.reference(inputs, op)
    for _ in range(3):
        out.fill_(float("nan"))
        run()
        assert torch.allclose(out.double(), want, rtol=1e-4, atol=1e-4)
        assert int(counters(out.device, 6).abs().sum()) == 0


# -- the fused bias + activation epilogue (kernels/epilogue.py) --------------------------------------------

_EPILOGUE_TORCH = {"none": lambda y: y, "gelu": torch.nn.functional.gelu,
                   "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
                   "relu": torch.nn.functional.relu}
GEMV_CFG = dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=1, num_warps=4, num_stages=2)


def epilogue_error(config: KernelConfig, shape: tuple[int, int, int], activation: str, *, bias: bool = True,
                   dtype: str = "fp16", layout: str = "nk", scale: float = 1.0) -> float:
    """Relative error of ``act(a @ W^T + bias)`` run through the registry against torch in float64."""
    kind = "gemv" if config.kernel == "gemv" else "gemm"
    op = OpSpec(kind=kind, shape=shape, dtype=dtype, layout=layout)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = registry.make_inputs(op, device, seed=7)
    inputs["a"] = inputs["a"] * scale
    if bias:
        gen = torch.Generator().manual_seed(8)
        inputs["bias"] = torch.randn(shape[1], generator=gen).to(device=device, dtype=inputs["a"].dtype)
    out = registry.alloc_out(op, device)
    out.fill_(float("nan"))  # an unwritten element shows
    registry.prepare(inputs, config, out, op, activation=activation)()
    pre = registry.reference(inputs, op) + (inputs["bias"].double() if bias else 0.0)
    want = _EPILOGUE_TORCH[activation](pre)
    return float((out.double() - want).norm() / want.norm())


def _needs_tma() -> None:
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("gemm_tma needs TMA (sm_90+)")


@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_gemm_epilogue_adds_the_bias_and_activates_ragged_tiles(activation: str, dtype: str) -> None:
    # (70, 120, 48): 5 x 4 tiles of 16 x 32, ragged in M and N; K=48 in 16-wide tiles
    err = epilogue_error(gemm_cfg(), (70, 120, 48), activation, dtype=dtype)
    assert err <= registry.tolerance(OpSpec(kind="gemm", shape=(70, 120, 48), dtype=dtype))


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_gemm_epilogue_without_a_bias_activates_only(activation: str) -> None:
    assert epilogue_error(gemm_cfg(), (3, 50, 40), activation, bias=False) <= 5e-3


@pytest.mark.parametrize("kernel,split_k", [("gemm", 3), ("gemv", 2), ("gemv", 3)])
def test_split_k_epilogue_runs_in_the_reduce_after_every_slice(kernel: str, split_k: int) -> None:
    # K=72 in 32-wide tiles over 2 or 3 slices, K=40 in 16-wide tiles over 3: the bias is added once, after
    # the slices are summed (a per-slice bias would count it split_k times)
    if kernel == "gemm":
        cfg, shape = gemm_cfg(SPLIT_K=split_k), (3, 50, 40)
    else:
        cfg, shape = KernelConfig(kernel="gemv", params={**GEMV_CFG, "BLOCK_M": 8, "SPLIT_K": split_k}), (5, 50, 72)
    assert epilogue_error(cfg, shape, "gelu_tanh") <= 5e-3


@pytest.mark.parametrize("m,block_m,layout", [(1, 1, "nk"), (5, 8, "kn"), (16, 16, "nk")])
def test_gemv_epilogue_on_the_fma_and_dot_paths(m: int, block_m: int, layout: str) -> None:
    cfg = KernelConfig(kernel="gemv", params={**GEMV_CFG, "BLOCK_M": block_m})
    assert epilogue_error(cfg, (m, 50, 72), "gelu", layout=layout) <= 5e-3


@pytest.mark.parametrize("extra", [{}, {"SPLIT_K": 2}, {"STREAM_K": 1}], ids=["persistent", "split_k", "stream_k"])
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemm_tma_epilogue_in_the_tile_loop_or_as_a_pass_after_split_and_stream_k(extra: dict, layout: str) -> None:
    _needs_tma()
    # (33, 48, 64): 3 x 2 tiles over 4 persistent programs under the interpreter, ragged in M
    assert epilogue_error(gemm_cfg("gemm_tma", **extra), (33, 48, 64), "relu", layout=layout) <= 5e-3


def test_epilogue_saturates_without_nan_on_large_inputs() -> None:
    # |a @ W^T| in the hundreds: exp(-2z) overflows to inf for tanh-GELU (giving -0), erf saturates at +-1
    for activation in ("gelu", "gelu_tanh"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)  # the interpreter's numpy
            assert epilogue_error(gemm_cfg(), (3, 50, 40), activation, dtype="fp32", scale=300.0) <= 1e-4


def test_epilogue_refuses_an_unknown_activation_and_a_misshapen_bias() -> None:
    op = OpSpec(kind="gemm", shape=(3, 50, 40), dtype="fp16")
    inputs = registry.make_inputs(op, "cpu")
    out = registry.alloc_out(op, "cpu")
    with pytest.raises(ValueError, match="unknown epilogue activation 'silu'"):
        registry.prepare(inputs, gemm_cfg(), out, op, activation="silu")
    inputs["bias"] = torch.zeros(49, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"unit-stride \[N=50\] vector; got shape \(49,\)"):
        registry.prepare(inputs, gemm_cfg(), out, op)
