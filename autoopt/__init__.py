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

from .errors import (
    AutooptError,
    BackendError,
    ConfigError,
    ModelError,
    OpError,
    PluginError,
    ProfileError,
    UnknownProfileError,
)

__version__ = "0.1.0"

_LAZY = {
    "detect": ("autoopt.detection", "detect"),
    "load_profile": ("autoopt.api", "load_profile"),
    "known_profiles": ("autoopt.api", "known_profiles"),
    "rank": ("autoopt.ranking", "rank"),
    "recommend": ("autoopt.recommendation", "recommend"),
    "HardwareProfile": ("autoopt.profile", "HardwareProfile"),
    "GPUProfile": ("autoopt.profile", "GPUProfile"),
    "CPUProfile": ("autoopt.profile", "CPUProfile"),
    "OpSpec": ("autoopt.ops", "OpSpec"),
    "KernelConfig": ("autoopt.config", "KernelConfig"),
    "Candidate": ("autoopt.config", "Candidate"),
    "Template": ("autoopt.template", "Template"),
    "Recommendation": ("autoopt.recommendation", "Recommendation"),
    "ModelSpec": ("autoopt.model", "ModelSpec"),
}

__all__ = [
    "AutooptError", "BackendError", "ConfigError", "ModelError", "OpError", "PluginError",
    "ProfileError", "UnknownProfileError", "__version__", *_LAZY,
]

if TYPE_CHECKING:  # pragma: no cover
    from .config import Candidate, KernelConfig
    from .detection import detect
    from .ops import OpSpec
    from .profile import CPUProfile, GPUProfile, HardwareProfile
    from .ranking import rank
    from .recommendation import Recommendation, recommend
    from .template import Template


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
