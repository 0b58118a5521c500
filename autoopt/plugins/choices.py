"""Plugin-aware choices: the first plugin's execution path or implementation, else the built-in default.

The defaults and the answer types live in :mod:`autoopt.kernels.choices`; this module only asks the
plugins first (``autoopt_choose_path`` / ``autoopt_choose_impl`` are first-result hooks, and the
built-ins answer ``trylast``).
"""

from __future__ import annotations

from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.choices import KERNEL_CLASSES, ImplChoice, PathChoice, default_impl, default_path
from autoopt.kernels.ops import OpSpec
from autoopt.plugins.manager import get_plugin_manager

__all__ = ["choose_impl", "choose_path"]


def choose_path(gpu: GPUProfile, op: OpSpec, *, strict: bool = False) -> PathChoice:
    """Path for ``op`` on ``gpu``: the first plugin answer, else :func:`default_path`."""
    got = get_plugin_manager().call_first("autoopt_choose_path", PathChoice, strict=strict, gpu=gpu, op=op)
    return got if got is not None else default_path(gpu, op)


def choose_impl(gpu: GPUProfile, kernel_class: str, *, strict: bool = False) -> ImplChoice:
    """Implementation for ``kernel_class`` on ``gpu``: the first plugin answer, else :func:`default_impl`."""
    if kernel_class not in KERNEL_CLASSES:
        raise AutooptError(f"unknown kernel class {kernel_class!r}; expected one of {', '.join(KERNEL_CLASSES)}")
    got = get_plugin_manager().call_first("autoopt_choose_impl", ImplChoice, strict=strict,
                                          gpu=gpu, kernel_class=kernel_class)
    return got if got is not None else default_impl(gpu, kernel_class)
