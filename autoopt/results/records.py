"""The rows of the results store: what was measured, where, with which kernel source.

A :class:`StoredResult` is one evaluated (environment, op, config). Its identity (the store's
UNIQUE key) is :class:`ResultKey` (environment + op) plus the kernel source hash plus the config's
canonical key; everything else is the measurement. Only ``measured`` rows (the output matched the
reference and was timed) can be winners; ``rejected``/``wrong``/``withheld`` rows are kept with
their reason so the tuner never tries that config again in that environment.

Every value is checked on construction and a bad one raises :class:`StoreError` naming the field:
rows come from files other people wrote (exports, shipped sets), so nothing is trusted.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from autoopt.errors import AutooptError, StoreError
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

__all__ = ["FAILED_LABELS", "LABELS", "MAX_REASON", "WINNER_LABEL", "EnvKey", "ResultKey", "StoredResult",
           "config_key", "op_columns", "op_from_columns"]

#: labels a stored row may carry. ``measured``: correct and timed (a possible winner);
#: ``rejected``: refused or failed to compile/launch; ``wrong``: ran but did not match the reference;
#: ``withheld``: correct but its time was below the physical floor (a timing error).
LABELS = ("measured", "rejected", "wrong", "withheld")
WINNER_LABEL = "measured"
FAILED_LABELS = tuple(label for label in LABELS if label != WINNER_LABEL)

#: bounds on text fields: a shipped or imported file is input, and a megabyte "driver" is an attack
_MAX_TEXT = 256
MAX_REASON = 4096
_MAX_PARAMS = 64
_HEX64 = re.compile(r"[0-9a-f]{64}")
#: 2020-01-01: no row predates autoopt. Writes also refuse rows dated after now + 1 day
#: (:meth:`StoredResult.check_not_future`): the newest measurement of a key wins, so a row dated in
#: the far future would block every re-measurement. Reads do not, so a clock set back cannot make
#: a store unreadable.
_EPOCH_MIN = 1_577_836_800.0
_CLOCK_SKEW_S = 86_400.0


def _text(value: Any, name: str, *, limit: int = _MAX_TEXT, empty: bool = True, lines: bool = False) -> str:
    """A bounded, printable string (``lines``: newlines and tabs allowed too, for compiler messages)."""
    if not isinstance(value, str):
        raise StoreError(f"expected a string, got {type(value).__name__}", field=name)
    if len(value) > limit:
        raise StoreError(f"is {len(value)} characters long (at most {limit})", field=name)
    if not empty and not value:
        raise StoreError("must not be empty", field=name)
    if not (value.replace("\n", "").replace("\t", "") if lines else value).isprintable():
        raise StoreError(f"has non-printable characters: {value[:40]!r}", field=name)
    return value


def _number(value: Any, name: str, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StoreError(f"expected a number{' or null' if optional else ''}, got {value!r}", field=name)
    if not math.isfinite(value) or value < 0:
        raise StoreError(f"must be a finite number >= 0, got {value!r}", field=name)
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvKey:
    """Where a row was measured: the device and the software stack that compiled its kernel.

    ``device`` is :attr:`GPUProfile.device_fingerprint` (name, capability, SMs and memory hashed);
    ``gpu`` is the device's name for people and ``prune --device``, and takes no part in equality
    (the fingerprint already covers it). An empty version means "not installed / not known".
    """

    device: str
    gpu: str = field(default="", compare=False)
    driver: str = ""
    torch: str = ""
    triton: str = ""

    def __post_init__(self) -> None:
        _text(self.device, "env.device", empty=False)
        for name in ("gpu", "driver", "torch", "triton"):
            _text(getattr(self, name), f"env.{name}")

    def to_dict(self) -> dict[str, str]:
        return {"device": self.device, "gpu": self.gpu, "driver": self.driver, "torch": self.torch,
                "triton": self.triton}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvKey:
        _fields_of(cls, data, "env", required=("device",))
        return cls(**{k: data[k] for k in data})


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultKey:
    """One op in one environment: the rows of a key compete, the fastest ``measured`` one wins."""

    env: EnvKey
    op: OpSpec

    def to_dict(self) -> dict[str, Any]:
        return {"env": self.env.to_dict(), "op": self.op.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResultKey:
        _fields_of(cls, data, "key", required=("env", "op"))
        return cls(env=EnvKey.from_dict(_mapping(data["env"], "env")), op=_op(data["op"]))


#: joins the activation dtype and the weight format in the store's dtype column
WEIGHT_SEP = "+"
#: joins the layout and a fused_moe op's single GEMM (``nk/gate_up``, ``nk/down``) in the layout column
GEMM_SEP = "/"


def _layout_column(op: OpSpec) -> str:
    return op.layout if op.moe_gemm in (None, "both") else f"{op.layout}{GEMM_SEP}{op.moe_gemm}"


def op_columns(op: OpSpec) -> tuple[str, str, str, str, str]:
    """The op as the store's columns: kind, shape ``"M,N,K"``, dtype, layout, out_dtype. A quantized
    weight rides in the dtype column as ``bf16+int4-g128`` (:func:`op_from_columns` splits it), so a
    quantized op's rows never compete with the plain op's and the schema stays as it was; a fused_moe
    op of one GEMM rides in the layout column the same way (``nk/gate_up``)."""
    dtype = f"{op.dtype}{WEIGHT_SEP}{op.weight}" if op.weight else op.dtype
    return (op.kind, ",".join(map(str, op.shape)), dtype, _layout_column(op), op.out_dtype or op.dtype)


def op_from_columns(kind: str, shape: str, dtype: str, layout: str, out_dtype: str) -> OpSpec:
    """The :class:`OpSpec` of a store row's op columns (the inverse of :func:`op_columns`)."""
    dtype, _, weight = dtype.partition(WEIGHT_SEP)
    layout, _, gemm = layout.partition(GEMM_SEP)
    return OpSpec(kind=kind, shape=tuple(int(d) for d in shape.split(",")), dtype=dtype, layout=layout,
                  out_dtype=out_dtype, weight=weight or None, moe_gemm=gemm or None)


def config_key(config: KernelConfig) -> str:
    """The config's identity as canonical JSON: kernel, path and sorted params (not the template,
    which only says who proposed it; :meth:`KernelConfig.key` draws the same line)."""
    return json.dumps({"kernel": config.kernel, "path": config.path, "params": dict(sorted(config.params.items()))},
                      sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredResult:
    """One evaluated config: its key, its kernel source, its outcome and when and by what it was measured.

    ``kernel_file`` is the kernel's source file relative to the autoopt package folder (an absolute
    path for a kernel outside it) and ``kernel_hash`` that file's sha256 at measurement time: when the
    file changes the row is stale (kept, never used). ``max_error`` is the relative error against the
    float64 reference; ``reason`` says why a failed row failed. ``row_id`` is the store's id (None
    outside a store) and is not part of a row's value.
    """

    env: EnvKey
    op: OpSpec
    config: KernelConfig
    label: str
    us: float | None = None
    max_error: float | None = None
    reason: str = ""
    kernel_file: str
    kernel_hash: str
    measured_at: float
    autoopt_version: str = ""
    row_id: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.env, EnvKey):
            raise StoreError(f"expected an EnvKey, got {type(self.env).__name__}", field="env")
        if not isinstance(self.op, OpSpec):
            raise StoreError(f"expected an OpSpec, got {type(self.op).__name__}", field="op")
        if not isinstance(self.config, KernelConfig):
            raise StoreError(f"expected a KernelConfig, got {type(self.config).__name__}", field="config")
        _check_config(self.config)
        if self.label not in LABELS:
            raise StoreError(f"{self.label!r} is not one of {', '.join(LABELS)}", field="label")
        us = _number(self.us, "us", optional=True)
        if self.label == WINNER_LABEL and not us:
            raise StoreError(f"a measured row needs a time > 0 µs, got {self.us!r}", field="us")
        err = _number(self.max_error, "max_error", optional=True)
        _text(self.reason, "reason", limit=MAX_REASON, lines=True)
        _text(self.kernel_file, "kernel_file", empty=False, limit=1024)
        if not isinstance(self.kernel_hash, str) or not _HEX64.fullmatch(self.kernel_hash):
            raise StoreError(f"expected 64 lowercase hex digits (sha256), got {self.kernel_hash!r}",
                             field="kernel_hash")
        at = _number(self.measured_at, "measured_at", optional=False)
        assert at is not None
        if at < _EPOCH_MIN:
            raise StoreError(f"{at} (seconds since 1970) is before 2020 ({_EPOCH_MIN:.0f})", field="measured_at")
        _text(self.autoopt_version, "autoopt_version")
        object.__setattr__(self, "us", us)
        object.__setattr__(self, "max_error", err)
        object.__setattr__(self, "measured_at", at)

    def check_not_future(self, now: float | None = None) -> None:
        """StoreError unless ``measured_at`` is at most a day (of clock skew) after ``now``."""
        latest = (time.time() if now is None else now) + _CLOCK_SKEW_S
        if self.measured_at > latest:
            raise StoreError(f"{self.measured_at} (seconds since 1970) is more than a day in the future",
                             field="measured_at")

    @property
    def key(self) -> ResultKey:
        return ResultKey(env=self.env, op=self.op)

    @property
    def config_key(self) -> str:
        return config_key(self.config)

    @property
    def is_winner_candidate(self) -> bool:
        """A ``measured`` row: correct and timed (staleness is the caller's second question)."""
        return self.label == WINNER_LABEL

    def to_dict(self) -> dict[str, Any]:
        """The row in the export format (``row_id`` is local to one store and is left out)."""
        return {"env": self.env.to_dict(), "op": self.op.to_dict(), "config": self.config.to_dict(),
                "label": self.label, "us": self.us, "max_error": self.max_error, "reason": self.reason,
                "kernel_file": self.kernel_file, "kernel_hash": self.kernel_hash,
                "measured_at": self.measured_at, "autoopt_version": self.autoopt_version}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoredResult:
        """Strict inverse of :meth:`to_dict`: unknown or missing fields and bad values raise
        :class:`StoreError` naming the field (the caller adds the file and row)."""
        _fields_of(cls, data, "", required=("env", "op", "config", "label", "kernel_file", "kernel_hash",
                                            "measured_at"), skip=("row_id",))
        kwargs = {k: v for k, v in data.items() if k not in ("env", "op", "config")}
        return cls(env=EnvKey.from_dict(_mapping(data["env"], "env")), op=_op(data["op"]),
                   config=_config(data["config"]), **kwargs)


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise StoreError(f"expected a mapping, got {type(value).__name__}", field=name)
    return value


def _fields_of(cls: type, data: Any, prefix: str, *, required: tuple[str, ...], skip: tuple[str, ...] = ()) -> None:
    """Unknown or missing keys of ``data`` for dataclass ``cls`` raise StoreError naming the field."""
    _mapping(data, prefix or "<row>")
    known = {f.name for f in fields(cls)} - set(skip)
    for key in data:
        if not isinstance(key, str) or key not in known:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise StoreError(f"unknown field (known: {', '.join(sorted(known))})", field=where)
    for key in required:
        if key not in data:
            raise StoreError("missing required field", field=f"{prefix}.{key}" if prefix else key)


def _op(value: Any) -> OpSpec:
    data = _mapping(value, "op")
    try:
        return OpSpec.from_dict(data)
    except AutooptError as exc:
        raise StoreError(str(exc), field="op") from None
    except (TypeError, ValueError) as exc:  # a shape of non-numbers: OpSpec compares before it checks
        raise StoreError(f"invalid op: {exc}", field="op") from None


def _config(value: Any) -> KernelConfig:
    data = _mapping(value, "config")
    allowed = {"kernel", "path", "template", "config"}
    for key in data:
        if key not in allowed:
            raise StoreError(f"unknown field (known: {', '.join(sorted(allowed))})", field=f"config.{key}")
    for key in ("kernel", "config"):
        if key not in data:
            raise StoreError("missing required field", field=f"config.{key}")
    for key in ("kernel", "path", "template"):
        if key in data:
            _text(data[key], f"config.{key}", empty=key == "template")
    params = _mapping(data["config"], "config.config")
    if len(params) > _MAX_PARAMS:
        raise StoreError(f"has {len(params)} params (at most {_MAX_PARAMS})", field="config.config")
    try:
        return KernelConfig.from_dict(data)
    except AutooptError as exc:
        raise StoreError(str(exc), field="config") from None


def _check_config(config: KernelConfig) -> None:
    _text(config.kernel, "config.kernel", empty=False)
    _text(config.template, "config.template")
    if len(config.params) > _MAX_PARAMS:
        raise StoreError(f"has {len(config.params)} params (at most {_MAX_PARAMS})", field="config.config")
    for name, value in config.params.items():
        _text(name, "config.config", empty=False, limit=64)
        if not -(1 << 31) <= value < (1 << 31):
            raise StoreError(f"param {name}={value} is outside the int32 range", field=f"config.config.{name}")
