"""autoopt: looks at a machine and a model, says how to run the model's kernels fast.

Public API (everything but the errors is imported lazily, so ``import autoopt``
stays fast and never imports torch, triton, rich or pynvml)::

    profile = autoopt.detect()                      # or autoopt.load_profile("h100-sxm")
    ranking = autoopt.rank(profile, {"kind": "gemm", "shape": (256, 6144, 4096), "dtype": "bf16"})
    plan    = autoopt.recommend(profile, "llama-3-8b", batch=8, context=8192)
    @autoopt.autotune(configs=[...], key=["M", "N", "K"])  # triton.autotune's drop-in: times the top 4
    report  = autoopt.optimize(model)               # swap an nn.Module's linears/norms/MLPs for the kernels

Errors all derive from :class:`AutooptError` (tree in :mod:`autoopt.errors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoopt._moved import install as _install_moved_paths
from autoopt.errors import (
    AutooptError,
    BackendError,
    ConfigError,
    ModelError,
    OpError,
    PluginError,
    ProfileError,
    UnknownProfileError,
)

__version__ = "0.2.0"

_install_moved_paths()  # 0.1 module paths (autoopt.ops, autoopt.ranking, ...) still import, with a warning

_LAZY = {
    "detect": ("autoopt.hardware.detection", "detect"),
    "load_profile": ("autoopt.api", "load_profile"),
    "known_profiles": ("autoopt.api", "known_profiles"),
    "rank": ("autoopt.search.ranking", "rank"),
    "recommend": ("autoopt.planning.recommendation", "recommend"),
    "HardwareProfile": ("autoopt.hardware.profile", "HardwareProfile"),
    "GPUProfile": ("autoopt.hardware.profile", "GPUProfile"),
    "CPUProfile": ("autoopt.hardware.profile", "CPUProfile"),
    "OpSpec": ("autoopt.kernels.ops", "OpSpec"),
    "KernelConfig": ("autoopt.kernels.config", "KernelConfig"),
    "Candidate": ("autoopt.kernels.config", "Candidate"),
    "Template": ("autoopt.kernels.template", "Template"),
    "Recommendation": ("autoopt.planning.recommendation", "Recommendation"),
    "ModelSpec": ("autoopt.planning.model", "ModelSpec"),
    "autotune": ("autoopt.tuning.autotune", "autotune"),
    "optimize": ("autoopt.nn.optimize", "optimize"),
    "restore": ("autoopt.nn.optimize", "restore"),
    "OptimizeReport": ("autoopt.nn.report", "OptimizeReport"),
}

__all__ = [
    "AutooptError", "BackendError", "ConfigError", "ModelError", "OpError", "PluginError",
    "ProfileError", "UnknownProfileError", "__version__", *_LAZY,
]

if TYPE_CHECKING:  # pragma: no cover
    # every _LAZY name, typed; `name as name` marks each as re-exported (it is in __all__ through _LAZY)
    from autoopt.api import known_profiles as known_profiles
    from autoopt.api import load_profile as load_profile
    from autoopt.hardware.detection import detect as detect
    from autoopt.hardware.profile import CPUProfile as CPUProfile
    from autoopt.hardware.profile import GPUProfile as GPUProfile
    from autoopt.hardware.profile import HardwareProfile as HardwareProfile
    from autoopt.kernels.config import Candidate as Candidate
    from autoopt.kernels.config import KernelConfig as KernelConfig
    from autoopt.kernels.ops import OpSpec as OpSpec
    from autoopt.kernels.template import Template as Template
    from autoopt.nn.optimize import optimize as optimize
    from autoopt.nn.optimize import restore as restore
    from autoopt.nn.report import OptimizeReport as OptimizeReport
    from autoopt.planning.model import ModelSpec as ModelSpec
    from autoopt.planning.recommendation import Recommendation as Recommendation
    from autoopt.planning.recommendation import recommend as recommend
    from autoopt.search.ranking import rank as rank
    from autoopt.tuning.autotune import autotune as autotune


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'autoopt' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
