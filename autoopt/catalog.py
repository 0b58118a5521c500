"""The catalog of known models: names -> ModelSpec, from the data in ``models.yaml``.

Each entry holds the architecture keys of the model's public ``config.json``
(cited in the YAML), parsed by :func:`autoopt.model.from_hf_config`, so the
catalog and a user's own config go through the same code.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import ModelError
from .model import ModelSpec, from_hf_config

__all__ = ["get_model", "model_names"]

log = logging.getLogger(__name__)
_DATA = Path(__file__).resolve().parent / "models.yaml"


@lru_cache(maxsize=1)
def _entries() -> dict[str, dict[str, Any]]:
    import yaml

    # libyaml's parser when PyYAML has it (same safe constructor; ~10x faster than the pure-Python one)
    data = yaml.load(_DATA.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    if not isinstance(data, dict):
        raise ModelError(f"{_DATA}: expected a mapping of model names")
    return data


def model_names() -> tuple[str, ...]:
    """Every catalog name, sorted."""
    return tuple(sorted(_entries()))


@lru_cache(maxsize=None)
def get_model(name: str) -> ModelSpec:
    """The catalog model called ``name`` (case-insensitive); ``ModelError`` with close names otherwise."""
    key = name.strip().lower()
    entries = _entries()
    if key not in entries:
        import difflib  # only for an unknown name: not at import

        close = difflib.get_close_matches(key, list(entries), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ModelError(f"unknown model {name!r}{hint} (known: {', '.join(sorted(entries))})", field="model")
    entry = entries[key]
    spec = from_hf_config(entry["config"], name=key)
    return ModelSpec.from_dict({**spec.to_dict(), "source": str(entry.get("source", ""))})
