"""Lazy package attributes: ``pkg.name`` imports its module on first use (PEP 562).

``autoopt``, ``autoopt.nn`` and ``autoopt.validation`` expose names whose modules pull in heavy
imports (torch, sqlite3, the templates); importing the package must stay cheap, so each name is
resolved the first time it is read and then kept in the package's namespace.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, table: Mapping[str, str], namespace: dict[str, Any], names: list[str]
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``table`` maps a name to the module defining it."""

    def __getattr__(name: str) -> Any:
        try:
            module = table[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
