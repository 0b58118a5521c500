"""Memory model of one deployment on one device: weights + KV cache + activations + reserve.

Terms, in bytes:
- weights: :func:`autoopt.quant.weight_bytes` (format bits incl. scales).
- KV cache: per layer, per cached token: ``2 (K and V) x KV heads x head_dim x bytes``
  (GQA/MQA: the KV heads, split over tensor-parallel ranks but never below one);
  MLA caches the compressed latent ``kv_lora_rank + qk_rope_head_dim`` once (no x2,
  replicated on every TP rank); a sliding-window layer caches at most ``window``
  tokens. Times context x batch.
- activations: the largest live set of one layer for the tokens processed at once
  (prefill chunk or decode batch): the residual and normed input, plus the widest
  stage (QKV+attention output, or gate_up+activation output; a plain MLP's fc1+activation output),
  bf16, and in a parallel block the attention's output while the MLP runs; plus fp32 logits
  for the last token of each sequence.
- workspace: cuBLAS workspace, 32 MiB on Hopper and later, 4 MiB before (cuBLAS docs,
  cublasSetWorkspace: recommended sizes).
- reserve: CUDA context ``CUDA_CONTEXT_BYTES`` (~500 MB for a PyTorch process with
  lazy module loading), plus the driver's own reservation on NVIDIA GPUs
  (``DRIVER_RESERVED_BYTES``: measured on an H100 80GB HBM3, NVML total 85520809984 B
  minus CUDA-visible total_memory 85017493504 B = 503316480 B), plus
  ``FRAGMENTATION`` of the dynamic allocations (KV + activations) for the caching
  allocator's fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt._serde import to_plain
from autoopt.hardware.profile import GPUProfile
from autoopt.planning.model import ModelSpec
from autoopt.planning.quant import QuantFormat, weight_bytes

__all__ = ["CUDA_CONTEXT_BYTES", "DRIVER_RESERVED_BYTES", "FRAGMENTATION", "KV_BYTES", "MemoryEstimate",
           "activation_bytes", "estimate_memory", "kv_bytes_per_token", "kv_cache_bytes", "workspace_bytes"]

log = get_logger(__name__)

CUDA_CONTEXT_BYTES = 500 * 10**6
DRIVER_RESERVED_BYTES = 85520809984 - 85017493504  # = 503316480 B (480 MiB), H100 capture
FRAGMENTATION = 0.05
#: default chunked-prefill token budget (like vLLM's max_num_batched_tokens): activations are sized for it.
PREFILL_CHUNK = 8192
#: bytes per cached element; llama.cpp's q8_0 / q4_0 caches are 34 / 18 bytes per 32 elements
KV_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "q8_0": 34 / 32,
                              "q4_0": 18 / 32}
_MIB = 1 << 20


def _kv_dtype_bytes(kv_dtype: str) -> float:
    from autoopt.errors import ModelError

    if kv_dtype not in KV_BYTES:
        raise ModelError(f"unknown KV-cache dtype {kv_dtype!r}; expected one of {', '.join(KV_BYTES)}",
                         field="kv_dtype")
    return KV_BYTES[kv_dtype]


def _kv_layer_elems(model: ModelSpec, tp: int) -> int:
    """Elements cached per token per layer on one TP rank."""
    if model.is_mla:
        return model.kv_lora_rank + model.qk_rope_head_dim  # type: ignore[operator]
    heads = -(-model.num_kv_heads // tp)  # ceil: a rank holds at least one KV head
    return 2 * heads * model.head_dim


def kv_bytes_per_token(model: ModelSpec, *, kv_dtype: str = "bf16", tp: int = 1,
                       layers: range | None = None) -> float:
    """KV bytes one more token of history costs (all layers, global ones only matter past the window)."""
    layers = range(model.num_layers) if layers is None else layers
    return len(layers) * _kv_layer_elems(model, tp) * _kv_dtype_bytes(kv_dtype)


def kv_cache_bytes(model: ModelSpec, *, batch: int, context: int, kv_dtype: str = "bf16", tp: int = 1,
                   layers: range | None = None) -> float:
    """KV cache for ``batch`` sequences of ``context`` tokens over ``layers`` on one TP rank."""
    per = _kv_layer_elems(model, tp) * _kv_dtype_bytes(kv_dtype)
    layers = range(model.num_layers) if layers is None else layers
    n_local = model.count_layers(layers, local=True)
    n_global = model.count_layers(layers, local=False)
    window = min(context, model.sliding_window) if model.sliding_window else context
    return float((n_local * window + n_global * context) * per * batch)


def activation_bytes(model: ModelSpec, *, tokens: int, batch: int, tp: int = 1) -> float:
    """Peak activation bytes of one layer for ``tokens`` processed at once, plus fp32 logits."""
    h = model.hidden_size
    if model.is_mla:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim  # type: ignore[operator]
        attn = model.num_attention_heads * (qk + model.v_head_dim) // tp + model.kv_lora_rank  # type: ignore
    else:
        attn = (2 * model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim // tp
    # gated: gate_up's 2 x intermediate plus the activation's output; plain: fc1's output and the activation's
    mlp = (3 if model.mlp == "gated" else 2) * model.intermediate_size // tp
    if model.is_moe:
        mi = model.moe_intermediate_size
        moe = 3 * mi * (model.experts_per_token + model.num_shared_experts) // tp  # type: ignore[operator]
        mlp = max(mlp if model.has_dense_layers else 0, moe + model.num_experts)
    # a parallel block (Phi, GPT-NeoX, Falcon) holds the attention's output until the MLP's joins it
    per_token = 2 * h + max(attn, mlp) + (h if model.parallel_block else 0)
    logits = batch * model.vocab_size * 4 / tp
    return float(tokens * per_token * 2 + logits)


def workspace_bytes(gpu: GPUProfile | None) -> int:
    if gpu is None:
        return 0
    cc = gpu.cc
    return 32 * _MIB if cc is not None and cc >= (9, 0) else 4 * _MIB


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Bytes needed on one device, against what it has."""

    device: str
    capacity_bytes: int
    weights_bytes: float
    kv_cache_bytes: float
    activation_bytes: float
    workspace_bytes: float
    reserve_bytes: float
    fragmentation_bytes: float
    kv_bytes_per_token: float

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.workspace_bytes
                + self.reserve_bytes + self.fragmentation_bytes)

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.total_bytes

    @property
    def headroom_pct(self) -> float:
        return 100.0 * self.headroom_bytes / self.capacity_bytes if self.capacity_bytes else 0.0

    @property
    def fits(self) -> bool:
        return self.headroom_bytes >= 0

    @property
    def extra_kv_tokens(self) -> int:
        """More cached tokens (summed over sequences) the headroom would hold, fragmentation included."""
        if self.headroom_bytes <= 0 or self.kv_bytes_per_token <= 0:
            return 0
        return int(self.headroom_bytes // (self.kv_bytes_per_token * (1 + FRAGMENTATION)))

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        out.update(total_bytes=round(self.total_bytes), headroom_bytes=round(self.headroom_bytes),
                   headroom_pct=round(self.headroom_pct, 2), fits=self.fits, extra_kv_tokens=self.extra_kv_tokens)
        return out

    def describe(self) -> str:
        gb = 1e9
        return (f"{self.device}: {self.total_bytes / gb:.2f} of {self.capacity_bytes / gb:.2f} GB "
                f"(weights {self.weights_bytes / gb:.2f}, KV {self.kv_cache_bytes / gb:.2f}, activations "
                f"{self.activation_bytes / gb:.2f}, workspace+reserve "
                f"{(self.workspace_bytes + self.reserve_bytes + self.fragmentation_bytes) / gb:.2f}) -> "
                f"{'fits' if self.fits else 'DOES NOT FIT'}, headroom {self.headroom_bytes / gb:.2f} GB "
                f"({self.headroom_pct:.1f}%)")


def estimate_memory(model: ModelSpec, fmt: QuantFormat, *, capacity_bytes: int, device: str = "gpu",
                    gpu: GPUProfile | None = None, batch: int = 1, context: int, prompt_len: int | None = None,
                    phase: str = "both", kv_dtype: str = "bf16", tp: int = 1, layers: range | None = None,
                    embed: bool = True, head: bool = True, prefill_chunk: int = PREFILL_CHUNK,
                    cpu: bool = False) -> MemoryEstimate:
    """Memory of ``layers`` of ``model`` in ``fmt`` on one device (one TP rank of ``tp``).

    ``cpu=True`` drops the CUDA reserve and workspace (host RAM holds no context).
    Activations are sized for the larger of the prefill chunk and the decode batch.
    """
    prompt_len = context if prompt_len is None else prompt_len
    tokens = batch if phase == "decode" else max(batch, min(batch * prompt_len, prefill_chunk))
    w = weight_bytes(model, fmt, layers, embed=embed, head=head, tp=tp)
    kv = kv_cache_bytes(model, batch=batch, context=context, kv_dtype=kv_dtype, tp=tp, layers=layers)
    act = activation_bytes(model, tokens=tokens, batch=batch, tp=tp)
    if cpu:
        ws, reserve = 0.0, 0.0
    else:
        ws = float(workspace_bytes(gpu))
        reserve = float(CUDA_CONTEXT_BYTES + (DRIVER_RESERVED_BYTES if gpu is None or gpu.vendor == "nvidia"
                                              else 0))
    frag = FRAGMENTATION * (kv + act)
    return MemoryEstimate(device=device, capacity_bytes=int(capacity_bytes), weights_bytes=w, kv_cache_bytes=kv,
                          activation_bytes=act, workspace_bytes=ws, reserve_bytes=reserve,
                          fragmentation_bytes=frag,
                          kv_bytes_per_token=kv_bytes_per_token(model, kv_dtype=kv_dtype, tp=tp, layers=layers))
