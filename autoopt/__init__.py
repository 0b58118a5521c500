"""autoopt: looks at a machine and a model, says how to run the model's kernels fast.

Public API (everything but the errors is imported lazily, so ``import autoopt``
stays fast and never imports torch, triton, rich or pynvml)::

    profile = autoopt.detect()                      # or autoopt.load_profile("h100-sxm")
    ranking = autoopt.rank(profile, {"kind": "gemm", "shape": (256, 6144, 4096), "dtype": "bf16"})
    plan    = autoopt.recommend(profile, "llama-3-8b", batch=8, context=8192)

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
}

__all__ = [
    "AutooptError", "BackendError", "ConfigError", "ModelError", "OpError", "PluginError",
    "ProfileError", "UnknownProfileError", "__version__", *_LAZY,
]

if TYPE_CHECKING:  # pragma: no cover
    from autoopt.hardware.detection import detect
    from autoopt.hardware.profile import CPUProfile, GPUProfile, HardwareProfile
    from autoopt.kernels.config import Candidate, KernelConfig
    from autoopt.kernels.ops import OpSpec
    from autoopt.kernels.template import Template
    from autoopt.planning.recommendation import Recommendation, recommend
    from autoopt.search.ranking import rank


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
