"""What a module and its replacement are compared on: samples, tolerances, the relative error.

Shared by :mod:`autoopt.nn.recognize` (its behaviour probes: does this module compute a norm, a gated
MLP ...?) and :mod:`autoopt.nn.optimize` (its check: does the replacement compute what the original
does?), so that neither calls into the other for them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["FLOAT_DTYPES", "rel_error", "sample", "tolerance"]

#: dtypes the kernels serve.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: relative Frobenius error ``||out - ref|| / ||ref||`` allowed, by dtype.
_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
#: fp32 matmuls at float32_matmul_precision 'high'/'medium' run as TF32 (10-bit mantissa).
_TOL_TF32 = 5e-3


def tolerance(dtype: torch.dtype, *, matmul: bool = False) -> float:
    """The relative error allowed for a module of ``dtype`` (looser for fp32 matmuls allowed to use TF32)."""
    tol = _TOL.get(dtype, 1e-4)
    if matmul and dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        tol = max(tol, _TOL_TF32)
    return tol


def rel_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 (inf when shapes differ or anything is not finite).

    Summed a chunk of about 2^20 elements at a time, so that checking an ``lm_head`` of a large
    vocabulary adds megabytes, not a float64 copy of its whole output, to the memory peak."""
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor) or out.shape != ref.shape:
        return math.inf
    width = out.shape[-1] if out.dim() and out.shape[-1] else 1
    o, r = out.detach().reshape(-1, width), ref.detach().reshape(-1, width)
    step = max(1, (1 << 20) // width)
    num = den = 0.0
    for i in range(0, o.shape[0], step):
        a, b = o[i:i + step].double(), r[i:i + step].double()
        d2, r2 = float((a - b).square().sum()), float(b.square().sum())
        if not (math.isfinite(d2) and math.isfinite(r2)):
            return math.inf
        num, den = num + d2, den + r2
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def sample(features: int, dtype: torch.dtype, device: torch.device, *, tokens: int = 8, offset: float = 0.0,
           seed: int = 0) -> torch.Tensor:
    """A ``[2, tokens, features]`` normal sample (plus ``offset``) from a private generator (the global
    RNG is not touched), in ``dtype`` on ``device``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(2, tokens, features, generator=gen, dtype=torch.float32) + offset
    return x.to(device=device, dtype=dtype)
