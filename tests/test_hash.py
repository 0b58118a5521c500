"""``autoopt._hash.sha256_hex`` is hashlib's SHA-256, whichever implementation answers."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from autoopt import _hash


@given(st.binary(max_size=4096))
def test_sha256_hex_is_hashlibs_sha256(data: bytes) -> None:
    assert _hash.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_sha256_hex_of_the_empty_string_is_the_published_digest() -> None:
    # FIPS 180-2 example: SHA-256("") and SHA-256("abc")
    assert _hash.sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert _hash.sha256_hex(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_without_the_builtin_module_hashlib_answers(monkeypatch) -> None:
    import importlib

    real = importlib.import_module

    def no_builtin(name: str, *a: object) -> object:
        if name in ("_sha2", "_sha256"):
            raise ImportError(name)
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", no_builtin)
    monkeypatch.setattr(_hash, "_sha256", None)
    assert _hash.sha256_hex(b"abc") == hashlib.sha256(b"abc").hexdigest()
    assert _hash._sha256 is hashlib.sha256
