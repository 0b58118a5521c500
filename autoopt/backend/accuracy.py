"""How far an output is from its reference: the one relative-error measure every check uses (the runner's
kernel checks, the quantized formats' error against the 16-bit layer, ``optimize()``'s replacement checks).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["rel_error"]


def rel_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 (inf when shapes differ or anything is not finite).

    Summed a chunk of about 2^20 elements at a time, so that checking an ``lm_head`` of a large
    vocabulary adds megabytes, not a float64 copy of its whole output, to the memory peak."""
    import torch

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
