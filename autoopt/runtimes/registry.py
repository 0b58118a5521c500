"""The runtimes autoopt knows: the built-ins plus what plugins describe, by name.

A plugin's description is checked like a built-in's; one that fails is reported through the plugin
manager and skipped, and a plugin cannot replace a built-in (the name is taken).
"""

from __future__ import annotations

import threading
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError, RuntimeRuleError
from autoopt.plugins.manager import get_plugin_manager, on_reset
from autoopt.runtimes.builtin import BUILTIN_RUNTIMES
from autoopt.runtimes.spec import RuntimeSpec

__all__ = ["get_runtime", "runtime_names", "runtimes"]

log = get_logger(__name__)
_CACHE: dict[str, RuntimeSpec] = {}
_LOCK = threading.Lock()


def _check_list(result: Any) -> str | None:
    if not isinstance(result, (list, tuple)):
        return f"returned {type(result).__name__}, expected a list of runtime description dicts"
    return None


def _load() -> dict[str, RuntimeSpec]:
    found = {d["name"]: RuntimeSpec.from_dict(d) for d in BUILTIN_RUNTIMES}
    pm = get_plugin_manager()
    for plugin, result in pm.call_each("autoopt_runtimes", _check_list):
        for i, data in enumerate(result):
            try:
                spec = RuntimeSpec.from_dict(data)
            except AutooptError as exc:
                pm.report(plugin, "autoopt_runtimes", f"item {i}: {exc}")
                continue
            if spec.name in found:
                pm.report(plugin, "autoopt_runtimes", f"runtime name {spec.name!r} is already taken")
                continue
            found[spec.name] = spec
    return found


def runtimes() -> dict[str, RuntimeSpec]:
    """Name -> spec of every known runtime (cached until the plugin manager is replaced)."""
    with _LOCK:
        if not _CACHE:
            _CACHE.update(_load())
        return dict(_CACHE)


@on_reset
def _forget() -> None:
    with _LOCK:
        _CACHE.clear()


def runtime_names() -> tuple[str, ...]:
    return tuple(runtimes())


def get_runtime(name: str | RuntimeSpec) -> RuntimeSpec:
    """The spec called ``name`` (a spec passes through); a typed error listing the known names."""
    if isinstance(name, RuntimeSpec):
        return name
    known = runtimes()
    if not isinstance(name, str) or name.strip().lower() not in known:
        raise RuntimeRuleError(f"unknown runtime {name!r}; known: {', '.join(known)}", rule="name")
    return known[name.strip().lower()]
