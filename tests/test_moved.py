"""0.1 module paths keep working for one release: the same module object, with a DeprecationWarning."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoopt._moved import MOVED, MOVED_NAMES

ROOT = Path(__file__).resolve().parents[1]


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_old_path_is_the_new_module(old, new):
    with pytest.warns(DeprecationWarning) if old not in sys.modules else _nothing():
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_old_path_warning_names_the_replacement():
    out = _fresh("import autoopt.ops")
    assert out.returncode == 1 and "autoopt.ops moved to autoopt.kernels.ops" in out.stderr


def test_from_old_path_import_name_gives_the_same_class():
    out = _fresh("import warnings; warnings.simplefilter('ignore')\n"
                 "from autoopt.profile import GPUProfile\n"
                 "from autoopt.hardware.profile import GPUProfile as New\n"
                 "print(GPUProfile is New)")
    assert out.stdout.strip() == "True", out.stderr


def test_every_moved_name_exists_at_its_new_place():
    for new in MOVED_NAMES.values():
        module, _, name = new.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name))


def test_every_new_module_exists():
    for new in MOVED.values():
        assert importlib.util.find_spec(new) is not None
