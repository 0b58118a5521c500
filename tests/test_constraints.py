"""Hard constraints: each rule holds at its exact limit and fails one past it, with a message naming it."""

from __future__ import annotations

import pytest

from autoopt._paths import builtin_templates
from autoopt.errors import ConfigError
from autoopt.hardware.library import load_profile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.search.ranking import generic_problems, rank, validate_config

builtin_templates()
from autoopt.templates.gemm import GemmTemplate  # noqa: E402
from autoopt.templates.hopper import HopperTmaGemmTemplate  # noqa: E402


def gpu(name: str):
    return load_profile(name).gpu


def gemm_cfg(bm, bn, bk, stages, warps=4, path="standard", split=1, group=1):
    return KernelConfig(kernel="gemm", template="gemm", path=path,
                        params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "SPLIT_K": split,
                                "num_warps": warps, "num_stages": stages})


BIG = OpSpec(kind="gemm", shape=(4096, 4096, 4096), dtype="bf16")


# -- shared memory ---------------------------------------------------------------

def test_smem_exactly_at_stress_12kb_opt_in_passes_and_one_byte_over_fails():
    lim = C.limits(gpu("stress-12kb"))
    assert lim.smem_optin_bytes == 12288
    assert C.check_smem(lim, 12288) == []
    assert C.check_smem(lim, 12289) == ["smem 12289 B > opt-in 12288 B"]


def test_gemm_that_fills_12kb_exactly_is_valid_and_one_more_stage_is_not():
    g = gpu("stress-12kb")
    # 2 stages x (16x64 + 32x64) x 2 B = 12288 B
    assert validate_config(g, BIG, gemm_cfg(16, 32, 64, 2)) == []
    assert validate_config(g, BIG, gemm_cfg(16, 32, 64, 3)) == ["smem 18432 B > opt-in 12288 B"]


def test_toy_64kb_fits_128x128x64_in_two_stages_but_not_three():
    g = gpu("toy-64kb")
    assert validate_config(g, BIG, gemm_cfg(128, 128, 32, 4, warps=8)) == []  # 4 x 16 KB = 65536
    assert validate_config(g, BIG, gemm_cfg(128, 128, 64, 3, warps=8)) == ["smem 98304 B > opt-in 65536 B"]


def test_h100_128x256x64_fits_four_stages_and_five_exceed_opt_in():
    g = gpu("h100-sxm")
    assert validate_config(g, BIG, gemm_cfg(128, 256, 64, 4, warps=8, path="wgmma")) == []
    assert validate_config(g, BIG, gemm_cfg(128, 256, 64, 5, warps=8, path="wgmma")) == \
        ["smem 245760 B > opt-in 232448 B"]


def test_tma_template_counts_its_epilogue_tile_in_shared_memory():
    g = gpu("h100-sxm")
    t = HopperTmaGemmTemplate()
    cfg = lambda s: KernelConfig(kernel="gemm_tma", template=t.name, path="tma_wgmma",  # noqa: E731
                                 params={"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
                                         "num_warps": 8, "num_stages": s})
    assert t.validate(g, BIG, cfg(3)) == []  # 147456 + 65536 = 212992
    assert t.validate(g, BIG, cfg(4)) == ["smem 262144 B > opt-in 232448 B"]


# -- registers and threads ------------------------------------------------------------

def test_255_registers_per_thread_pass_and_256_spill():
    lim = C.limits(gpu("h100-sxm"))
    assert C.check_regs(lim, 255, 128) == []
    assert C.check_regs(lim, 256, 128) == ["~256 registers/thread > 255 (would spill)"]


def test_block_register_share_is_exact_at_64_registers_for_1024_threads():
    lim = C.limits(gpu("h100-sxm"))
    assert C.check_regs(lim, 64, 1024) == []
    assert C.check_regs(lim, 65, 1024) == ["1024 threads x ~72 registers = 73728 > 65536 per block"]


def test_wgmma_128x256_with_8_warps_fits_registers_but_256x256_does_not():
    g = gpu("h100-sxm")
    assert C.gemm_regs_per_thread(128, 256, 8, 32, wgmma=True) == 160
    assert C.gemm_regs_per_thread(128, 256, 8, 32, wgmma=False) == 224
    problems = validate_config(g, BIG, gemm_cfg(256, 256, 32, 3, warps=8, path="wgmma"))
    assert problems == ["~288 registers/thread > 255 (would spill)",
                        "256 threads x ~288 registers = 73728 > 65536 per block"]


def test_threads_per_block_limit_is_1024_on_nvidia_and_wave64_halves_the_warps_on_amd():
    nv, amd = C.limits(gpu("h100-sxm")), C.limits(gpu("mi300x"))
    assert C.check_threads(nv, 32) == []
    assert C.check_threads(nv, 64) == ["num_warps=64 x warp 32 = 2048 threads > 1024 per block"]
    assert C.check_threads(amd, 16) == []
    assert C.check_threads(amd, 32) == ["num_warps=32 x warp 64 = 2048 threads > 1024 per block"]
    assert C.check_threads(nv, 6) == ["num_warps=6 is not a power of two (Triton requires one)"]


# -- block shape against the problem ---------------------------------------------------

def test_block_may_reach_next_power_of_two_of_the_dim_but_not_beyond():
    assert C.check_block_vs_dim("BLOCK_M", 128, 100, 16) == []
    assert C.check_block_vs_dim("BLOCK_M", 256, 100, 16) == [
        "BLOCK_M=256 > 128 (next power of two of the problem's 100, min 16): mostly padding"]
    assert C.check_block_vs_dim("BLOCK_M", 16, 1, 16) == []  # the MMA minimum is always allowed


def test_split_k_needs_a_whole_block_k_per_slice():
    assert C.check_split_k(4, 64, 256) == []
    assert C.check_split_k(4, 64, 255) == ["SPLIT_K=4 x BLOCK_K=64 = 256 > K=255 (empty K-slices)"]
    assert C.check_split_k(1, 64, 16) == []


def test_non_power_of_two_block_is_rejected():
    assert C.check_pow2("BLOCK_N", 96) == ["BLOCK_N=96 is not a power of two (tl.arange needs power-of-two extents)"]


# -- TMA / WGMMA ---------------------------------------------------------------------

def test_tma_row_stride_must_be_a_multiple_of_16_bytes():
    assert C.tma_problems((8, 64), (16,), (8, 64), 2, "A") == []
    assert C.tma_problems((12, 64), (24,), (8, 64), 2, "A") == [
        "A: TMA row stride 24 B is not a multiple of 16 B (pad the inner dim)"]


def test_tma_box_is_at_most_256_per_dim_and_its_inner_row_at_least_16_bytes():
    assert C.tma_problems((4096, 4096), (8192,), (64, 256), 2, "W") == []
    assert C.tma_problems((4096, 4096), (8192,), (64, 257), 2, "W") == ["W: TMA box dimension 257 > 256"]
    assert C.tma_problems((4096, 4096), (8192,), (4, 64), 2, "W") == ["W: TMA box inner row 4 x 2 B < 16 B"]


def test_tma_dims_below_2_pow_32_and_strides_below_2_pow_40():
    assert C.tma_problems(((1 << 32) - 1, 2), (16,), (8, 2), 2, "A") == []
    assert C.tma_problems((1 << 32, 2), (1 << 40,), (8, 2), 2, "A") == [
        "A: TMA dimension 4294967296 >= 2^32", "A: TMA stride 1099511627776 B >= 2^40"]


def test_tma_template_rejects_k_rows_that_are_not_16_byte_aligned():
    g = gpu("h100-sxm")
    op = OpSpec(kind="gemm", shape=(4096, 4096, 4104), dtype="bf16")  # 8208 B rows: aligned
    bad = OpSpec(kind="gemm", shape=(4096, 4096, 4097), dtype="bf16")  # 8194 B rows
    cfg = KernelConfig(kernel="gemm_tma", template="hopper-tma-gemm", path="tma_wgmma",
                       params={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
                               "num_warps": 8, "num_stages": 3})
    assert validate_config(g, op, cfg) == []
    assert validate_config(g, bad, cfg)[:2] == [
        "A: TMA row stride 8194 B is not a multiple of 16 B (pad the inner dim)",
        "W: TMA row stride 8194 B is not a multiple of 16 B (pad the inner dim)"]


@pytest.mark.parametrize(("bk", "e", "mode"), [(64, 2, 128), (32, 2, 64), (16, 2, 32), (8, 2, 0), (128, 1, 128)])
def test_swizzle_follows_the_box_row_width(bk, e, mode):
    assert C.swizzle_bytes(bk, e) == mode


def test_wgmma_instruction_k_is_16_for_16_bit_and_32_for_8_bit():
    assert C.wgmma_instr_shape("bf16") == (64, 256, 16)
    assert C.wgmma_instr_shape("fp8") == (64, 256, 32)
    assert C.wgmma_instructions_per_tile(128, 64, "bf16") == 8
    assert C.wgmma_instructions_per_tile(128, 128, "fp8") == 8


def test_wgmma_rules_name_each_broken_shape():
    assert C.wgmma_problems(128, 256, 64, 8, "bf16") == []
    assert C.wgmma_problems(96, 264, 48, 6, "fp8") == [
        "wgmma needs BLOCK_M % 64 == 0, got 96",
        "wgmma needs whole warpgroups (num_warps % 4 == 0), got 6",
        "wgmma N must be a multiple of 8 in [8, 256], got BLOCK_N=264",
        "wgmma K for fp8 is 32; BLOCK_K=48 is not a multiple"]


# -- across generations ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a100-sxm-80gb", "a10", "l40s", "b200", "rtx-5090", "mi300x"])
def test_no_wgmma_or_tma_path_off_sm_90a(name):
    r = rank(gpu(name), BIG, top=1000)
    assert r.candidates
    assert not {c.config.path for c in r.candidates} & {"wgmma", "tma_wgmma"}


def test_h100_takes_a_wgmma_path_for_a_large_gemm():
    r = rank(gpu("h100-sxm"), BIG, top=1)
    assert r.best.config.path in ("wgmma", "tma_wgmma")
    assert r.path.path == "tma_wgmma"


def test_fp8_gemm_is_refused_below_sm_89_with_the_reason():
    op = OpSpec(kind="gemm", shape=(1024, 1024, 1024), dtype="fp8")
    with pytest.raises(ConfigError, match="fp8 needs native FP8 MMA"):
        rank(gpu("a100-sxm-80gb"), op)
    assert rank(gpu("l40s"), op).best.config.kernel == "gemm"


def test_fp4_cluster_path_needs_tcgen05():
    t = GemmTemplate()
    cfg = KernelConfig(kernel="x", template=t.name, path="fp4_cluster", params={"num_warps": 4})
    assert generic_problems(gpu("b200"), cfg, t) == []
    assert generic_problems(gpu("h100-sxm"), cfg, t) == [
        "path 'fp4_cluster' needs sm_100a/sm_103a (tcgen05); sm_90a lacks tcgen05"]
    assert generic_problems(gpu("rtx-5090"), cfg, t)  # sm_120: fp4 but no tcgen05


def _max_stages(name: str, bm: int, bn: int, bk: int) -> int:
    g = gpu(name)
    ok = [s for s in range(1, 12) if not any(p.startswith("smem") for p in
                                             validate_config(g, BIG, gemm_cfg(bm, bn, bk, s, warps=8,
                                                                               path="wgmma" if g.features.wgmma
                                                                               else "standard")))]
    return max(ok)


def test_smaller_smem_on_sm_86_and_sm_120_allows_fewer_stages():
    assert _max_stages("h100-sxm", 128, 128, 64) == 7
    assert _max_stages("a100-sxm-80gb", 128, 128, 64) == 5
    assert _max_stages("a10", 128, 128, 64) == 3
    assert _max_stages("rtx-5090", 128, 128, 64) == 3
