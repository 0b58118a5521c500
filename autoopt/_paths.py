"""Where the shipped data lives, in a wheel and in a source checkout.

A wheel installs ``profiles/`` as ``autoopt/profiles`` and ``templates/`` as the
``autoopt.templates`` package (see ``[tool.setuptools.package-dir]``). Running
from a checkout (``PYTHONPATH=.``) finds them beside the ``autoopt`` folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).resolve().parent


def profiles_dir() -> Path:
    """The folder of known-hardware YAML profiles."""
    for cand in (_HERE / "profiles", _HERE.parent / "profiles"):
        if cand.is_dir():
            return cand
    return _HERE / "profiles"


def builtin_templates() -> ModuleType:
    """Import the built-in templates package (``templates/``) as ``autoopt.templates``."""
    try:
        return importlib.import_module("autoopt.templates")
    except ModuleNotFoundError:
        tree = _HERE.parent / "templates"
        spec = importlib.util.spec_from_file_location(
            "autoopt.templates", tree / "__init__.py", submodule_search_locations=[str(tree)])
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules["autoopt.templates"] = module
        spec.loader.exec_module(module)
        return module
