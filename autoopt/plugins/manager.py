"""Plugin discovery and isolation (pluggy, entry-point group ``"autoopt"``).

Built-in templates register through the same ``register(module, name=...)``
path a third-party plugin takes. Every hook is called one implementation at a
time (pluggy would re-raise a plugin's exception at the call site and stop the
others), so a plugin that fails to import, raises, returns garbage or emits an
invalid config is recorded as a :class:`PluginProblem`, logged with plugin,
hook and reason, and skipped; with ``strict=True`` it raises
:class:`~autoopt.errors.PluginError` instead.

The manager is created on first use, never at ``import autoopt``. Set
``AUTOOPT_DISABLE_PLUGIN_AUTOLOAD`` to skip entry points (as pytest's
``PYTEST_DISABLE_PLUGIN_AUTOLOAD``).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from autoopt._log import get_logger
from autoopt.errors import PluginError
from autoopt.plugins import hookspecs

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from autoopt.kernels.template import Template

log = get_logger(__name__)
_FAILED = object()  # marks a hook implementation that raised

__all__ = ["AUTOLOAD_ENV", "BUILTIN", "PluginManager", "PluginProblem", "get_plugin_manager",
           "list_plugins", "reset_plugin_manager"]

AUTOLOAD_ENV = "AUTOOPT_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN = "builtin"
T = TypeVar("T", bound="DataclassInstance")  # call_first answers are dataclasses (replace() credits the plugin)
_OVERRIDE_HOOKS = ("autoopt_choose_path", "autoopt_choose_impl")


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginProblem:
    """A plugin failure that was skipped: which plugin, in which hook, and why."""

    plugin: str
    hook: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"plugin": self.plugin, "hook": self.hook, "reason": self.reason}

    def __str__(self) -> str:
        return f"{self.hook}: {self.reason}"


class PluginManager:
    """A pluggy manager for project ``autoopt`` with per-implementation isolation."""

    def __init__(self, *, autoload: bool = True, builtins: bool = True) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.problems: list[PluginProblem] = []
        #: plugin name -> (distribution name, version) for entry-point plugins.
        self.dists: dict[str, tuple[str, str]] = {}
        self._templates: list[Template] | None = None
        self._template_owner: dict[str, str] = {}
        self._lock = threading.RLock()
        if builtins:
            from autoopt._paths import builtin_templates

            builtin_templates()
            self.register(importlib.import_module("autoopt.templates.plugin"), name=BUILTIN)
        if autoload and not os.environ.get(AUTOLOAD_ENV):
            self.load_entrypoints()

    # -- problems -------------------------------------------------------------
    def report(self, plugin: str, hook: str, reason: str, *, strict: bool = False) -> None:
        """Record a problem (and raise :class:`PluginError` when ``strict``)."""
        problem = PluginProblem(plugin=plugin, hook=hook, reason=reason)
        if problem not in self.problems:
            self.problems.append(problem)
            log.warning("plugin %r skipped in %s: %s", plugin, hook, reason)
        if strict:
            raise PluginError(f"plugin {plugin!r} failed in {hook}: {reason}", plugin=plugin, hook=hook)

    def check_strict(self) -> None:
        """Raise :class:`PluginError` for the first recorded problem, if any."""
        if self.problems:
            p = self.problems[0]
            raise PluginError(f"plugin {p.plugin!r} failed in {p.hook}: {p.reason}", plugin=p.plugin, hook=p.hook)

    # -- registration ------------------------------------------------------------
    def register(self, plugin: Any, *, name: str | None = None, strict: bool = False) -> str | None:
        """Register a module/object of hookimpls; a malformed one is reported and skipped."""
        label = name or str(getattr(plugin, "__name__", repr(plugin)))
        try:
            got = self.pm.register(plugin, name=name)
        except Exception as exc:  # pluggy.PluginValidationError, duplicate names, ...
            self.report(label, "register", f"{type(exc).__name__}: {exc}", strict=strict)
            return None
        self._templates = None
        return got

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._templates = None

    def load_entrypoints(self, group: str = hookspecs.PROJECT) -> None:
        """Load every entry point of ``group``, one at a time (pluggy's own loader stops at the first
        broken plugin; this records it and goes on)."""
        for ep in _entry_points(group):
            if self.pm.get_plugin(ep.name) is not None or self.pm.is_blocked(ep.name):
                continue
            try:
                obj = ep.load()
            except Exception as exc:
                self.report(ep.name, "load", f"cannot import {ep.value!r}: {type(exc).__name__}: {exc}")
                continue
            if self.register(obj, name=ep.name) is not None and ep.dist is not None:
                self.dists[ep.name] = (ep.dist.metadata["Name"], ep.dist.version)

    # -- isolated hook calls -----------------------------------------------------
    def _impls(self, hook: str) -> list[Any]:
        # pluggy calls later-registered / tryfirst implementations first: reverse of get_hookimpls().
        return list(reversed(getattr(self.pm.hook, hook).get_hookimpls()))

    def _safe_call(self, impl: Any, hook: str, kwargs: dict[str, Any], strict: bool) -> Any:
        """One implementation's answer, or ``_FAILED`` after reporting the exception it raised
        (pluggy would re-raise it at the call site and abort every other plugin)."""
        try:
            return impl.function(**{k: kwargs[k] for k in impl.argnames})
        except Exception as exc:
            self.report(impl.plugin_name, hook, f"raised {type(exc).__name__}: {exc}", strict=strict)
            return _FAILED

    def call_each(self, hook: str, check: Callable[[Any], str | None], *, strict: bool = False,
                  **kwargs: Any) -> list[tuple[str, Any]]:
        """Call each implementation of ``hook``; keep (plugin, result) pairs whose ``check`` passes
        (``check`` returns a reason for garbage, or None)."""
        out = []
        for impl in self._impls(hook):
            result = self._safe_call(impl, hook, kwargs, strict)
            if result is _FAILED:
                continue
            why = check(result)
            if why:
                self.report(impl.plugin_name, hook, why, strict=strict)
                continue
            out.append((impl.plugin_name, result))
        return out

    def call_first(self, hook: str, kind: type[T], *, strict: bool = False, **kwargs: Any) -> T | None:
        """First non-None answer of a firstresult hook that is a ``kind`` instance; others reported."""
        for impl in self._impls(hook):
            result = self._safe_call(impl, hook, kwargs, strict)
            if result is _FAILED or result is None:
                continue
            if not isinstance(result, kind):
                self.report(impl.plugin_name, hook,
                            f"returned {type(result).__name__}, expected {kind.__name__} or None", strict=strict)
                continue
            if getattr(result, "source", None) == BUILTIN and impl.plugin_name != BUILTIN:
                result = replace(result, source=impl.plugin_name)  # credit the plugin that answered
            return result
        return None

    # -- contributions -------------------------------------------------------------
    def templates(self, *, strict: bool = False) -> list[Template]:
        """Every valid template from every plugin (cached until a plugin is (un)registered)."""
        with self._lock:
            if self._templates is not None and not strict:
                return self._templates
            found: list[Template] = []
            owner: dict[str, str] = {}
            for plugin, result in self.call_each("autoopt_templates", _check_template_list, strict=strict):
                for t in result:
                    if t.name in owner:
                        self.report(plugin, "autoopt_templates",
                                    f"template name {t.name!r} is already taken by plugin {owner[t.name]!r}",
                                    strict=strict)
                        continue
                    owner[t.name] = plugin
                    found.append(t)
            self._templates, self._template_owner = found, owner
            return found

    def owner_of(self, template: Template | str) -> str:
        """The plugin that contributed a template (by instance or name)."""
        name = template if isinstance(template, str) else template.name
        return self._template_owner.get(name, "unknown")

    def profile_dirs(self, *, strict: bool = False) -> list[Path]:
        """Profile YAML dirs/files contributed by plugins (missing paths reported and skipped)."""
        out: list[Path] = []
        for plugin, result in self.call_each("autoopt_profile_dirs", _check_path_list, strict=strict):
            for p in result:
                path = Path(p)
                if not path.exists():
                    self.report(plugin, "autoopt_profile_dirs", f"path {str(path)!r} does not exist", strict=strict)
                    continue
                out.append(path)
        return out

    def plugin_names(self) -> list[str]:
        return [name for name, _ in self.pm.list_name_plugin()]

    def describe(self) -> list[dict[str, Any]]:
        """One record per plugin (registered or failed): name, version, module, contributions, problems."""
        templates = self.templates()
        dirs: dict[str, list[str]] = {}
        for plugin, result in self.call_each("autoopt_profile_dirs", _check_path_list):
            dirs.setdefault(plugin, []).extend(str(p) for p in result)
        out = []
        names = self.plugin_names() + [p.plugin for p in self.problems]
        for name in dict.fromkeys(names):
            obj = self.pm.get_plugin(name)
            hooks = [h.name for h in self.pm.get_hookcallers(obj) or []] if obj is not None else []
            out.append({
                "name": name,
                "version": self._version(name),
                "distribution": self.dists.get(name, (None, None))[0],
                "module": getattr(obj, "__name__", type(obj).__name__) if obj is not None else None,
                "templates": [t.name for t in templates if self._template_owner.get(t.name) == name],
                "profile_dirs": dirs.get(name, []),
                "hooks": sorted(h for h in hooks if h in _OVERRIDE_HOOKS),
                "problems": [str(p) for p in self.problems if p.plugin == name],
            })
        return out

    def _version(self, name: str) -> str | None:
        if name in self.dists:
            return self.dists[name][1]
        if name == BUILTIN:
            from importlib.metadata import PackageNotFoundError, version

            try:
                return version("autoopt")
            except PackageNotFoundError:
                return None
        return None


def _entry_points(group: str) -> Any:
    """``importlib.metadata.entry_points(group=group)``, without importing importlib.metadata when no
    distribution on ``sys.path`` declares ``group``: its import (email, zipfile, csv, ...) and its
    parse of every installed distribution's entry points cost ~25 ms of a cold recommend() on a
    2-core box (121 distributions), the scan for a ``[group]`` section ~1.5 ms. Anything the scan
    cannot read the way importlib.metadata would (a zip or egg on the path, a meta-path finder with
    its own distributions, an entry_points function replaced by the host) goes to importlib.metadata."""
    md = sys.modules.get("importlib.metadata")
    if md is not None and getattr(md.entry_points, "__module__", None) != md.__name__:
        return md.entry_points(group=group)  # replaced (a host or a test): it decides
    if not _may_declare(group):
        return ()
    from importlib.metadata import entry_points as found

    return found(group=group)


def _may_declare(group: str) -> bool:
    """False only when no ``*.dist-info``/``*.egg-info`` on ``sys.path`` has a ``[group]`` section in
    its entry_points.txt and no other place importlib.metadata looks (zips, eggs, other finders) exists."""
    from importlib.machinery import PathFinder

    if any(f is not PathFinder and getattr(f, "find_distributions", None) for f in sys.meta_path):
        return True
    section = f"[{group}]"  # importlib.metadata's section line, stripped: '[' + group + ']'
    for entry in sys.path:
        if not isinstance(entry, str):
            return True
        if entry.lower().endswith(".egg"):
            return True
        try:
            names = os.listdir(entry or ".")
        except OSError:
            if os.path.exists(entry):  # a zip file: importlib.metadata reads its members
                return True
            continue
        for name in names:
            if name.lower().endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(entry, name, "entry_points.txt"), encoding="utf-8") as fh:
                        if section in fh.read():
                            return True
                except OSError:
                    continue
                except ValueError:  # not UTF-8: let importlib.metadata judge it
                    return True
    return False


def _check_template_list(result: Any) -> str | None:
    # imported here: a start-up that only reads the shipped rank cache never loads the template base
    from autoopt.kernels.template import Template

    if not isinstance(result, (list, tuple)):
        return f"returned {type(result).__name__}, expected a list of Template instances"
    for i, t in enumerate(result):
        if not isinstance(t, Template):
            return f"item {i} is {type(t).__name__}, not an autoopt.template.Template instance"
        if not isinstance(t.name, str) or not t.name:
            return f"item {i} ({type(t).__name__}) has no name"
        if not isinstance(t.ops, tuple) or not t.ops:
            return f"template {t.name!r}: ops must be a non-empty tuple of op kinds, got {t.ops!r}"
    return None


def _check_path_list(result: Any) -> str | None:
    if not isinstance(result, (list, tuple)) or not all(isinstance(p, (str, os.PathLike)) for p in result):
        return f"returned {result!r}, expected a list of paths"
    return None


_MANAGER: PluginManager | None = None
_MANAGER_LOCK = threading.Lock()
#: called after the manager is replaced; later stages that cache what plugins contributed (the
#: rankings) register here, so this stage never imports them.
_ON_RESET: list[Callable[[], None]] = []


def on_reset(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` whenever :func:`reset_plugin_manager` replaces the manager (decorator-friendly)."""
    if callback not in _ON_RESET:
        _ON_RESET.append(callback)
    return callback


def get_plugin_manager(*, strict: bool = False) -> PluginManager:
    """The process-wide manager, created on first use; ``strict`` raises for any recorded problem."""
    global _MANAGER
    with _MANAGER_LOCK:
        if _MANAGER is None:
            _MANAGER = PluginManager()
        pm = _MANAGER
    if strict:
        pm.check_strict()
    return pm


def reset_plugin_manager(manager: PluginManager | None = None) -> None:
    """Drop (or replace) the process-wide manager, and cached rankings built from its templates."""
    global _MANAGER
    with _MANAGER_LOCK:
        _MANAGER = manager
    for callback in tuple(_ON_RESET):
        callback()


def list_plugins() -> list[dict[str, Any]]:
    """What ``autoopt plugins`` shows: each plugin's name, version, module, contributions and problems."""
    return get_plugin_manager().describe()
