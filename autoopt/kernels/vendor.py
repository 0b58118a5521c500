"""The vendor library's matmul (cuBLAS, as ``torch.nn.functional.linear`` runs it), priced.

autoopt's own GEMM kernels do not beat cuBLAS everywhere: on the H100 and H200 the tiled GEMMs
measure 0.92-0.96x cuBLAS geomean at M >= 256 (``benchmarks/results/HW_LIMIT.md``), while the
decode GEMVs beat it. A runtime that swaps autoopt kernels into a model (``autoopt.nn``) should
run whichever is faster for each shape, so cuBLAS needs a price in the same microseconds as the
cost model's: :func:`predict_vendor_matmul`.

The model is a roofline with three constants per GPU, fitted on the committed same-run torch
timings of ``benchmarks/results/{h100,h200}/hw_limit*.json`` by ``benchmarks/fit_vendor_matmul.py``
(results in ``benchmarks/results/vendor_matmul_fit.json``)::

    t = max(FLOPs / (e_compute * peak), bytes / (e_memory * bandwidth)) + fixed_us

peak and bandwidth are the profile's datasheet values (as the cost model uses them); bytes are
A, W and C once each. It prices what it was fitted on, 16-bit float matmuls on a GPU with a fit,
and one quantized case: a W8A8 ``fp8`` GEMM (per-channel weight scales, per-token activation
scales) as ``torch._scaled_mm`` with row-wise scales (cuBLASLt, sm_90+) after autoopt's own
activation quantization (``act_quant.py``, priced as the quant-gemm template prices it), fitted apart
(:data:`FP8_FITS`) on the measured ``act_quant + torch._scaled_mm`` rows of ``benchmarks/quant_kernels.py``,
with one more constant: cuBLASLt's FP8 kernel runs 128 x 128 output tiles (:data:`FP8_TILE`), so at
decode batches a GEMM with few tiles for the SMs reads its weight slower, by ``min(1, tiles / SMs) **
occupancy_exp``. Before that fit the FP8 price reused the bf16 efficiencies: it put the H200's batch-32
down projection at 31 us against 47 measured, and optimize() ran cuBLAS where autoopt's kernel measured
faster on every measured shape (Qwen2.5-7B's batch-32 fp8 step 7 % slower than bf16). Anything else, the
other quantized formats included (cuBLAS has no int4/int8-weight GEMM), and a GPU with no FP8 fit,
answers None, and the caller keeps autoopt's kernel.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.cost import peak_flops
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.quant_cost import act_quant_us

__all__ = ["FITS", "FP8_FITS", "FP8_TILE", "VendorFit", "predict_vendor_matmul", "vendor_fit", "vendor_roofline_us"]


@dataclass(frozen=True, slots=True, kw_only=True)
class VendorFit:
    """The three constants of one GPU's cuBLAS roofline and how well they fit the timings."""

    gpu: str
    e_compute: float
    e_memory: float
    fixed_us: float
    #: distinct shapes fitted, and the median |ln(predicted / measured)| with each shape left out of
    #: the fit that predicts it.
    shapes: int
    median_abs_log_err: float
    source: str
    #: the memory term's exponent on the share of SMs the output tiles fill (0: none; the FP8 fits)
    occupancy_exp: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VendorFit:
        return cls(gpu=str(data["gpu"]), e_compute=float(data["e_compute"]), e_memory=float(data["e_memory"]),
                   fixed_us=float(data["fixed_us"]), shapes=int(data["shapes"]),
                   median_abs_log_err=float(data["median_abs_log_err"]), source=str(data["source"]),
                   occupancy_exp=float(data.get("occupancy_exp", 0.0)))


_SOURCE = "benchmarks/results/vendor_matmul_fit.json (torch 2.11.0+cu130, driver 580.159.04)"

#: fitted constants by the GPU's torch/NVML name (``GPUProfile.name``).
FITS: dict[str, VendorFit] = {
    fit.gpu: fit for fit in (
        # decisions against autoopt's top-1 (predicted): 34 of 41 shapes right, the chosen kernel at 1.005x
        # the faster one's time geomean (1.137x always taking autoopt's)
        VendorFit(gpu="NVIDIA H100 80GB HBM3", e_compute=0.74, e_memory=0.76, fixed_us=10.0, shapes=41,
                  median_abs_log_err=0.069, source=_SOURCE),
        # 36 of 41 right, 1.029x (1.179x always autoopt's); worst 1.57x where the cost model
        # under-predicts autoopt's own kernel (512x8192x3584: 49 us predicted, 69 measured)
        VendorFit(gpu="NVIDIA H200", e_compute=0.76, e_memory=0.83, fixed_us=10.25, shapes=41,
                  median_abs_log_err=0.057, source=_SOURCE),
    )
}

#: cuBLASLt's FP8 output tile at decode batches (``nvjet_sm90_qqtst_128x128_...`` in
#: ``benchmarks/results/h200/quant_trace_*_b32_layers8.json``)
FP8_TILE = 128

_FP8_SOURCE = "benchmarks/results/vendor_matmul_fit.json fp8_fits (torch 2.11.0+cu130, driver 580.159.04)"

#: the W8A8 path's constants (act_quant's price comes on top), fitted by ``benchmarks/fit_vendor_matmul.py``
FP8_FITS: dict[str, VendorFit] = {
    fit.gpu: fit for fit in (
        # 10 shapes, M = 32 and 2048 (event-timed, one call: the fixed cost holds a launch); |ln err| median 0.028
        VendorFit(gpu="NVIDIA H100 80GB HBM3", e_compute=0.62, e_memory=0.81, fixed_us=13.25, shapes=10,
                  median_abs_log_err=0.028, source=_FP8_SOURCE, occupancy_exp=0.45),
        # 5 shapes at M = 32, graph-replayed (fit fixed cost 0.0; shipped with a standalone launch's extra, 4.21 us,
        # the basis rank()'s prices share); e_compute is the H100's (no compute-bound H200 row); median 0.012
        VendorFit(gpu="NVIDIA H200", e_compute=0.62, e_memory=0.58, fixed_us=4.21, shapes=5,
                  median_abs_log_err=0.012, source=_FP8_SOURCE, occupancy_exp=0.45),
    )
}

#: the dtypes the fit covers (its timings are bf16; fp16 runs on the same tensor-core rate).
_DTYPES = ("bf16", "fp16")


def vendor_fit(gpu: GPUProfile) -> VendorFit | None:
    """The cuBLAS fit for ``gpu``, or None where none was measured."""
    return FITS.get(gpu.name)


def predict_vendor_matmul(gpu: GPUProfile, op: OpSpec) -> float | None:
    """Predicted microseconds of cuBLAS for ``op`` (``F.linear`` of A ``[M, K]`` and W ``[N, K]``), or
    None where there is no fit for this GPU or dtype (see the module docstring)."""
    fit = vendor_fit(gpu)
    if fit is None or not op.is_matmul or op.dtype not in _DTYPES or op.layout != "nk":
        return None
    if op.weight is not None:
        return _scaled_mm_us(gpu, op)
    bw = gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs
    peak = peak_flops(gpu, op.dtype)
    if not bw or not peak:
        return None
    return vendor_roofline_us(op.flops / peak, op.min_bytes / (bw * 1e9), fit.e_compute, fit.e_memory,
                              fit.fixed_us)


def _scaled_mm_us(gpu: GPUProfile, op: OpSpec) -> float | None:
    """A W8A8 ``fp8`` GEMM as activation quantization + ``torch._scaled_mm`` (row-wise scales need
    sm_90+ in torch's cuBLASLt/CUTLASS path), or None for any other quantized op or a GPU with no FP8 fit."""
    fmt = op.weight_format
    fit = FP8_FITS.get(gpu.name)
    if (fit is None or fmt is None or op.kind != "gemm" or fmt.name != "fp8" or not fmt.quantizes_activations
            or gpu.cc is None or gpu.cc < (9, 0) or not gpu.sm_count):
        return None
    bw = gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs
    peak = peak_flops(gpu, "fp8")
    if not bw or not peak:
        return None
    m, n, k = op.shape
    moved = m * k + fmt.weight_bytes(n, k) + 4 * m + m * n * DTYPE_BYTES[op.out_dtype or op.dtype]
    occupancy = min(1.0, math.ceil(m / FP8_TILE) * math.ceil(n / FP8_TILE) / gpu.sm_count) ** fit.occupancy_exp
    gemm = vendor_roofline_us(op.flops / peak, moved / (bw * 1e9 * occupancy), fit.e_compute, fit.e_memory,
                              fit.fixed_us)
    return gemm + act_quant_us(gpu, op)


def vendor_roofline_us(compute_s: float, memory_s: float, e_compute: float, e_memory: float,
                       fixed_us: float) -> float:
    """The model's formula on the op's two datasheet times (seconds at peak and at spec bandwidth)."""
    return max(compute_s / e_compute, memory_s / e_memory) * 1e6 + fixed_us
