"""autoopt: looks at a machine and a model, says how to run the model's kernels fast.

Public API (everything but the errors is imported lazily, so ``import autoopt``
stays fast and never imports torch, triton, rich or pynvml)::

    profile = autoopt.detect()                      # or autoopt.load_profile("h100-sxm")
    ranking = autoopt.rank(profile, {"kind": "gemm", "shape": (256, 6144, 4096), "dtype": "bf16"})
    plan    = autoopt.recommend(profile, "llama-3-8b", batch=8, context=8192)
    @autoopt.autotune(configs=[...], key=["M", "N", "K"])  # triton.autotune's drop-in: times the top 4
    report  = autoopt.optimize(model)               # swap an nn.Module's linears/norms/MLPs for the kernels
    result  = autoopt.tune(profile, {"kind": "gemm", "shape": (256, 6144, 4096), "dtype": "bf16"})
    tuned   = autoopt.tune_ops(profile, [op_a, op_b], budget_s=60)  # measured winners kept in the store

Errors all derive from :class:`AutooptError` (tree in :mod:`autoopt.errors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoopt._lazy import lazy_attributes
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
    "detect": "autoopt.hardware.detection",
    "load_profile": "autoopt.api",
    "known_profiles": "autoopt.api",
    "rank": "autoopt.search.ranking",
    "recommend": "autoopt.planning.recommendation",
    "HardwareProfile": "autoopt.hardware.profile",
    "GPUProfile": "autoopt.hardware.profile",
    "CPUProfile": "autoopt.hardware.profile",
    "OpSpec": "autoopt.kernels.ops",
    "KernelConfig": "autoopt.kernels.config",
    "Candidate": "autoopt.kernels.config",
    "Template": "autoopt.kernels.template",
    "Recommendation": "autoopt.planning.recommendation",
    "ModelSpec": "autoopt.planning.model",
    "autotune": "autoopt.tuning.autotune",
    "tune": "autoopt.tuning.campaign",
    "tune_ops": "autoopt.tuning.campaign",
    "TuneResult": "autoopt.tuning.tuner",
    "TunedOp": "autoopt.tuning.campaign",
    "optimize": "autoopt.nn.optimize",
    "restore": "autoopt.nn.optimize",
    "OptimizeReport": "autoopt.nn.report",
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
    from autoopt.tuning.campaign import TunedOp as TunedOp
    from autoopt.tuning.campaign import tune as tune
    from autoopt.tuning.campaign import tune_ops as tune_ops
    from autoopt.tuning.tuner import TuneResult as TuneResult


__getattr__, __dir__ = lazy_attributes("autoopt", _LAZY, globals(), __all__)
