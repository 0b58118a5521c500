"""The shipped start-up data (rank cache, YAML mirrors): current, equal to what it replaces, ignored when stale.

When a test here fails with "stale", a template, the cost model, a profile or the catalog changed
since the shipped files were written: run ``PYTHONPATH=. python benchmarks/regen_startup_cache.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from autoopt.errors import AutooptError, OpError
from autoopt.hardware import library, yaml_mirror
from autoopt.hardware.library import known_names, load_profile
from autoopt.kernels.cost import DEFAULT_CONSTANTS, using
from autoopt.kernels.ops import OpSpec
from autoopt.planning import catalog, recommendation
from autoopt.plugins.manager import PluginManager, get_plugin_manager, reset_plugin_manager
from autoopt.results import keys
from autoopt.results.lookup import ResultLookup, reset_default_lookup
from autoopt.search import rank_cache
from autoopt.search.ranking import rank

ROOT = Path(__file__).resolve().parents[1]
REGEN = "run `PYTHONPATH=. python benchmarks/regen_startup_cache.py`"
H100 = load_profile("h100-sxm").gpu


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No measured winners, no calibrated constants, built-in templates only, nothing cached in-process."""
    monkeypatch.setattr("autoopt.results.lookup._default", ResultLookup(store_path=None, shipped_dir=None))
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", "off")
    monkeypatch.setattr(recommendation, "_RANK_CACHE", {})
    reset_plugin_manager(PluginManager(autoload=False))
    rank_cache.clear_cache()
    yield
    reset_plugin_manager()
    reset_default_lookup()
    rank_cache.clear_cache()


def _header(path: Path) -> dict:
    return json.loads(zlib.decompress(path.read_bytes()).decode().partition("\n")[0])


def _ops(path: Path) -> list[OpSpec]:
    ops = []
    for line in zlib.decompress(path.read_bytes()).decode().splitlines()[1:]:
        kind, shape, dtype, layout, out_dtype, *weight = line.partition("\t")[0].split(" ")
        ops.append(OpSpec(kind=kind, shape=tuple(int(x) for x in shape.split("x")), dtype=dtype, layout=layout,
                          out_dtype=out_dtype, weight=weight[0].removeprefix("w=") if weight else None))
    return ops


def _gpus() -> dict[Path, object]:
    """Shipped cache file -> a built-in profile's GPU it serves."""
    return {rank_cache.file_for(gpu): gpu for gpu in (load_profile(n).gpu for n in known_names())}


# -- the shipped rank cache -------------------------------------------------------------------

def test_every_shipped_rank_cache_file_is_current():
    files = sorted(rank_cache.SHIPPED_DIR.glob(f"*{rank_cache.SUFFIX}"))
    assert files, f"no shipped rank cache: {REGEN}"
    assert set(files) == set(_gpus()), f"the shipped files are not one per built-in GPU: {REGEN}"
    sources = rank_cache.code_sources()
    for path in files:
        h = _header(path)
        assert h["sources"] == sources, f"{path.name} is stale (templates or cost model changed): {REGEN}"
        assert h["constants"] == DEFAULT_CONSTANTS.to_dict(), f"{path.name} is stale (constants): {REGEN}"
        assert h["templates"] == [t.name for t in get_plugin_manager().templates()], f"{path.name}: {REGEN}"
        assert h["autoopt_version"] == __import__("autoopt").__version__, f"{path.name} is stale: {REGEN}"


@pytest.mark.parametrize("path", sorted(rank_cache.SHIPPED_DIR.glob(f"*{rank_cache.SUFFIX}")), ids=lambda p: p.name)
def test_shipped_answers_equal_a_fresh_ranking(path):
    gpu = _gpus()[path]
    ops = _ops(path)
    for op in ops[:: max(1, len(ops) // 12)]:  # ~12 ops of every GPU, spread over the file's sorted keys
        cached = rank_cache.best(gpu, op)
        assert cached is not None, f"{path.name}: no answer for {op.label()} (stale?): {REGEN}"
        try:
            fresh = rank(gpu, op, top=3, measured=False).best
        except AutooptError as exc:
            assert isinstance(cached, AutooptError) and str(cached) == str(exc), op.label()
            continue
        assert cached == fresh, op.label()
        assert type(cached.roofline_pct) is type(fresh.roofline_pct), op.label()


@pytest.mark.parametrize(("profile", "model", "runtime", "kwargs"), [
    ("h100-sxm-8x", "llama-3-70b", "vllm", {}),
    ("a100-sxm-80gb", "mixtral-8x7b", None, {"preference": "speed"}),
    ("rtx-4090", "llama-3-8b", "llama.cpp", {}),
    ("h200-4x", "deepseek-v3", "sglang", {"preference": "quality"}),
    ("mi300x", "qwen2.5-72b", None, {"batch": 8}),  # partly outside the cache: it ranks what it lacks
    ("h100-sxm", "llama-3-8b", "transformers", {"top": 1}),
])
def test_recommend_is_the_same_with_and_without_the_cache(monkeypatch, profile, model, runtime, kwargs):
    def plan() -> dict:
        d = recommendation.recommend(load_profile(profile), model, runtime=runtime, **kwargs).to_dict()
        d.pop("elapsed_ms")
        for k in ("plan", "plan_alternative"):
            if d[k]:
                d[k].pop("elapsed_s")
        return d

    with_cache = plan()
    monkeypatch.setattr(recommendation, "_RANK_CACHE", {})
    monkeypatch.setattr(rank_cache, "SHIPPED_DIR", Path("/nonexistent/autoopt-rank-cache"))
    rank_cache.clear_cache()
    assert plan() == with_cache


def test_a_cold_recommend_reads_the_cache_and_no_yaml():
    code = ("import sys, autoopt\n"
            "autoopt.recommend(autoopt.load_profile('h100-sxm-8x'), 'llama-3-70b', runtime='vllm')\n"
            "print(sorted(m for m in ('yaml', 'autoopt.search.ranking', 'torch', 'triton') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_CACHE_DIR": "off", "AUTOOPT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]", f"a cold recommend() ranked or parsed YAML (stale files?): {REGEN}"


# -- answers the cache must not give -------------------------------------------------------

OP = OpSpec(kind="gemm", shape=(256, 6144, 4096), dtype="bf16")


def _built(tmp_path: Path, ops: list[OpSpec] | None = None) -> Path:
    answers = []
    for op in ops or [OP]:
        answers.append((H100, op, rank(H100, op, measured=False).best))
    rank_cache.write(answers, tmp_path, constants=DEFAULT_CONSTANTS.to_dict())
    return rank_cache.file_for(H100, tmp_path)


def test_a_measured_winner_labels_the_cached_config_or_leaves_the_answer_to_rank(tmp_path):
    from autoopt.results.lookup import default_lookup

    _built(tmp_path)
    cached = rank_cache.best(H100, OP, folder=tmp_path)
    assert cached is not None and cached.source == "predicted"
    default_lookup().remember(keys.make_result(H100, OP, cached.config, label="measured", us=12.5,
                                               kernel_module="autoopt.backend.kernels.gemm"))
    hit = rank_cache.best(H100, OP, folder=tmp_path)
    assert hit is not None and (hit.source, hit.measured_us, hit.config) == ("measured:memory", 12.5, cached.config)
    assert hit == rank(H100, OP).best
    other = rank(H100, OP, top=2, measured=False).candidates[1]
    default_lookup().remember(keys.make_result(H100, OP, other.config, label="measured", us=5.0,
                                               kernel_module="autoopt.backend.kernels.gemm"))
    assert rank_cache.best(H100, OP, folder=tmp_path) is None  # another config measured faster: rank() decides


def test_other_constants_make_the_cache_stand_aside(tmp_path, caplog):
    _built(tmp_path)
    with using(replace(DEFAULT_CONSTANTS, l2_bw_ratio=DEFAULT_CONSTANTS.l2_bw_ratio * 2)), \
            caplog.at_level(logging.INFO, logger="autoopt.search.rank_cache"):
        assert rank_cache.best(H100, OP, folder=tmp_path) is None
    assert "other cost-model constants" in caplog.text
    assert rank_cache.best(H100, OP, folder=tmp_path) is not None


def test_a_plugin_template_makes_the_cache_stand_aside(tmp_path):
    from tests.test_plugins import TinyGemm, plugin_module

    _built(tmp_path)
    manager = PluginManager(autoload=False)
    manager.register(plugin_module("tiny", autoopt_templates=lambda: [TinyGemm()]), name="tiny")
    reset_plugin_manager(manager)
    assert rank_cache.best(H100, OP, folder=tmp_path) is None


def test_an_op_or_gpu_the_cache_does_not_hold_gets_no_answer(tmp_path):
    _built(tmp_path)
    assert rank_cache.best(H100, replace(OP, shape=(257, 6144, 4096)), folder=tmp_path) is None
    assert rank_cache.best(load_profile("a10").gpu, OP, folder=tmp_path) is None


def test_an_error_rank_raised_comes_back_as_that_error(tmp_path):
    from autoopt.errors import ConfigError

    exc = ConfigError("no valid config for gemm[256x6144x4096] on X: smem too small (x3)", reasons=("smem",))
    rank_cache.write([(H100, OP, exc)], tmp_path, constants=DEFAULT_CONSTANTS.to_dict())
    got = rank_cache.best(H100, OP, folder=tmp_path)
    assert isinstance(got, ConfigError) and (str(got), got.reasons) == (str(exc), exc.reasons)


# -- files that are not right ------------------------------------------------------------------

def _rewrite(path: Path, edit) -> None:
    head, _, body = zlib.decompress(path.read_bytes()).decode().partition("\n")
    head, body = edit(json.loads(head), body)
    path.write_bytes(zlib.compress((json.dumps(head) + "\n" + body).encode()))


@pytest.mark.parametrize(("edit", "logged"), [
    (lambda h, b: ({**h, "sources": {**h["sources"], "templates/gemm.py": "00000000"}}, b),
     "built from other sources (templates/gemm.py changed)"),
    (lambda h, b: ({**h, "autoopt_version": "0.0.1"}, b), "built by autoopt 0.0.1"),
    (lambda h, b: ({**h, "templates": ["gemm"]}, b), "built for templates"),
])
def test_a_stale_file_is_ignored_with_a_log_line(tmp_path, caplog, edit, logged):
    _rewrite(_built(tmp_path), edit)
    with caplog.at_level(logging.INFO, logger="autoopt.search.rank_cache"):
        assert rank_cache.best(H100, OP, folder=tmp_path) is None
        assert rank_cache.best(H100, OP, folder=tmp_path) is None
    assert logged in caplog.text and "regen_startup_cache" in caplog.text
    assert caplog.text.count(logged) == 1  # once per file and reason


@pytest.mark.parametrize(("damage", "logged"), [
    (lambda p: p.write_bytes(b"not zlib at all"), "not zlib-compressed"),
    (lambda p: p.write_bytes(zlib.compress(b"{\"format\": \"something else\"}\n")), "not a autoopt-rank-cache"),
    (lambda p: p.write_bytes(p.read_bytes()[:-20]), "cut short"),
    (lambda p: p.write_bytes(zlib.compress(b"\xff\xfe" * 10)), "not zlib-compressed UTF-8"),
    (lambda p: p.write_bytes(zlib.compress(b"[" * 100_000 + b"\n")), "not a JSON header"),
    (lambda p: (p.unlink(), p.mkdir()), "not a regular file"),
    (lambda p: p.write_bytes(b"\0" * (rank_cache.MAX_FILE_BYTES + 1)), "more than a rank cache file holds"),
    (lambda p: _rewrite(p, lambda h, b: ({**h, "entries": 7}, b)), "the header says 7"),
    (lambda p: _rewrite(p, lambda h, b: ({k: v for k, v in h.items() if k != "constants"}, b)), "'constants'"),
])
def test_a_broken_file_is_ignored_with_a_warning_never_an_exception(tmp_path, caplog, damage, logged):
    damage(_built(tmp_path))
    with caplog.at_level(logging.WARNING, logger="autoopt.search.rank_cache"):
        assert rank_cache.best(H100, OP, folder=tmp_path) is None
    assert "ignored" in caplog.text and logged in caplog.text


def test_a_bomb_is_not_inflated(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(rank_cache, "MAX_TEXT_BYTES", 1 << 16)
    path = _built(tmp_path)
    path.write_bytes(zlib.compress(b"\n" * (1 << 20), 9))
    with caplog.at_level(logging.WARNING, logger="autoopt.search.rank_cache"):
        assert rank_cache.best(H100, OP, folder=tmp_path) is None
    assert "inflates past" in caplog.text


def test_a_bad_entry_is_dropped_and_the_others_answer(tmp_path, caplog):
    other = replace(OP, shape=(512, 6144, 4096))
    path = _built(tmp_path, [OP, other])
    key = rank_cache.op_key(OP)
    _rewrite(path, lambda h, b: (h, "\n".join(f"{key}\t{{\"kernel\": 3}}" if ln.startswith(key + "\t") else ln
                                                for ln in b.splitlines()) + "\n"))
    with caplog.at_level(logging.WARNING, logger="autoopt.search.rank_cache"):
        assert rank_cache.best(H100, OP, folder=tmp_path) is None
        assert rank_cache.best(H100, other, folder=tmp_path) is not None
    assert "malformed entry" in caplog.text


# -- the YAML mirrors ------------------------------------------------------------------------

def _mirrored() -> list[tuple[Path, Path]]:
    from autoopt._paths import profiles_dir

    return [*((p, library.MIRROR) for p in sorted(profiles_dir().glob("*.yaml"))), (catalog._DATA, catalog.MIRROR)]


@pytest.mark.parametrize(("path", "mirror"), _mirrored(), ids=lambda x: x.name)
def test_every_shipped_yaml_file_is_in_its_mirror_and_reads_as_yaml_does(path, mirror):
    import yaml

    text = path.read_text()
    data = yaml_mirror.load(text, path.name, mirror)
    assert data is not None, f"{path.name} changed since its mirror was written: {REGEN}"
    assert yaml_mirror._same(data, yaml.safe_load(text))


def test_an_edited_yaml_file_is_parsed_not_mirrored(tmp_path, monkeypatch):
    from autoopt._paths import profiles_dir

    text = (profiles_dir() / "h100-sxm.yaml").read_text()
    assert yaml_mirror.load(text, "h100-sxm.yaml", library.MIRROR) is not None
    assert yaml_mirror.load(text + "# edited\n", "h100-sxm.yaml", library.MIRROR) is None
    assert yaml_mirror.load(text, "h100-pcie.yaml", library.MIRROR) is None  # the text under another name
    (tmp_path / "h100-sxm.yaml").write_text(text + "# edited\n")
    parsed = library._load_file(tmp_path / "h100-sxm.yaml")
    monkeypatch.setattr(library, "MIRROR", tmp_path / "no-mirror.json")
    assert {**parsed.to_dict(), "path": ""} == {**library._load_file(profiles_dir() / "h100-sxm.yaml").to_dict(),
                                                "path": ""}


@pytest.mark.parametrize("content", [b"{not json", b"[]", json.dumps({"format": "x"}).encode(), b"\xff\xfe"])
def test_a_broken_mirror_is_ignored_with_a_warning(tmp_path, caplog, content):
    mirror = tmp_path / "m.json"
    mirror.write_bytes(content)
    yaml_mirror.clear_cache()
    with caplog.at_level(logging.WARNING, logger="autoopt.hardware.yaml_mirror"):
        assert yaml_mirror.load("a: 1\n", "a.yaml", mirror) is None
    assert "ignored" in caplog.text
    yaml_mirror.clear_cache()


def test_a_mirror_keeps_only_what_json_carries_exactly(tmp_path):
    (tmp_path / "a.yaml").write_text("x: 1\ny: [1.5, true, null]\n")
    (tmp_path / "b.yaml").write_text("1: one\n")  # an int key: JSON would make it "1"
    (tmp_path / "c.yaml").write_text("when: 2024-01-01\n")  # a date
    mirror = yaml_mirror.write(sorted(tmp_path.glob("*.yaml")), tmp_path / "m.json")
    assert yaml_mirror.load("x: 1\ny: [1.5, true, null]\n", "a.yaml", mirror) == {"x": 1, "y": [1.5, True, None]}
    assert yaml_mirror.load("1: one\n", "b.yaml", mirror) is None
    assert yaml_mirror.load("when: 2024-01-01\n", "c.yaml", mirror) is None
    yaml_mirror.clear_cache()


# -- where the results cache is -------------------------------------------------------------

@pytest.mark.parametrize("env", [{}, {"XDG_CACHE_HOME": "/tmp/xdg-cache"}, {"XDG_CACHE_HOME": ""},
                                 {"XDG_CACHE_HOME": "relative/dir"}, {"HOME": "/tmp/home-dir/"},
                                 {"HOME": None}, {"HOME": ""}, {"HOME": "relative-home"}])
def test_the_store_folder_is_platformdirs_own_answer(monkeypatch, env):
    import platformdirs

    from autoopt.results.location import default_path

    monkeypatch.delenv("AUTOOPT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    assert default_path() == Path(platformdirs.user_cache_dir("autoopt")) / "results.sqlite3"


def test_with_no_home_to_find_there_is_no_store_and_one_warning(monkeypatch, caplog):
    # no $HOME, no $XDG_CACHE_HOME and an account with no password entry: platformdirs 4 raises RuntimeError
    import platformdirs

    from autoopt.results import location

    def no_home(*_a, **_k):
        raise RuntimeError("could not determine the home directory for '~/.cache'")

    for var in ("AUTOOPT_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("os.path.expanduser", lambda p: p)
    monkeypatch.setattr(platformdirs, "user_cache_dir", no_home)
    monkeypatch.setattr(location, "_warned_no_home", False)
    with caplog.at_level("WARNING"):
        assert location.default_path() is None
        assert location.default_path() is None
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["no results cache"]


# -- this machine's learned answers ------------------------------------------------------------

ODD = OpSpec(kind="gemm", shape=(77, 1234, 4096), dtype="bf16")  # no catalog model has it: not shipped


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    """A cache folder of its own (the learned files live there); nothing remembered in-process."""
    from autoopt.results import presence, winners

    monkeypatch.setenv("AUTOOPT_CACHE_DIR", str(tmp_path))
    presence.clear()
    winners.clear()
    yield tmp_path
    presence.clear()
    winners.clear()


def test_an_op_ranked_here_is_learned_and_then_answered_without_ranking(cache_on):
    assert rank_cache.best(H100, ODD) is None
    answer = rank(H100, ODD).best
    rank_cache.learn(H100, ODD, answer)
    (path,) = rank_cache.flush()
    assert path.parent == cache_on / "ranks"
    rank_cache.clear_cache()
    assert rank_cache.best(H100, ODD) == answer


def test_a_learned_error_comes_back_as_that_error(cache_on):
    bad = OpSpec(kind="gemm", shape=(16, 16, 16), dtype="fp8", layout="kn")
    rank_cache.learn(H100, bad, OpError("no fp8 gemm template takes layout kn"))
    rank_cache.flush()
    rank_cache.clear_cache()
    got = rank_cache.best(H100, bad)
    assert isinstance(got, OpError) and str(got) == "no fp8 gemm template takes layout kn"


def test_a_measured_winner_other_than_the_pick_is_answered_from_its_learned_prediction(cache_on):
    from autoopt.results.lookup import default_lookup

    other = rank(H100, OP, top=2, measured=False).candidates[1]
    default_lookup().remember(keys.make_result(H100, OP, other.config, label="measured", us=5.0,
                                               kernel_module="autoopt.backend.kernels.gemm"))
    assert rank_cache.best(H100, OP) is None  # not learned yet: rank() decides
    ranked = rank(H100, OP).best
    assert (ranked.config, ranked.source) == (other.config, "measured:memory")
    rank_cache.learn(H100, OP, ranked)
    rank_cache.flush()
    rank_cache.clear_cache()
    assert rank_cache.best(H100, OP) == ranked


def test_learned_answers_of_other_constants_are_not_used_and_are_replaced(cache_on):
    rank_cache.learn(H100, ODD, rank(H100, ODD).best)
    (path,) = rank_cache.flush()
    rank_cache.clear_cache()
    with using(replace(DEFAULT_CONSTANTS, l2_bw_ratio=DEFAULT_CONSTANTS.l2_bw_ratio * 2)):
        assert rank_cache.best(H100, ODD) is None
        rank_cache.learn(H100, OP, rank(H100, OP).best)
        rank_cache.flush()
        assert _header(path)["entries"] == 1  # the stale file's entry was not carried over
    rank_cache.clear_cache()
    assert rank_cache.best(H100, ODD) is None


def test_with_the_cache_off_nothing_is_learned(monkeypatch):
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", "off")
    rank_cache.learn(H100, ODD, rank(H100, ODD).best)
    assert rank_cache.flush() == []


def test_an_unwritable_cache_folder_is_logged_not_raised(cache_on, caplog):
    (cache_on / "ranks").write_text("a file where the folder goes")
    rank_cache.learn(H100, ODD, rank(H100, ODD).best)
    with caplog.at_level(logging.INFO):
        assert rank_cache.flush() == []
    assert "not written" in caplog.text


def test_a_damaged_learned_file_is_ignored_and_then_replaced(cache_on, caplog):
    path = rank_cache.file_for(H100, cache_on / "ranks")
    path.parent.mkdir()
    path.write_bytes(b"not zlib at all")
    with caplog.at_level(logging.WARNING):
        assert rank_cache.best(H100, ODD) is None
    assert "ignored" in caplog.text
    answer = rank(H100, ODD).best
    rank_cache.learn(H100, ODD, answer)
    assert rank_cache.flush() == [path]
    rank_cache.clear_cache()
    assert rank_cache.best(H100, ODD) == answer


def _two_start_ups(code: str, cache: Path) -> list[str]:
    """The stdout of ``code`` run in two fresh processes, one after the other, over the cache folder ``cache``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_CACHE_DIR": str(cache),
           "AUTOOPT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                           timeout=300).stdout for _ in range(2)]


def test_a_tuned_machine_starts_up_without_ranking_or_sqlite_from_its_second_start(tmp_path):
    """The store's winner of one GEMM differs from the shipped pick: the first start-up ranks that op,
    opens the store, and writes the snapshot and the learned prediction; the second reads only those."""
    from autoopt.backend.registry import KERNELS
    from autoopt.results.store import ResultStore

    profile = load_profile("h100-sxm-8x")
    recommendation._RECORD = asked = []
    try:
        recommendation.recommend(profile, "llama-3-70b", runtime="vllm")
    finally:
        recommendation._RECORD = None
    gpu, op = next((g, o) for g, o in asked if o.kind == "gemm")
    second = rank(gpu, op, top=2, measured=False).candidates[1]
    with ResultStore(tmp_path / "results.sqlite3") as store:
        store.put(keys.make_result(gpu, op, second.config, label="measured", us=1.0,
                                   kernel_module=KERNELS[second.config.kernel].module))
    code = ("import sys, autoopt\n"
            "r = autoopt.recommend(autoopt.load_profile('h100-sxm-8x'), 'llama-3-70b', runtime='vllm')\n"
            "print(sorted({o.source for o in r.ops if o.measured_us == 1.0}),"
            " [m for m in ('sqlite3', 'autoopt.search.ranking') if m in sys.modules])")
    runs = [out.strip() for out in _two_start_ups(code, tmp_path)]
    assert runs == ["['measured:store'] ['sqlite3', 'autoopt.search.ranking']", "['measured:store'] []"]


def test_a_model_outside_the_catalog_is_ranked_once_per_machine(tmp_path):
    code = ("import sys, autoopt\n"
            "cfg = {'model_type': 'llama', 'hidden_size': 1536, 'num_hidden_layers': 4, 'num_attention_heads': 12,"
            " 'num_key_value_heads': 4, 'intermediate_size': 4096, 'vocab_size': 32000,"
            " 'max_position_embeddings': 4096}\n"
            "r = autoopt.recommend(autoopt.load_profile('h100-sxm'), cfg)\n"
            "print(len(r.ops), 'autoopt.search.ranking' in sys.modules)")
    runs = [out.split() for out in _two_start_ups(code, tmp_path)]
    assert runs[0][1] == "True" and runs[1] == [runs[0][0], "False"]
    assert [p.name for p in (tmp_path / "ranks").iterdir()] == [rank_cache.file_for(H100).name]
