"""Weight formats: exact bits per weight (scales included), hardware gating, and the choice.

Bits per weight, with what is modelled:
- BF16/FP16: 16.
- FP8 (e4m3, W8A8): 8 + one fp32 scale per output channel = 8 + 32/K (K = in_features).
- INT8 (W8A16 weight-only): 8 + one fp32 scale per output channel = 8 + 32/K (what autoopt's kernels
  store: :mod:`autoopt.kernels.quant`).
- Q8_0 (llama.cpp): blocks of 32 int8 + fp16 scale = 34 B / 32 = 8.5.
- Q6_K: 256-weight super-blocks of 210 B = 6.5625.
- Q5_K_M: mix of Q5_K (176 B / 256 = 5.5) with Q6_K on half of attn_v/ffn_down: ~5.7 whole-model average.
- Q4_K_M: mix of Q4_K (144 B / 256 = 4.5) with Q6_K on half of attn_v/ffn_down: ~4.85 average.
- MXFP4 (OCP MX v1.0): e2m1 + one E8M0 scale per 32 = 4 + 8/32 = 4.25.
- NVFP4: e2m1 + one FP8 e4m3 scale per 16 = 4 + 8/16 = 4.5, plus one fp32 scale per tensor (32/(N·K)).

Formats only a serving runtime offers (``extra``: never in the runtime-less default pool):
- AWQ / GPTQ int4 (group 128): 4 + fp16 scale + packed 4-bit zero per 128 = 4 + 20/128 = 4.156.
- W8A8 int8 (compressed-tensors): 8 + fp32 per-channel scale; int8 tensor cores from sm_75.
- NF4 (bitsandbytes, block 64): 4 + int8 absmax per 64 + fp32 per 256 blocks = 4.127.
- LLM.int8 (bitsandbytes): 8 + fp32 per-row scale.
- Q4_0 (GGUF): 18 B per 32 weights = 4.5 bits.
- FP8 weight-only (Marlin on Ampere; autoopt's ``fp8-wo``): 8 + fp32 per-channel scale, dequantized in the kernel.
- INT4 (autoopt's ``int4``, W4A16): 4 + one bf16 scale per 128 weights of a row = 4 + 16/128 = 4.125
  (``int4-g128``; :mod:`autoopt.kernels.quant` counts the padded last group exactly).

The fp8, fp8-weight-only, int8 and int4 entries are autoopt's own kernels' formats: their bits are
:meth:`autoopt.kernels.quant.WeightFormat.bits_per_weight` (tests/test_quant.py holds them equal).

Which weights a format covers: GPU formats (FP8, INT8, MXFP4, NVFP4) quantize the
Linear layers only; embeddings, LM head and norms stay in the checkpoint dtype
(ModelOpt and vLLM leave ``lm_head`` unquantized by default). GGUF K-quants
(Q8_0..Q4_K_M) quote a whole-model average, so their bits apply to every parameter.

Hardware gating (autoopt.features): FP8 matmuls are native from sm_89 (and CDNA3),
FP4 from sm_100; older GPUs get the weight-only formats, which dequantize to
bf16/fp16 inside the GEMM and save memory and bandwidth but no compute.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt._serde import to_plain
from autoopt.errors import ModelError, RuntimeRuleError
from autoopt.hardware.profile import GPUProfile
from autoopt.planning.model import ModelSpec

__all__ = ["FORMATS", "PREFERENCES", "QuantChoice", "QuantFormat", "available_formats", "choose_format",
           "get_format", "weight_bytes"]

log = get_logger(__name__)
PREFERENCES = ("speed", "balanced", "quality", "fastest")


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantFormat:
    """One weight format."""

    name: str
    #: bits per weight before per-channel/per-tensor terms (those are added in :meth:`bits_per_weight`).
    bits: float
    #: extra scale bits per output channel (divided by in_features K).
    channel_scale_bits: float = 0.0
    #: extra scale bits per tensor (divided by N·K).
    tensor_scale_bits: float = 0.0
    #: "native" (the tensor cores compute in it), "weight-only" (dequantized in the kernel), or "original".
    mode: str = "native"
    #: the dtype the GEMM computes in (what the cost model rates it at).
    compute_dtype: str = "bf16"
    #: feature flag the GPU needs (``fp8``/``fp4``), or ``None``.
    requires: str | None = None
    #: whether the bits apply to every parameter (GGUF averages) or to Linear weights only.
    whole_model: bool = False
    approx: bool = False
    #: offered only where a serving runtime lists it (see :mod:`autoopt.runtimes`)
    extra: bool = False
    note: str = ""

    @property
    def covers_every_weight(self) -> bool:
        """Whether the format's bits hold for the embeddings, LM head and norms too (a GGUF average, a model served
        at another original dtype), not only the layers' Linear weights (every GPU format: those stay 16-bit)."""
        return self.whole_model or self.mode == "original"

    def bits_per_weight(self, in_features: int | None = None, out_features: int | None = None) -> float:
        b = self.bits
        if self.channel_scale_bits and in_features:
            b += self.channel_scale_bits / in_features
        if self.tensor_scale_bits and in_features and out_features:
            b += self.tensor_scale_bits / (in_features * out_features)
        return b

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


def _f(**kw: Any) -> QuantFormat:
    return QuantFormat(**kw)


#: every format, largest first.
FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    _f(name="fp32", bits=32, mode="original", compute_dtype="fp32", note="full precision"),
    _f(name="bf16", bits=16, mode="original", compute_dtype="bf16", note="checkpoint precision"),
    _f(name="fp16", bits=16, mode="original", compute_dtype="fp16", note="checkpoint precision"),
    _f(name="fp8", bits=8, channel_scale_bits=32, mode="native", compute_dtype="fp8", requires="fp8",
       note="e4m3 weights and activations, fp32 per-channel weight scales"),
    _f(name="q8_0", bits=8.5, mode="weight-only", whole_model=True, note="GGUF: 32-weight blocks, fp16 scale"),
    _f(name="int8", bits=8, channel_scale_bits=32, mode="weight-only",
       note="W8A16, fp32 per-channel scales"),
    _f(name="q6_k", bits=6.5625, mode="weight-only", whole_model=True, note="GGUF: 256-weight super-blocks"),
    _f(name="q5_k_m", bits=5.7, mode="weight-only", whole_model=True, approx=True,
       note="GGUF mix: Q5_K (5.5) + Q6_K on half of attn_v/ffn_down"),
    _f(name="q4_k_m", bits=4.85, mode="weight-only", whole_model=True, approx=True,
       note="GGUF mix: Q4_K (4.5) + Q6_K on half of attn_v/ffn_down"),
    _f(name="nvfp4", bits=4.5, tensor_scale_bits=32, mode="native", compute_dtype="fp4", requires="fp4",
       note="e2m1, e4m3 scale per 16 + fp32 per tensor"),
    _f(name="mxfp4", bits=4.25, mode="native", compute_dtype="fp4", requires="fp4",
       note="e2m1, E8M0 scale per 32 (OCP MX)"),
    _f(name="fp8-weight-only", bits=8, channel_scale_bits=32, mode="weight-only", extra=True,
       note="fp8 weights dequantized to bf16 in the kernel (Marlin)"),
    _f(name="w8a8_int8", bits=8, channel_scale_bits=32, mode="native", compute_dtype="int8", extra=True,
       note="int8 weights and activations, fp32 per-channel scales"),
    _f(name="bnb_int8", bits=8, channel_scale_bits=32, mode="weight-only", extra=True,
       note="bitsandbytes LLM.int8, fp32 per-row scales"),
    _f(name="q4_0", bits=4.5, mode="weight-only", whole_model=True, extra=True,
       note="GGUF: 32-weight blocks, fp16 scale"),
    _f(name="awq", bits=4 + 20 / 128, mode="weight-only", extra=True,
       note="AWQ int4, group 128: fp16 scale + 4-bit zero"),
    _f(name="gptq", bits=4 + 20 / 128, mode="weight-only", extra=True,
       note="GPTQ int4, group 128: fp16 scale + packed 4-bit zero"),
    _f(name="nf4", bits=4 + 8 / 64 + 32 / (64 * 256), mode="weight-only", extra=True,
       note="bitsandbytes NF4, block 64, double-quantized absmax"),
    _f(name="int4", bits=4 + 16 / 128, mode="weight-only", extra=True,
       note="W4A16, bf16 scale per 128 weights of a row (autoopt int4-g128)"),
)}
_ORIGINAL_BITS = {"fp32": 32.0, "bf16": 16.0, "fp16": 16.0, "fp8": 8.0}
#: the lowest precision the automatic choice goes to (4-bit formats keep quality acceptable for 7B+ models).
MIN_BITS = 4.0


def get_format(name: str) -> QuantFormat:
    key = name.strip().lower()
    key = key if key in FORMATS else key.replace("-", "_")  # fp8-weight-only is spelled with hyphens
    key = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "e4m3": "fp8"}.get(key, key)
    if key not in FORMATS:
        raise ModelError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}", field="weight_dtype")
    return FORMATS[key]


def supported(fmt: QuantFormat, gpu: GPUProfile | None) -> bool:
    """Whether ``gpu`` can run ``fmt`` (CPU: weight-only and original formats only)."""
    if fmt.requires is None:  # except bf16 before Ampere (no bf16 tensor cores: fp16 instead)
        return not (fmt.name == "bf16" and gpu is not None and not gpu.features.bf16)
    return gpu is not None and bool(getattr(gpu.features, fmt.requires))


def available_formats(gpu: GPUProfile | None, model: ModelSpec,
                      names: Collection[str] | None = None) -> tuple[QuantFormat, ...]:
    """Formats this GPU supports that are no larger than the model's checkpoint format: among
    ``names`` (a runtime's formats) when given, else the default pool (no ``extra`` formats)."""
    limit = _ORIGINAL_BITS[model.dtype]
    out: list[QuantFormat] = []
    for f in FORMATS.values():
        if (f.extra if names is None else f.name not in names):
            continue
        if f.mode == "original":
            # fp32 checkpoints may be served in fp32/bf16/fp16; bf16/fp16 ones in either 16-bit type.
            if f.bits > limit or model.dtype == "fp8":
                continue
        elif f.bits > limit or (f.name == "fp8-weight-only" and any(x.name == "fp8" for x in out)):
            continue
        if supported(f, gpu):
            out.append(f)
    if model.dtype == "fp8" and not any(f.name.startswith("fp8") for f in out) \
            and (names is None or "fp8-weight-only" in names):
        # An fp8 checkpoint on a GPU without fp8 matmuls: served weight-only (e.g. Marlin FP8 on Ampere).
        out.insert(0, FORMATS["fp8-weight-only"])
    return tuple(out)


def weight_bytes(model: ModelSpec, fmt: QuantFormat, layers: range | None = None, *,
                 embed: bool = True, head: bool = True, tp: int = 1) -> float:
    """Bytes of the weights of ``layers`` (all by default) in ``fmt``, divided over ``tp`` ranks.

    Linear weights are counted at the format's bits (per-channel scales taken at
    K = hidden_size; down_proj's larger K makes that a slight over-count); ``embed``
    and ``head`` add the embedding table and the LM head + final norm. Embeddings, LM head, norms and the router
    at the checkpoint dtype unless the format is a whole-model GGUF average.
    """
    lin_bits = fmt.bits_per_weight(model.hidden_size, model.hidden_size)
    rest_bits = fmt.bits if fmt.covers_every_weight else _ORIGINAL_BITS[model.dtype]
    if fmt.mode == "original":
        lin_bits = fmt.bits
    total = 0.0
    layers = range(model.num_layers) if layers is None else layers
    for moe in ((False, True) if model.is_moe else (False,)):
        count = model.count_layers(layers, moe=moe)
        if not count:
            continue
        i = model.first_moe_layer if moe else 0  # a layer of this kind (layer 0 is dense when any is)
        if not moe and not model.has_dense_layers:
            continue
        lin = model.linear_params(i)
        rest = model.layer_params(i) - lin
        # Linear weights shard over tensor-parallel ranks; norms and the router are replicated.
        layer = lin * lin_bits / 8 / tp + rest * rest_bits / 8
        ebits = _EXPERT_BITS.get(model.expert_dtype or "")
        if moe and ebits is not None and ebits < lin_bits:
            # experts shipped quantized (gpt-oss: MXFP4) stay so whatever the rest is served in
            experts = _routed_expert_params(model)
            layer -= experts * (lin_bits - ebits) / 8 / tp
        total += count * layer
    # Embedding and LM head are vocab-parallel over TP ranks (tied: one table, held with the embedding).
    if embed:
        total += model.embedding_params * rest_bits / 8 / tp
    if head:
        # A tied head on a device without the embedding (last pipeline stage) needs its own copy.
        head_params = model.lm_head_params + (model.embedding_params if model.tied_embeddings and not embed else 0)
        total += head_params * rest_bits / 8 / tp + model.final_norm_params * rest_bits / 8
    return total


#: bits per weight of expert formats a checkpoint can ship its experts in (ModelSpec.expert_dtype)
_EXPERT_BITS = {"mxfp4": 4.25, "fp8": 8.0}


def _routed_expert_params(model: ModelSpec) -> int:
    """Weights (and biases) of one MoE layer's routed experts."""
    h, mi = model.hidden_size, model.moe_intermediate_size or 0
    per_expert = 3 * h * mi + ((2 * mi + h) if model.moe_bias else 0)
    return (model.num_experts or 0) * per_expert


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantChoice:
    """The chosen format, why, and what else was considered."""

    format: QuantFormat
    reason: str
    considered: tuple[tuple[str, float, bool], ...] = ()  # (format, weight bytes, fits)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format.name, "mode": self.format.mode,
                "bits_per_weight": round(self.format.bits_per_weight(), 4), "approx": self.format.approx,
                "compute_dtype": self.format.compute_dtype, "note": self.format.note, "reason": self.reason,
                "considered": [{"format": n, "weight_bytes": round(b), "fits": f} for n, b, f in self.considered]}


def choose_format(gpu: GPUProfile | None, model: ModelSpec, *, preference: str = "balanced",
                  fits: Callable[[QuantFormat], bool] | None = None,
                  requested: str | None = None, names: Collection[str] | None = None,
                  runtime: str | None = None) -> QuantChoice:
    """Pick a weight format for ``model`` on ``gpu``; with ``names`` (and ``runtime``, for the reasons)
    only among the formats a serving runtime has kernels for there.

    ``fits(fmt)`` says whether the whole deployment fits in memory with that format
    (the caller owns the memory model). Rules, among supported formats no larger
    than the checkpoint and no lower than 4 bits:

    - ``quality``: the most bits that fit.
    - ``speed``: the lowest-precision *native* class that fits (FP4 on Blackwell,
      FP8 from Ada/Hopper), best accuracy within it (NVFP4's 16-weight e4m3-scaled
      blocks over MXFP4's 32-weight power-of-two scales); without one, the fewest
      bits among weight-only formats (decode is bandwidth bound).
    - ``balanced``: native FP8 when it fits, else the checkpoint format when it fits,
      else the most bits that fit.
    - ``fastest``: chosen by :func:`~autoopt.planning.recommendation.recommend`, which prices every format
      that fits and keeps the fastest; here (one format at a time) it answers as ``balanced``.
    """
    if preference not in PREFERENCES:
        raise ModelError(f"unknown preference {preference!r}; expected one of {', '.join(PREFERENCES)}",
                         field="preference")
    fits = fits or (lambda f: True)
    if requested:
        fmt = get_format(requested)
        if not supported(fmt, gpu):
            need = {"fp8": "sm_89+", "fp4": "sm_100+"}.get(fmt.requires or "", "")
            raise ModelError(f"{fmt.name} needs native {fmt.requires} matmuls ({need}); "
                             f"{gpu.name if gpu else 'this CPU'} ({gpu.arch if gpu else 'no GPU'}) has none",
                             field="weight_dtype")
        if names is not None and fmt.name not in names:
            raise RuntimeRuleError(f"has no {fmt.name} kernels on {gpu.name if gpu else 'the CPU'}; it runs "
                                   f"{', '.join(sorted(names))} there", runtime=runtime, rule="format")
        return QuantChoice(format=fmt, reason=f"{fmt.name} as requested",
                           considered=((fmt.name, weight_bytes(model, fmt), fits(fmt)),))
    pool = [f for f in available_formats(gpu, model, names) if f.bits >= MIN_BITS]
    if not pool:
        raise RuntimeRuleError(f"runs none of its formats for a {model.dtype} checkpoint on "
                               f"{gpu.name if gpu else 'the CPU'} (it offers {', '.join(sorted(names or ()))})",
                               runtime=runtime, rule="format")
    considered = tuple((f.name, weight_bytes(model, f), fits(f)) for f in pool)
    ok = [f for f, (_, _, fit) in zip(pool, considered, strict=True) if fit]
    if not ok:
        smallest = min(pool, key=lambda f: f.bits)
        return QuantChoice(format=smallest, reason=f"nothing fits; {smallest.name} is the smallest format "
                           f"(a multi-device split is needed)", considered=considered)
    by_bits = sorted(ok, key=lambda f: -f.bits_per_weight(model.hidden_size))
    native = [f for f in ok if f.mode == "native"]
    original = [f for f in ok if f.mode == "original"]
    if preference == "quality":
        f = by_bits[0]
        return QuantChoice(format=f, reason=f"quality: {f.name} is the most precise format that fits",
                           considered=considered)
    if preference == "speed":
        if native:
            cls = min({f.compute_dtype for f in native}, key=lambda d: {"fp4": 0, "fp8": 1}.get(d, 2))
            f = max((f for f in native if f.compute_dtype == cls), key=lambda f: f.bits)
            return QuantChoice(format=f, reason=f"speed: {f.name} is the lowest-precision format this GPU "
                               f"computes natively ({cls} tensor cores) that fits", considered=considered)
        f = by_bits[-1]
        return QuantChoice(format=f, reason=f"speed: no native low-precision format here; {f.name} moves the "
                           "fewest weight bytes (decode is bandwidth bound)", considered=considered)
    fp8 = [f for f in native if f.compute_dtype == "fp8"]
    if fp8:
        return QuantChoice(format=fp8[0], reason="balanced: native FP8 halves weight bytes and doubles tensor-core "
                           "rate at small accuracy cost", considered=considered)
    if original:
        f = original[0]
        return QuantChoice(format=f, reason=f"balanced: the checkpoint format {f.name} fits",
                           considered=considered)
    f = by_bits[0]
    return QuantChoice(format=f, reason=f"balanced: {f.name} is the most precise format that fits",
                       considered=considered)


def describe_formats() -> Mapping[str, float]:
    """Format name -> bits per weight at K=4096 (for listings)."""
    return {n: f.bits_per_weight(4096, 4096) for n, f in FORMATS.items()}
