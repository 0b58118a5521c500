"""Cold-start shortcuts stay exact: lazy tile tables, the MMA-time floor, plugin discovery, one-file load.

The per-GPU tile tables of the GEMM templates hold cheap facts for every tile and
probe a tile's MMA times only when the ranking expands it; its root bound uses a
floor of those times instead. Plugin discovery scans ``sys.path`` for an
``[autoopt]`` entry-point section before importing importlib.metadata, and
``load_profile(name)`` parses only that name's file. Each must give what the slow
way gives (tests/test_rank_pruning.py checks the rankings themselves).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoopt.hardware.library import clear_cache, get_known, known_names, load_profile
from autoopt.kernels.ops import OpSpec
from autoopt.plugins import manager as plugins
from autoopt.plugins.manager import AUTOLOAD_ENV, PluginManager
from autoopt.search.ranking import clear_cache as clear_rankings
from autoopt.search.ranking import rank
from autoopt.templates.gemm import GemmTemplate, block_ks
from autoopt.templates.gemv import GemvTemplate
from autoopt.templates.hopper import HopperTmaGemmTemplate

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("h100-sxm", "a100-sxm-80gb", "rtx-4090", "l4", "b200", "mi300x", "stress-12kb")


def _every_tile(template, gpu, dtype):
    """(tile key, TileTable) for every tile of the template's table on this GPU and dtype."""
    if isinstance(template, GemvTemplate):
        tables = template.tables(gpu, dtype, 1)
        keys = [(bn, bk) for bn in (16, 32, 64, 128, 256) for bk in (32, 64, 128, 256, 512)]
    elif isinstance(template, HopperTmaGemmTemplate):
        tables = template.tables(gpu, dtype, dtype)
        keys = [(bm, bn, bk) for bm in (64, 128, 256) for bn in (64, 128, 256) for bk in block_ks(dtype)]
    else:
        tables = template.tables(gpu, dtype)
        keys = [(bm, bn, bk) for bm in (16, 32, 64, 128, 256) for bn in (32, 64, 128, 256)
                for bk in block_ks(dtype)]
    return [(key, tables[key]) for key in keys]


@pytest.mark.parametrize("profile", PROFILES)
def test_tile_floor_is_at_most_every_probed_mma_time(profile):
    gpu = load_profile(profile).gpu
    for template in (GemmTemplate(), GemvTemplate(), HopperTmaGemmTemplate()):
        if isinstance(template, HopperTmaGemmTemplate) and not (gpu.features.tma and gpu.features.wgmma):
            continue
        for dtype in ("bf16", "fp8", "fp32"):
            for key, tt in _every_tile(template, gpu, dtype):
                for w, _, t_min, stages, _, _ in tt.variants():
                    assert tt.t_comp_floor <= t_min * (1 + 1e-12), (template.name, dtype, key, w)
                    assert all(t >= t_min for _, _, t in stages)


def test_ranking_probes_only_the_tiles_it_expands(monkeypatch):
    import autoopt.templates.gemm as gemm

    probed = []
    real = gemm.probe_t_comp
    monkeypatch.setattr(gemm, "probe_t_comp",
                        lambda t, g, op, cfg: probed.append(op.shape) or real(t, g, op, cfg))
    clear_rankings()
    r = rank(load_profile("a100-sxm-80gb").gpu, OpSpec(kind="gemm", shape=(4096, 4096, 4096)), top=3)
    # 60 tiles x 3 num_warps are probed by an eager table; the search expands a handful of tiles
    assert r.considered == 900 and 0 < len(set(probed)) <= 12 and len(probed) <= 60


def test_the_gpus_of_a_machine_profile_share_one_tile_table():
    gpus = load_profile("h100-sxm-8x").gpus
    t = GemmTemplate()
    assert t.tables(gpus[0], "bf16") is t.tables(gpus[7], "bf16")
    assert t.tables(gpus[0], "bf16")[(128, 128, 64)] is t.tables(gpus[3], "bf16")[(128, 128, 64)]


def test_a_tile_is_built_on_its_first_lookup_and_probed_on_its_first_expansion():
    gpu = load_profile("l4").gpu
    tables = GemmTemplate().tables(gpu, "fp16")
    assert (32, 32, 128) not in tables
    tt = tables[(32, 32, 128)]
    assert (32, 32, 128) in tables and tt._probed == []
    assert tt.variants() is tt.variants() and len(tt._probed) == 1


# -- plugin discovery --------------------------------------------------------------------------

def _dist(root: Path, name: str, entry_points: str) -> None:
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_scan_finds_a_distribution_declaring_the_group(tmp_path, monkeypatch):
    _dist(tmp_path, "other", "[console_scripts]\nautoopt = x:y\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert plugins._may_declare("autoopt") is False
    _dist(tmp_path, "mine", "[autoopt]\nmine = mine_plugin\n")
    assert plugins._may_declare("autoopt") is True


def test_a_zip_on_the_path_sends_discovery_to_importlib_metadata(tmp_path, monkeypatch):
    (tmp_path / "bundle.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "bundle.zip")])
    assert plugins._may_declare("autoopt") is True


def test_an_installed_entry_point_is_loaded_through_the_scan(tmp_path, monkeypatch):
    (tmp_path / "scan_found_plugin.py").write_text(
        "import pluggy\nfrom autoopt.templates.gemm import GemmTemplate\n"
        "class Found(GemmTemplate):\n    name = 'found-gemm'\n"
        "@pluggy.HookimplMarker('autoopt')\ndef autoopt_templates():\n    return [Found()]\n")
    _dist(tmp_path, "scan-found", "[autoopt]\nfound = scan_found_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    manager = PluginManager()
    assert "found-gemm" in [t.name for t in manager.templates()]
    assert manager.dists["found"] == ("scan-found", "1.0")


def test_discovery_without_a_declaring_distribution_does_not_import_importlib_metadata():
    code = ("import sys, json; from autoopt.plugins import get_plugin_manager; pm = get_plugin_manager(); "
            "print(json.dumps([pm.plugin_names(), 'importlib.metadata' in sys.modules]))")
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD_ENV}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                         check=True)
    names, imported = json.loads(out.stdout)
    if plugins._may_declare("autoopt"):
        pytest.skip("a distribution on this sys.path declares autoopt entry points")
    assert names == ["builtin"] and imported is False


# -- load_profile by name --------------------------------------------------------------------

@pytest.mark.parametrize("name", known_names())
def test_load_profile_by_name_equals_the_full_library_entry(name):
    clear_cache()
    alone = load_profile(name)
    assert alone.to_dict() == get_known(name).to_profile().to_dict()


def test_load_profile_by_alias_still_finds_the_device():
    clear_cache()
    assert load_profile("H100 SXM5 80GB").name == get_known("H100 SXM5 80GB").name
