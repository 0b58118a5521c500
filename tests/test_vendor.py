"""autoopt.kernels.vendor: cuBLAS's roofline, where it applies, and its constants against their fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoopt.hardware.library import load_profile
from autoopt.kernels.cost import peak_flops
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.vendor import FITS, FP8_FITS, VendorFit, predict_vendor_matmul, vendor_fit

FIT_FILE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "vendor_matmul_fit.json"


def gpu(name):
    return load_profile(name).gpu


def test_prediction_is_the_roofline_of_flops_and_bytes_plus_the_fixed_cost():
    h100 = gpu("h100-sxm")
    op = OpSpec(kind="gemm", shape=(4096, 4096, 4096), dtype="bf16")
    fit = vendor_fit(h100)
    compute_us = op.flops / (fit.e_compute * peak_flops(h100, "bf16")) * 1e6
    assert predict_vendor_matmul(h100, op) == pytest.approx(compute_us + fit.fixed_us)


def test_a_decode_gemv_is_priced_by_its_bytes():
    h200 = gpu("h200")
    op = OpSpec(kind="gemv", shape=(1, 28672, 4096), dtype="bf16")
    fit = vendor_fit(h200)
    memory_us = op.min_bytes / (fit.e_memory * h200.mem_bandwidth_gbs * 1e9) * 1e6
    assert predict_vendor_matmul(h200, op) == pytest.approx(memory_us + fit.fixed_us)


def test_fp16_uses_the_bf16_fit_and_is_priced_the_same():
    h100 = gpu("h100-sxm")
    bf16 = predict_vendor_matmul(h100, OpSpec(kind="gemm", shape=(512, 4096, 4096), dtype="bf16"))
    assert predict_vendor_matmul(h100, OpSpec(kind="gemm", shape=(512, 4096, 4096), dtype="fp16")) == bf16


@pytest.mark.parametrize("profile, op", [
    ("h100-sxm", OpSpec(kind="gemm", shape=(512, 4096, 4096), dtype="fp32")),  # TF32: not fitted
    ("h100-sxm", OpSpec(kind="gemm", shape=(512, 4096, 4096), dtype="fp8")),   # _scaled_mm, not F.linear
    ("h100-sxm", OpSpec(kind="gemm", shape=(512, 4096, 4096), dtype="bf16", layout="kn")),
    ("h100-sxm", OpSpec(kind="rmsnorm", shape=(512, 4096), dtype="bf16")),
    ("a100-sxm-80gb", OpSpec(kind="gemm", shape=(512, 4096, 4096), dtype="bf16")),  # no timings fitted
])
def test_nothing_is_priced_outside_the_fit(profile, op):
    assert predict_vendor_matmul(gpu(profile), op) is None


def test_shipped_constants_are_the_committed_fit():
    fits = json.loads(FIT_FILE.read_text())["fits"]
    for fitted in fits.values():
        shipped = FITS[fitted["gpu"]]
        assert (shipped.e_compute, shipped.e_memory, shipped.fixed_us) == (
            fitted["e_compute"], fitted["e_memory"], fitted["fixed_us"])
        assert shipped.shapes == fitted["shapes"]
        assert shipped.median_abs_log_err == pytest.approx(fitted["held_out_median_abs_log_err"], abs=1e-3)


def test_the_fit_picks_the_faster_kernel_more_often_than_always_autoopt():
    for fitted in json.loads(FIT_FILE.read_text())["fits"].values():
        assert fitted["geomean_chosen_over_best"] < fitted["geomean_always_autoopt_over_best"]
        assert fitted["decisions_right"] >= 0.8 * fitted["decisions"]


def test_vendor_fit_round_trips_through_a_dict():
    fit = next(iter(FITS.values()))
    assert VendorFit.from_dict(fit.to_dict()) == fit


def test_the_fp8_constants_are_the_committed_fit():
    for fitted in json.loads(FIT_FILE.read_text())["fp8_fits"].values():
        shipped = FP8_FITS[fitted["gpu"]]
        assert (shipped.e_compute, shipped.e_memory, shipped.fixed_us, shipped.occupancy_exp) == (
            fitted["e_compute"], fitted["e_memory"], fitted["fixed_us_as_ranked"], fitted["occupancy_exp"])
        assert shipped.shapes == fitted["shapes"]


def test_a_batch_32_fp8_gemm_with_few_tiles_for_the_sms_is_priced_slower_per_byte():
    # H200, h200/quant_kernels_m32_graph.json: act_quant + _scaled_mm measured 47.2 us on the down projection
    # (32 tiles of 128 for 132 SMs) against 48.0 on gate_up, which reads twice the bytes (224 tiles)
    h200 = gpu("h200")
    down = predict_vendor_matmul(h200, OpSpec(kind="gemm", shape=(32, 4096, 14336), dtype="bf16", weight="fp8"))
    gate_up = predict_vendor_matmul(h200, OpSpec(kind="gemm", shape=(32, 28672, 4096), dtype="bf16", weight="fp8"))
    assert down is not None and gate_up is not None
    assert 0.9 <= (down - 4.21 + 1.0) / 47.2 <= 1.1 and 0.9 <= (gate_up - 4.21 + 1.0) / 48.0 <= 1.1


def test_at_batch_32_the_dispatch_keeps_autoopts_fp8_kernel_where_it_measured_faster():
    # h200/quant_kernels_m32_graph.json: quant_gemm 18.6 / 16.7 / 38.7 / 45.6 us against act_quant +
    # _scaled_mm 20.0 / 16.8 / 48.0 / 47.2 on Llama-3-8B's qkv, o, gate_up and down at M = 32
    from autoopt.search.ranking import rank

    h200 = gpu("h200")
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        op = OpSpec(kind="gemm", shape=(32, n, k), dtype="bf16", weight="fp8")
        assert rank(h200, op, top=1).best.predicted_us < predict_vendor_matmul(h200, op)
