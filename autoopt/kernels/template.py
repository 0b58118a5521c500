"""The template interface every built-in and plugin template implements.

A template knows one family of kernels: which ops and GPUs it applies to, the
search space of configs it can emit (knobs and caps derived from the profile),
the hard constraints a config must meet (``validate``), and a cost-model
prediction for each valid config. Configs use Triton's own key names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

__all__ = ["Prediction", "Template"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Cost-model output for one config: time, what bounds it, and the terms behind it."""

    us: float
    bound: str
    roofline_pct: float
    reason: str = ""
    breakdown: dict[str, float] = field(default_factory=dict)


class Template:
    """Base class: subclass, set ``name`` and ``ops``, implement the four methods."""

    #: unique name, e.g. ``"gemm"`` or ``"blackwell-fp4-gemm"``.
    name: ClassVar[str] = ""
    #: op kinds (see :data:`autoopt.ops.OP_KINDS`) this template can serve.
    ops: ClassVar[tuple[str, ...]] = ()
    #: higher wins ties between templates whose predictions are equal.
    priority: ClassVar[int] = 0
    #: whether its kernels read packed quantized weights (``OpSpec.weight``): an op with one is
    #: offered only to templates that say so (see autoopt.kernels.quant).
    quantized_weights: ClassVar[bool] = False

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        """Whether this template can serve ``op`` on ``gpu`` at all."""
        return op.kind in self.ops

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterable[KernelConfig]:
        """Every config worth considering, before hard constraints."""
        raise NotImplementedError

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        """Hard-constraint violations of ``config`` (empty list: valid)."""
        raise NotImplementedError

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        """Cost-model prediction for a valid config."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "ops": list(self.ops), "priority": self.priority,
                "class": f"{type(self).__module__}.{type(self).__qualname__}"}
