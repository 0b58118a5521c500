"""`import autoopt` is cheap: no torch, no triton, no rich, no pynvml, well under 150 ms."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "rich", "pynvml", "numpy", "yaml", "cpuinfo", "pluggy")


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args, "-c", code], capture_output=True, text=True, env=env,
                          check=True, cwd=ROOT)


def test_import_autoopt_pulls_in_no_heavy_module():
    out = _run("import sys, json, autoopt; print(json.dumps(sorted(sys.modules)))")
    loaded = set(json.loads(out.stdout))
    assert not [m for m in HEAVY if m in loaded]


def test_import_time_reported_by_importtime_is_well_under_150ms():
    # -X importtime writes one line per module: "import time: self | cumulative | name".
    best = min(
        int(line.split("|")[1])
        for line in [
            next(ln for ln in _run("import autoopt", "-X", "importtime").stderr.splitlines()
                 if ln.rstrip().endswith("| autoopt"))
            for _ in range(3)
        ]
    )
    assert best < 150_000, f"import autoopt took {best} us"


# prints whether autoopt imported tempfile; on stderr, the stack that first asked for it (a failure names the
# culprit). Some interpreters load tempfile before any user code (a site hook, a .pth file: CI's did, with an
# empty stack): then nothing autoopt does can cost it, and the test checks only that autoopt adds nothing.
_COLD_RECOMMEND = ("import sys, traceback\n"
                   "before = set(sys.modules)\n"
                   "class Watch:\n"
                   "    def find_spec(self, name, path=None, target=None):\n"
                   "        if name == 'tempfile':\n"
                   "            sys.stderr.write(''.join(traceback.format_stack(limit=30)))\n"
                   "sys.meta_path.insert(0, Watch())\n"
                   "import logging; logging.basicConfig(level=logging.INFO)\n"
                   "import autoopt\n"
                   "autoopt.recommend('h100-sxm', 'llama-3-8b', batch=1, phase='decode')\n"
                   "print('tempfile' in set(sys.modules) - before)")


def test_a_cold_recommend_does_not_import_tempfile(tmp_path):
    # the stores' atomic writer imports it when it writes: tempfile (shutil, bz2, lzma, random) is ~5 ms.
    # Cold means a fresh machine: an empty cache folder of its own, not the one earlier tests filled
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _COLD_RECOMMEND], capture_output=True, text=True, check=True,
                         cwd=ROOT, env=env)
    assert out.stdout.strip() == "False", out.stderr[-6000:]


def test_without_home_the_cache_folder_is_found_without_importing_platformdirs():
    # CI runners and services often start with no $HOME: the cache folder then comes from the password
    # database (as expanduser does), not from platformdirs, which imports tempfile (~5 ms)
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", "AUTOOPT_CACHE_DIR")}
    code = ("import sys\n"
            "before = set(sys.modules)\n"
            "from autoopt.results.location import default_path\n"
            "path = default_path()\n"
            "new = set(sys.modules) - before\n"
            "print(path.is_absolute(), 'platformdirs' in new, 'tempfile' in new)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**env, "PYTHONPATH": str(ROOT)})
    assert out.stdout.split() == ["True", "False", "False"]


def test_importtime_lists_neither_torch_nor_triton():
    lines = _run("import autoopt", "-X", "importtime").stderr.splitlines()
    names = {ln.rsplit("|", 1)[-1].strip() for ln in lines if "|" in ln}
    assert "torch" not in names and "triton" not in names


def test_lazy_public_api_resolves_on_first_use():
    out = _run("import autoopt; print(autoopt.OpSpec.__module__, autoopt.HardwareProfile.__name__)")
    assert out.stdout.split() == ["autoopt.kernels.ops", "HardwareProfile"]


def test_tune_and_tune_ops_are_on_the_package_face():
    out = _run("import autoopt; print(autoopt.tune.__module__, autoopt.tune_ops.__module__, "
               "'tune' in autoopt.__all__, 'tune_ops' in autoopt.__all__)")
    assert out.stdout.split() == ["autoopt.tuning.campaign", "autoopt.tuning.campaign", "True", "True"]


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="with a GPU it tunes for real")
def test_tune_without_a_cuda_gpu_is_a_backend_error_naming_it():
    code = ("import autoopt\n"
            "try:\n"
            "    autoopt.tune(autoopt.load_profile('h100-sxm'), {'kind': 'gemm', 'shape': (16, 64, 64)})\n"
            "except autoopt.BackendError as exc:\n"
            "    print('BackendError', exc)\n")
    out = _run(code, "-X", "utf8").stdout
    assert out.startswith("BackendError") and "GPU" in out


def test_public_functions_stay_callable_after_every_submodule_is_imported():
    # a submodule named like a public function would replace it on the package when imported
    code = ("import importlib, pkgutil, autoopt\n"
            "for m in pkgutil.iter_modules(autoopt.__path__):\n"
            "    if m.name != '__main__': importlib.import_module('autoopt.' + m.name)\n"
            "names = ('detect', 'rank', 'recommend', 'load_profile', 'tune', 'tune_ops')\n"
            "print(all(callable(getattr(autoopt, n)) for n in names))")
    assert _run(code).stdout.strip() == "True"


def test_a_cold_recommend_on_a_fresh_machine_loads_only_what_it_uses(tmp_path):
    # what a runtime pays at start-up on a new install: no results store, no calibrated constants,
    # a current shipped rank cache. Each module below costs ms and would answer nothing here.
    code = ("import sys, json, autoopt\n"
            "from autoopt.hardware.library import load_profile\n"
            "from autoopt.planning.recommendation import recommend\n"
            "recommend(load_profile('h100-sxm-8x'), 'llama-3-70b', runtime='vllm')\n"
            "print(json.dumps(sorted(sys.modules)))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         cwd=ROOT)
    loaded = set(json.loads(out.stdout))
    unused = ("logging", "sqlite3", "importlib.metadata", "autoopt.results.records", "autoopt.results.lookup",
              "autoopt.results.constants", "autoopt.kernels.cost", "autoopt.kernels.template",
              "autoopt.planning.offload", "autoopt.search.ranking")
    assert not [m for m in unused if m in loaded]
    assert "autoopt.search.rank_cache" in loaded  # the answers came from the shipped cache
