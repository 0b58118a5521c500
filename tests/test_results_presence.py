"""The start-up presence checks: "may a lookup find anything here?", answered without the lookups.

False is a promise (the real lookup would find nothing); True sends the caller to the real lookup.
"""

import json

import pytest

from autoopt.hardware.library import load_profile
from autoopt.results import lookup, presence, transfer, versions
from autoopt.results.location import CONSTANTS_FOLDER, FILE_NAME, SHIPPED_DIR
from autoopt.results.records import StoredResult

H100 = load_profile("h100-sxm").gpus[0]
#: what the shipped H100 set was measured with (autoopt/results/shipped/h100.json)
SHIPPED_H100 = {"torch": "2.11.0", "triton": "3.6.0"}


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(versions, "_versions", {"torch": "2.13.0", "triton": "3.9.0"})
    presence.clear()
    yield
    presence.clear()


def test_a_fresh_machine_has_nothing_to_look_up():
    assert not presence.may_have_measured(H100.device_fingerprint)
    assert not presence.may_have_constants()


def test_a_store_file_sends_the_lookup_to_it(tmp_path):
    (tmp_path / FILE_NAME).write_bytes(b"")
    assert presence.may_have_measured(H100.device_fingerprint)


def test_a_constants_folder_sends_the_constants_lookup_to_it(tmp_path):
    (tmp_path / CONSTANTS_FOLDER).mkdir()
    assert presence.may_have_constants()


def test_the_cache_switched_off_holds_nothing(monkeypatch):
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", "off")
    assert not presence.may_have_measured(H100.device_fingerprint) and not presence.may_have_constants()


def test_a_bad_cache_setting_is_left_to_the_real_lookup_to_report(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", str(tmp_path / "a-file"))
    assert presence.may_have_measured(H100.device_fingerprint) and presence.may_have_constants()


def test_shipped_rows_of_this_gpu_and_software_are_found(monkeypatch):
    monkeypatch.setattr(versions, "_versions", dict(SHIPPED_H100))
    assert presence.may_have_measured(H100.device_fingerprint)


def test_shipped_rows_of_another_torch_are_not(monkeypatch):
    monkeypatch.setattr(versions, "_versions", {**SHIPPED_H100, "torch": "2.12.0"})
    assert not presence.may_have_measured(H100.device_fingerprint)


def test_every_shipped_environment_is_announced(monkeypatch):
    # the promise, checked against the real reader: every (device, torch, triton) a shipped file holds
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        for row in transfer.read_file(path):
            monkeypatch.setattr(versions, "_versions", {"torch": row.env.torch, "triton": row.env.triton})
            presence.clear()
            assert presence.may_have_measured(row.env.device), (path.name, row.env)


def test_a_shipped_file_not_in_the_export_format_is_a_maybe(tmp_path):
    folder = tmp_path / "shipped"
    folder.mkdir()
    (folder / "edited.json").write_text(json.dumps({"rows": []}))
    assert presence.may_have_measured(H100.device_fingerprint, shipped_dir=folder)


def test_a_shipped_folder_with_other_gpus_only_is_a_no(tmp_path):
    folder = tmp_path / "shipped"
    folder.mkdir()
    (folder / "other.json").write_text(json.dumps({"format": transfer.FORMAT, "rows": [
        {"env": {"device": "0123456789abcdef", "torch": "2.13.0", "triton": "3.9.0"}}]}))
    assert not presence.may_have_measured(H100.device_fingerprint, shipped_dir=folder)


def test_rows_remembered_in_this_process_are_a_maybe(tmp_path):
    assert not presence.may_have_measured(H100.device_fingerprint)
    row = StoredResult.from_dict(transfer.read_file(SHIPPED_DIR / "h100.json")[0].to_dict())
    lookup.ResultLookup(store_path=None, shipped_dir=None).remember(row)
    assert presence.may_have_measured(H100.device_fingerprint)


def test_the_format_marker_is_the_export_formats_name():
    assert json.dumps(transfer.FORMAT).encode() == presence._FORMAT_TEXT
