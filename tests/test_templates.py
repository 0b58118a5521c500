"""Built-in templates: the config keys contracted with the backend kernels, paths, spaces, choices."""

from __future__ import annotations

import pytest

from autoopt._paths import builtin_templates
from autoopt.errors import AutooptError, ConfigError
from autoopt.hardware.library import load_profile
from autoopt.kernels import constraints as C
from autoopt.kernels.choices import default_impl, default_path
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.plugins.choices import choose_impl
from autoopt.search.ranking import rank, validate_config

builtin_templates()
from autoopt.templates.elementwise import ElementwiseTemplate  # noqa: E402
from autoopt.templates.gemm import GemmTemplate  # noqa: E402
from autoopt.templates.gemv import GemvTemplate  # noqa: E402
from autoopt.templates.norm import NormTemplate  # noqa: E402

H100 = load_profile("h100-sxm").gpu
KEYS = {
    "gemm": {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages"},
    "gemm_tma": {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "STREAM_K", "num_warps", "num_stages"},
    "gemv": {"BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"},
    "silu_mul": {"BLOCK_SIZE", "num_warps"},
    "add": {"BLOCK_SIZE", "num_warps"},
    "rmsnorm_single": {"BLOCK_N", "ROWS_PER_PROGRAM", "num_warps"},
    "rmsnorm_looped": {"BLOCK_N", "num_warps"},
    "rmsnorm_split": {"BLOCK_N", "SPLIT_N", "num_warps", "num_stages"},
    "rmsnorm_coop": {"BLOCK_N", "SPLIT_N", "num_warps"},
}
OPS = [OpSpec(kind="gemm", shape=(4096, 4096, 4096)), OpSpec(kind="gemm", shape=(16, 4096, 4096)),
       OpSpec(kind="gemv", shape=(1, 4096, 4096)), OpSpec(kind="silu_mul", shape=(512, 14336)),
       OpSpec(kind="add", shape=(512, 4096)), OpSpec(kind="rmsnorm", shape=(512, 4096)),
       OpSpec(kind="rmsnorm", shape=(64, 131072))]


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.label())
def test_ranked_configs_use_exactly_the_backend_keys_and_pass_validate(op):
    r = rank(H100, op, top=50)
    for c in r.candidates:
        assert set(c.config.params) == KEYS[c.config.kernel], c.config.kernel
        assert validate_config(H100, op, c.config) == []


def test_gemm_path_is_wgmma_only_for_64_row_blocks_and_whole_warpgroups_on_sm_90a():
    sm80 = load_profile("a100-sxm-80gb").gpu
    from autoopt.templates.gemm import matmul_path
    assert matmul_path(H100, 128, 8) == "wgmma"
    assert matmul_path(H100, 32, 8) == "standard"
    assert matmul_path(H100, 128, 2) == "standard"
    assert matmul_path(sm80, 128, 8) == "standard"


def test_gemm_block_m_is_capped_by_next_power_of_two_of_m():
    op = OpSpec(kind="gemm", shape=(40, 4096, 4096))
    assert {c.params["BLOCK_M"] for c in GemmTemplate().space(H100, op)} == {16, 32, 64}


def test_gemm_split_k_is_offered_only_for_skinny_shapes_with_long_k():
    t = GemmTemplate()
    big = {c.params["SPLIT_K"] for c in t.space(H100, OpSpec(kind="gemm", shape=(4096, 4096, 4096)))}
    skinny = {c.params["SPLIT_K"] for c in t.space(H100, OpSpec(kind="gemm", shape=(16, 1024, 8192)))}
    assert big == {1}
    assert skinny == {1, 2, 4, 8, 16}


def test_fp8_gemm_space_reaches_block_k_256():
    op = OpSpec(kind="gemm", shape=(4096, 4096, 4096), dtype="fp8")
    assert max(c.params["BLOCK_K"] for c in GemmTemplate().space(H100, op)) == 256
    assert max(c.params["BLOCK_K"] for c in GemmTemplate().space(H100, OpSpec(kind="gemm", shape=(4096,) * 3))) == 128


@pytest.mark.parametrize(("m", "bm"), [(1, 1), (3, 4), (8, 8), (16, 16)])
def test_gemv_block_m_is_next_power_of_two_of_m(m, bm):
    op = OpSpec(kind="gemv", shape=(m, 4096, 4096))
    assert {c.params["BLOCK_M"] for c in GemvTemplate().space(H100, op)} == {bm}


def test_gemv_rejects_block_m_below_m():
    op = OpSpec(kind="gemv", shape=(5, 4096, 4096))
    cfg = KernelConfig(kernel="gemv", template="gemv", params={"BLOCK_M": 4, "BLOCK_N": 64, "BLOCK_K": 128,
                                                               "SPLIT_K": 1, "num_warps": 4, "num_stages": 2})
    assert validate_config(H100, op, cfg) == [
        "BLOCK_M=4 must be next_pow2(M)=8 (one program covers all M=5 rows)"]


def test_decode_gemm_is_ranked_across_gemm_and_gemv_templates():
    r = rank(H100, OpSpec(kind="gemv", shape=(1, 4096, 4096)), top=10_000)
    assert {c.config.template for c in r.candidates} == {"gemm", "gemv"}
    assert r.best.bound == "memory"


def test_elementwise_reason_reports_vector_width_and_elements_per_thread():
    op = OpSpec(kind="silu_mul", shape=(512, 14336), dtype="bf16")
    cfg = KernelConfig(kernel="silu_mul", template="elementwise", params={"BLOCK_SIZE": 1024, "num_warps": 4})
    pred = ElementwiseTemplate().predict(H100, op, cfg)
    assert "vector width 8 x bf16 = 16 B, 8 elements/thread" in pred.reason


def test_elementwise_refuses_more_threads_than_elements():
    op = OpSpec(kind="add", shape=(512, 4096))
    cfg = KernelConfig(kernel="add", template="elementwise", params={"BLOCK_SIZE": 256, "num_warps": 16})
    assert validate_config(H100, op, cfg) == ["BLOCK_SIZE=256 < 512 threads: idle threads"]


# -- norm: single-pass vs looped ---------------------------------------------------------------

@pytest.mark.parametrize("n", [1024, 8192, 32768])
def test_norm_single_pass_wins_up_to_32768_on_h100(n):
    assert rank(H100, OpSpec(kind="rmsnorm", shape=(4096, n))).best.config.kernel == "rmsnorm_single"


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax"])
def test_only_looped_is_valid_from_131072_on_h100(kind):
    r = rank(H100, OpSpec(kind=kind, shape=(4096, 131072)), top=10_000)
    assert {c.config.kernel for c in r.candidates} == {f"{kind}_looped"}


def test_single_pass_row_of_32768_needs_at_least_8_warps_and_65536_never_fits():
    cfg = lambda n, w: KernelConfig(kernel="rmsnorm_single", template="norm",  # noqa: E731
                                    params={"BLOCK_N": n, "ROWS_PER_PROGRAM": 1, "num_warps": w})
    op = OpSpec(kind="rmsnorm", shape=(8, 32768))
    assert validate_config(H100, op, cfg(32768, 8)) == []  # 128 + 32 registers x 256 threads
    assert validate_config(H100, op, cfg(32768, 4))[0] == (
        "row of 32768 fp32 does not fit on chip with 128 threads: ~288 registers/thread > 255 (would spill)")
    wide = OpSpec(kind="rmsnorm", shape=(8, 65536))
    assert validate_config(H100, wide, cfg(65536, 32))[0] == (  # 64 + 32 registers x 1024 threads
        "row of 65536 fp32 does not fit on chip with 1024 threads: 1024 threads x ~96 registers = 98304 > 65536 "
        "per block")


def test_force_single_on_a_row_too_wide_raises_with_the_register_reason():
    with pytest.raises(ConfigError, match=r"force='single'.*does not fit on chip"):
        rank(H100, OpSpec(kind="rmsnorm", shape=(64, 131072)), force="single")


def test_force_looped_overrides_the_cheaper_single_pass():
    r = rank(H100, OpSpec(kind="softmax", shape=(4096, 4096)), force="looped", top=3)
    assert all(c.config.kernel == "softmax_looped" for c in r.candidates)


def test_force_on_a_gemm_is_an_error():
    with pytest.raises(AutooptError, match="force='single' applies to rmsnorm/layernorm/softmax"):
        rank(H100, OpSpec(kind="gemm", shape=(64, 64, 64)), force="single")


def test_norm_single_refuses_a_block_shorter_than_the_row():
    op = OpSpec(kind="layernorm", shape=(8, 5000))
    cfg = KernelConfig(kernel="layernorm_single", template="norm",
                       params={"BLOCK_N": 4096, "ROWS_PER_PROGRAM": 1, "num_warps": 4})
    assert NormTemplate().validate(H100, op, cfg)[0] == (
        "single-pass holds the whole row: BLOCK_N=4096 < N=5000 (use BLOCK_N=8192 or the looped kernel)")


# -- path and implementation choices -------------------------------------------------------------

@pytest.mark.parametrize(("profile", "shape", "path"), [
    ("h100-sxm", (4096, 4096, 4096), "tma_wgmma"),
    ("h100-sxm", (4096, 4096, 4097), "wgmma"),
    ("h100-sxm", (8, 4096, 4096), "standard"),
    ("a100-sxm-80gb", (4096, 4096, 4096), "standard"),
    ("b200", (4096, 4096, 4096), "standard"),
    ("rtx-5090", (4096, 4096, 4096), "standard"),
    ("mi300x", (4096, 4096, 4096), "mfma"),
])
def test_default_path_by_generation(profile, shape, path):
    assert default_path(load_profile(profile).gpu, OpSpec(kind="gemm", shape=shape)).path == path


@pytest.mark.parametrize(("profile", "impl"), [
    ("h100-sxm", "flash-attention-3 (wgmma+tma)"), ("a100-sxm-80gb", "flash-attention-2"),
    ("l40s", "flash-attention-2"), ("b200", "cudnn/flashinfer tcgen05"), ("mi300x", "ck/aiter"),
])
def test_attention_implementation_by_generation(profile, impl):
    got = choose_impl(load_profile(profile).gpu, "attention")
    assert got.impl == impl
    assert got.reason and got.source == "builtin"


def test_every_kernel_class_has_an_implementation_on_every_generation():
    from autoopt.kernels.choices import KERNEL_CLASSES
    for name in ("h100-sxm", "a100-sxm-80gb", "l40s", "b200", "rtx-5090", "mi300x", "stress-12kb"):
        for kc in KERNEL_CLASSES:
            assert default_impl(load_profile(name).gpu, kc).impl


def test_unknown_kernel_class_is_refused():
    with pytest.raises(AutooptError, match="unknown kernel class 'conv3d'"):
        choose_impl(H100, "conv3d")


def test_stress_12kb_still_gets_a_small_tile_gemm():
    g = load_profile("stress-12kb").gpu
    best = rank(g, OpSpec(kind="gemm", shape=(1024, 1024, 1024))).best
    p = best.config.params
    assert C.gemm_smem_bytes(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["num_stages"], 2) <= 12288


def test_h100_decode_gate_up_picks_gemv_over_a_gemm_grid_that_idles_20_sms():
    # the GEMM kernel's 112 tiles of BLOCK_N=256 leave 20 of 132 SMs idle: measured 99.9 us against
    # 91.1 us for the GEMV pick (benchmarks/results/h100/tune_llm.jsonl); the busiest-SM DRAM term sees it
    best = rank(H100, OpSpec(kind="gemv", shape=(1, 28672, 4096)), measured=False).best
    assert best.config.kernel == "gemv"


def test_few_wide_rmsnorm_rows_are_split_over_programs_of_one_launch():
    # H100, 64x262144: one launch with 32 programs per row 36.0-38.8 us, two launches 42.9 us
    # (benchmarks/results/h100/norm_coop_probe.json)
    best = rank(H100, OpSpec(kind="rmsnorm", shape=(64, 262144)), measured=False).best
    assert best.config.kernel == "rmsnorm_coop" and best.config.params["SPLIT_N"] >= 4


def test_coop_rmsnorm_is_not_offered_where_every_sm_gets_eight_rows():
    space = NormTemplate().space(H100, OpSpec(kind="rmsnorm", shape=(8 * 132, 65536)))
    assert not [c for c in space if c.kernel in ("rmsnorm_coop", "rmsnorm_split")]


def test_coop_rmsnorm_chunks_must_cover_the_row_with_none_empty():
    op = OpSpec(kind="rmsnorm", shape=(64, 262144))
    short = KernelConfig(kernel="rmsnorm_coop", template="norm", params={"BLOCK_N": 8192, "SPLIT_N": 16,
                                                                          "num_warps": 8})
    long = KernelConfig(kernel="rmsnorm_coop", template="norm", params={"BLOCK_N": 8192, "SPLIT_N": 33,
                                                                         "num_warps": 8})
    assert any("use SPLIT_N=32" in p for p in NormTemplate().validate(H100, op, short))
    assert any("use SPLIT_N=32" in p for p in NormTemplate().validate(H100, op, long))


def test_coop_rmsnorm_keeps_a_row_within_half_of_what_the_chip_holds():
    # 1024-wide chunks on 4 warps: 256 programs meet at each row's counter; the chip holds 132 x 16
    op = OpSpec(kind="rmsnorm", shape=(2, 262144))
    cfg = KernelConfig(kernel="rmsnorm_coop", template="norm", params={"BLOCK_N": 1024, "SPLIT_N": 256,
                                                                        "num_warps": 1})
    assert NormTemplate().validate(H100, op, cfg) == []
    tiny = load_profile("toy-64kb").gpu
    problems = NormTemplate().validate(tiny, op, cfg)
    assert any("at most" in p and "may wait" in p for p in problems)


def test_tma_split_k_is_offered_only_where_output_tiles_make_under_two_waves():
    from autoopt.templates.hopper import tma_splits

    assert tma_splits(H100, OpSpec(kind="gemm", shape=(4096, 4096, 4096)), 128, 128, 64) == [1]
    # 256x6144 in 128x128 tiles: 96 tiles on 132 SMs
    assert tma_splits(H100, OpSpec(kind="gemm", shape=(256, 6144, 4096)), 128, 128, 64) == [1, 2, 3, 4]


def test_stream_k_is_offered_with_split_k_and_never_combined_with_it():
    from autoopt.templates.hopper import HopperTmaGemmTemplate, decompositions

    assert decompositions(H100, OpSpec(kind="gemm", shape=(4096, 4096, 4096)), 128, 128, 64) == [1]
    assert decompositions(H100, OpSpec(kind="gemm", shape=(256, 6144, 4096)), 128, 128, 64) == [1, 2, 3, 4, 0]
    op = OpSpec(kind="gemm", shape=(256, 6144, 4096))
    both = KernelConfig(kernel="gemm_tma", path="tma_wgmma", params={
        "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 2, "STREAM_K": 1,
        "num_warps": 8, "num_stages": 4})
    assert any("STREAM_K" in p for p in HopperTmaGemmTemplate().validate(H100, op, both))


def _coop_measurements() -> dict[tuple, dict[tuple, float]]:
    """H100 timings of the norm probe (benchmarks/results/h100/norm_coop_probe_wide.json): shape -> config -> us."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks/results/h100/norm_coop_probe_wide.json"
    out: dict[tuple, dict[tuple, float]] = {}
    for row in json.loads(path.read_text())["rows"]:
        if row.get("us"):
            cfg = row["config"]
            out.setdefault(tuple(row["shape"]), {})[(cfg["kernel"], tuple(sorted(cfg["config"].items())))] = row["us"]
    return out


def test_coop_rmsnorm_barrier_cost_per_program_grows_with_the_programs_sharing_a_counter():
    from autoopt.kernels.constants import constants
    from autoopt.templates.norm import coop_sync_us

    assert coop_sync_us(4096, 64, constants()) / coop_sync_us(4096, 2, constants()) > 4


def test_coop_rmsnorm_model_ranks_the_measured_configs_of_the_few_row_shapes():
    # among the configs the H100 probe timed, the model's favourite is within 3 % of the fastest
    for shape in ((64, 262144), (256, 131072)):
        timed = _coop_measurements()[shape]
        op = OpSpec(kind="rmsnorm", shape=shape, dtype="bf16")

        def predicted(key: tuple, op: OpSpec = op) -> float:
            cfg = KernelConfig(kernel=key[0], template="norm", path="standard", params=dict(key[1]))
            return NormTemplate().predict(H100, op, cfg).us
        pick = min(timed, key=predicted)
        assert min(timed.values()) / timed[pick] >= 0.97, (shape, pick)
