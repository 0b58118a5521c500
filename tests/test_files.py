"""autoopt._files.write_atomic: the one way every store replaces a file."""

from __future__ import annotations

import os

import pytest

from autoopt._files import write_atomic


def test_text_and_bytes_replace_the_file_whole(tmp_path):
    path = tmp_path / "store.json"
    write_atomic(path, "old\n")
    write_atomic(path, b"\x00new")
    assert path.read_bytes() == b"\x00new"
    assert os.listdir(tmp_path) == ["store.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "store.json"
    write_atomic(path, "old\n")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["store.json"]
