"""Quantized weight formats as data: what a packed weight holds, its exact bytes, and its name.

A :class:`WeightFormat` describes how a bf16/fp16 ``nn.Linear`` weight ``W[N, K]`` is stored once
quantized in place, and what the matmul does with the activations:

========================  =================================================  ==========================
spec                      weights and scales                                 activations (GEMM, M > 16)
========================  =================================================  ==========================
``fp8``                   e4m3 ``[N, K]``, fp32 scale per output channel     e4m3, fp32 scale per token
``fp8-wo``                the same                                           unquantized (weight-only)
``fp8_block``             e4m3 ``[N, K]``, fp32 scale per 128 x 128 block    e4m3, scale per token per 128
``fp8_block-wo``          the same                                           unquantized
``int8``                  int8 ``[N, K]``, fp32 scale per output channel     unquantized
``int4-g128``             4-bit, bf16 scale per (channel, 128 of K)          unquantized
``int4-g128-asym``        4-bit, bf16 scale and bf16 offset per group        unquantized
========================  =================================================  ==========================

Decode GEMVs (M <= 16) never quantize activations, whatever the format says: they are bound by the
weight stream, so activation quantization would add a launch and error for no time saved.

Exact bytes of a quantized ``[N, K]`` weight (:meth:`WeightFormat.weight_bytes`, what the packed
tensors hold, no more): fp8/int8 ``N*K + 4*N``; fp8_block ``N*K + 4*ceil(N/128)*ceil(K/128)``;
int4 ``N*Kp/2 + 2*N*Kp/g`` (``+ 2*N*Kp/g`` more when asymmetric) with ``Kp = ceil(K/g)*g``: the
last group is padded (see ``autoopt.backend.quant`` for the packing). Bits per weight at K = 4096:
fp8 8.008, fp8_block 8.002, int8 8.008, int4-g128 4.125, int4-g128-asym 4.25.

Specs parse case-insensitively (:func:`parse_weight`): ``int4``, ``int4-asym``, ``int4-g64-sym``,
``fp8-wo`` (= ``fp8-weight-only``), ``w4a16`` (= ``int4``), ``w8a16`` (= ``int8``), ``w8a8`` (= ``fp8``). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from autoopt._serde import from_plain, to_plain
from autoopt.errors import OpError

__all__ = ["ACTIVATIONS", "FORMAT_NAMES", "INT4_GROUPS", "WeightFormat", "parse_weight"]

FORMAT_NAMES = ("fp8", "fp8_block", "int8", "int4")
#: activation quantization: none (weight-only), per token (one scale per row of A), per token per
#: 128-group of K (the block-FP8 checkpoints' activation scheme, DeepSeek-V3 / Qwen3 -FP8)
ACTIVATIONS = ("none", "per_token", "per_token_group")
#: group sizes the int4 kernels take: powers of two, so a K-tile holds whole groups or divides one
INT4_GROUPS = (32, 64, 128, 256)
#: side of a block-FP8 weight-scale block and of an activation group (DeepSeek-V3's 128 x 128)
FP8_BLOCK = 128
_SCALE_BYTES = {"fp32": 4, "bf16": 2}
#: other names of the formats; ``fp8-weight-only`` is the planner's (``autoopt.planning.quant``)
_ALIASES = {"w4a16": "int4", "w8a16": "int8", "w8a8": "fp8", "e4m3": "fp8", "fp8-block": "fp8_block",
            "fp8block": "fp8_block", "fp8-weight-only": "fp8-wo"}


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightFormat:
    """One quantized weight format (validated on construction; ``OpError`` names what is wrong)."""

    #: one of :data:`FORMAT_NAMES`
    name: str
    #: K-group of the scales: int4 32..256 (default 128); fp8_block 128 (the square block's side);
    #: None for one scale per output channel (fp8, int8)
    group_size: int | None = None
    #: int4 only: False stores an offset per group beside its scale: ``w = (q - 8) * s + z`` (z: the
    #: value at the middle code, as torchao's tinygemm layout keeps it); symmetric means z = 0
    symmetric: bool = True
    #: dtype of the stored scales (and offsets): ``fp32`` or ``bf16``
    scale_dtype: str = "fp32"
    #: one of :data:`ACTIVATIONS` (what the prefill GEMM does with A)
    activation: str = "none"
    #: name of the packed layout the kernels read (``nk``: one byte a weight, nn.Linear order;
    #: ``int4_group_halves``: see autoopt.backend.quant)
    layout: str = "nk"

    def __post_init__(self) -> None:
        if self.name not in FORMAT_NAMES:
            raise OpError(f"unknown weight format {self.name!r}; expected one of {', '.join(FORMAT_NAMES)}")
        if self.scale_dtype not in _SCALE_BYTES:
            raise OpError(f"weight format {self.name}: scale_dtype {self.scale_dtype!r} is not one of fp32, bf16")
        if self.activation not in ACTIVATIONS:
            raise OpError(f"weight format {self.name}: activation {self.activation!r} is not one of "
                          f"{', '.join(ACTIVATIONS)}")
        want = _EXPECTED[self.name]
        for field, value in (("group_size", self.group_size), ("layout", self.layout)):
            allowed = want[field]
            if value not in allowed:
                raise OpError(f"weight format {self.name}: {field}={value!r}; expected one of "
                              f"{', '.join(map(repr, allowed))}")
        if not self.symmetric and self.name != "int4":
            raise OpError(f"weight format {self.name} is symmetric only (asymmetric offsets are an int4 option)")
        if self.activation not in want["activation"]:
            raise OpError(f"weight format {self.name}: activation {self.activation!r}; expected one of "
                          f"{', '.join(want['activation'])}")

    # -- what it is -------------------------------------------------------------------
    @property
    def spec(self) -> str:
        """The canonical name (:func:`parse_weight` of it gives this format back)."""
        if self.name == "int4":
            return f"int4-g{self.group_size}" + ("" if self.symmetric else "-asym") + \
                ("" if self.scale_dtype == "bf16" else f"-s{self.scale_dtype}")
        wo = "-wo" if self.name.startswith("fp8") and self.activation == "none" else ""
        return self.name + wo

    @property
    def weight_bits(self) -> int:
        """Bits of one quantized value (before scales)."""
        return 4 if self.name == "int4" else 8

    @property
    def quantizes_activations(self) -> bool:
        """Whether the prefill GEMM runs on e4m3 activations (W8A8, fp8 tensor cores)."""
        return self.activation != "none"

    @property
    def kgroup(self) -> int | None:
        """K-extent sharing one scale: the int4 group, the FP8 block, None for per-channel scales."""
        return self.group_size

    # -- shapes and bytes -----------------------------------------------------------
    def padded_k(self, k: int) -> int:
        """K as stored: int4 rounds up to whole groups (the last group padded), others keep K."""
        if self.name == "int4":
            assert self.group_size is not None
            return -(-k // self.group_size) * self.group_size
        return k

    def packed_shape(self, n: int, k: int) -> tuple[int, int]:
        """Shape of the packed weight tensor (uint8 for int4, e4m3/int8 otherwise)."""
        return (n, self.padded_k(k) // 2) if self.name == "int4" else (n, k)

    def scale_shape(self, n: int, k: int) -> tuple[int, ...]:
        """Shape of the scale tensor (and of the int4 offsets): ``[N]`` per channel,
        ``[ceil(N/128), ceil(K/128)]`` per block, ``[N, ceil(K/g)]`` per int4 group."""
        if self.name == "fp8_block":
            return (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
        if self.name == "int4":
            assert self.group_size is not None
            return (n, -(-k // self.group_size))
        return (n,)

    def scale_bytes(self, n: int, k: int) -> int:
        """Bytes of the scales, and of the offsets when asymmetric."""
        return math.prod(self.scale_shape(n, k)) * _SCALE_BYTES[self.scale_dtype] * (1 if self.symmetric else 2)

    def packed_bytes(self, n: int, k: int) -> int:
        rows, cols = self.packed_shape(n, k)
        return rows * cols

    def weight_bytes(self, n: int, k: int) -> int:
        """Exact bytes of the quantized weight: packed values + scales (+ offsets)."""
        return self.packed_bytes(n, k) + self.scale_bytes(n, k)

    def ideal_bytes(self, n: int, k: int) -> float:
        """The format's theoretical bytes: ``N*K`` values at :attr:`weight_bits` plus the scales, no padding."""
        return n * k * self.weight_bits / 8 + self.scale_bytes(n, k)

    def bits_per_weight(self, k: int, n: int | None = None) -> float:
        """Stored bits per weight of a ``[N, K]`` weight (N matters only for block scales; default 128)."""
        n = n or FP8_BLOCK
        return 8.0 * self.weight_bytes(n, k) / (n * k)

    def elem_bytes(self, n: int, k: int) -> float:
        """Stored bytes per weight element, scales included (what one element costs to stream)."""
        return self.weight_bytes(n, k) / (n * k)

    # -- data -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WeightFormat:
        """The format of a mapping: ``name`` required, the other fields default to that name's
        (``{"name": "int4"}`` is int4-g128)."""
        if not isinstance(data, Mapping) or "name" not in data:
            raise OpError(f"weight format must be a mapping with a 'name', got {data!r}")
        base = parse_weight(str(data["name"])).to_dict()
        return from_plain(cls, {**base, **data}, lambda msg, where: OpError(f"weight format: {where}: {msg}"))


_EXPECTED: dict[str, dict[str, tuple[Any, ...]]] = {
    "fp8": {"group_size": (None,), "layout": ("nk",), "activation": ("none", "per_token")},
    "fp8_block": {"group_size": (FP8_BLOCK,), "layout": ("nk",), "activation": ("none", "per_token_group")},
    "int8": {"group_size": (None,), "layout": ("nk",), "activation": ("none",)},
    "int4": {"group_size": INT4_GROUPS, "layout": ("int4_group_halves",), "activation": ("none",)},
}


def _defaults(name: str) -> dict[str, Any]:
    if name == "fp8":
        return {"name": name, "activation": "per_token"}
    if name == "fp8_block":
        return {"name": name, "group_size": FP8_BLOCK, "activation": "per_token_group"}
    if name == "int8":
        return {"name": name}
    return {"name": name, "group_size": 128, "scale_dtype": "bf16", "layout": "int4_group_halves"}


@lru_cache(maxsize=256)
def parse_weight(spec: str) -> WeightFormat:
    """The :class:`WeightFormat` a spec names (module docstring); ``OpError`` says what is wrong.

    Options after the name, ``-`` separated, any order: ``gNNN`` (int4 group), ``sym``/``asym``
    (int4), ``wo`` (fp8 formats: weight-only), ``sfp32``/``sbf16`` (int4 scale dtype)."""
    if not isinstance(spec, str) or not spec.strip():
        raise OpError(f"weight format must be a non-empty string like 'int4' or 'fp8', got {spec!r}")
    text = spec.strip().lower()
    text = _ALIASES.get(text, text)
    head, *opts = text.split("-")
    head = _ALIASES.get(head, head)
    if head not in FORMAT_NAMES:
        raise OpError(f"unknown weight format {spec!r}; expected one of {', '.join(FORMAT_NAMES)} "
                      "(options: -gNNN, -sym, -asym, -wo)")
    kw = _defaults(head)
    seen: set[str] = set()
    for opt in opts:
        key = "g" if opt.startswith("g") and opt[1:].isdigit() else "s" if opt in ("sfp32", "sbf16") else opt
        if key in seen or (key in ("sym", "asym") and ({"sym", "asym"} & seen)):
            raise OpError(f"weight format {spec!r}: option {opt!r} is given twice or contradicts another")
        seen.add(key)
        if key == "g" and head == "int4":
            g = int(opt[1:])
            if g not in INT4_GROUPS:
                raise OpError(f"weight format {spec!r}: group {g} is not one of {', '.join(map(str, INT4_GROUPS))}")
            kw["group_size"] = g
        elif key in ("sym", "asym") and head == "int4":
            kw["symmetric"] = key == "sym"
        elif key == "s" and head == "int4":
            kw["scale_dtype"] = opt[1:]
        elif key == "wo" and head.startswith("fp8"):
            kw["activation"] = "none"
        else:
            raise OpError(f"weight format {spec!r}: option {opt!r} does not apply to {head} "
                          "(int4: -gNNN, -sym, -asym, -sfp32; fp8/fp8_block: -wo)")
    return WeightFormat(**kw)

