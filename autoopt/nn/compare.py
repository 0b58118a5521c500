"""What a module and its replacement are compared on: samples and tolerances (the error measure is
:func:`autoopt.backend.accuracy.rel_error`).

Shared by :mod:`autoopt.nn.recognize` (its behaviour probes: does this module compute a norm, a gated
MLP ...?) and :mod:`autoopt.nn.optimize` (its check: does the replacement compute what the original
does?), so that neither calls into the other for them.
"""

from __future__ import annotations

import torch

__all__ = ["FLOAT_DTYPES", "QUANT_BOUNDS", "quant_bound", "sample", "tolerance"]

#: dtypes the kernels serve.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: relative Frobenius error ``||out - ref|| / ||ref||`` allowed, by dtype.
_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
#: fp32 matmuls at float32_matmul_precision 'high'/'medium' run as TF32 (10-bit mantissa).
_TOL_TF32 = 5e-3


#: relative Frobenius error ``||out - ref|| / ||ref||`` a quantized linear's output may have against its 16-bit
#: layer on the check sample, by format name; ``optimize(check=True)`` keeps the 16-bit weight above it.
#: Measured on an H100 (``benchmarks/results/h100/quant_kernels.json``, ``measured_rel_err_vs_bf16_layer``:
#: random W ~ N(0, 1/K) weights, Llama-3-8B's linears): fp8 per channel ~2.6 % (decode and weight-only; W8A8
#: prefill, its activations quantized too, ~3.7 %), int8 ~0.9 %, int4 group 128 ~10.3 % (asymmetric ~10.0 %);
#: the bounds keep a margin over those. A
#: checkpoint's block-FP8 linear is checked against its own dequantized weight (its quantization error is
#: the checkpoint's): left is the activation quantization's (W8A8), under the fp8 bound.
QUANT_BOUNDS: dict[str, float] = {"fp8": 0.06, "fp8_block": 0.06, "int8": 0.03, "int4": 0.15}


def quant_bound(fmt_name: str) -> float:
    """The documented error bound of the format ``fmt_name`` (:data:`QUANT_BOUNDS`)."""
    return QUANT_BOUNDS[fmt_name]


def tolerance(dtype: torch.dtype, *, matmul: bool = False) -> float:
    """The relative error allowed for a module of ``dtype`` (looser for fp32 matmuls allowed to use TF32)."""
    tol = _TOL.get(dtype, 1e-4)
    if matmul and dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        tol = max(tol, _TOL_TF32)
    return tol


def sample(features: int, dtype: torch.dtype, device: torch.device, *, tokens: int = 8, offset: float = 0.0,
           seed: int = 0) -> torch.Tensor:
    """A ``[2, tokens, features]`` normal sample (plus ``offset``) from a private generator (the global
    RNG is not touched), in ``dtype`` on ``device``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(2, tokens, features, generator=gen, dtype=torch.float32) + offset
    return x.to(device=device, dtype=dtype)
