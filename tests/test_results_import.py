"""Importing results files: anything but a regular, sane-sized, UTF-8 JSON results file of valid rows
is a StoreError naming the file (and the row and field), raised before anything is stored."""

from __future__ import annotations

import copy
import json
import time

import pytest
from _fuzz import budget
from _results_rows import KERNEL_FILE, KERNEL_HASH, T0, row
from hypothesis import given
from hypothesis import strategies as st

from autoopt.errors import StoreError
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OP_KINDS, OpSpec
from autoopt.results import transfer
from autoopt.results.records import LABELS, EnvKey, StoredResult
from autoopt.results.store import ResultStore


def _write(tmp_path, data) -> str:
    path = tmp_path / "results.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# -- files --------------------------------------------------------------------------------------

def test_importing_dev_urandom_is_refused_unread():
    with pytest.raises(StoreError, match="/dev/urandom: is a device, pipe or socket"):
        transfer.read_file("/dev/urandom")


def test_importing_a_directory_is_refused(tmp_path):
    with pytest.raises(StoreError, match="is a folder"):
        transfer.read_file(tmp_path)


def test_a_huge_sparse_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.json"
    with path.open("wb") as fh:
        fh.truncate(transfer.MAX_FILE_BYTES + 1)  # sparse: no disk used, 256 MiB + 1 of zeros to read
    t = time.perf_counter()
    with pytest.raises(StoreError, match=f"is {transfer.MAX_FILE_BYTES + 1} bytes"):
        transfer.read_file(path)
    assert time.perf_counter() - t < 0.5  # refused on its size, not after reading it


def test_a_missing_file_is_a_store_error(tmp_path):
    with pytest.raises(StoreError, match="cannot read"):
        transfer.read_file(tmp_path / "nope.json")


def test_bad_json_names_the_line_and_column(tmp_path):
    with pytest.raises(StoreError, match=r"not valid JSON: .* at line 2 column"):
        transfer.read_file(_write(tmp_path, '{"format": "autoopt-results",\n "version": 1,, "rows": []}'))


def test_a_binary_file_is_not_utf8(tmp_path):
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(StoreError, match="not UTF-8"):
        transfer.read_file(path)


def test_deeply_nested_json_is_refused(tmp_path):
    with pytest.raises(StoreError):
        transfer.read_file(_write(tmp_path, "[" * 100_000 + "]" * 100_000))


def test_a_newer_format_version_is_refused_by_name(tmp_path):
    doc = transfer.document([row(1)])
    doc["version"] = transfer.FORMAT_VERSION + 1
    with pytest.raises(StoreError, match="field 'version': format version 2 was written by a newer autoopt"):
        transfer.read_file(_write(tmp_path, doc))


def test_a_version_that_is_not_an_integer_is_refused(tmp_path):
    doc = transfer.document([row(1)])
    doc["version"] = "1"
    with pytest.raises(StoreError, match="field 'version': expected an integer"):
        transfer.read_file(_write(tmp_path, doc))


def test_another_format_is_not_a_results_file(tmp_path):
    with pytest.raises(StoreError, match=r"field 'format'.*not an autoopt results file"):
        transfer.read_file(_write(tmp_path, {"format": "something-else", "version": 1, "rows": []}))


def test_a_bad_field_names_the_file_row_and_field(tmp_path):
    doc = transfer.document([row(1), row(2), row(3)])
    doc["rows"][2]["op"]["shape"] = [256, -1, 4096]
    path = _write(tmp_path, doc)
    with pytest.raises(StoreError) as info:
        transfer.read_file(path)
    assert (info.value.source, info.value.row, info.value.field) == (path, 2, "op")
    assert str(info.value).startswith(f"{path}: row 2: field 'op': gemm: dimension N must be a positive integer")


def test_an_invalid_file_leaves_the_store_untouched(tmp_path):
    with ResultStore(tmp_path / "s.sqlite3") as s:
        s.put(row(7))
        with pytest.raises(StoreError):
            transfer.import_file(s, "/dev/urandom")
        assert [r.config.params["SEQ"] for r in s.rows()] == [7]


# -- the row validator, by property -------------------------------------------------------------

_names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), max_size=24).filter(str.isprintable)
_kind_shape = st.sampled_from(sorted(OP_KINDS)).flatmap(lambda kind: st.tuples(
    st.just(kind), st.lists(st.integers(1, 16 if kind == "gemv" else 512 if kind == "fused_moe" else 8192),
                            min_size=len(OP_KINDS[kind][0]), max_size=len(OP_KINDS[kind][0]))))


@st.composite
def valid_rows(draw: st.DrawFn) -> StoredResult:
    kind, shape = draw(_kind_shape)
    moe = kind == "fused_moe"
    if moe:  # top-k of at most E experts
        shape[2] = min(shape[2], shape[1])
    label = draw(st.sampled_from(LABELS))
    us = draw(st.floats(0.001, 1e7)) if label == "measured" else draw(st.none() | st.floats(0, 1e7))
    return StoredResult(
        env=EnvKey(device=draw(_names.filter(bool)), gpu=draw(_names), driver=draw(_names), torch=draw(_names),
                   triton=draw(_names)),
        op=OpSpec(
            kind=kind, shape=tuple(shape), dtype=draw(st.sampled_from(OP_KINDS[kind][1])),
            layout="nk" if moe else draw(st.sampled_from(("nk", "kn"))),
            moe_gemm=draw(st.sampled_from(("both", "gate_up", "down"))) if moe else None),
        config=KernelConfig(
            kernel=draw(_names.filter(bool)), template=draw(_names),
            params=draw(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True),
                                        st.integers(-(2**31), 2**31 - 1), max_size=8)),
            path=draw(st.sampled_from(("standard", "tma", "wgmma")))),
        label=label, us=us, max_error=draw(st.none() | st.floats(0, 10)), reason=draw(_names),
        kernel_file=KERNEL_FILE, kernel_hash=draw(st.sampled_from((KERNEL_HASH, "0" * 64))),
        measured_at=draw(st.floats(T0, T0 + 1e7)), autoopt_version=draw(_names))


@budget(150)
@given(st.lists(valid_rows(), max_size=4))
def test_every_valid_row_survives_export_and_parse_unchanged(rows):
    text = json.dumps(transfer.document(rows))
    assert transfer.parse(json.loads(text)) == rows


#: (field path, a wrong value for it)
_BREAKAGES = [
    (("label",), "fast"), (("label",), None), (("us",), "12"), (("us",), -1.0), (("us",), True),
    (("max_error",), [1]), (("measured_at",), 5.0), (("measured_at",), "yesterday"), (("reason",), 3),
    (("kernel_hash",), "abc"), (("kernel_file",), ""), (("autoopt_version",), {}), (("env",), "gpu"),
    (("env", "device"), ""), (("env", "triton"), 3.1), (("env", "cuda"), "12.4"), (("op",), []),
    (("op", "kind"), "conv"), (("op", "shape"), [1, 2, 3, 4]), (("op", "shape"), "a,b,c"), (("op", "dtype"), "int4"),
    (("config",), None), (("config", "kernel"), ""), (("config", "config"), {"BLOCK_M": 1.5}),
    (("config", "config"), {"BLOCK_M": 2**40}), (("config", "path"), "warp"), (("config", "extra"), 1),
    (("surprise",), 1),
]


@budget(150)
@given(st.lists(valid_rows(), min_size=1, max_size=3), st.data())
def test_any_broken_field_is_a_store_error_naming_the_row_and_field(rows, data):
    doc = json.loads(json.dumps(transfer.document(rows)))
    index = data.draw(st.integers(0, len(rows) - 1))
    path, value = data.draw(st.sampled_from(_BREAKAGES))
    target = doc["rows"][index]
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = copy.deepcopy(value)
    with pytest.raises(StoreError) as info:
        transfer.parse(doc, source="team.json")
    assert (info.value.source, info.value.row) == ("team.json", index)
    assert info.value.field is not None and info.value.field.split(".")[0] == path[0]


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4), max_leaves=20)


@budget(300)
@given(st.dictionaries(st.sampled_from(["env", "op", "config", "label", "us", "max_error", "reason", "kernel_file",
                                        "kernel_hash", "measured_at", "autoopt_version", "other"]), _json))
def test_arbitrary_json_as_a_row_is_accepted_or_a_store_error_never_another_exception(raw):
    doc = {"format": transfer.FORMAT, "version": 1, "rows": [raw]}
    try:
        rows = transfer.parse(doc)
    except StoreError as exc:
        assert exc.row == 0
    else:
        assert len(rows) == 1


@budget(200)
@given(_json)
def test_arbitrary_json_as_a_document_is_a_store_error_or_a_list_of_rows(raw):
    try:
        rows = transfer.parse(raw)
    except StoreError:
        return
    assert isinstance(rows, list)
