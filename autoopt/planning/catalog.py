"""The catalog of known models (names -> ModelSpec, from ``models.yaml``) and :func:`parse_model`,
which resolves anything a user may pass as a model: a ModelSpec, an HF config, a module or a name.

Each entry holds the architecture keys of the model's public ``config.json``
(cited in the YAML), parsed by :func:`autoopt.planning.model.from_hf_config`, so the
catalog and a user's own config go through the same code.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import ModelError
from autoopt.planning.model import ModelSpec, from_hf_config, from_module

__all__ = ["get_model", "model_names", "parse_model"]

log = get_logger(__name__)
_DATA = Path(__file__).resolve().parent / "models.yaml"


#: ``models.yaml`` parsed (see :mod:`autoopt.hardware.yaml_mirror`): while the file's text is the one
#: in it, the catalog is read without importing PyYAML (~15 ms of a cold recommend() on a 2-core box)
MIRROR = Path(__file__).resolve().parent / "models.mirror.json"


@lru_cache(maxsize=1)
def _entries() -> dict[str, dict[str, Any]]:
    from autoopt.hardware import yaml_mirror

    text = _DATA.read_text()
    data = yaml_mirror.load(text, _DATA.name, MIRROR)
    if data is None:
        import yaml

        # libyaml's parser when PyYAML has it (same safe constructor; ~10x faster than the pure-Python one)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(data, dict):
        raise ModelError(f"{_DATA}: expected a mapping of model names")
    return data


def model_names() -> tuple[str, ...]:
    """Every catalog name, sorted."""
    return tuple(sorted(_entries()))


@cache
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
    return ModelSpec.from_dict({**spec.to_dict(), "source": str(entry.get("source", "")),
                                "checkpoint": str(entry.get("repo", ""))})


def _is_torch_module(obj: Any) -> bool:
    return any(klass.__module__.startswith("torch.nn") and klass.__name__ == "Module" for klass in type(obj).__mro__)


def parse_model(model: Any) -> ModelSpec:
    """ModelSpec from a ModelSpec, an HF config (mapping or path), a torch Module or a catalog name."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        if "architecture" in model and "num_layers" in model:
            return ModelSpec.from_dict(model)
        return from_hf_config(model)
    if isinstance(model, Path) or (isinstance(model, str) and (model.endswith(".json") or "/" in model
                                                               or Path(model).is_dir())):
        if Path(model).exists():
            return from_hf_config(model)
        if str(model).endswith(".json"):
            raise ModelError(f"no config file at {model}")
    if isinstance(model, str):
        return get_model(model)
    if _is_torch_module(model):
        return from_module(model)
    raise ModelError(f"cannot read a model from a {type(model).__name__}; pass a ModelSpec, a config.json "
                     "(dict or path), a torch.nn.Module or a catalog name")
