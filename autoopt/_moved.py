"""Old module paths (before the stage sub-packages) keep importing, with a DeprecationWarning, for one release.

``import autoopt.ops`` (0.1 layout) gives the very module ``autoopt.kernels.ops``: the same object,
so classes, ``isinstance`` and monkeypatching agree. Three old modules were split; what left them
is named in :data:`MOVED_NAMES` and is not reachable through the old path.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import importlib.abc

__all__ = ["MOVED", "MOVED_NAMES", "install"]

#: old module (0.1) -> new module. Remove in 0.3.
MOVED: dict[str, str] = {
    "autoopt.profile": "autoopt.hardware.profile",
    "autoopt.features": "autoopt.hardware.features",
    "autoopt.cpu": "autoopt.hardware.cpu",
    "autoopt.nvml_probe": "autoopt.hardware.nvml",
    "autoopt.torch_probe": "autoopt.hardware.torch_cuda",
    "autoopt.probes": "autoopt.hardware.probes",
    "autoopt.library": "autoopt.hardware.library",
    "autoopt.detection": "autoopt.hardware.detection",
    "autoopt.ops": "autoopt.kernels.ops",
    "autoopt.config": "autoopt.kernels.config",
    "autoopt.template": "autoopt.kernels.template",
    "autoopt.constraints": "autoopt.kernels.constraints",
    "autoopt.cost": "autoopt.kernels.cost",
    "autoopt.pruning": "autoopt.kernels.pruning",
    "autoopt.choices": "autoopt.kernels.choices",
    "autoopt.suite": "autoopt.kernels.suite",
    "autoopt.hookspecs": "autoopt.plugins.hookspecs",
    "autoopt.ranking": "autoopt.search.ranking",
    "autoopt.model": "autoopt.planning.model",
    "autoopt.catalog": "autoopt.planning.catalog",
    "autoopt.quant": "autoopt.planning.quant",
    "autoopt.memory": "autoopt.planning.memory",
    "autoopt.split": "autoopt.planning.split",
    "autoopt.schedule": "autoopt.planning.schedule",
    "autoopt.plan": "autoopt.planning.chain",
    "autoopt.recommendation": "autoopt.planning.recommendation",
}

#: names that left a module when it was split: old "module.name" -> new "module.name".
MOVED_NAMES: dict[str, str] = {
    "autoopt.choices.choose_path": "autoopt.plugins.choices.choose_path",
    "autoopt.choices.choose_impl": "autoopt.plugins.choices.choose_impl",
    "autoopt.cost.fit_constants": "autoopt.search.calibration.fit_constants",
    "autoopt.model.parse_model": "autoopt.planning.catalog.parse_model",
}


class _Alias:
    """Finds an old module name and loads it as the new module object, warning once per name.

    A meta-path finder and loader by protocol (``find_spec``, ``create_module``, ``exec_module``), not by
    inheriting ``importlib.abc``: importing that module pulls in ``importlib.resources`` and ``tempfile``,
    about 12 ms of every ``import autoopt`` on a 2-core machine."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("importlib.abc.Loader", self))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new} in autoopt 0.2; import {new} instead "
                      "(the old path goes in 0.3)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The new module is already executed."""


_FINDER = _Alias()


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once); asks nothing of names outside :data:`MOVED`."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
