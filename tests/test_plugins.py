"""Plugin system: discovery, isolation of broken plugins, strict mode, overrides, a real install."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import sysconfig
import types
from importlib.metadata import EntryPoint
from pathlib import Path

import pluggy
import pytest

from autoopt.errors import PluginError
from autoopt.hardware.library import load_profile
from autoopt.kernels.choices import PathChoice
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.template import Prediction, Template
from autoopt.plugins.choices import choose_path
from autoopt.plugins.manager import (
    AUTOLOAD_ENV,
    PluginManager,
    get_plugin_manager,
    list_plugins,
    reset_plugin_manager,
)
from autoopt.search.ranking import rank

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIR = ROOT / "plugins" / "autoopt-blackwell"
hookimpl = pluggy.HookimplMarker("autoopt")
H100 = load_profile("h100-sxm").gpu
A100 = load_profile("a100-sxm-80gb").gpu
OP = OpSpec(kind="gemm", shape=(512, 512, 512))


def plugin_module(name: str, **hooks) -> types.ModuleType:
    """A module object carrying the given hook implementations, as a third party's would."""
    mod = types.ModuleType(name)
    for hook, fn in hooks.items():
        setattr(mod, hook, hookimpl(fn))
    return mod


@pytest.fixture
def pm():
    """A fresh manager with the built-ins and no entry points, installed as the process-wide one."""
    manager = PluginManager(autoload=False)
    reset_plugin_manager(manager)
    yield manager
    reset_plugin_manager()


class TinyGemm(Template):
    """A plugin template with one config; ``path``/``warps`` let tests make it invalid."""

    name = "tiny-gemm"
    ops = ("gemm",)

    def __init__(self, path="standard", warps=4, us=1.0):
        self.path, self.warps, self.us = path, warps, us

    def space(self, gpu, op):
        yield KernelConfig(kernel="tiny", template=self.name, path=self.path, params={"num_warps": self.warps})

    def validate(self, gpu, op, config):
        return []

    def predict(self, gpu, op, config):
        return Prediction(us=self.us, bound="compute", roofline_pct=1.0, reason="tiny")


def test_builtins_register_through_the_plugin_path(pm):
    assert pm.plugin_names() == ["builtin"]
    assert [t.name for t in pm.templates()] == ["gemm", "gemv", "hopper-tma-gemm", "elementwise", "norm", "quant-gemv",
                                                "quant-gemv-swap", "quant-gemm", "quant-dequant-cublas",
                                                "fused-moe-triton"]
    assert pm.problems == []


def test_plugin_raising_in_a_hook_is_reported_with_plugin_hook_and_reason_and_skipped(pm, caplog):
    def autoopt_templates():
        raise RuntimeError("no GPU database")
    pm.register(plugin_module("broken", autoopt_templates=autoopt_templates), name="broken")
    with caplog.at_level(logging.WARNING, logger="autoopt.plugins.manager"):
        names = [t.name for t in pm.templates()]
    assert "gemm" in names
    assert [p.to_dict() for p in pm.problems] == [
        {"plugin": "broken", "hook": "autoopt_templates", "reason": "raised RuntimeError: no GPU database"}]
    assert "plugin 'broken' skipped in autoopt_templates: raised RuntimeError: no GPU database" in caplog.text
    assert rank(H100, OP).candidates  # ranking still works


@pytest.mark.parametrize(("ret", "why"), [
    ("gemm", "returned str, expected a list of Template instances"),
    ([object()], "item 0 is object, not an autoopt.template.Template instance"),
    ([TinyGemm], "item 0 is type, not an autoopt.template.Template instance"),
])
def test_garbage_template_list_is_reported_and_skipped(pm, ret, why):
    pm.register(plugin_module("junk", autoopt_templates=lambda: ret), name="junk")
    assert "tiny-gemm" not in [t.name for t in pm.templates()]
    assert [(p.plugin, p.hook, p.reason) for p in pm.problems] == [("junk", "autoopt_templates", why)]


def test_a_plugin_template_wins_when_it_predicts_faster(pm):
    pm.register(plugin_module("tiny", autoopt_templates=lambda: [TinyGemm()]), name="tiny")
    r = rank(H100, OP)
    assert r.best.config.template == "tiny-gemm"
    assert pm.owner_of("tiny-gemm") == "tiny"


@pytest.mark.parametrize(("tpl", "reason"), [
    (TinyGemm(path="wgmma"), "invalid config: path 'wgmma' needs sm_90a; sm_80 lacks wgmma"),
    (TinyGemm(warps=64), "invalid config: num_warps=64 x warp 32 = 2048 threads > 1024 per block"),
])
def test_invalid_config_from_a_plugin_template_is_rejected_and_reported(pm, tpl, reason):
    pm.register(plugin_module("bad", autoopt_templates=lambda: [tpl]), name="bad")
    r = rank(A100, OP, top=1000)
    assert all(c.config.template != "tiny-gemm" for c in r.candidates)
    assert [(p.plugin, p.hook, p.reason) for p in pm.problems] == [("bad", "Template.space (tiny-gemm)", reason)]


def test_garbage_prediction_from_a_plugin_template_is_skipped(pm):
    pm.register(plugin_module("nan", autoopt_templates=lambda: [TinyGemm(us=float("nan"))]), name="nan")
    assert rank(H100, OP).best.config.template != "tiny-gemm"
    assert pm.problems[0].hook == "Template.predict (tiny-gemm)"


def test_strict_turns_a_plugin_failure_into_plugin_error(pm):
    pm.register(plugin_module("bad", autoopt_templates=lambda: [TinyGemm(path="wgmma")]), name="bad")
    with pytest.raises(PluginError, match=r"plugin 'bad' failed in Template\.space") as info:
        rank(A100, OP, strict=True)
    assert (info.value.plugin, info.value.hook) == ("bad", "Template.space (tiny-gemm)")
    with pytest.raises(PluginError):
        get_plugin_manager(strict=True)


def test_a_plugin_path_choice_overrides_the_builtin_one(pm):
    def autoopt_choose_path(gpu, op):
        return PathChoice(path="standard", reason="site policy: no TMA", source="site")
    pm.register(plugin_module("site", autoopt_choose_path=autoopt_choose_path), name="site")
    got = choose_path(H100, OpSpec(kind="gemm", shape=(4096, 4096, 4096)))
    assert (got.path, got.source) == ("standard", "site")


def test_a_plugin_path_choice_of_the_wrong_type_is_reported_and_the_builtin_used(pm):
    pm.register(plugin_module("odd", autoopt_choose_path=lambda gpu, op: "tma"), name="odd")
    got = choose_path(H100, OpSpec(kind="gemm", shape=(4096, 4096, 4096)))
    assert (got.path, got.source) == ("tma_wgmma", "builtin")
    assert pm.problems[0].reason == "returned str, expected PathChoice or None"


def test_a_plugin_with_a_misnamed_hook_argument_is_reported_at_register(pm):
    bad = plugin_module("typo", autoopt_choose_path=lambda gpu, operation: None)
    assert pm.register(bad, name="typo") is None
    assert pm.problems[0].plugin == "typo" and pm.problems[0].hook == "register"


def test_entry_point_that_fails_to_import_is_reported_and_others_still_load(monkeypatch):
    good = types.ModuleType("good_plugin")
    good.autoopt_templates = hookimpl(lambda: [TinyGemm()])
    monkeypatch.setitem(sys.modules, "good_plugin", good)
    eps = [EntryPoint(name="missing", value="no_such_module_xyz", group="autoopt"),
           EntryPoint(name="good", value="good_plugin", group="autoopt")]
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: eps)
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    manager = PluginManager()
    assert "tiny-gemm" in [t.name for t in manager.templates()]
    assert manager.problems[0].plugin == "missing" and manager.problems[0].hook == "load"
    assert "No module named 'no_such_module_xyz'" in manager.problems[0].reason


def test_env_var_disables_entry_point_autoload(monkeypatch):
    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group: [EntryPoint(name="x", value="no_such_module_xyz", group="autoopt")])
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    manager = PluginManager()
    assert manager.plugin_names() == ["builtin"] and manager.problems == []


def test_manager_is_not_created_at_import():
    code = "import autoopt, autoopt.plugins.manager as p; print(p._MANAGER is None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "True", out.stderr


def test_list_plugins_describes_contributions_and_problems(pm):
    pm.register(plugin_module("broken", autoopt_templates=lambda: 42), name="broken")
    rows = {r["name"]: r for r in list_plugins()}
    assert rows["builtin"]["templates"] == ["gemm", "gemv", "hopper-tma-gemm", "elementwise", "norm", "quant-gemv",
                                            "quant-gemv-swap", "quant-gemm", "quant-dequant-cublas",
                                            "fused-moe-triton"]
    assert rows["builtin"]["hooks"] == ["autoopt_choose_impl", "autoopt_choose_path"]
    assert rows["broken"]["problems"] == ["autoopt_templates: returned int, expected a list of Template instances"]


def test_example_walkthrough_runs():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "write_a_template_plugin.py")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("OK")


_RANK_SCRIPT = """
import json
from autoopt.library import load_profile
from autoopt.ops import OpSpec
from autoopt.plugins import list_plugins
from autoopt.ranking import rank
op = OpSpec(kind="gemm", shape=(8192, 8192, 8192), dtype="fp8")
out = {name: rank(load_profile(name), op, top=1).best.config.template for name in ("b200", "h100-sxm")}
out["plugins"] = list_plugins()
print(json.dumps(out))
"""


@pytest.mark.slow
def _venv_with_plugin(tmp_path: Path) -> Path:
    """A fresh venv holding the example plugin as an installed distribution; returns its python.

    The wheel is built by the interpreter running the tests (it has the project's build
    requirements), then installed with --no-deps --no-index, so nothing depends on what the
    machine's base Python holds (a stock 3.11 base has setuptools 65.5 and no ``wheel``). The venv
    sees this interpreter's packages (pluggy, pyyaml, ...) through a .pth file, not through
    --system-site-packages, which would be the base Python's.
    """
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(dist), str(PLUGIN_DIR)], check=True, capture_output=True, cwd=tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    outer = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(purelib, "_outer_site.pth").write_text("\n".join(sorted(outer)) + "\n")
    wheel, = dist.glob("autoopt_blackwell-*.whl")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, capture_output=True, cwd=tmp_path)
    return py


def test_installed_plugin_is_found_by_entry_point_and_used_only_on_its_architecture(tmp_path):
    py = _venv_with_plugin(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD_ENV}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([str(py), "-c", _RANK_SCRIPT], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["b200"] == "blackwell-tcgen05-gemm"
    assert got["h100-sxm"] != "blackwell-tcgen05-gemm"
    row = next(p for p in got["plugins"] if p["name"] == "blackwell")
    assert row["version"] == "0.1.0" and row["distribution"] == "autoopt-blackwell"
    assert row["templates"] == ["blackwell-tcgen05-gemm"] and row["hooks"] == ["autoopt_choose_path"]
    assert row["problems"] == []


def test_builtin_template_names_known_without_import_match_the_templates_hook() -> None:
    from autoopt.templates import plugin

    assert tuple(t.name for t in plugin.autoopt_templates()) == plugin.TEMPLATE_NAMES
