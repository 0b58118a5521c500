"""Strict dict <-> dataclass conversion shared by every cross-module record.

``to_plain`` turns nested dataclasses into JSON/YAML-ready dicts; ``from_plain``
rebuilds them with schema checks driven by the type hints: unknown fields,
missing required fields, wrong types and negative sizes are reported through an
error factory the caller supplies (so a profile gets a ``ProfileError`` naming
file and field, a model a ``ModelError``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
ErrorFactory = Callable[[str, str], Exception]  # (message, field path) -> exception

__all__ = ["from_plain", "to_plain"]


def to_plain(obj: Any) -> Any:
    """Recursively convert dataclasses/tuples/mappings to plain JSON types."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.repr}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, where: str, err: ErrorFactory, signed: bool) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        last: Exception | None = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where, err, signed)
            except Exception as exc:  # try the next member of the union
                last = exc
        raise last if last else err(f"expected {_describe(tp)}, got {type(value).__name__}", where)
    if value is None:
        raise err(f"must not be null (expected {_describe(tp)})", where)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise err(f"expected a mapping, got {type(value).__name__}", where)
        return from_plain(tp, value, err, prefix=where)
    if origin is tuple or tp is tuple:
        if not isinstance(value, (list, tuple)):
            raise err(f"expected a list, got {type(value).__name__}", where)
        item_tp = args[0] if args else Any
        return tuple(_convert(v, item_tp, f"{where}[{i}]", err, signed) for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise err(f"expected a mapping, got {type(value).__name__}", where)
        ktp, vtp = args if args else (Any, Any)
        out = {}
        for k, v in value.items():
            if ktp is str and not isinstance(k, str):
                raise err(f"keys must be strings, got {k!r}", where)
            out[k] = _convert(v, vtp, f"{where}.{k}", err, signed)
        return out
    if tp is bool:
        if not isinstance(value, bool):
            raise err(f"expected true/false, got {value!r}", where)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise err(f"expected an integer, got {value!r}", where)
        if not signed and value < 0:
            raise err(f"must not be negative, got {value}", where)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise err(f"expected a number, got {value!r}", where)
        if not math.isfinite(value):
            raise err(f"must be finite, got {value!r}", where)
        if not signed and value < 0:
            raise err(f"must not be negative, got {value}", where)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise err(f"expected a string, got {value!r}", where)
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise err(f"expected {_describe(tp)}, got {type(value).__name__}", where)


def from_plain(cls: type[T], data: Mapping[str, Any], err: ErrorFactory, *, prefix: str = "") -> T:
    """Build ``cls`` from a mapping, checking every field against its type hint.

    Numbers are non-negative unless the field's metadata says ``signed=True``;
    fields with ``init=False`` or ``repr=False`` (derived values) are ignored on input.
    """
    if not isinstance(data, Mapping):
        raise err(f"expected a mapping, got {type(data).__name__}", prefix or "<root>")
    hints = _hints(cls)
    flds = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        f = flds.get(key) if isinstance(key, str) else None
        if f is None:
            known = ", ".join(sorted(n for n, fl in flds.items() if fl.init))
            raise err(f"unknown field (known fields: {known})", where)
        if not f.init or not f.repr:
            continue
        kwargs[key] = _convert(value, hints[key], where, err, bool(f.metadata.get("signed")))
    for name, f in flds.items():
        if f.init and name not in kwargs and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            raise err("missing required field", f"{prefix}.{name}" if prefix else name)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise err(str(exc), prefix or cls.__name__) from None
