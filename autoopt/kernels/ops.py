"""Op descriptions: what a kernel must compute, independent of how.

An :class:`OpSpec` names the kind, the shape and the dtype. It knows its own
FLOP count and the fewest bytes it must move (every input read once, every
output written once), which give the physical floor any kernel is held to.

Shapes by kind:
- ``gemm``/``gemv``: ``(M, N, K)``: ``C[M,N] = A[M,K] @ W[N,K]^T`` (``nn.Linear``
  weights, layout ``nk``) or ``A @ B[K,N]`` (layout ``kn``). ``gemv`` is M <= 16.
  ``weight`` (e.g. ``"int4"``, ``"fp8"``; :mod:`autoopt.kernels.quant`) names a quantized ``W``:
  ``dtype`` is then the activations' (and the output's), the FLOPs are unchanged and the bytes
  count the packed weight with its scales exactly.
- ``silu_mul``: ``(rows, N)``: ``out[rows,N] = silu(x[rows,N]) * y[rows,N]``.
- ``gelu_tanh_mul``: ``(rows, N)``: ``out = gelu_tanh(x) * y`` (GeGLU, Gemma's activation).
- ``add``: ``(rows, N)`` (or ``(numel,)``): ``out = x + y``.
- ``rmsnorm``/``layernorm``/``softmax``: ``(rows, N)``, normalised over N.
- ``fused_moe``: ``(M, E, topk, N, K)``: M tokens each routed to ``topk`` of ``E`` experts; expert e's
  gate_up weight ``w13[e]`` is ``[2N, K]`` (gate rows first), its down weight ``w2[e]`` is ``[K, N]``
  (N: intermediate size per shard, K: hidden size; vLLM's config files name N and E).
  ``moe_gemm`` says what is meant: ``both`` (``out[M,K] = sum_j w_j * down_j(silu(gate_j) * up_j)``),
  ``gate_up`` (``[M*topk, 2N]``, one row per routed token) or ``down`` (``[M*topk, N] -> [M*topk, K]``,
  each row times its routing weight). ``dtype`` is the activations'; ``weight`` a quantized expert
  format (fp8 = vLLM's ``fp8_w8a8`` per channel, ``fp8_block`` its ``block_shape=[128,128]``, int8 =
  ``int8_w8a16``, int4 = ``int4_w4a16``). FLOPs are the GEMMs' ``2*M*topk*N_out*K_in`` (the activation
  and the weighted sum are not counted). Bytes count the weights of the *expected* number of distinct
  experts touched under uniform routing, ``E * (1 - (1 - topk/E)^M)`` (an expert is missed by one token
  with probability ``1 - topk/E``, by all M independently), plus activations in and out once and the
  routing (int32 ids; fp32 weights where used).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoopt.errors import OpError
from autoopt.kernels.quant import WeightFormat, parse_weight

__all__ = ["DTYPE_BYTES", "MOE_GEMMS", "OP_KINDS", "QUANT_ACT_DTYPES", "OpSpec", "parse_shape"]

#: bytes per element; fp4 packs two per byte.
DTYPE_BYTES: dict[str, float] = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2,
                                 "fp8": 1, "int8": 1, "fp4": 0.5}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
                  "bfloat16": "bf16", "float8": "fp8", "e4m3": "fp8", "float8_e4m3fn": "fp8",
                  "float64": "fp64", "double": "fp64"}

#: kind -> (dimension names, dtypes supported)
OP_KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gemm": (("M", "N", "K"), ("bf16", "fp16", "fp8", "fp32")),
    "gemv": (("M", "N", "K"), ("bf16", "fp16", "fp8", "fp32")),
    "silu_mul": (("rows", "N"), ("bf16", "fp16", "fp32")),
    "add": (("rows", "N"), ("bf16", "fp16", "fp32")),
    "gelu_tanh_mul": (("rows", "N"), ("bf16", "fp16", "fp32")),
    "rmsnorm": (("rows", "N"), ("bf16", "fp16", "fp32")),
    "layernorm": (("rows", "N"), ("bf16", "fp16", "fp32")),
    "softmax": (("rows", "N"), ("bf16", "fp16", "fp32")),
    "fused_moe": (("M", "E", "topk", "N", "K"), ("bf16", "fp16")),
}
#: which GEMM of a ``fused_moe`` op is meant (``OpSpec.moe_gemm``)
MOE_GEMMS = ("both", "gate_up", "down")
#: activation (and output) dtypes of a matmul with a quantized weight
QUANT_ACT_DTYPES = ("bf16", "fp16")
_MAX_DIM = 1 << 31  # int32 indexing in the kernels; larger is refused up front
GEMV_MAX_M = 16


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse ``"256,6144,4096"`` (also ``x`` separated) into positive ints; ``OpError`` otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise OpError("shape is empty; expected comma-separated positive integers like 256,6144,4096")
    parts = [p.strip() for p in text.replace("x", ",").replace("X", ",").split(",")]
    dims = []
    for p in parts:
        if not (p.isascii() and p.isdigit()) or int(p) == 0:
            raise OpError(f"shape {text!r}: {p!r} is not a positive integer")
        dims.append(int(p))
    return tuple(dims)


def normalize_dtype(dtype: str) -> str:
    d = str(dtype).strip().lower()
    d = _DTYPE_ALIASES.get(d.removeprefix("torch."), d.removeprefix("torch."))
    if d not in DTYPE_BYTES:
        raise OpError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return d


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSpec:
    """One op: kind, shape and dtype (validated on construction)."""

    kind: str
    shape: tuple[int, ...]
    dtype: str = "bf16"
    layout: str = "nk"
    #: dtype of the output; defaults to the input dtype (fp8 GEMMs write bf16).
    out_dtype: str | None = None
    #: quantized weight format of a matmul (a :func:`~autoopt.kernels.quant.parse_weight` spec, kept
    #: canonical); None: W is stored in ``dtype`` like A.
    weight: str | None = None
    #: ``fused_moe`` only: which GEMM (:data:`MOE_GEMMS`; None there means ``both``); None for other kinds
    moe_gemm: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise OpError(f"unknown op kind {self.kind!r}; expected one of {', '.join(OP_KINDS)}")
        names, dtypes = OP_KINDS[self.kind]
        shape = tuple(self.shape)
        if self.kind == "add" and len(shape) == 1:
            shape = (1, shape[0])
        if len(shape) != len(names):
            raise OpError(f"{self.kind} takes a shape of {len(names)} dims ({','.join(names)}), got {len(shape)}")
        for n, v in zip(names, shape, strict=True):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise OpError(f"{self.kind}: dimension {n} must be a positive integer, got {v!r}")
            if v >= _MAX_DIM:
                raise OpError(f"{self.kind}: dimension {n}={v} is too large (limit {_MAX_DIM - 1})")
        size: int = math.prod(shape)
        what = f"shape {shape}"
        if self.kind == "fused_moe":  # its largest tensor: the experts' gate_up weights or the routed rows
            tokens, experts, topk, inter, hidden = shape
            weights, rows = experts * 2 * inter * hidden, tokens * topk * max(2 * inter, hidden)
            size, what = (weights, "the gate_up weights") if weights >= rows else (rows, "the routed rows")
        if size >= 1 << 40:
            raise OpError(f"{self.kind}: {what} hold more than 2^40 elements ({size})")
        dtype = normalize_dtype(self.dtype)
        if dtype not in dtypes:
            raise OpError(f"{self.kind} does not support dtype {dtype}; expected one of {', '.join(dtypes)}")
        if self.kind == "gemv" and shape[0] > GEMV_MAX_M:
            raise OpError(f"gemv is for M <= {GEMV_MAX_M} (decode); M={shape[0]}: use kind 'gemm'")
        if self.layout not in ("nk", "kn"):
            raise OpError(f"layout {self.layout!r} is not supported; expected 'nk' (nn.Linear weight) or 'kn'")
        out = normalize_dtype(self.out_dtype) if self.out_dtype else ("bf16" if dtype == "fp8" else dtype)
        if self.kind == "fused_moe":
            if shape[2] > shape[1]:
                raise OpError(f"fused_moe: topk={shape[2]} exceeds the number of experts E={shape[1]}")
            gemm = "both" if self.moe_gemm is None else self.moe_gemm
            if gemm not in MOE_GEMMS:
                raise OpError(f"fused_moe: moe_gemm={self.moe_gemm!r}; expected one of {', '.join(MOE_GEMMS)}")
            object.__setattr__(self, "moe_gemm", gemm)
            if self.layout != "nk":
                raise OpError(f"fused_moe experts are stored [N_out, K] (transformers' and vLLM's layout): layout "
                              f"must be 'nk', got {self.layout!r}")
        elif self.moe_gemm is not None:
            raise OpError(f"{self.kind} has no expert GEMMs; 'moe_gemm' applies to fused_moe only")
        if self.weight is not None:
            if self.kind not in ("gemm", "gemv", "fused_moe"):
                raise OpError(f"{self.kind} has no weight to quantize; 'weight' applies to gemm/gemv/fused_moe")
            fmt = parse_weight(self.weight) if isinstance(self.weight, str) else None
            if fmt is None:
                raise OpError(f"weight must be a format name like 'int4' or 'fp8', got {self.weight!r}")
            if dtype not in QUANT_ACT_DTYPES or out not in (*QUANT_ACT_DTYPES, "fp32"):
                raise OpError(f"a {fmt.spec} weight takes {' or '.join(QUANT_ACT_DTYPES)} activations and "
                              f"outputs; got dtype {dtype}, out_dtype {out}")
            if self.layout != "nk":
                raise OpError(f"a {fmt.spec} weight is packed from an nn.Linear [N, K] weight: layout must be "
                              f"'nk', got {self.layout!r}")
            object.__setattr__(self, "weight", fmt.spec)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "out_dtype", out)

    # -- derived quantities -------------------------------------------------
    @property
    def dims(self) -> dict[str, int]:
        return dict(zip(OP_KINDS[self.kind][0], self.shape, strict=True))

    @property
    def is_matmul(self) -> bool:
        return self.kind in ("gemm", "gemv")

    @property
    def uses_tensor_cores(self) -> bool:
        """Whether the op's work is matmuls (priced at the tensor-core peak): gemm, gemv, fused_moe."""
        return self.is_matmul or self.kind == "fused_moe"

    @property
    def moe_matrices(self) -> tuple[tuple[int, int], ...]:
        """``fused_moe``: the ``(N_out, K_in)`` of each expert weight the op multiplies by, gate_up
        ``(2N, K)`` then down ``(K, N)``, as ``moe_gemm`` selects; () for other kinds."""
        if self.kind != "fused_moe":
            return ()
        _, _, _, n, k = self.shape
        both = {"gate_up": (2 * n, k), "down": (k, n)}
        return tuple(v for name, v in both.items() if self.moe_gemm in ("both", name))

    @property
    def moe_touched_experts(self) -> float:
        """``fused_moe``: expected distinct experts hit under uniform routing, ``E*(1-(1-topk/E)^M)``."""
        m, e, topk, _, _ = self.shape
        return e * (1.0 - (1.0 - topk / e) ** m)

    def moe_weight_bytes(self, n_out: int, k_in: int) -> float:
        """Stored bytes of one expert's ``[n_out, k_in]`` weight (packed + scales for a quantized format)."""
        fmt = self.weight_format
        return float(fmt.weight_bytes(n_out, k_in) if fmt is not None else n_out * k_in * DTYPE_BYTES[self.dtype])

    @property
    def weight_format(self) -> WeightFormat | None:
        """The quantized weight's format, or None for a plain matmul (or a non-matmul op)."""
        return None if self.weight is None else parse_weight(self.weight)

    @property
    def compute_dtype(self) -> str:
        """The dtype the matmul's MMAs run in: fp8 for a W8A8 GEMM (activations quantized to e4m3),
        else ``dtype`` (weight-only formats dequantize W to the activations' dtype; decode GEMVs
        never quantize activations)."""
        fmt = self.weight_format
        if fmt is not None and self.kind in ("gemm", "fused_moe") and fmt.quantizes_activations:
            return "fp8"
        return self.dtype

    @property
    def weight_elem_bytes(self) -> float:
        """Stored bytes per element of W: the dtype's, or the packed format's with its scales."""
        fmt = self.weight_format
        if self.kind == "fused_moe":  # over the op's expert matrices
            mats = self.moe_matrices
            return sum(self.moe_weight_bytes(n, k) for n, k in mats) / sum(n * k for n, k in mats)
        if fmt is None:
            return DTYPE_BYTES[self.dtype]
        _, n, k = self.shape
        return fmt.elem_bytes(n, k)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def flops(self) -> float:
        """Useful floating-point operations (2·M·N·K for a matmul; per-element work otherwise)."""
        if self.is_matmul:
            m, n, k = self.shape
            return 2.0 * m * n * k
        if self.kind == "fused_moe":
            rows = self.shape[0] * self.shape[2]
            return sum(2.0 * rows * n * k for n, k in self.moe_matrices)
        per_elem = {"silu_mul": 5.0, "add": 1.0, "gelu_tanh_mul": 9.0, "rmsnorm": 4.0, "layernorm": 7.0,
                    "softmax": 5.0}
        return per_elem[self.kind] * self.numel

    @property
    def min_bytes(self) -> float:
        """Fewest bytes through device memory: every input read once, every output written once."""
        e = DTYPE_BYTES[self.dtype]
        o = DTYPE_BYTES[self.out_dtype or self.dtype]
        if self.is_matmul:
            m, n, k = self.shape
            fmt = self.weight_format
            if fmt is not None:  # A once in its dtype, the packed W and its scales once, C once
                return m * k * e + fmt.weight_bytes(n, k) + m * n * o
            return (m * k + n * k) * e + m * n * o
        if self.kind == "fused_moe":
            return self._moe_min_bytes(e, o)
        rows, n = self.shape
        if self.kind in ("silu_mul", "add", "gelu_tanh_mul"):
            return 3.0 * rows * n * e
        if self.kind == "rmsnorm":
            return 2.0 * rows * n * e + n * e
        if self.kind == "layernorm":
            return 2.0 * rows * n * e + 2 * n * e
        return 2.0 * rows * n * e  # softmax

    def _moe_min_bytes(self, e: float, o: float) -> float:
        """Touched experts' weights (expected, uniform routing), activations in and out once, and
        the routing: int32 expert ids (every GEMM), fp32 weights (where they scale the down GEMM)."""
        m, _, topk, n, k = self.shape
        slots = m * topk
        w = self.moe_touched_experts * sum(self.moe_weight_bytes(no, ki) for no, ki in self.moe_matrices)
        io = {"both": m * k * e + m * k * o, "gate_up": m * k * e + slots * 2 * n * o,
              "down": slots * n * e + slots * k * o}[self.moe_gemm or "both"]
        routing = slots * (4 if self.moe_gemm == "gate_up" else 8)
        return w + io + routing

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte at the floor."""
        return self.flops / self.min_bytes

    def label(self) -> str:
        w = f" w={self.weight}" if self.weight else ""
        if self.kind == "fused_moe" and self.moe_gemm != "both":
            w += f" {self.moe_gemm}"
        return f"{self.kind}[{'x'.join(map(str, self.shape))}] {self.dtype}{w}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data; ``weight`` appears only when set (a plain op's dict is what it always was)."""
        out: dict[str, Any] = {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype,
                               "layout": self.layout, "out_dtype": self.out_dtype}
        if self.weight is not None:
            out["weight"] = self.weight
        if self.moe_gemm is not None:
            out["moe_gemm"] = self.moe_gemm
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpSpec:
        if not isinstance(data, Mapping):
            raise OpError(f"op description must be a mapping, got {type(data).__name__}")
        unknown = set(data) - {"kind", "shape", "dtype", "layout", "out_dtype", "weight", "moe_gemm"}
        if unknown:
            raise OpError(f"op description has unknown fields {sorted(map(str, unknown))}")
        if "kind" not in data or "shape" not in data:
            raise OpError("op description needs 'kind' and 'shape'")
        shape = data["shape"]
        if isinstance(shape, str):
            shape = parse_shape(shape)
        if not isinstance(shape, Sequence):
            raise OpError(f"shape must be a list of integers, got {type(shape).__name__}")
        kind = data["kind"]
        if not isinstance(kind, str):
            raise OpError(f"kind must be a string, got {type(kind).__name__}")
        weight = data.get("weight")
        if weight is not None and not isinstance(weight, str):
            raise OpError(f"weight must be a format name like 'int4', got {type(weight).__name__}")
        moe_gemm = data.get("moe_gemm")
        if moe_gemm is not None and not isinstance(moe_gemm, str):
            raise OpError(f"moe_gemm must be one of {', '.join(MOE_GEMMS)}, got {type(moe_gemm).__name__}")
        return cls(kind=kind.lower(), shape=tuple(shape), dtype=str(data.get("dtype", "bf16")),
                   layout=str(data.get("layout", "nk")),
                   out_dtype=data.get("out_dtype"), weight=weight, moe_gemm=moe_gemm)
