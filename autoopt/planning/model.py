"""ModelSpec: the shape of a transformer LLM, and how to get one from what a user has.

A :class:`ModelSpec` holds the architecture numbers a recommendation needs
(sizes, heads, GQA/MQA, MoE, MLA, sliding windows, dtype). From them it derives
the parameter count (total and active per token) and, for a given number of
tokens, the op list of each layer: the projections as GEMM shapes, attention,
norms, activations and the MoE router/experts.

:func:`from_hf_config` reads a Hugging Face ``config.json`` (dict or path) and
:func:`from_module` walks a ``torch.nn.Module`` (never run; torch is imported only
then); :func:`autoopt.planning.catalog.parse_model` takes any of these or a catalog name.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from autoopt._serde import from_plain, to_plain
from autoopt.errors import ModelError, OpError
from autoopt.kernels.ops import GEMV_MAX_M, OP_KINDS, OpSpec

__all__ = ["FAMILIES", "LayerOp", "ModelSpec", "from_hf_config", "from_module"]

log = logging.getLogger(__name__)

#: architecture families understood (HF ``model_type``) -> defaults for what config.json leaves implicit.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {}, "mistral": {}, "mixtral": {}, "qwen2": {"qkv_bias": True}, "qwen3": {},
    "gemma": {"activation": "gelu", "tied_embeddings": True},
    # Gemma-2: four RMSNorms per layer (input, post-attention, pre- and post-feedforward),
    # local/global attention alternating (transformers Gemma2DecoderLayer: is_sliding = layer_idx % 2 == 0).
    "gemma2": {"activation": "gelu", "tied_embeddings": True, "norms_per_layer": 4, "sliding_window_pattern": 2},
    "deepseek_v2": {}, "deepseek_v3": {}, "phi3": {},
}
_ARCH_TO_FAMILY = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                   "MixtralForCausalLM": "mixtral", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                   "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
                   "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
                   "Phi3ForCausalLM": "phi3"}
_DTYPES = ("bf16", "fp16", "fp32", "fp8")
_HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16",
              "fp32": "fp32", "fp8": "fp8", "float8_e4m3fn": "fp8"}
_ACT_BYTES = 2  # activations between ops are bf16/fp16 in every runtime modelled here


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerOp:
    """One op of a layer for a given token count.

    ``op`` is the :class:`OpSpec` a kernel template can rank; it is ``None`` for ops
    autoopt has no template kind for (attention, gated GELU), which are costed with
    the roofline from ``flops`` and ``bytes``. ``count`` is how many times the op
    runs in the layer (MoE experts touched).
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    count: int = 1
    flops: float = 0.0
    bytes: float = 0.0
    op: OpSpec | None = None
    #: kernel class for the implementation choice (gemm, attention, norm, elementwise, moe).
    kernel_class: str = "gemm"

    def key(self) -> tuple[Any, ...]:
        return (self.name, self.kind, self.shape, self.count, self.op.dtype if self.op else None)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "shape": list(self.shape), "count": self.count,
                "flops": self.flops, "bytes": self.bytes, "kernel_class": self.kernel_class,
                "op": self.op.to_dict() if self.op else None}


def _positive(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelError(f"must be a positive integer, got {value!r}", field=name)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, by the numbers (HF config.json names in comments)."""

    name: str
    architecture: str                      # model_type
    hidden_size: int                       # hidden_size
    intermediate_size: int                 # intermediate_size (dense MLP)
    num_layers: int                        # num_hidden_layers
    num_attention_heads: int               # num_attention_heads
    num_kv_heads: int                      # num_key_value_heads (GQA < heads, MQA = 1)
    head_dim: int                          # head_dim, else hidden_size / num_attention_heads
    vocab_size: int                        # vocab_size
    tied_embeddings: bool = False          # tie_word_embeddings
    norm: str = "rmsnorm"                  # rmsnorm | layernorm
    norms_per_layer: int = 2
    activation: str = "silu"               # gated: silu (SwiGLU) | gelu (GeGLU)
    qkv_bias: bool = False                 # Qwen2 has biases on q, k, v
    max_position_embeddings: int = 8192
    sliding_window: int | None = None      # tokens a local layer attends to
    #: 1: every layer is local when sliding_window is set; N > 1: layer i is global when i % N == N-1.
    sliding_window_pattern: int = 1
    num_experts: int = 0                   # num_local_experts / n_routed_experts
    experts_per_token: int = 0             # num_experts_per_tok
    num_shared_experts: int = 0            # n_shared_experts
    moe_intermediate_size: int | None = None
    first_k_dense_replace: int = 0         # leading dense layers in a MoE model
    q_lora_rank: int | None = None         # MLA (DeepSeek-V2/V3)
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    dtype: str = "bf16"                    # the checkpoint's weight dtype
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ModelError("must be a non-empty string", field="name")
        if self.architecture not in FAMILIES:
            raise ModelError(f"unknown architecture {self.architecture!r}; known: {', '.join(sorted(FAMILIES))}",
                             field="architecture")
        for f in ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_kv_heads",
                  "head_dim", "vocab_size", "max_position_embeddings", "norms_per_layer",
                  "sliding_window_pattern"):
            _positive(getattr(self, f), f)
        if self.num_attention_heads % self.num_kv_heads:
            raise ModelError(f"{self.num_kv_heads} KV heads do not divide {self.num_attention_heads} attention "
                             "heads (GQA needs a whole number of query heads per KV head)", field="num_kv_heads")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ModelError(f"unknown norm {self.norm!r}; expected 'rmsnorm' or 'layernorm'", field="norm")
        if self.activation not in ("silu", "gelu"):
            raise ModelError(f"unknown activation {self.activation!r}; expected 'silu' or 'gelu'", field="activation")
        if self.dtype not in _DTYPES:
            raise ModelError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(_DTYPES)}", field="dtype")
        if self.sliding_window is not None:
            _positive(self.sliding_window, "sliding_window")
        if self.num_experts:
            _positive(self.num_experts, "num_experts")
            _positive(self.experts_per_token, "experts_per_token")
            if self.experts_per_token > self.num_experts:
                raise ModelError(f"top-{self.experts_per_token} routing needs at least that many experts, "
                                 f"model has {self.num_experts}", field="experts_per_token")
            if self.moe_intermediate_size is None:
                object.__setattr__(self, "moe_intermediate_size", self.intermediate_size)
            _positive(self.moe_intermediate_size, "moe_intermediate_size")
            if not 0 <= self.first_k_dense_replace <= self.num_layers:
                raise ModelError(f"must be in 0..num_layers ({self.num_layers})", field="first_k_dense_replace")
        elif self.experts_per_token or self.num_shared_experts:
            raise ModelError("set without num_experts (a MoE model needs num_experts > 0)",
                             field="experts_per_token" if self.experts_per_token else "num_shared_experts")
        if self.kv_lora_rank is not None:
            for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                _positive(getattr(self, f), f)
            if self.q_lora_rank is not None:
                _positive(self.q_lora_rank, "q_lora_rank")

    # -- structure ------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and i >= self.first_k_dense_replace

    def is_local_layer(self, i: int) -> bool:
        """Whether layer ``i`` uses sliding-window (local) attention."""
        if self.sliding_window is None:
            return False
        p = self.sliding_window_pattern
        return p == 1 or i % p != p - 1

    def count_layers(self, layers: range, *, moe: bool | None = None, local: bool | None = None) -> int:
        """How many layers of ``layers`` (step 1) are MoE/dense and local/global (None: either), in O(1)."""
        a, b = max(0, layers.start), min(self.num_layers, layers.stop)
        if b <= a:
            return 0
        if moe is None:
            lo, hi = a, b
        else:
            k = self.first_k_dense_replace if self.is_moe else self.num_layers
            lo, hi = (max(a, k), b) if moe else (a, min(b, k))
        if hi <= lo:
            return 0
        total = hi - lo
        if local is None:
            return total
        if self.sliding_window is None:
            n_local = 0
        elif self.sliding_window_pattern == 1:
            n_local = total
        else:
            p = self.sliding_window_pattern
            # globals are i with i % p == p - 1: count them in [lo, hi)
            n_global = hi // p - lo // p  # i in [0, x) with i % p == p-1: x // p of them
            n_local = total - n_global
        return n_local if local else total - n_local

    def layer_kind(self, i: int) -> str:
        """A short key naming what distinguishes layer ``i`` ("dense/global", "moe/local", ...)."""
        return f"{'moe' if self.is_moe_layer(i) else 'dense'}/{'local' if self.is_local_layer(i) else 'global'}"

    # -- parameter counts -----------------------------------------------------
    def _attention_params(self) -> int:
        h, n, kv, d = self.hidden_size, self.num_attention_heads, self.num_kv_heads, self.head_dim
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim  # type: ignore[operator]
            # with a q LoRA rank: q_a, q_a_norm, q_b; without: one q projection
            q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * n * qk if self.q_lora_rank else h * n * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank  # type: ignore[operator]
            kv_b = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)  # type: ignore[operator]
            return q + kv_a + kv_b + n * self.v_head_dim * h  # type: ignore[operator]
        p = h * n * d + 2 * h * kv * d + n * d * h
        if self.qkv_bias:
            p += n * d + 2 * kv * d
        return p

    def _mlp_params(self, i: int, *, active: bool) -> int:
        h = self.hidden_size
        if not self.is_moe_layer(i):
            return 3 * h * self.intermediate_size  # gate, up, down
        per_expert = 3 * h * self.moe_intermediate_size  # type: ignore[operator]
        routed = self.experts_per_token if active else self.num_experts
        return (routed + self.num_shared_experts) * per_expert + h * self.num_experts  # + router

    def layer_params(self, i: int, *, active: bool = False) -> int:
        return self._attention_params() + self._mlp_params(i, active=active) + self.norms_per_layer * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def _count(self, *, active: bool) -> int:
        per_kind: dict[bool, int] = {}
        total = 0
        for i in range(self.num_layers):
            moe = self.is_moe_layer(i)
            if moe not in per_kind:
                per_kind[moe] = self.layer_params(i, active=active)
            total += per_kind[moe]
        return total + self.embedding_params + self.lm_head_params + self.hidden_size  # + final norm

    @property
    def num_params(self) -> int:
        """Every parameter (embeddings counted once when tied)."""
        return self._count(active=False)

    @property
    def active_params(self) -> int:
        """Parameters touched per token: routed experts counted top-k times, embeddings included."""
        return self._count(active=True)

    def linear_params(self, i: int, *, active: bool = False) -> int:
        """Parameters of layer ``i`` held in Linear weights (what a quant format compresses)."""
        return self.layer_params(i, active=active) - self.norms_per_layer * self.hidden_size \
            - (self.num_experts * self.hidden_size if self.is_moe_layer(i) else 0) \
            - (self.q_lora_rank or 0) - (self.kv_lora_rank or 0)

    # -- ops ------------------------------------------------------------------
    def kv_len(self, i: int, context: int) -> int:
        """Tokens layer ``i`` attends to (and caches) at ``context`` tokens of history."""
        window = self.sliding_window
        if window is not None and self.is_local_layer(i):  # a local layer always has a window
            return min(context, window)
        return context

    def layer_ops(self, i: int, *, batch: int, q_len: int, context: int,
                  dtype: str = "bf16") -> tuple[LayerOp, ...]:
        """Ops of layer ``i`` for ``batch`` sequences of ``q_len`` new tokens at ``context`` total tokens.

        Decode is ``q_len=1``; prefill is ``q_len=context``. ``dtype`` is the GEMM
        compute dtype (``bf16``/``fp16``/``fp8``). MoE routing is taken as uniform:
        with ``T`` tokens routed to ``k`` of ``E`` experts, the expected number of
        experts touched is ``E·(1-(1-k/E)^T)`` and each gets ``T·k/touched`` tokens.
        """
        tokens = batch * q_len
        h = self.hidden_size
        ops: list[LayerOp] = []
        norm_kind = self.norm

        def gemm(name: str, m: int, n: int, k: int, count: int = 1) -> None:
            kind = "gemv" if m <= GEMV_MAX_M else "gemm"
            gdt = dtype if dtype in OP_KINDS[kind][1] else "bf16"
            try:
                op = OpSpec(kind=kind, shape=(m, n, k), dtype=gdt)
            except OpError:  # beyond what one kernel launch indexes (M*N*K >= 2^40): costed analytically
                e = 1 if gdt == "fp8" else 2
                ops.append(LayerOp(name=name, kind=kind, shape=(m, n, k), count=count, flops=2.0 * m * n * k,
                                   bytes=float((m * k + n * k) * e + m * n * 2), kernel_class="gemm"))
                return
            ops.append(LayerOp(name=name, kind=kind, shape=(m, n, k), count=count, flops=op.flops,
                               bytes=op.min_bytes, op=op, kernel_class="gemm"))

        def rowwise(name: str, kind: str, rows: int, n: int, kernel_class: str) -> None:
            if kind in OP_KINDS:
                op = OpSpec(kind=kind, shape=(rows, n), dtype="bf16")
                ops.append(LayerOp(name=name, kind=kind, shape=(rows, n), flops=op.flops, bytes=op.min_bytes,
                                   op=op, kernel_class=kernel_class))
            else:  # gelu_mul: tanh-GELU(x)*y, ~8 flops/element, reads 2 writes 1
                ops.append(LayerOp(name=name, kind=kind, shape=(rows, n), flops=8.0 * rows * n,
                                   bytes=3.0 * rows * n * _ACT_BYTES, kernel_class=kernel_class))

        def act(name: str, rows: int, n: int, count: int = 1) -> None:
            kind = "silu_mul" if self.activation == "silu" else "gelu_mul"
            rowwise(name, kind, rows, n, "elementwise")
            if count != 1:
                ops[-1] = _with_count(ops[-1], count)

        rowwise("input_norm", norm_kind, tokens, h, "norm")
        kv = self.kv_len(i, context)
        # Causal attention: query t (0-based, of q_len new) sees context - q_len + t + 1 keys, capped by the window.
        first = context - q_len + 1
        keys = sum(min(first + t, kv) for t in range(q_len)) if q_len <= 4096 else \
            q_len * min(kv, (first + context) / 2)
        n, nkv = self.num_attention_heads, self.num_kv_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim  # type: ignore[operator]
            if self.q_lora_rank:
                gemm("q_a_proj", tokens, self.q_lora_rank, h)
                rowwise("q_a_norm", norm_kind, tokens, self.q_lora_rank, "norm")
                gemm("q_b_proj", tokens, n * qk, self.q_lora_rank)
            else:
                gemm("q_proj", tokens, n * qk, h)
            gemm("kv_a_proj", tokens, self.kv_lora_rank + self.qk_rope_head_dim, h)  # type: ignore[operator]
            rowwise("kv_a_norm", norm_kind, tokens, self.kv_lora_rank, "norm")  # type: ignore[arg-type]
            latent = self.kv_lora_rank + self.qk_rope_head_dim  # type: ignore[operator]
            if q_len == 1:
                # Decode with absorbed weights: scores over the cached latent (kv_lora + rope) and output
                # in the latent space (kv_lora), per head: 2·n·(latent + kv_lora) FLOP per key.
                flops = 2.0 * batch * keys * n * (latent + self.kv_lora_rank)  # type: ignore[operator]
            else:
                gemm("kv_b_proj", tokens, n * (self.qk_nope_head_dim + self.v_head_dim),  # type: ignore[operator]
                     self.kv_lora_rank)  # type: ignore[arg-type]
                flops = 2.0 * batch * keys * n * (qk + self.v_head_dim)  # type: ignore[operator]
            cache = batch * kv * latent * _ACT_BYTES
            qo = tokens * n * (qk + self.v_head_dim) * _ACT_BYTES  # type: ignore[operator]
            ops.append(LayerOp(name="attention", kind="attention", shape=(batch, n, q_len, kv, latent),
                               flops=flops, bytes=float(cache + qo), kernel_class="attention"))
            gemm("o_proj", tokens, h, n * self.v_head_dim)  # type: ignore[operator]
        else:
            d = self.head_dim
            gemm("qkv_proj", tokens, (n + 2 * nkv) * d, h)
            flops = 4.0 * batch * keys * n * d  # QK^T and PV, 2 FLOP per MAC
            cache = 2 * batch * kv * nkv * d * _ACT_BYTES  # K and V read
            qo = 2 * tokens * n * d * _ACT_BYTES
            ops.append(LayerOp(name="attention", kind="attention", shape=(batch, n, q_len, kv, d),
                               flops=flops, bytes=float(cache + qo), kernel_class="attention"))
            gemm("o_proj", tokens, h, n * d)
        if self.norms_per_layer >= 4:
            rowwise("post_attn_norm", norm_kind, tokens, h, "norm")
        rowwise("residual_add", "add", tokens, h, "elementwise")
        rowwise("pre_mlp_norm", norm_kind, tokens, h, "norm")
        if self.is_moe_layer(i):
            e, k = self.num_experts, self.experts_per_token
            mi = self.moe_intermediate_size
            gemm("router", tokens, e, h)
            rowwise("router_softmax", "softmax", tokens, e, "moe")
            touched = max(1, min(e, round(e * (1.0 - (1.0 - k / e) ** tokens))))
            per = max(1, math.ceil(tokens * k / touched))
            gemm("expert_gate_up", per, 2 * mi, h, count=touched)  # type: ignore[operator]
            act("expert_act", per, mi, count=touched)  # type: ignore[arg-type]
            gemm("expert_down", per, h, mi, count=touched)  # type: ignore[arg-type]
            if self.num_shared_experts:
                s = self.num_shared_experts * mi  # type: ignore[operator]
                gemm("shared_gate_up", tokens, 2 * s, h)
                act("shared_act", tokens, s)
                gemm("shared_down", tokens, h, s)
        else:
            gemm("gate_up_proj", tokens, 2 * self.intermediate_size, h)
            act("mlp_act", tokens, self.intermediate_size)
            gemm("down_proj", tokens, h, self.intermediate_size)
        if self.norms_per_layer >= 4:
            rowwise("post_mlp_norm", norm_kind, tokens, h, "norm")
        rowwise("residual_add", "add", tokens, h, "elementwise")
        return tuple(ops)

    def head_ops(self, *, batch: int, q_len: int, dtype: str = "bf16") -> tuple[LayerOp, ...]:
        """Final norm and LM head (logits for the last token of each sequence only, as runtimes do)."""
        rows = batch
        kind = "gemv" if rows <= GEMV_MAX_M else "gemm"
        gdt = dtype if dtype in OP_KINDS[kind][1] else "bf16"
        op = OpSpec(kind=kind, shape=(rows, self.vocab_size, self.hidden_size), dtype=gdt)
        nop = OpSpec(kind=self.norm, shape=(batch * q_len, self.hidden_size))
        return (LayerOp(name="final_norm", kind=self.norm, shape=nop.shape, flops=nop.flops, bytes=nop.min_bytes,
                        op=nop, kernel_class="norm"),
                LayerOp(name="lm_head", kind=kind, shape=op.shape, flops=op.flops, bytes=op.min_bytes, op=op,
                        kernel_class="gemm"))

    # -- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        return from_plain(cls, data, lambda msg, where: ModelError(msg, field=where))

    def summary(self) -> str:
        parts = [f"{self.name} ({self.architecture}, {self.num_params / 1e9:.2f} B params"]
        if self.is_moe:
            parts.append(f", {self.active_params / 1e9:.2f} B active, {self.num_experts} experts top-"
                         f"{self.experts_per_token}")
        parts.append(f", {self.num_layers} layers, hidden {self.hidden_size}, {self.num_attention_heads} heads/"
                     f"{self.num_kv_heads} KV, {self.dtype})")
        return "".join(parts)


def _with_count(op: LayerOp, count: int) -> LayerOp:
    return LayerOp(name=op.name, kind=op.kind, shape=op.shape, count=count, flops=op.flops, bytes=op.bytes,
                   op=op.op, kernel_class=op.kernel_class)


# -- Hugging Face config.json ---------------------------------------------------
def _family(cfg: Mapping[str, Any]) -> str:
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in FAMILIES:
        return mt
    for arch in cfg.get("architectures") or ():
        if arch in _ARCH_TO_FAMILY:
            return _ARCH_TO_FAMILY[arch]
    raise ModelError(f"unknown architecture (model_type={mt!r}, architectures={cfg.get('architectures')!r}); "
                     f"known model_type values: {', '.join(sorted(FAMILIES))}", field="model_type")


def _req(cfg: Mapping[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise ModelError("missing from the config (a Hugging Face config.json has it)", field=key)
    return cfg[key]


#: the largest config.json accepted: published ones are 1-10 KB (DeepSeek-V3's is 1.7 KB); a
#: bigger file is not a model config, and /dev/urandom or a FIFO would never end
MAX_CONFIG_BYTES = 1 << 20


def _read_config_text(path: Path) -> str:
    """The text of a config file, checked first: a regular file of at most 1 MiB, UTF-8."""
    import stat

    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelError(f"no config file at {path}") from None
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelError(f"{path} is not a regular file; pass a config.json (or the folder holding one)")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ModelError(f"{path} is {st.st_size} bytes; a model config.json is at most {MAX_CONFIG_BYTES} bytes")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelError(f"{path} grew past {MAX_CONFIG_BYTES} bytes while being read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path} is not UTF-8 text (byte {exc.start}); a config.json is JSON") from None


def from_hf_config(config: Mapping[str, Any] | str | Path, *, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` (a mapping, a file, or a folder holding one)."""
    source = ""
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        import json  # a HF config file only: not at import

        text = _read_config_text(path)
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelError(f"{path} is not valid JSON: {exc}") from None
        source = str(path)
        name = name or path.parent.name or path.stem
    if not isinstance(config, Mapping):
        raise ModelError(f"a config must be a mapping, got {type(config).__name__}")
    cfg: Mapping[str, Any] = config
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    family = _family(cfg)
    defaults = FAMILIES[family]
    hidden = _req(cfg, "hidden_size")
    heads = _req(cfg, "num_attention_heads")
    _positive(hidden, "hidden_size")
    _positive(heads, "num_attention_heads")
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ModelError(f"{heads} heads do not divide hidden_size {hidden} and no head_dim is given",
                             field="num_attention_heads")
        head_dim = hidden // heads
    num_experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0
    act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or defaults.get("activation", "silu"))
    activation = "gelu" if act.startswith("gelu") else "silu" if act in ("silu", "swish") else act
    norm = "layernorm" if ("layer_norm_eps" in cfg or "layer_norm_epsilon" in cfg) and "rms_norm_eps" not in cfg \
        else "rmsnorm"
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:  # Qwen2 ships sliding_window but switches it off
        window = None
    pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern")
                  or defaults.get("sliding_window_pattern", 1))
    layer_types = cfg.get("layer_types")
    if window is not None and isinstance(layer_types, list) and layer_types:
        globals_at = [i for i, t in enumerate(layer_types) if t != "sliding_attention"]
        if not globals_at:
            pattern = 1
        else:
            p = globals_at[0] + 1
            if globals_at != list(range(p - 1, len(layer_types), p)):
                raise ModelError("local/global layers do not follow a period; only periodic patterns are modelled",
                                 field="layer_types")
            pattern = p
    dtype = _HF_DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"))
    if dtype is None:
        raise ModelError(f"unknown torch_dtype {cfg.get('torch_dtype')!r}", field="torch_dtype")
    quant = cfg.get("quantization_config")
    if isinstance(quant, Mapping) and quant.get("quant_method") == "fp8":
        dtype = "fp8"  # DeepSeek-V3 ships e4m3 weights with 128x128 block scales
    kv_heads = cfg.get("num_key_value_heads") or heads
    try:
        return ModelSpec(
            name=name or str(cfg.get("_name_or_path") or family),
            architecture=family,
            hidden_size=hidden,
            intermediate_size=_req(cfg, "intermediate_size"),
            num_layers=_req(cfg, "num_hidden_layers"),
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=_req(cfg, "vocab_size"),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", defaults.get("tied_embeddings", False))),
            norm=norm,
            norms_per_layer=int(defaults.get("norms_per_layer", 2)),
            activation=activation,
            qkv_bias=bool(cfg.get("attention_bias", defaults.get("qkv_bias", False))),
            max_position_embeddings=cfg.get("max_position_embeddings") or 8192,
            sliding_window=window,
            sliding_window_pattern=pattern,
            num_experts=num_experts,
            experts_per_token=(cfg.get("num_experts_per_tok") or 0) if num_experts else 0,
            num_shared_experts=(cfg.get("n_shared_experts") or 0) if num_experts else 0,
            moe_intermediate_size=cfg.get("moe_intermediate_size") if num_experts else None,
            first_k_dense_replace=(cfg.get("first_k_dense_replace") or 0) if num_experts else 0,
            q_lora_rank=cfg.get("q_lora_rank") if cfg.get("kv_lora_rank") else None,
            kv_lora_rank=cfg.get("kv_lora_rank"),
            qk_rope_head_dim=cfg.get("qk_rope_head_dim") if cfg.get("kv_lora_rank") else None,
            qk_nope_head_dim=cfg.get("qk_nope_head_dim") if cfg.get("kv_lora_rank") else None,
            v_head_dim=cfg.get("v_head_dim") if cfg.get("kv_lora_rank") else None,
            dtype=dtype,
            source=source,
        )
    except ModelError as exc:
        hf = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads",
              "num_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"}
        if exc.field in hf:
            raise ModelError(str(exc).split(": ", 1)[-1], field=hf[exc.field]) from None
        raise


# -- torch.nn.Module ------------------------------------------------------------
def from_module(module: Any, *, name: str | None = None, **overrides: Any) -> ModelSpec:
    """Build a ModelSpec by walking a ``torch.nn.Module``'s Linear/Embedding/norm shapes (never runs it).

    A Hugging Face model carries its config, which is used directly. Otherwise the
    walk reads the embedding (vocab, hidden), the first layer's projections
    (``q_proj``/``k_proj``/``v_proj``/``o_proj``, ``gate_proj``/``up_proj``/
    ``down_proj``), counts the numbered layers and looks for ``num_heads``/
    ``head_dim`` attributes; what shapes cannot tell (the head count) must be
    there or passed in ``overrides`` (ModelSpec field names).
    """
    import torch  # lazily: only when the object is a Module

    cfg = getattr(module, "config", None)
    if cfg is not None and hasattr(cfg, "to_dict"):
        spec = from_hf_config(cfg.to_dict(), name=name or getattr(cfg, "_name_or_path", None) or None)
        return _replace(spec, overrides)
    nn = torch.nn
    embed: Any = None
    linears: dict[str, Any] = {}
    norms: list[str] = []
    layer_ids: set[int] = set()
    attrs: dict[str, int] = {}
    for mod_name, mod in module.named_modules():
        parts = mod_name.split(".")
        for a, b in itertools.pairwise(parts):
            if a in ("layers", "h", "blocks") and b.isdigit():
                layer_ids.add(int(b))
        if isinstance(mod, nn.Embedding) and embed is None:
            embed = mod
        elif isinstance(mod, nn.Linear):
            linears[mod_name] = mod
        elif isinstance(mod, nn.LayerNorm) or "rmsnorm" in type(mod).__name__.lower():
            norms.append(mod_name)
        for attr, key in (("num_heads", "num_attention_heads"), ("num_attention_heads", "num_attention_heads"),
                          ("head_dim", "head_dim"), ("num_key_value_heads", "num_kv_heads"),
                          ("num_kv_heads", "num_kv_heads")):
            val = getattr(mod, attr, None)
            if isinstance(val, int) and not isinstance(val, bool) and val > 0 and key not in attrs:
                attrs[key] = val
    if embed is None:
        raise ModelError("the module has no nn.Embedding to read vocab and hidden size from", field="vocab_size")
    if not layer_ids:
        raise ModelError("found no numbered layers (modules named like 'layers.0')", field="num_layers")
    first = min(layer_ids)

    def find(suffix: str) -> Any:
        for n_, m in linears.items():
            ps = n_.split(".")
            if ps[-1] == suffix and any(a in ("layers", "h", "blocks") and b == str(first)
                                        for a, b in itertools.pairwise(ps)):
                return m
        return None

    vocab, hidden = embed.weight.shape
    q, k, up, gate = find("q_proj"), find("k_proj"), find("up_proj"), find("gate_proj")
    if q is None or k is None:
        raise ModelError("layer 0 has no q_proj/k_proj Linear to read attention shapes from",
                         field="num_attention_heads")
    if up is None and gate is None:
        raise ModelError("layer 0 has no up_proj/gate_proj Linear to read the MLP width from",
                         field="intermediate_size")
    heads = overrides.pop("num_attention_heads", attrs.get("num_attention_heads"))
    head_dim = overrides.pop("head_dim", attrs.get("head_dim"))
    if heads is None and head_dim:
        heads = q.out_features // head_dim
    if heads is None:
        raise ModelError("shapes alone cannot tell the head count: the attention module has no num_heads "
                         "attribute; pass num_attention_heads=...", field="num_attention_heads")
    head_dim = head_dim or q.out_features // heads
    lm_head = linears.get("lm_head")
    layer_norms = sum(1 for n_ in norms if f".{first}." in f".{n_}.")
    spec = ModelSpec(
        name=name or type(module).__name__, architecture=str(overrides.pop("architecture", "llama")),
        hidden_size=int(hidden), intermediate_size=int((up or gate).out_features),
        num_layers=len(layer_ids), num_attention_heads=int(heads),
        num_kv_heads=int(overrides.pop("num_kv_heads", k.out_features // head_dim)),
        head_dim=int(head_dim), vocab_size=int(vocab),
        tied_embeddings=lm_head is None or lm_head.weight is embed.weight,
        norm="layernorm" if any(isinstance(dict(module.named_modules())[n_], nn.LayerNorm) for n_ in norms)
        else "rmsnorm",
        norms_per_layer=max(1, layer_norms) if layer_norms else 2,
        qkv_bias=q.bias is not None,
        dtype=_HF_DTYPES.get(str(q.weight.dtype).removeprefix("torch."), "bf16"),
        source=f"torch module {type(module).__name__}")
    return _replace(spec, overrides)


def _replace(spec: ModelSpec, overrides: Mapping[str, Any]) -> ModelSpec:
    if not overrides:
        return spec
    known = {f.name for f in fields(ModelSpec)}
    bad = set(overrides) - known
    if bad:
        raise ModelError(f"unknown ModelSpec fields {sorted(bad)}", field=sorted(bad)[0])
    return ModelSpec(**{**{f.name: getattr(spec, f.name) for f in fields(ModelSpec)}, **overrides})
