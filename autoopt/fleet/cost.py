"""What one evaluation roughly costs, so the fleet hands the longest ones out first.

The pools dispatch longest-processing-time-first (LPT, Graham 1969): each idle worker takes the
costliest item waiting. A sweep's end is then made of short items, so no GPU is left finishing one
large GEMM alone while the others idle; LPT's finish time is within 4/3 of the best possible
schedule, against 2x for an arbitrary order. The estimate only has to *order* items; its scale is
nominal seconds on a current datacenter GPU:

- compiling a new Triton config takes 0.2-1 s on the lent H100/H200 hosts (see
  ``autoopt.tuning.precompile``), more for more pipeline stages, more warps and bigger tiles, whose
  unrolled code the compiler schedules;
- making the inputs and the float64 reference, and the timed runs, grow with the op's FLOPs and
  bytes (large GEMMs first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autoopt.kernels.ops import OpSpec

__all__ = ["estimated_cost"]

#: seconds to compile the smallest config, and per pipeline stage, per warp, per tile element
COMPILE_BASE_S, PER_STAGE_S, PER_WARP_S, PER_TILE_ELEMENT_S = 0.2, 0.05, 0.02, 2.0**-22
#: effective rates of reference + inputs + timed runs (float64 reference matmul, randn, copies)
REFERENCE_FLOPS_PER_S, INPUT_BYTES_PER_S = 1e13, 1e11


def estimated_cost(op: Mapping[str, Any], config: Mapping[str, Any]) -> float:
    """Nominal seconds to evaluate ``config`` (a ``KernelConfig.to_dict()``) on ``op`` (an
    ``OpSpec.to_dict()``): compile (stages, warps, tile size) plus work (FLOPs, bytes). Used only to
    order the fleet's queue longest-first (LPT scheduling; see the module doc), never reported."""
    spec = OpSpec.from_dict(op)
    params = config.get("config", {})
    ints = {k: v for k, v in params.items() if isinstance(v, int) and not isinstance(v, bool)}
    tile = math.prod(v for k, v in ints.items() if k.startswith("BLOCK_"))
    compile_s = (COMPILE_BASE_S + PER_STAGE_S * ints.get("num_stages", 1) + PER_WARP_S * ints.get("num_warps", 4)
                 + PER_TILE_ELEMENT_S * tile)
    return compile_s + spec.flops / REFERENCE_FLOPS_PER_S + spec.min_bytes / INPUT_BYTES_PER_S
