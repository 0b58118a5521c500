"""The hooks a plugin may implement (pluggy project ``"autoopt"``).

A plugin is a module (or object) with functions marked by
``pluggy.HookimplMarker("autoopt")``, registered through the ``autoopt``
entry-point group of its distribution::

    [project.entry-points.autoopt]
    blackwell = "autoopt_blackwell.plugin"

Hooks that choose (``autoopt_choose_path``/``autoopt_choose_impl``) are
``firstresult``: the first non-``None`` answer wins, and plugins are asked
before the built-ins (whose implementations are ``trylast``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # annotations only: no import cycle at runtime
    from autoopt.hardware.profile import GPUProfile
    from autoopt.kernels.choices import ImplChoice, PathChoice
    from autoopt.kernels.ops import OpSpec
    from autoopt.kernels.template import Template

__all__ = ["PROJECT", "hookimpl", "hookspec"]

#: pluggy project name and entry-point group.
PROJECT = "autoopt"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# A hookspec is a signature that pluggy reads and never calls: its body is the docstring alone, which
# mypy's empty-body check takes for a missing return on the hooks that return a list.
@hookspec
def autoopt_templates() -> list[Template]:  # type: ignore[empty-body]
    """Templates this plugin contributes (instances of :class:`autoopt.template.Template`).

    Each template decides per op and GPU whether it applies (``Template.applies``),
    so one plugin can target one architecture or kernel class.
    """


@hookspec
def autoopt_profile_dirs() -> list[str | Path]:  # type: ignore[empty-body]
    """Directories (or single files) of known-hardware profile YAML this plugin ships."""


@hookspec(firstresult=True)
def autoopt_choose_path(gpu: GPUProfile, op: OpSpec) -> PathChoice | None:
    """The execution path for ``op`` on ``gpu`` (:class:`autoopt.choices.PathChoice`), or None to pass."""


@hookspec(firstresult=True)
def autoopt_choose_impl(gpu: GPUProfile, kernel_class: str) -> ImplChoice | None:
    """The implementation to use for a kernel class (:class:`autoopt.choices.ImplChoice`), or None."""


@hookspec
def autoopt_runtimes() -> list[dict[str, Any]]:  # type: ignore[empty-body]
    """Serving runtimes this plugin describes (TensorRT-LLM, MLC, ...): plain dicts in the schema of
    :meth:`autoopt.runtimes.spec.RuntimeSpec.from_dict` (each checked; a bad one is reported and skipped)."""


@hookspec
def autoopt_trace_rules() -> list[dict[str, str]]:  # type: ignore[empty-body]
    """Kernel-name rules for ``autoopt trace``: ``{"class": <op class>, "pattern": <regex>}`` dicts, tried
    before the built-in rules (:data:`autoopt.trace.classify.RULES`); a bad rule is reported and skipped."""
