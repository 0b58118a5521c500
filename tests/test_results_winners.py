"""The start-up winners snapshot: the full lookup's answers, read without SQLite while the store is unchanged.

Its promise: whenever :func:`winners.answer` gives an answer (a Winner or None), it is the answer the
full lookup's store and shipped layers give; anything it cannot vouch for is UNKNOWN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autoopt.hardware.library import load_profile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.results import keys, presence, sources, versions, winners
from autoopt.results.location import FILE_NAME, SHIPPED_DIR, WINNERS_FOLDER
from autoopt.results.lookup import ResultLookup
from autoopt.results.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]
H100 = load_profile("h100-sxm").gpu  # a known profile: no driver, so it takes any driver's rows
DETECTED = replace(H100, driver_version="580.159.04")
OTHER_DRIVER = replace(H100, driver_version="550.54.14")
OP = OpSpec(kind="gemm", shape=(256, 6144, 4096), dtype="bf16")
OP2 = OpSpec(kind="gemv", shape=(1, 4096, 4096), dtype="bf16")


def _config(block_n: int) -> KernelConfig:
    return KernelConfig(kernel="gemm", template="gemm", path="standard",
                        params={"BLOCK_M": 64, "BLOCK_N": block_n, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4,
                                "num_stages": 3})


def _row(gpu, op, block_n, us, *, stale=False):
    row = keys.make_result(gpu, op, _config(block_n), label="measured", us=us,
                           kernel_module="autoopt.backend.kernels.gemm")
    return replace(row, kernel_hash="0" * 64) if stale else row


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(versions, "_versions", {"torch": "2.13.0", "triton": "3.9.0"})
    presence.clear()
    winners.clear()
    yield
    presence.clear()
    winners.clear()


def _store(tmp_path, rows):
    with ResultStore(tmp_path / FILE_NAME) as store:
        store.put_many(rows)


def _full(tmp_path, gpu, op):
    """The full lookup's answer (its store and shipped layers), as (config key, us, label) or None."""
    lookup = ResultLookup(store_path=tmp_path / FILE_NAME, shipped_dir=None)
    try:
        hit = lookup.lookup(gpu, op)
    finally:
        lookup.close()
    return None if hit is None else (hit.result.config.key(), hit.result.us, hit.label)


def _quick(gpu, op, shipped_dir=None):
    got = winners.answer(gpu, op, shipped_dir=shipped_dir)
    return got if got is None or got is winners.UNKNOWN else (got.config_key(), got.us, got.label)


def test_with_no_snapshot_the_answer_is_unknown(tmp_path):
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    assert winners.answer(H100, OP, shipped_dir=None) is winners.UNKNOWN


def test_the_full_lookup_writes_the_snapshot_and_it_answers_the_same(tmp_path):
    _store(tmp_path, [_row(H100, OP, 128, 20.0), _row(H100, OP, 64, 18.0)])
    full = _full(tmp_path, H100, OP)
    assert list((tmp_path / WINNERS_FOLDER).glob("*.json"))
    assert _quick(H100, OP) == full == (_config(64).key(), 18.0, "measured:store")


def test_an_op_the_store_never_measured_answers_none_not_unknown(tmp_path):
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    _full(tmp_path, H100, OP)
    assert _quick(H100, OP2) is None


def test_it_agrees_with_the_full_lookup_on_drivers_and_changed_kernel_sources(tmp_path):
    rows = [_row(DETECTED, OP, 128, 20.0), _row(OTHER_DRIVER, OP, 64, 15.0), _row(DETECTED, OP, 32, 10.0, stale=True),
            _row(OTHER_DRIVER, OP2, 16, 5.0), _row(DETECTED, OP2, 256, 7.0)]
    _store(tmp_path, rows)
    for gpu in (H100, DETECTED, OTHER_DRIVER):
        for op in (OP, OP2):
            full = _full(tmp_path, gpu, op)
            assert _quick(gpu, op) == full, (gpu.driver_version, op)
    assert _quick(DETECTED, OP) == (_config(128).key(), 20.0, "measured:store")  # the stale 10 us row is passed over
    assert _quick(H100, OP) == (_config(64).key(), 15.0, "measured:store")  # any driver


def test_a_commit_by_another_process_makes_the_snapshot_stale(tmp_path):
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    _full(tmp_path, H100, OP)
    code = ("import sys; from dataclasses import replace; from autoopt.results.store import ResultStore; "
            "from autoopt.results import keys; from autoopt.hardware.library import load_profile; "
            "from autoopt.kernels.ops import OpSpec; from autoopt.kernels.config import KernelConfig\n"
            "s = ResultStore(sys.argv[1]); gpu = load_profile('h100-sxm').gpu\n"
            "c = KernelConfig(kernel='gemm', template='gemm', path='standard', params={'BLOCK_M': 32})\n"
            "s.put(keys.make_result(gpu, OpSpec(kind='gemm', shape=(8, 8, 8), dtype='bf16'), c, label='measured',"
            " us=1.0, kernel_module='autoopt.backend.kernels.gemm'))\n"
            "print('put', flush=True); input()\n")  # keeps its connection open: the commit stays in the WAL
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / FILE_NAME)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "put"
        assert os.path.getsize(f"{tmp_path / FILE_NAME}-wal") > 0
        assert winners.answer(H100, OP, shipped_dir=None) is winners.UNKNOWN
    finally:
        child.communicate("\n", timeout=60)
    assert winners.answer(H100, OP, shipped_dir=None) is winners.UNKNOWN  # checkpointed into the file: still stale


def test_rows_remembered_in_this_process_send_the_caller_to_the_full_lookup(tmp_path):
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    _full(tmp_path, H100, OP)
    presence.note_remembered()
    assert winners.answer(H100, OP, shipped_dir=None) is winners.UNKNOWN


def test_a_changed_kernel_source_passes_the_row_over(tmp_path, monkeypatch):
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    _full(tmp_path, H100, OP)
    monkeypatch.setitem(sources._hashes, "backend/kernels/gemm.py", "f" * 64)
    assert winners.answer(H100, OP, shipped_dir=None) is None


def test_other_shipped_files_make_the_snapshot_stale(tmp_path):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    ResultLookup(store_path=tmp_path / FILE_NAME, shipped_dir=shipped).lookup(H100, OP)
    assert winners.answer(H100, OP, shipped_dir=shipped) is not winners.UNKNOWN
    (shipped / "new.json").write_text("{}")
    winners.clear()
    assert winners.answer(H100, OP, shipped_dir=shipped) is winners.UNKNOWN


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other-format", "a-folder", "oversized", "bad-row"])
def test_a_damaged_snapshot_is_unknown_never_an_error(tmp_path, damage):
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    _full(tmp_path, H100, OP)
    (path,) = (tmp_path / WINNERS_FOLDER).glob("*.json")
    text = path.read_text()
    if damage == "garbage":
        path.write_bytes(b"\x00\xff" * 64)
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "other-format":
        path.write_text(json.dumps({**json.loads(text), "format": "something-else"}))
    elif damage == "a-folder":
        path.unlink()
        path.mkdir()
    elif damage == "oversized":
        path.write_text(text + " " * winners.MAX_BYTES)
    else:
        doc = json.loads(text)
        doc["ops"] = {k: [["store", "", "gemm"]] for k in doc["ops"]}
        path.write_text(json.dumps(doc))
    winners.clear()
    assert winners.answer(H100, OP, shipped_dir=None) is winners.UNKNOWN


def test_a_tuned_machine_starts_up_from_the_snapshot_without_sqlite(tmp_path):
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    _full(tmp_path, H100, OP)
    code = ("import sys; from autoopt.hardware.library import load_profile; from autoopt.kernels.ops import OpSpec\n"
            "from autoopt.results import winners, versions\n"
            "versions._versions = {'torch': '2.13.0', 'triton': '3.9.0'}\n"
            "w = winners.answer(load_profile('h100-sxm').gpu, OpSpec(kind='gemm', shape=(256, 6144, 4096), "
            "dtype='bf16'), shipped_dir=None)\n"
            "print(w.label, w.us, w.params['BLOCK_N'], 'sqlite3' in sys.modules,"
            " 'autoopt.results.records' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_CACHE_DIR": str(tmp_path)})
    assert out.stdout.split() == ["measured:store", "20.0", "128", "False", "False"]


def test_a_winner_round_trips_through_its_dict():
    w = winners.Winner(kernel="gemm", path="standard", params={"BLOCK_N": 64}, us=3.5, layer="store")
    assert winners.Winner.from_dict(w.to_dict()) == w and w.label == "measured:store"
    assert w.config_key() == KernelConfig(kernel="gemm", path="standard", params={"BLOCK_N": 64}).key()


def test_a_refresh_after_tuning_rewrites_the_snapshot_for_the_new_winners(tmp_path):
    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    lookup = ResultLookup(store_path=tmp_path / FILE_NAME, shipped_dir=None)
    lookup.lookup(H100, OP)
    _store(tmp_path, [_row(H100, OP, 64, 9.0)])  # a tuning run measures a faster config
    assert winners.answer(H100, OP, shipped_dir=None) is winners.UNKNOWN
    lookup.refresh_snapshot(keys.env_key(H100))
    lookup.close()
    assert _quick(H100, OP) == (_config(64).key(), 9.0, "measured:store")


def test_refresh_snapshots_rewrites_every_environment_that_has_one(tmp_path):
    from autoopt.results.lookup import refresh_snapshots

    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    _full(tmp_path, H100, OP)
    _store(tmp_path, [_row(H100, OP, 32, 7.0)])
    assert winners.answer(H100, OP, shipped_dir=None) is winners.UNKNOWN
    assert refresh_snapshots(tmp_path / FILE_NAME) == 1  # with the package's shipped sets, as a process would
    assert _quick(H100, OP, SHIPPED_DIR) == (_config(32).key(), 7.0, "measured:store")


def test_refresh_snapshots_with_none_written_does_nothing(tmp_path):
    from autoopt.results.lookup import refresh_snapshots

    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    assert refresh_snapshots(tmp_path / FILE_NAME) == 0
    assert not (tmp_path / WINNERS_FOLDER).exists()


def test_cli_store_import_leaves_the_snapshot_current(tmp_path):
    from autoopt.results import transfer

    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    _full(tmp_path, H100, OP)
    src = tmp_path / "team.json"
    src.write_text(json.dumps(transfer.document([_row(H100, OP, 64, 5.0)])))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(AUTOOPT_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT), AUTOOPT_DISABLE_PLUGIN_AUTOLOAD="1")
    res = subprocess.run([sys.executable, "-m", "autoopt", "store", "import", str(src)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert _quick(H100, OP, SHIPPED_DIR) == (_config(64).key(), 5.0, "measured:store")


def test_refresh_snapshots_also_writes_a_tuned_gpus_first_snapshot(tmp_path):
    from autoopt.results.lookup import refresh_snapshots

    _store(tmp_path, [_row(H100, OP, 128, 20.0)])
    assert refresh_snapshots(tmp_path / FILE_NAME, also=[keys.env_key(H100)]) == 1
    assert _quick(H100, OP, SHIPPED_DIR) == (_config(128).key(), 20.0, "measured:store")
