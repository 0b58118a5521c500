"""The built-in templates' plugin module: registered as ``"builtin"`` through the same
``PluginManager.register`` path a third-party plugin takes. The choice hooks are
``trylast`` so any plugin's answer comes first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.ops import OpSpec
from autoopt.plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from autoopt.kernels.choices import ImplChoice, PathChoice
    from autoopt.kernels.template import Template

#: the names of the templates :func:`autoopt_templates` returns, in its order, known without importing
#: them: a start-up lookup (the shipped rank cache) checks them against its header, and importing the
#: five template modules costs ~10 ms of a ~125 ms cold recommend() on a 2-core box
#: (tests/test_plugins.py checks the two agree)
TEMPLATE_NAMES = ("gemm", "gemv", "hopper-tma-gemm", "elementwise", "norm", "quant-gemv", "quant-gemv-swap",
                  "quant-gemm", "quant-dequant-cublas", "fused-moe-triton")


@hookimpl
def autoopt_templates() -> list[Template]:
    from autoopt.templates.elementwise import ElementwiseTemplate
    from autoopt.templates.gemm import GemmTemplate
    from autoopt.templates.gemv import GemvTemplate
    from autoopt.templates.hopper import HopperTmaGemmTemplate
    from autoopt.templates.moe import FusedMoeTemplate
    from autoopt.templates.norm import NormTemplate
    from autoopt.templates.quant import (
        QuantDequantCublasTemplate,
        QuantGemmTemplate,
        QuantGemvSwapTemplate,
        QuantGemvTemplate,
    )

    return [GemmTemplate(), GemvTemplate(), HopperTmaGemmTemplate(), ElementwiseTemplate(), NormTemplate(),
            QuantGemvTemplate(), QuantGemvSwapTemplate(), QuantGemmTemplate(), QuantDequantCublasTemplate(),
            FusedMoeTemplate()]


@hookimpl(trylast=True)
def autoopt_choose_path(gpu: GPUProfile, op: OpSpec) -> PathChoice:
    from autoopt.kernels.choices import default_path

    return default_path(gpu, op)


@hookimpl(trylast=True)
def autoopt_choose_impl(gpu: GPUProfile, kernel_class: str) -> ImplChoice:
    from autoopt.kernels.choices import default_impl

    return default_impl(gpu, kernel_class)
