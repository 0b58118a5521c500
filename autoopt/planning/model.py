"""ModelSpec: the shape of a transformer LLM, and how to get one from what a user has.

A :class:`ModelSpec` holds the architecture numbers a recommendation needs
(sizes, heads, GQA/MQA, MoE, MLA, sliding windows, dtype) and the layer's structure
(gated or plain MLP, biases, LayerNorm or RMSNorm, sequential or parallel block). From
them it derives the parameter count (total and active per token) and, for a given
number of tokens, the op list of each layer: the projections as GEMM shapes, attention,
norms, activations and the MoE router/experts.

:func:`from_hf_config` reads a Hugging Face ``config.json`` (dict or path) and
:func:`from_module` walks a ``torch.nn.Module`` (never run; torch is imported only
then); :func:`autoopt.planning.catalog.parse_model` takes any of these or a catalog name.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from autoopt._log import get_logger
from autoopt._serde import from_plain, to_plain
from autoopt.errors import ModelError, OpError
from autoopt.kernels.ops import GEMV_MAX_M, OP_KINDS, OpSpec

__all__ = ["FAMILIES", "LayerOp", "ModelSpec", "from_hf_config", "from_module"]

log = get_logger(__name__)

#: architecture families described (HF ``model_type``) -> what their config.json leaves implicit (ModelSpec
#: field defaults, as transformers' classes build them). A ``model_type`` not here is still planned, from its
#: standard fields as a Llama-style layer, with a warning -- unless its config shows a structure that layer
#: does not have (a key of _STRUCTURAL_KEYS, a GELU MLP), which is refused.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {}, "mistral": {}, "mixtral": {}, "qwen2": {"qkv_bias": True, "o_bias": False},
    # Qwen3 / Qwen3-MoE: RMSNorm over each head of q and k (transformers Qwen3Attention q_norm/k_norm).
    "qwen3": {"qk_norm": "head"}, "qwen3_moe": {"qk_norm": "head"},
    # Qwen2-MoE: q/k/v biases only; the shared expert's output goes through a sigmoid gate (hidden -> 1).
    "qwen2_moe": {"qkv_bias": True, "o_bias": False, "shared_expert_gate": True},
    # Gemma: GemmaRMSNorm scales by (1 + weight) (so do Gemma 2's and 3's norms).
    "gemma": {"activation": "gelu", "tied_embeddings": True, "norm_unit_offset": True},
    # Gemma-2: four RMSNorms per layer (input, post-attention, pre- and post-feedforward),
    # local/global attention alternating (transformers Gemma2DecoderLayer: is_sliding = layer_idx % 2 == 0).
    "gemma2": {"activation": "gelu", "tied_embeddings": True, "norm_unit_offset": True, "norms_per_layer": 4,
               "sliding_window_pattern": 2},
    # Gemma-3: Gemma-2's four norms plus per-head q/k norms; five local layers then one global
    # (transformers Gemma3TextConfig: sliding_window_pattern 6).
    "gemma3": {"activation": "gelu", "tied_embeddings": True, "norm_unit_offset": True, "norms_per_layer": 4,
               "qk_norm": "head", "sliding_window_pattern": 6},
    # gpt-oss: biases on q/k/v/o (attention_bias), one learned sink logit per head, biases on the
    # router and on every expert projection (transformers GptOssAttention / GptOssTopKRouter / GptOssExperts).
    "gpt_oss": {"attention_sinks": True, "moe_bias": True},
    # Llama 4: a shared expert beside the routed ones; chunked attention on RoPE layers, every
    # fourth layer global without RoPE (transformers Llama4TextConfig: no_rope_layer_interval 4).
    "llama4": {},
    # Phi-3.5-MoE: LayerNorm with bias (its config.json names rms_norm_eps all the same).
    "phimoe": {"norm": "layernorm"},
    # OLMo 2: norms after attention and after the MLP, and RMSNorm over all of q and all of k.
    "olmo2": {"qk_norm": "full"},
    # Granite 3: Llama layers; the embedding/attention/residual/logit multipliers scale, they add no weights.
    "granite": {},
    "deepseek_v2": {}, "deepseek_v3": {}, "phi3": {},
    # The plain-MLP families (an ungated MLP, LayerNorm with a bias); what their config keys decide is
    # read by _FAMILY_READERS below. StarCoder2 (transformers Starcoder2MLP c_fc/c_proj, nn.LayerNorm,
    # Starcoder2Config: gelu_pytorch_tanh, tie_word_embeddings true).
    "starcoder2": {"mlp": "plain", "norm": "layernorm", "activation": "gelu", "tied_embeddings": True},
    # Phi-1/1.5/2 (PhiDecoderLayer: one input_layernorm feeds attention and MLP; q/k/v/dense, fc1/fc2 and
    # lm_head all with bias=True; PhiConfig: gelu_new).
    "phi": {"mlp": "plain", "norm": "layernorm", "activation": "gelu", "parallel_block": True,
            "norms_per_layer": 1, "qkv_bias": True, "o_bias": True, "mlp_bias": True, "lm_head_bias": True},
    # GPT-NeoX / Pythia (GPTNeoXLayer: input_layernorm and post_attention_layernorm; GPTNeoXMLP
    # dense_h_to_4h/dense_4h_to_h with biases; a separate embed_out, GPTNeoXConfig: untied, gelu).
    "gpt_neox": {"mlp": "plain", "norm": "layernorm", "activation": "gelu", "mlp_bias": True},
    # Falcon (FalconConfig: tie_word_embeddings true, activation gelu; FalconMLP dense_h_to_4h/4h_to_h).
    "falcon": {"mlp": "plain", "norm": "layernorm", "activation": "gelu", "tied_embeddings": True},
}
#: ``model_type`` of the text model inside a multimodal config -> its family.
_ALIASES = {"gemma3_text": "gemma3", "llama4_text": "llama4"}
_ARCH_TO_FAMILY = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                   "MixtralForCausalLM": "mixtral", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                   "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
                   "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
                   "Phi3ForCausalLM": "phi3", "Qwen3MoeForCausalLM": "qwen3_moe",
                   "Qwen2MoeForCausalLM": "qwen2_moe", "GptOssForCausalLM": "gpt_oss",
                   "Llama4ForCausalLM": "llama4", "Llama4ForConditionalGeneration": "llama4",
                   "Gemma3ForCausalLM": "gemma3", "Gemma3ForConditionalGeneration": "gemma3",
                   "PhiMoEForCausalLM": "phimoe", "PhimoeForCausalLM": "phimoe", "Olmo2ForCausalLM": "olmo2",
                   "GraniteForCausalLM": "granite", "Starcoder2ForCausalLM": "starcoder2", "PhiForCausalLM": "phi",
                   "GPTNeoXForCausalLM": "gpt_neox", "FalconForCausalLM": "falcon"}
#: transformers config-class defaults for keys a family's published config.json leaves out (google/gemma-3-12b-it's
#: text_config has no head_dim, vocab_size or max_position_embeddings: Gemma3TextConfig's are 256, 262208, 131072).
_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3": {"head_dim": 256, "vocab_size": 262_208, "max_position_embeddings": 131_072},
    # tiiuae/falcon-7b's config.json has no max_position_embeddings: FalconConfig's is 2048
    "falcon": {"max_position_embeddings": 2048}}
#: config keys that change which weights a model has -> the families whose transformers class reads them
#: (each read in _FAMILY_READERS, or for llama/granite/phimoe in _structure). Anywhere else a value that
#: would add weights is refused: autoopt cannot tell whether the checkpoint has them.
_STRUCTURAL_KEYS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("use_bias", "mlp_type", "norm_type"), frozenset({"starcoder2"})),
    "qk_layernorm": frozenset({"phi"}),
    "use_parallel_residual": frozenset({"gpt_neox"}),
    **dict.fromkeys(("parallel_attn", "new_decoder_architecture", "multi_query", "num_kv_heads",
                     "num_ln_in_parallel_attn", "bias", "ffn_hidden_size"), frozenset({"falcon"})),
    "mlp_bias": frozenset({"llama", "granite"}),  # LlamaMLP / GraniteMLP: bias=config.mlp_bias
    "lm_head_bias": frozenset({"phimoe"}),  # PhimoeForCausalLM: nn.Linear(..., bias=config.lm_head_bias)
}
#: transformers' activation names (ACT2FN) -> the two activations autoopt costs
_ACTIVATIONS = {**dict.fromkeys(("gelu", "gelu_new", "gelu_fast", "gelu_python", "gelu_pytorch_tanh",
                                 "gelu_accurate", "gelu_10", "quick_gelu"), "gelu"),
                "silu": "silu", "swish": "silu"}
#: model_types that are not decoder-only attention stacks (state-space, recurrent, hybrid with linear
#: attention or convolutions, encoder or encoder-decoder): their standard fields would parse, but
#: planning them as a transformer decoder would be wrong, so they are refused by name.
_NOT_DECODERS = frozenset({
    "mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm",
    "jamba", "zamba", "zamba2", "bamba", "falcon_h1", "nemotron_h", "granitemoehybrid", "lfm2", "qwen3_next",
    "minimax", "t5", "mt5", "umt5", "bart", "mbart", "whisper", "bert", "roberta", "xlm-roberta", "deberta-v2",
    "modernbert",
})
#: ``layer_types`` entries: attention over a bounded span (a sliding window, or Llama 4's chunks) and over all.
_LOCAL_KINDS = frozenset({"sliding_attention", "chunked_attention"})
_GLOBAL_KINDS = frozenset({"full_attention"})
#: names other conventions use for the fields autoopt reads (said in the error when those are missing).
_OTHER_NAMES = {"hidden_size": ("n_embd", "d_model", "dim"), "num_hidden_layers": ("n_layer", "n_layers", "num_layers"),
                "num_attention_heads": ("n_head", "n_heads", "num_heads"),
                "intermediate_size": ("n_inner", "ffn_dim", "ffn_hidden_size"), "vocab_size": ("padded_vocab_size",)}
_QK_NORMS = ("head", "full")
_EXPERT_DTYPES = ("mxfp4",)
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


def _causal_keys(first: int, kv: int, q_len: int) -> int | float:
    """``sum(min(first + t, kv) for t in range(q_len))``: keys the ``q_len`` new queries see in all. In
    closed form for integers (the same integer, without a 1024-step loop per prefill layer op)."""
    if not (isinstance(first, int) and isinstance(kv, int)):
        return sum(min(first + t, kv) for t in range(q_len))
    rising = max(0, min(q_len, kv - first + 1))  # queries t with first + t <= kv
    return rising * first + rising * (rising - 1) // 2 + (q_len - rising) * kv


def _chunked_keys(start: int, stop: int, chunk: int) -> int:
    """``sum(p % chunk + 1 for p in range(start, stop))``: keys seen by queries at positions start..stop-1
    under chunked attention (a query sees its own chunk up to itself), in closed form."""
    def upto(n: int) -> int:  # the sum over positions 0..n-1
        full, rest = divmod(n, chunk)
        return full * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2
    return upto(stop) - upto(max(0, start))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, by the numbers (HF config.json names in comments).

    Local layers attend to at most ``sliding_window`` tokens and cache that many: a sliding
    window (Mistral, Gemma 2/3, gpt-oss), or with ``chunked_attention`` Llama 4's fixed chunks, where
    a token sees only its own chunk so far (its KV cache is still taken at its worst case, a full chunk).
    """

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
    #: the dense MLP: "gated" act(gate(x)) * up(x) -> down (Llama's gate/up/down_proj), or "plain"
    #: act(fc1(x)) -> fc2 (StarCoder2 c_fc/c_proj, Phi fc1/fc2, GPT-NeoX dense_h_to_4h/4h_to_h, Falcon)
    mlp: str = "gated"
    mlp_bias: bool = False                 # biases on the dense MLP's projections (mlp_bias, use_bias, bias)
    norm: str = "rmsnorm"                  # rmsnorm | layernorm
    #: a bias beside each norm's weight; None: as torch builds them (nn.LayerNorm with one, RMSNorm without)
    norm_bias: bool | None = None
    #: RMSNorm scaling by (1 + weight) (Gemma's RMSNorm): no more weights, the same memory-bound pass
    norm_unit_offset: bool = False
    norms_per_layer: int = 2
    #: attention and MLP read the same layer input and their outputs join the residual together (GPT-J
    #: style: Phi, GPT-NeoX use_parallel_residual, Falcon parallel_attn); one norm shared, or one each
    parallel_block: bool = False
    activation: str = "silu"               # silu | gelu (gated: SwiGLU | GeGLU)
    qkv_bias: bool = False                 # Qwen2 has biases on q, k, v
    o_bias: bool = False                   # attention_bias covering o_proj too (gpt-oss, Phi-3.5-MoE)
    lm_head_bias: bool = False             # a bias on the LM head (Phi-2, Phi-3.5-MoE lm_head_bias)
    #: RMSNorm on queries and keys: "head" (over each head: Qwen3, Gemma 3) or "full" (over all heads: OLMo 2)
    qk_norm: str | None = None
    attention_sinks: bool = False          # one learned sink logit per head (gpt-oss)
    max_position_embeddings: int = 8192
    sliding_window: int | None = None      # tokens a local layer attends to
    #: 1: every layer is local when sliding_window is set; N > 1: layer i is global when i % N == N-1.
    sliding_window_pattern: int = 1
    #: local layers attend within fixed chunks of sliding_window tokens (Llama 4's attention_chunk_size)
    #: instead of a window sliding with the token: position p sees p % chunk + 1 keys
    chunked_attention: bool = False
    num_experts: int = 0                   # num_local_experts / n_routed_experts
    experts_per_token: int = 0             # num_experts_per_tok
    num_shared_experts: int = 0            # n_shared_experts (or shared_expert_intermediate_size / moe width)
    shared_expert_gate: bool = False       # sigmoid gate hidden -> 1 on the shared experts (Qwen2-MoE)
    moe_bias: bool = False                 # biases on the router and every expert projection (gpt-oss)
    moe_intermediate_size: int | None = None
    first_k_dense_replace: int = 0         # leading dense layers in a MoE model
    #: from first_k_dense_replace on, MoE on the layers i with (i + 1) % moe_layer_step == 0 and dense
    #: on the others (Llama-4-Maverick's interleave_moe_layer_step: 2); 1: every layer from there
    moe_layer_step: int = 1
    q_lora_rank: int | None = None         # MLA (DeepSeek-V2/V3)
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    dtype: str = "bf16"                    # the checkpoint's weight dtype
    #: the routed experts' checkpoint format where it is not ``dtype`` (gpt-oss ships them as "mxfp4")
    expert_dtype: str | None = None
    source: str = ""
    #: what a runtime loads: the Hugging Face repo id (the catalog's ``repo``, a config's ``_name_or_path``)
    #: or the local folder the config.json was read from; "" when nothing says (the exports then name the
    #: model and say to replace it)
    checkpoint: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ModelError("must be a non-empty string", field="name")
        if not isinstance(self.architecture, str) or not self.architecture:
            raise ModelError("must be a non-empty string (the HF model_type)", field="architecture")
        for f in ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_kv_heads",
                  "head_dim", "vocab_size", "max_position_embeddings", "norms_per_layer",
                  "sliding_window_pattern"):
            _positive(getattr(self, f), f)
        if self.num_attention_heads % self.num_kv_heads:
            raise ModelError(f"{self.num_kv_heads} KV heads do not divide {self.num_attention_heads} attention "
                             "heads (GQA needs a whole number of query heads per KV head)", field="num_kv_heads")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ModelError(f"unknown norm {self.norm!r}; expected 'rmsnorm' or 'layernorm'", field="norm")
        self._check_block()
        if self.activation not in ("silu", "gelu"):
            raise ModelError(f"unknown activation {self.activation!r}; expected 'silu' or 'gelu'", field="activation")
        if self.dtype not in _DTYPES:
            raise ModelError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(_DTYPES)}", field="dtype")
        if self.qk_norm is not None and self.qk_norm not in _QK_NORMS:
            raise ModelError(f"unknown q/k norm {self.qk_norm!r}; expected 'head', 'full' or null", field="qk_norm")
        self._check_moe_extras()
        if self.sliding_window is not None:
            _positive(self.sliding_window, "sliding_window")
        if not isinstance(self.chunked_attention, bool) or (self.chunked_attention and self.sliding_window is None):
            raise ModelError("must be true or false, and true only with sliding_window (the chunk length)",
                             field="chunked_attention")
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
            if isinstance(self.moe_layer_step, bool) or not isinstance(self.moe_layer_step, int) \
                    or not 1 <= self.moe_layer_step <= self.num_layers:
                raise ModelError(f"must be an integer in 1..num_layers ({self.num_layers})", field="moe_layer_step")
        elif self.experts_per_token or self.num_shared_experts:
            raise ModelError("set without num_experts (a MoE model needs num_experts > 0)",
                             field="experts_per_token" if self.experts_per_token else "num_shared_experts")
        if self.kv_lora_rank is not None:
            for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                _positive(getattr(self, f), f)
            if self.q_lora_rank is not None:
                _positive(self.q_lora_rank, "q_lora_rank")

    def _check_block(self) -> None:
        """The layer-structure fields: an MLP kind, a norm bias resolved, layouts that exist."""
        if self.mlp not in ("gated", "plain"):
            raise ModelError(f"unknown MLP kind {self.mlp!r}; expected 'gated' or 'plain'", field="mlp")
        if self.norm_bias is None:
            object.__setattr__(self, "norm_bias", self.norm == "layernorm")
        if self.norm_unit_offset and self.norm != "rmsnorm":
            raise ModelError("(1 + weight) scaling is an RMSNorm variant (Gemma); this model has "
                             f"{self.norm}", field="norm_unit_offset")
        if self.parallel_block and self.norms_per_layer > 2:
            raise ModelError(f"a parallel block has one norm shared by attention and MLP or one each, not "
                             f"{self.norms_per_layer}", field="norms_per_layer")
        if self.mlp == "plain" and self.num_experts:
            raise ModelError("a plain (ungated) MLP with experts is not modelled: every MoE family described has "
                             "gated experts", field="mlp")

    def _check_moe_extras(self) -> None:
        """The MoE-only fields need the MoE they describe."""
        if self.expert_dtype is not None and self.expert_dtype not in _EXPERT_DTYPES + _DTYPES:
            raise ModelError(f"unknown expert dtype {self.expert_dtype!r}; expected one of "
                             f"{', '.join(_EXPERT_DTYPES + _DTYPES)} or null", field="expert_dtype")
        for f in ("moe_bias", "expert_dtype"):
            if getattr(self, f) not in (None, False) and not self.num_experts:
                raise ModelError("set without num_experts (only a MoE model has experts)", field=f)
        if self.shared_expert_gate and not self.num_shared_experts:
            raise ModelError("set without shared experts (num_shared_experts is 0)", field="shared_expert_gate")

    # -- structure ------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and i >= self.first_k_dense_replace and (i + 1) % self.moe_layer_step == 0

    @property
    def first_moe_layer(self) -> int:
        """The first MoE layer's index (a dense model: num_layers)."""
        if not self.is_moe:
            return self.num_layers
        k, s = self.first_k_dense_replace, self.moe_layer_step
        return min(self.num_layers, k + (-(k + 1)) % s)

    @property
    def has_dense_layers(self) -> bool:
        """Whether any layer runs a dense MLP (all of a dense model; leading or interleaved ones of a MoE)."""
        return not self.is_moe or self.first_k_dense_replace > 0 or self.moe_layer_step > 1

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
        if moe is not None and self.is_moe and self.moe_layer_step > 1:
            return self._count_interleaved(a, b, moe, local)
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

    def _count_interleaved(self, a: int, b: int, moe: bool, local: bool | None) -> int:
        """count_layers for interleaved MoE: below first_k_dense_replace every layer is dense; from there
        the MoE and local/global patterns repeat every lcm(moe_layer_step, window pattern) layers, so one
        period is counted and multiplied (O(period), a few layers)."""
        p = self.sliding_window_pattern if self.sliding_window is not None else 1
        period = math.lcm(self.moe_layer_step, p)

        def want(i: int) -> bool:
            return self.is_moe_layer(i) == moe and (local is None or self.is_local_layer(i) == local)

        total = 0
        k = self.first_k_dense_replace
        for lo, hi in ((a, min(b, k)), (max(a, k), b)):
            if hi <= lo:
                continue
            full, _ = divmod(hi - lo, period)
            if full:
                total += full * sum(want(i) for i in range(lo, lo + period))
            total += sum(want(i) for i in range(lo + full * period, hi))
        return total

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
        if self.o_bias:
            p += h
        return p + self._attention_aux_params()

    def _attention_aux_params(self) -> int:
        """Attention parameters outside its projections: MLA's latent norms, or q/k norms and sinks."""
        if self.is_mla:
            return (self.q_lora_rank or 0) + (self.kv_lora_rank or 0)
        n, d = self.num_attention_heads, self.head_dim
        qk = {"head": 2 * d,  # one weight of head_dim for q, one for k, shared by the heads
              "full": (n + self.num_kv_heads) * d}.get(self.qk_norm or "", 0)  # over all of q and all of k
        # the q/k norms are of the model's norm kind (Qwen3/Gemma 3/OLMo 2 RMSNorm; Phi's qk_layernorm LayerNorm)
        return qk * (2 if self.norm_bias else 1) + (n if self.attention_sinks else 0)

    def _norm_params(self, count: int) -> int:
        """``count`` norms of hidden width: a weight each, and a bias where the norm has one."""
        return count * self.hidden_size * (2 if self.norm_bias else 1)

    def _dense_mlp_params(self) -> int:
        """A dense MLP: gate/up/down (gated) or fc1/fc2 (plain), and their biases."""
        h, m = self.hidden_size, self.intermediate_size
        if self.mlp == "gated":
            return 3 * h * m + ((2 * m + h) if self.mlp_bias else 0)
        return 2 * h * m + ((m + h) if self.mlp_bias else 0)

    def _router_params(self) -> int:
        """The router (and bias), plus the shared experts' gate where the model has one."""
        e, h = self.num_experts, self.hidden_size
        return h * e + (e if self.moe_bias else 0) + (h if self.shared_expert_gate else 0)

    def _mlp_params(self, i: int, *, active: bool) -> int:
        h = self.hidden_size
        if not self.is_moe_layer(i):
            return self._dense_mlp_params()
        mi: int = self.moe_intermediate_size  # type: ignore[assignment]
        per_expert = 3 * h * mi + ((2 * mi + h) if self.moe_bias else 0)  # gate/up/down (+ their biases)
        routed = self.experts_per_token if active else self.num_experts
        return routed * per_expert + self.num_shared_experts * 3 * h * mi + self._router_params()

    def layer_params(self, i: int, *, active: bool = False) -> int:
        return self._attention_params() + self._mlp_params(i, active=active) + self._norm_params(self.norms_per_layer)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The LM head's own weights (none when tied to the embedding) and its bias, where it has one."""
        return (0 if self.tied_embeddings else self.vocab_size * self.hidden_size) \
            + (self.vocab_size if self.lm_head_bias else 0)

    @property
    def final_norm_params(self) -> int:
        return self._norm_params(1)

    def _count(self, *, active: bool) -> int:
        per_kind: dict[bool, int] = {}
        total = 0
        for i in range(self.num_layers):
            moe = self.is_moe_layer(i)
            if moe not in per_kind:
                per_kind[moe] = self.layer_params(i, active=active)
            total += per_kind[moe]
        return total + self.embedding_params + self.lm_head_params + self.final_norm_params

    @property
    def num_params(self) -> int:
        """Every parameter (embeddings counted once when tied)."""
        return self._count(active=False)

    @property
    def active_params(self) -> int:
        """Parameters touched per token: routed experts counted top-k times, embeddings included."""
        return self._count(active=True)

    def linear_params(self, i: int, *, active: bool = False) -> int:
        """Parameters of layer ``i`` held in Linear weights and their biases (what a quant format compresses);
        the rest (norms, sinks, the router) stays in the checkpoint dtype."""
        rest = self._norm_params(self.norms_per_layer) + self._attention_aux_params() \
            + (self._router_params() if self.is_moe_layer(i) else 0)
        return self.layer_params(i, active=active) - rest

    # -- ops ------------------------------------------------------------------
    def kv_len(self, i: int, context: int) -> int:
        """Tokens layer ``i`` attends to (and caches) at ``context`` tokens of history."""
        window = self.sliding_window
        if window is not None and self.is_local_layer(i):  # a local layer always has a window
            return min(context, window)
        return context

    def layer_ops(self, i: int, *, batch: int, q_len: int, context: int,
                  dtype: str = "bf16", fused: bool = True) -> tuple[LayerOp, ...]:
        """Ops of layer ``i`` for ``batch`` sequences of ``q_len`` new tokens at ``context`` total tokens.

        Decode is ``q_len=1``; prefill is ``q_len=context``. ``dtype`` is the GEMM
        compute dtype (``bf16``/``fp16``/``fp8``). MoE routing is taken as uniform:
        with ``T`` tokens routed to ``k`` of ``E`` experts, the expected number of
        experts touched is ``E·(1-(1-k/E)^T)`` and each gets ``T·k/touched`` tokens.
        ``fused=False``: q/k/v and gate/up as the separate GEMMs a runtime that keeps the checkpoint's
        linears runs (``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj``), not one each.
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

        def rowwise(name: str, kind: str, rows: int, n: int, kernel_class: str, inputs: int = 2) -> None:
            if kind in OP_KINDS:
                op = OpSpec(kind=kind, shape=(rows, n), dtype="bf16")
                ops.append(LayerOp(name=name, kind=kind, shape=(rows, n), flops=op.flops, bytes=op.min_bytes,
                                   op=op, kernel_class=kernel_class))
            else:  # gelu_mul: tanh-GELU(x)*y; gelu/silu: of x alone. ~8 flops/element, reads `inputs`, writes 1
                ops.append(LayerOp(name=name, kind=kind, shape=(rows, n), flops=8.0 * rows * n,
                                   bytes=(inputs + 1.0) * rows * n * _ACT_BYTES, kernel_class=kernel_class))

        def act(name: str, rows: int, n: int, count: int = 1) -> None:
            kind = "silu_mul" if self.activation == "silu" else "gelu_mul"
            rowwise(name, kind, rows, n, "elementwise")
            if count != 1:
                ops[-1] = _with_count(ops[-1], count)

        # A parallel block (Phi, GPT-NeoX, Falcon) runs attention and MLP on the same layer input: the MLP's
        # norm (where it has its own) normalises that input, and both outputs join the residual at the end.
        rowwise("input_norm", norm_kind, tokens, h, "norm")
        kv = self.kv_len(i, context)
        # Causal attention: query t (0-based, of q_len new) sees context - q_len + t + 1 keys, capped by the
        # window; in a chunked layer, the keys of its own chunk up to itself
        first = context - q_len + 1
        if self.chunked_attention and self.is_local_layer(i):
            keys: int | float = _chunked_keys(context - q_len, context, self.sliding_window)  # type: ignore[arg-type]
        else:
            keys = _causal_keys(first, kv, q_len) if q_len <= 4096 else q_len * min(kv, (first + context) / 2)
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
            if fused:
                gemm("qkv_proj", tokens, (n + 2 * nkv) * d, h)
            else:
                for name, width in (("q_proj", n * d), ("k_proj", nkv * d), ("v_proj", nkv * d)):
                    gemm(name, tokens, width, h)
            if self.qk_norm == "head":  # a norm over each head's d values
                rowwise("q_norm", norm_kind, tokens * n, d, "norm")
                rowwise("k_norm", norm_kind, tokens * nkv, d, "norm")
            elif self.qk_norm == "full":
                rowwise("q_norm", norm_kind, tokens, n * d, "norm")
                rowwise("k_norm", norm_kind, tokens, nkv * d, "norm")
            flops = 4.0 * batch * keys * n * d  # QK^T and PV, 2 FLOP per MAC
            cache = 2 * batch * kv * nkv * d * _ACT_BYTES  # K and V read
            qo = 2 * tokens * n * d * _ACT_BYTES
            ops.append(LayerOp(name="attention", kind="attention", shape=(batch, n, q_len, kv, d),
                               flops=flops, bytes=float(cache + qo), kernel_class="attention"))
            gemm("o_proj", tokens, h, n * d)
        if self.norms_per_layer >= 4:
            rowwise("post_attn_norm", norm_kind, tokens, h, "norm")
        if not self.parallel_block:
            rowwise("residual_add", "add", tokens, h, "elementwise")
        if self.norms_per_layer >= 2:  # a parallel block with one norm feeds the MLP input_norm's output
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
        elif self.mlp == "plain":  # two GEMMs and the activation of one input between them
            gemm("fc1", tokens, self.intermediate_size, h)
            rowwise("mlp_act", self.activation, tokens, self.intermediate_size, "elementwise", inputs=1)
            gemm("fc2", tokens, h, self.intermediate_size)
        else:
            if fused:
                gemm("gate_up_proj", tokens, 2 * self.intermediate_size, h)
            else:
                gemm("gate_proj", tokens, self.intermediate_size, h)
                gemm("up_proj", tokens, self.intermediate_size, h)
            act("mlp_act", tokens, self.intermediate_size)
            gemm("down_proj", tokens, h, self.intermediate_size)
        if self.norms_per_layer >= 4:
            rowwise("post_mlp_norm", norm_kind, tokens, h, "norm")
        rowwise("residual_add", "add", tokens, h, "elementwise")
        if self.parallel_block:  # attention's output + MLP's output + the residual: two adds
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
def _family(cfg: Mapping[str, Any]) -> str | None:
    """The described family of a config (its ``model_type``, else a known ``architectures`` class), or
    None for a decoder nobody described; a model_type that is no transformer decoder is refused."""
    mt = cfg.get("model_type")
    mt = _ALIASES.get(mt, mt) if isinstance(mt, str) else None
    if mt in _NOT_DECODERS or cfg.get("is_encoder_decoder"):
        raise ModelError(f"{mt or 'an encoder-decoder'} is not a decoder-only transformer (state-space, recurrent, "
                         "hybrid and encoder models are not planned); autoopt plans decoder LLMs such as "
                         "llama, qwen3_moe or gpt_oss", field="model_type")
    if mt in FAMILIES:
        return mt
    for arch in cfg.get("architectures") or ():
        if arch in _ARCH_TO_FAMILY:
            return _ARCH_TO_FAMILY[arch]
    return None


#: what each required field is, for the error that says it is missing.
_REQUIRED = {"hidden_size": "the residual width", "num_hidden_layers": "the decoder layers",
             "num_attention_heads": "the query heads", "intermediate_size": "the MLP width",
             "vocab_size": "the embedding rows"}


#: every config key autoopt reads, by the kind of value transformers' config classes hold there; a value
#: of another kind is refused up front, naming the key (a fuzzed config once reached int() with a list)
_SIZE_KEYS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size", "head_dim",
    "num_key_value_heads", "num_kv_heads", "moe_intermediate_size", "intermediate_size_mlp", "ffn_hidden_size",
    "num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok", "decoder_sparse_step",
    "interleave_moe_layer_step", "moe_layer_freq", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim", "max_position_embeddings", "sliding_window_pattern", "_sliding_window_pattern",
    "num_ln_in_parallel_attn", "no_rope_layer_interval")
#: 0 allowed: no shared expert, no dense prefix, a window switched off (Qwen2-MoE ships sliding_window 0 with
#: use_sliding_window false in some checkpoints)
_COUNT_KEYS = ("n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace", "sliding_window",
               "attention_chunk_size")
_BOOL_KEYS = ("attention_bias", "tie_word_embeddings", "use_bias", "bias", "mlp_bias", "use_parallel_residual",
              "parallel_attn", "new_decoder_architecture", "multi_query", "qk_layernorm", "use_sliding_window",
              "is_encoder_decoder", "lm_head_bias")
_TEXT_KEYS = ("model_type", "hidden_act", "hidden_activation", "activation", "torch_dtype", "dtype", "mlp_type",
              "norm_type", "_name_or_path")
_INT_LIST_KEYS = ("mlp_only_layers", "moe_layers", "no_rope_layers")
_TEXT_LIST_KEYS = ("architectures", "layer_types")
#: the largest size a config may give: the kernels index with int32
_MAX_SIZE = (1 << 31) - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_kinds(cfg: Mapping[str, Any]) -> None:
    """Refuse a value of the wrong kind for a key autoopt reads (a list where a width goes, text where a
    flag goes), naming the key and what it should hold."""
    for key in _SIZE_KEYS + _COUNT_KEYS:
        value, low = cfg.get(key), 1 if key in _SIZE_KEYS else 0
        if value is not None and not (_is_int(value) and low <= value <= _MAX_SIZE):
            raise ModelError(f"must be a whole number in {low}..{_MAX_SIZE}, got {value!r}", field=key)
    for keys, ok, what in ((_BOOL_KEYS, lambda v: isinstance(v, bool), "true or false"),
                           (_TEXT_KEYS, lambda v: isinstance(v, str), "a string"),
                           (_INT_LIST_KEYS, lambda v: isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v),
                            "a list of layer indices"),
                           (_TEXT_LIST_KEYS, lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                            "a list of strings")):
        for key in keys:
            if cfg.get(key) is not None and not ok(cfg[key]):
                raise ModelError(f"must be {what}, got {cfg[key]!r}", field=key)


def _check_required(cfg: Mapping[str, Any]) -> None:
    """Refuse a config without the fields every decoder has, naming all that are missing at once."""
    missing = [k for k in _REQUIRED if cfg.get(k) is None]
    if not missing:
        return
    other = [f"{alt!r} for {k}" for k in missing for alt in _OTHER_NAMES.get(k, ()) if cfg.get(alt) is not None]
    hint = f"; this config spells them otherwise ({', '.join(other)}), autoopt reads Hugging Face names" \
        if other else ""
    raise ModelError(f"missing from the config: {', '.join(f'{k} ({_REQUIRED[k]})' for k in missing)}{hint}; "
                     "a Hugging Face config.json of a decoder LLM has each, copy them from the model's",
                     field=missing[0])


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The text decoder's keys (a multimodal config's ``text_config``, with the outer keys it inherits), less nulls."""
    text = cfg.get("text_config")
    if "hidden_size" in cfg or not isinstance(text, Mapping):
        return {k: v for k, v in cfg.items() if v is not None}
    merged = {k: v for k, v in text.items() if v is not None}
    for k in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings", "_name_or_path", "architectures"):
        if k not in merged and cfg.get(k) is not None:
            merged[k] = cfg[k]
    merged["model_type"] = text.get("model_type") or cfg.get("model_type")
    return merged


def _flag(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key)
    return default if value is None else bool(value)


def _head_dim(cfg: Mapping[str, Any]) -> int:
    if cfg.get("head_dim") is not None:
        return int(cfg["head_dim"])
    return _split_heads(cfg)


def _split_heads(cfg: Mapping[str, Any]) -> int:
    """hidden_size / num_attention_heads, refused where the heads do not divide it."""
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    if hidden % heads:
        raise ModelError(f"{heads} heads do not divide hidden_size {hidden} and no head_dim is given",
                         field="num_attention_heads")
    return int(hidden // heads)


def _activation(cfg: Mapping[str, Any], family: str | None, defaults: Mapping[str, Any]) -> str:
    """The MLP's activation, from the key the family's transformers class reads (Falcon: ``activation``)."""
    key = "activation" if family == "falcon" else "hidden_activation" if cfg.get("hidden_activation") \
        else "hidden_act"
    raw = cfg.get(key) or defaults.get("activation", "silu")
    act = _ACTIVATIONS.get(str(raw))
    if act is None:
        raise ModelError(f"activation {raw!r} is not one autoopt models; it plans the GELU variants "
                         f"({', '.join(k for k, v in _ACTIVATIONS.items() if v == 'gelu')}) and SiLU (silu, swish)",
                         field=key)
    if family is None and act == "gelu":
        raise ModelError(f"{raw!r} in a model_type nobody described: a GELU MLP is plain in some families "
                         "(StarCoder2, Phi, GPT-NeoX, Falcon: two matrices) and gated in others (Gemma: three), "
                         "and the config does not say which; autoopt plans the families it describes "
                         f"({', '.join(sorted(FAMILIES))})", field=key)
    return act


def _refuse_unread_keys(cfg: Mapping[str, Any], family: str | None) -> None:
    """Refuse a key that would change the model's weights where the family's transformers class does
    not read it (``use_parallel_residual`` on a Llama, ``mlp_type`` on a model_type nobody described)."""
    for key, readers in _STRUCTURAL_KEYS.items():
        value = cfg.get(key)
        if family in readers or value is None or value is False:
            continue
        who = f"a {family} model" if family else "a model_type nobody described"
        raise ModelError(f"{key} = {value!r} changes which weights a model has; autoopt reads it for "
                         f"{', '.join(sorted(readers))} only (as transformers does), so the size of {who} with it "
                         "cannot be told; drop the key if the checkpoint's layers have no such structure", field=key)


def _expect(cfg: Mapping[str, Any], key: str, value: str, layout: str) -> None:
    """A layout key transformers does not read for the family: only the one layout it builds is planned."""
    if cfg.get(key) not in (None, value):
        raise ModelError(f"{cfg[key]!r} is not the layout transformers builds for this family ({layout}; "
                         f"{key} {value!r}); autoopt plans that one only", field=key)


def _starcoder2(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """StarCoder2: use_bias puts biases on q/k/v/o_proj and c_fc/c_proj (transformers Starcoder2Attention,
    Starcoder2MLP); Starcoder2Config has no mlp_type or norm_type, its one layout is c_fc/c_proj + LayerNorm."""
    _expect(cfg, "mlp_type", "default", "a plain c_fc/c_proj MLP")
    _expect(cfg, "norm_type", "layer_norm", "nn.LayerNorm")
    bias = _flag(cfg, "use_bias", True)
    return {"qkv_bias": bias, "o_bias": bias, "mlp_bias": bias}


def _phi(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Phi: q/k/v and dense always with biases; qk_layernorm adds a LayerNorm over each head of q and k
    (transformers PhiAttention); PhiConfig ignores attention_bias."""
    return {"qkv_bias": True, "o_bias": True, "qk_norm": "head" if cfg.get("qk_layernorm") else None}


def _gpt_neox(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-NeoX: one fused query_key_value of 3 x hidden (every head its own K and V, head size hidden / heads)
    and dense, both with attention_bias (default true); use_parallel_residual (default true): the MLP reads
    post_attention_layernorm(x) of the layer input, not the attention's output (transformers GPTNeoXLayer)."""
    bias = _flag(cfg, "attention_bias", True)
    return {"qkv_bias": bias, "o_bias": bias, "parallel_block": _flag(cfg, "use_parallel_residual", True),
            "num_kv_heads": cfg["num_attention_heads"], "head_dim": _split_heads(cfg)}


def _falcon(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Falcon (transformers FalconAttention, FalconDecoderLayer): new_decoder_architecture has num_kv_heads
    K/V heads and, with num_ln_in_parallel_attn 2 (its default), ln_attn and ln_mlp; otherwise multi_query
    (default true) has one K/V head, and parallel_attn (default true) one input_layernorm for both halves,
    two norms when false. ``bias`` covers every projection; head size is hidden / heads."""
    heads = cfg["num_attention_heads"]
    new = _flag(cfg, "new_decoder_architecture", False)
    parallel = _flag(cfg, "parallel_attn", True)
    n_ln = cfg.get("num_ln_in_parallel_attn")
    if new and not parallel:
        raise ModelError("new_decoder_architecture without parallel_attn: FalconDecoderLayer builds "
                         "input/post-attention norms but runs ln_attn/ln_mlp, so no checkpoint has this layout; "
                         "Falcon-40B/180B set parallel_attn true", field="parallel_attn")
    if n_ln not in (None, 1, 2) or (n_ln == 2 and parallel and not new):
        raise ModelError(f"{n_ln!r} builds norms FalconDecoderLayer does not run: it runs one (input_layernorm), "
                         "or two (ln_attn, ln_mlp) with new_decoder_architecture only", field="num_ln_in_parallel_attn")
    kv = (cfg.get("num_kv_heads") or heads) if new else 1 if _flag(cfg, "multi_query", True) else heads
    bias = _flag(cfg, "bias", False)
    norms = 2 if not parallel or (new and n_ln != 1) else 1
    return {"num_kv_heads": kv, "head_dim": _split_heads(cfg), "parallel_block": parallel,
            "norms_per_layer": norms, "qkv_bias": bias, "o_bias": bias, "mlp_bias": bias}


def _read_flag(cfg: Mapping[str, Any], key: str, family: str | None, defaults: Mapping[str, Any]) -> bool:
    """The ModelSpec field of the same name: the config's key where the family's transformers class reads
    it (_STRUCTURAL_KEYS), else the family's default (a false value elsewhere changes nothing)."""
    default = bool(defaults.get(key, False))
    return _flag(cfg, key, default) if family in _STRUCTURAL_KEYS[key] else default


#: family -> the ModelSpec fields its config keys decide, as its transformers classes read them
_FAMILY_READERS = {"starcoder2": _starcoder2, "phi": _phi, "gpt_neox": _gpt_neox, "falcon": _falcon}


def _normalised(cfg: dict[str, Any], family: str | None) -> dict[str, Any]:
    """The config with the family's transformers defaults and spellings of the standard fields."""
    cfg = {**_CONFIG_DEFAULTS.get(family or "", {}), **cfg}
    if family == "falcon" and cfg.get("hidden_size") is not None:
        # FalconMLP is ffn_hidden_size wide, 4 x hidden_size by default; FalconConfig reads no intermediate_size
        cfg["intermediate_size"] = cfg.get("ffn_hidden_size") or 4 * cfg["hidden_size"]
    return cfg


def _structure(cfg: Mapping[str, Any], family: str | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec's layer-structure fields (MLP kind, activation, biases, norms, block layout, K/V heads):
    the family's defaults, overridden by the config keys its transformers classes read; a key that would
    change the weights where the family does not read it is refused."""
    _refuse_unread_keys(cfg, family)
    attention_bias = cfg.get("attention_bias")
    if attention_bias and cfg.get("kv_lora_rank"):
        raise ModelError("biases on multi-head latent attention's projections are not modelled (DeepSeek-V2/V3 "
                         "checkpoints have none)", field="attention_bias")
    fields: dict[str, Any] = {
        "num_kv_heads": cfg.get("num_key_value_heads") or cfg["num_attention_heads"], "head_dim": _head_dim(cfg),
        "mlp": defaults.get("mlp", "gated"), "activation": _activation(cfg, family, defaults),
        "norm": _norm(cfg, defaults), "norm_unit_offset": bool(defaults.get("norm_unit_offset", False)),
        "norms_per_layer": int(defaults.get("norms_per_layer", 2)),
        "parallel_block": bool(defaults.get("parallel_block", False)),
        "qkv_bias": _flag(cfg, "qkv_bias", bool(attention_bias) if attention_bias is not None
                          else defaults.get("qkv_bias", False)),
        "o_bias": bool(defaults.get("o_bias", attention_bias or False)),
        "qk_norm": defaults.get("qk_norm"),
        "mlp_bias": _read_flag(cfg, "mlp_bias", family, defaults),
        "lm_head_bias": _read_flag(cfg, "lm_head_bias", family, defaults),
    }
    reader = _FAMILY_READERS.get(family or "")
    return {**fields, **reader(cfg)} if reader else fields


def _norm(cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    if "norm" in defaults:
        return str(defaults["norm"])
    layer_norm = ("layer_norm_eps" in cfg or "layer_norm_epsilon" in cfg) and "rms_norm_eps" not in cfg
    return "layernorm" if layer_norm else "rmsnorm"


def _dtypes(cfg: Mapping[str, Any]) -> tuple[str, str | None]:
    """The checkpoint's weight dtype, and the experts' where its quantization_config gives them another."""
    raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    dtype = _HF_DTYPES.get(raw)
    if dtype is None:
        raise ModelError(f"unknown torch_dtype {raw!r}; expected one of {', '.join(sorted(_HF_DTYPES))}",
                         field="torch_dtype")
    quant = cfg.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if method == "fp8":
        return "fp8", None  # DeepSeek-V3 ships e4m3 weights with 128x128 block scales
    if method == "mxfp4":
        # gpt-oss: MoE experts in MXFP4; attention, router, embeddings and head stay bf16 (modules_to_not_convert)
        return dtype, "mxfp4"
    return dtype, None


def _layer_kinds_period(kinds: list[Any], window: int | None, layers: int) -> tuple[int | None, int]:
    """(window, sliding_window_pattern) from ``layer_types``: local layers i % p != p - 1, global ones the rest."""
    unknown = sorted({str(k) for k in kinds} - _LOCAL_KINDS - _GLOBAL_KINDS)
    if unknown:
        raise ModelError(f"has layer kinds autoopt cannot model: {unknown}; it plans only "
                         f"{', '.join(sorted(_LOCAL_KINDS | _GLOBAL_KINDS))} layers", field="layer_types")
    if len(kinds) != layers:
        raise ModelError(f"has {len(kinds)} entries for num_hidden_layers {layers}; expected one per layer",
                         field="layer_types")
    local = [k in _LOCAL_KINDS for k in kinds]
    if window is None or not any(local):
        return None, 1
    if all(local):
        return window, 1
    p = local.index(False) + 1
    if local != [i % p != p - 1 for i in range(layers)]:
        raise ModelError(f"local and global layers do not repeat with a period (the first global one, layer {p - 1}, "
                         f"would make every {p}th layer global); only periodic patterns ending in a global layer "
                         "are modelled, as Gemma 2/3, gpt-oss and Llama 4 have", field="layer_types")
    return window, p


def _llama4_layer_kinds(cfg: Mapping[str, Any], layers: int) -> list[str]:
    """Llama 4's layer_types as transformers derives them: RoPE layers chunked, NoPE layers global."""
    interval = cfg.get("no_rope_layer_interval") or 4
    rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]  # 1: uses RoPE
    return ["chunked_attention" if r else "full_attention" for r in rope]


def _local_attention(cfg: Mapping[str, Any], family: str | None, layers: int,
                     defaults: Mapping[str, Any]) -> tuple[int | None, int]:
    """(sliding_window, sliding_window_pattern): how far local layers see, and which layers are local."""
    if family == "llama4":  # chunked attention: a token sees its own chunk of attention_chunk_size
        window = cfg.get("attention_chunk_size")
        kinds = cfg.get("layer_types") or _llama4_layer_kinds(cfg, layers)
    else:
        window = cfg.get("sliding_window") or None  # Qwen2-MoE writes 0 for "off"
        if cfg.get("use_sliding_window") is False:  # Qwen2 ships sliding_window but switches it off
            window = None
        kinds = cfg.get("layer_types")
    if isinstance(kinds, list) and kinds:
        return _layer_kinds_period(kinds, window, layers)
    pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") \
        or defaults.get("sliding_window_pattern", 1)
    return window, int(pattern)


def _moe_layers(cfg: Mapping[str, Any], layers: int) -> tuple[int, int]:
    """(first_k_dense_replace, moe_layer_step): MoE on the layers i >= k with (i + 1) % step == 0. Other
    layouts (DeepSeek's moe_layer_freq > 1, arbitrary mlp_only_layers) are refused naming the field."""
    if isinstance(cfg.get("moe_layers"), list):  # Llama 4 (transformers fills it from interleave_moe_layer_step)
        moe, key = sorted(set(cfg["moe_layers"])), "moe_layers"
    else:
        # MoE where (i + 1) % step == 0 (Llama 4, Qwen-MoE) and i % freq == 0 (DeepSeek)
        step = cfg.get("interleave_moe_layer_step") or cfg.get("decoder_sparse_step") or 1
        freq = cfg.get("moe_layer_freq") or 1
        dense = set(cfg.get("mlp_only_layers") or ())
        moe = [i for i in range(cfg.get("first_k_dense_replace") or 0, layers)
               if i not in dense and (i + 1) % step == 0 and i % freq == 0]
        key = next((k for k in ("interleave_moe_layer_step", "decoder_sparse_step", "moe_layer_freq", "mlp_only_layers")
                    if cfg.get(k) not in (None, 1, [])), "first_k_dense_replace")
    if not moe:
        raise ModelError(f"MoE fields but no MoE layer among {layers}", field=key)
    step = moe[1] - moe[0] if len(moe) > 1 else 1
    # where the dense prefix ends: the first MoE layer (every layer MoE from there, or the pattern's
    # first layer at or after it; both describe the same layers)
    k = moe[0]
    if moe != [i for i in range(k, layers) if (i + 1) % step == 0]:
        raise ModelError(f"MoE on {len(moe)} of {layers} layers in a pattern autoopt does not model: it models k "
                         "dense layers, then MoE on every layer or on every step-th layer ((i + 1) % step == 0, "
                         "as Llama 4's interleave_moe_layer_step) to the last", field=key)
    return k, step


def _shared_experts(cfg: Mapping[str, Any], family: str | None, width: int) -> int:
    """Shared experts, in units of one routed expert's width."""
    if family == "llama4":
        return 1  # Llama4TextMoe: one shared expert as wide as a routed one, on every MoE layer
    if cfg.get("n_shared_experts"):
        return int(cfg["n_shared_experts"])
    size = cfg.get("shared_expert_intermediate_size")  # Qwen2-MoE: one shared MLP of this width
    if not size:
        return 0
    n, rest = divmod(int(size), width)
    if rest:
        n += 1
        log.warning("shared_expert_intermediate_size %d is not a multiple of the expert width %d: planned as %d "
                    "shared experts (%d wider than the model's)", size, width, n, n * width - size)
    return n


def _moe_fields(cfg: Mapping[str, Any], family: str | None, layers: int,
                defaults: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec's MoE fields (none for a dense model)."""
    experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0
    if not experts:
        return {}
    # Llama 4's routed and shared experts are intermediate_size wide (its dense MLPs: intermediate_size_mlp)
    width = int(cfg["intermediate_size"] if family == "llama4"
                else cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    shared = _shared_experts(cfg, family, width)
    top_k = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0  # gpt-oss has both spellings
    return {"num_experts": experts, "experts_per_token": top_k, "num_shared_experts": shared,
            "moe_intermediate_size": width, **dict(zip(("first_k_dense_replace", "moe_layer_step"),
                                                      _moe_layers(cfg, layers), strict=True)),
            "shared_expert_gate": bool(shared) and bool(defaults.get("shared_expert_gate", False)),
            "moe_bias": bool(defaults.get("moe_bias", False))}


def _mla_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Multi-head latent attention's ranks and head sizes (DeepSeek-V2/V3), none without kv_lora_rank."""
    if not cfg.get("kv_lora_rank"):
        return {}
    return {k: cfg.get(k) for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                    "v_head_dim")}


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


def _load_config(config: Mapping[str, Any] | str | Path,
                 name: str | None) -> tuple[Mapping[str, Any], str, str | None]:
    """(the config mapping, the file it came from or "", the name to give the model)."""
    if not isinstance(config, (str, Path)):
        if not isinstance(config, Mapping):
            raise ModelError(f"a config must be a mapping, got {type(config).__name__}")
        return config, "", name
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    import json  # a HF config file only: not at import

    text = _read_config_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise ModelError(f"{path}: a config must be a JSON object, got {type(data).__name__}")
    return data, str(path), name or path.parent.name or path.stem


def _checkpoint(raw: Mapping[str, Any], source: str) -> str:
    """What a runtime loads for this config: the folder a config.json file was read from (runtimes take
    the folder, never the file), else the repo id that ``save_pretrained`` records as ``_name_or_path``."""
    if source:
        return str(Path(source).parent)
    named = raw.get("_name_or_path")
    return named if isinstance(named, str) else ""


def from_hf_config(config: Mapping[str, Any] | str | Path, *, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` (a mapping, a file, or a folder holding one).

    A family in :data:`FAMILIES` brings what its config leaves implicit and reads the keys its
    transformers classes read; any other ``model_type`` is planned from the standard decoder fields,
    with a warning naming what was assumed. What cannot be sized exactly -- a key that changes the
    weights where the family does not read it, an activation or layout outside those modelled, a GELU
    MLP of a model_type nobody described -- raises :class:`ModelError` naming the key. A multimodal
    config is read for its text decoder (``text_config``); a vision tower is not planned.
    """
    raw, source, name = _load_config(config, name)
    cfg = _text_config(raw)
    _check_kinds(cfg)
    family = _family(cfg)
    defaults = FAMILIES.get(family or "", {})
    cfg = _normalised(cfg, family)
    _check_required(cfg)
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
        _positive(cfg[key], key)
    layers = cfg["num_hidden_layers"]
    structure = _structure(cfg, family, defaults)
    window, pattern = _local_attention(cfg, family, layers, defaults)
    moe = _moe_fields(cfg, family, layers, defaults)
    dtype, expert_dtype = _dtypes(cfg)
    # Llama 4's dense layers are intermediate_size_mlp wide (its experts intermediate_size)
    dense_width = cfg.get("intermediate_size_mlp") if family == "llama4" else None
    architecture = family or str(cfg.get("model_type") or "unknown")
    try:
        spec = ModelSpec(
            name=name or str(cfg.get("_name_or_path") or architecture),
            architecture=architecture,
            hidden_size=cfg["hidden_size"],
            intermediate_size=dense_width or cfg["intermediate_size"],
            num_layers=layers,
            num_attention_heads=cfg["num_attention_heads"],
            vocab_size=cfg["vocab_size"],
            tied_embeddings=_flag(cfg, "tie_word_embeddings", defaults.get("tied_embeddings", False)),
            **structure,
            attention_sinks=bool(defaults.get("attention_sinks", False)),
            max_position_embeddings=cfg.get("max_position_embeddings") or 8192,
            sliding_window=window,
            sliding_window_pattern=pattern,
            chunked_attention=family == "llama4" and window is not None,
            **moe,
            **_mla_fields(cfg),
            dtype=dtype,
            expert_dtype=expert_dtype if moe else None,
            source=source,
            checkpoint=_checkpoint(raw, source),
        )
    except ModelError as exc:
        hf = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads",
              "num_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"}
        if exc.field in hf:
            raise ModelError(str(exc).split(": ", 1)[-1], field=hf[exc.field]) from None
        raise
    if family is None:
        log.warning(_assumed(spec, cfg))
    return spec


def _assumed(spec: ModelSpec, cfg: Mapping[str, Any]) -> str:
    """The warning for a model_type nobody described: what autoopt took it to be."""
    s = spec
    parts = [f"q/k/v/o attention with {s.num_attention_heads} heads of {s.head_dim}"
             + ("" if cfg.get("head_dim") else " (head_dim taken as hidden_size / heads)")
             + (f", {s.num_kv_heads} KV heads" if cfg.get("num_key_value_heads") else
                ", as many KV heads (num_key_value_heads absent)")
             + (f", biases on q/k/v{'/o' if s.o_bias else ''}" if s.qkv_bias else ", no biases")]
    if s.is_moe:
        every = f", on every {s.moe_layer_step}th layer" if s.moe_layer_step > 1 else ""
        parts.append(f"MoE from layer {s.first_moe_layer}{every}: {s.num_experts} experts of "
                     f"{s.moe_intermediate_size}, top-{s.experts_per_token}"
                     + (f", {s.num_shared_experts} shared" if s.num_shared_experts else ", none shared"))
    if s.has_dense_layers:
        parts.append(f"gated {s.activation} MLP of {s.intermediate_size}")
    parts.append(f"{s.norms_per_layer} {s.norm}s per layer, no q/k norms")
    if s.sliding_window:
        parts.append(f"a {s.sliding_window}-token window on "
                     + ("every layer" if s.sliding_window_pattern == 1 else
                        f"{s.sliding_window_pattern - 1} of each {s.sliding_window_pattern} layers"))
    parts.append("embeddings " + ("tied" if s.tied_embeddings else "untied")
                 + ("" if "tie_word_embeddings" in cfg else " (tie_word_embeddings absent)"))
    if not (cfg.get("torch_dtype") or cfg.get("dtype")):
        parts.append(f"{s.dtype} weights (torch_dtype absent)")
    families = ", ".join(sorted(FAMILIES))
    return (f"model_type {s.architecture!r} is not a described family ({families}); planned from its standard "
            f"fields as a decoder of {s.num_layers} layers: {'; '.join(parts)}. Weights it has beyond these "
            f"(extra norms, biases, sinks, a vision tower, prediction heads) are not counted: check its "
            f"{s.num_params / 1e9:.2f} B parameters against the model card")


# -- torch.nn.Module ------------------------------------------------------------
def from_module(module: Any, *, name: str | None = None, **overrides: Any) -> ModelSpec:
    """Build a ModelSpec by walking a ``torch.nn.Module``'s Linear/Embedding/norm shapes (never runs it).

    A Hugging Face model carries its config, which is used directly. Otherwise the
    walk reads the embedding (vocab, hidden), the first layer's projections
    (``q_proj``/``k_proj``/``v_proj``/``o_proj``, ``gate_proj``/``up_proj``/
    ``down_proj``: an ``up_proj`` without a ``gate_proj`` is a plain MLP) and their
    biases, counts the numbered layers and looks for ``num_heads``/
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
    modules = dict(module.named_modules())
    layer_norm = next((modules[n_] for n_ in norms if isinstance(modules[n_], nn.LayerNorm)), None)
    o = find("o_proj")
    spec = ModelSpec(
        name=name or type(module).__name__, architecture=str(overrides.pop("architecture", "llama")),
        hidden_size=int(hidden), intermediate_size=int((up or gate).out_features),
        num_layers=len(layer_ids), num_attention_heads=int(heads),
        num_kv_heads=int(overrides.pop("num_kv_heads", k.out_features // head_dim)),
        head_dim=int(head_dim), vocab_size=int(vocab),
        tied_embeddings=lm_head is None or lm_head.weight is embed.weight,
        norm="rmsnorm" if layer_norm is None else "layernorm",
        norm_bias=layer_norm is not None and layer_norm.bias is not None,
        norms_per_layer=max(1, layer_norms) if layer_norms else 2,
        mlp="plain" if gate is None else "gated",  # an up_proj alone: up, activation, down
        mlp_bias=(up or gate).bias is not None,
        qkv_bias=q.bias is not None, o_bias=o is not None and o.bias is not None,
        lm_head_bias=lm_head is not None and lm_head.bias is not None,
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
