"""Hook implementations of the autoopt-blackwell plugin (entry point ``autoopt: blackwell``)."""

from __future__ import annotations

import pluggy

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.choices import PathChoice
from autoopt.kernels.ops import OpSpec

from .template import BlackwellClusterGemm

hookimpl = pluggy.HookimplMarker("autoopt")


@hookimpl
def autoopt_templates() -> list:
    return [BlackwellClusterGemm()]


@hookimpl
def autoopt_choose_path(gpu: GPUProfile, op: OpSpec) -> PathChoice | None:
    """fp8/fp4 GEMMs on tcgen05 GPUs take the cluster path; everything else is left to others."""
    if op.is_matmul and op.dtype in ("fp8", "fp4") and gpu.features.tcgen05:
        return PathChoice(path="fp4_cluster", reason=f"{gpu.arch}: {op.dtype} on tcgen05 with 2-CTA clusters "
                                                     "and TMA multicast", source="blackwell")
    return None
