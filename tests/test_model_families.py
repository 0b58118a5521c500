"""Model families beyond the catalog's: Qwen3-MoE, Qwen2-MoE, gpt-oss, Llama 4, Gemma 3, Phi-3.5-MoE,
OLMo 2, Granite 3; the plain-MLP families StarCoder2, Phi, GPT-NeoX (Pythia) and Falcon; and a
``model_type`` nobody described.

Each published config below holds the architecture keys of the model's public ``config.json``,
copied key for key (tokenizer ids, RoPE factor lists and other keys that hold no weights are left
out). Parameter counts are checked three ways: against the count the publisher states, against
transformers' own model built on the meta device, and between the raw ``config.json`` and the
same values passed through transformers' config class (so family defaults match transformers').
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from autoopt.errors import ModelError
from autoopt.planning.memory import kv_cache_bytes
from autoopt.planning.model import ModelSpec, from_hf_config

# https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "vocab_size": 151936,
}
# https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/blob/main/config.json
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "decoder_sparse_step": 1,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06, "shared_expert_intermediate_size": 5632, "sliding_window": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}
# https://huggingface.co/Qwen/Qwen2-57B-A14B/blob/main/config.json
QWEN2_57B_A14B = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "decoder_sparse_step": 1,
    "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "moe_intermediate_size": 2560, "norm_topk_prob": False, "num_attention_heads": 28,
    "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "shared_expert_intermediate_size": 20480, "sliding_window": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}
# https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 201088,
}
# https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json: gpt-oss-20b's keys but for these
GPT_OSS_120B = {**GPT_OSS_20B, "layer_types": ["sliding_attention", "full_attention"] * 18,
                "num_hidden_layers": 36, "num_local_experts": 128}
# https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E/blob/main/config.json
LLAMA4_SCOUT = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text", "attention_bias": False, "attention_chunk_size": 8192, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "max_position_embeddings": 10485760, "no_rope_layers": [],
        "num_attention_heads": 40, "num_experts_per_tok": 1,
        "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16, "rms_norm_eps": 1e-05,
        "torch_dtype": "bfloat16", "use_qk_norm": True, "vocab_size": 202048,
    },
    "vision_config": {
        "model_type": "llama4_vision_model", "hidden_act": "gelu", "hidden_size": 1408, "image_size": 336,
        "intermediate_size": 5632, "multi_modal_projector_bias": False, "norm_eps": 1e-05, "num_attention_heads": 16,
        "num_channels": 3, "num_hidden_layers": 34, "patch_size": 14, "pixel_shuffle_ratio": 0.5,
        "projector_input_dim": 4096, "projector_output_dim": 4096, "vision_output_dim": 4096,
    },
}
# https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E/blob/main/config.json: Scout's keys but 128
# experts on every second layer (interleave_moe_layer_step 2), dense MLPs of intermediate_size_mlp between
LLAMA4_MAVERICK = {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "interleave_moe_layer_step": 2,
                                                   "num_local_experts": 128}}
# https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json (text_config omits vocab_size,
# tie_word_embeddings and the local/global pattern: transformers' Gemma3TextConfig defaults fill them)
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
        "sliding_window": 1024,
    },
    "vision_config": {
        "model_type": "siglip_vision_model", "hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
        "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False,
    },
}
# https://huggingface.co/google/gemma-3-12b-it/blob/main/config.json (head_dim left to its default, 256)
GEMMA3_12B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text", "hidden_size": 3840, "intermediate_size": 15360, "num_attention_heads": 16,
        "num_hidden_layers": 48, "num_key_value_heads": 8, "sliding_window": 1024,
    },
}
# https://huggingface.co/microsoft/Phi-3.5-MoE-instruct/blob/main/config.json (rope_scaling's longrope
# factor lists left out)
PHI35_MOE = {
    "architectures": ["PhiMoEForCausalLM"], "model_type": "phimoe", "attention_bias": True, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 6400, "lm_head_bias": True, "max_position_embeddings": 131072,
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 16, "rms_norm_eps": 1e-05, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 32064,
}
# https://huggingface.co/allenai/OLMo-2-1124-7B/blob/main/config.json
OLMO2_7B = {
    "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "attention_bias": False, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
    "torch_dtype": "float32", "vocab_size": 100352,
}
# https://huggingface.co/allenai/OLMo-2-1124-13B/blob/main/config.json
OLMO2_13B = {**OLMO2_7B, "hidden_size": 5120, "intermediate_size": 13824, "num_attention_heads": 40,
             "num_hidden_layers": 40, "num_key_value_heads": 40}
# https://huggingface.co/ibm-granite/granite-3.1-8b-instruct/blob/main/config.json
GRANITE31_8B = {
    "architectures": ["GraniteForCausalLM"], "model_type": "granite", "attention_bias": False,
    "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 12800, "logits_scaling": 16.0, "max_position_embeddings": 131072, "mlp_bias": False,
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "residual_multiplier": 0.22,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 49155,
}

# -- plain (ungated) MLP families ------------------------------------------------------
# https://huggingface.co/bigcode/starcoder2-3b/blob/main/config.json
STARCODER2_3B = {
    "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 3072, "intermediate_size": 12288, "layer_norm_epsilon": 1e-05, "max_position_embeddings": 16384,
    "mlp_type": "default", "norm_epsilon": 1e-05, "norm_type": "layer_norm", "num_attention_heads": 24,
    "num_hidden_layers": 30, "num_key_value_heads": 2, "rope_theta": 999999.4420358813, "sliding_window": 4096,
    "torch_dtype": "float32", "use_bias": True, "vocab_size": 49152,
}
# https://huggingface.co/bigcode/starcoder2-7b/blob/main/config.json: starcoder2-3b's keys but for these
STARCODER2_7B = {**STARCODER2_3B, "hidden_size": 4608, "intermediate_size": 18432, "num_attention_heads": 36,
                 "num_hidden_layers": 32, "num_key_value_heads": 4, "rope_theta": 1000000}
# https://huggingface.co/bigcode/starcoder2-15b/blob/main/config.json: starcoder2-3b's keys but for these
STARCODER2_15B = {**STARCODER2_3B, "hidden_size": 6144, "intermediate_size": 24576, "num_attention_heads": 48,
                  "num_hidden_layers": 40, "num_key_value_heads": 4, "rope_theta": 100000}
# https://huggingface.co/microsoft/phi-2/blob/main/config.json
PHI2 = {
    "architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_act": "gelu_new", "hidden_size": 2560,
    "intermediate_size": 10240, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4, "qk_layernorm": False,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 51200,
}
# https://huggingface.co/EleutherAI/pythia-1b/blob/main/config.json
PYTHIA_1B = {
    "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_act": "gelu", "hidden_size": 2048,
    "intermediate_size": 8192, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "num_attention_heads": 8,
    "num_hidden_layers": 16, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
    "torch_dtype": "float16", "use_parallel_residual": True, "vocab_size": 50304,
}
# https://huggingface.co/EleutherAI/pythia-6.9b/blob/main/config.json: pythia-1b's keys but for these
PYTHIA_6_9B = {**PYTHIA_1B, "hidden_size": 4096, "intermediate_size": 16384, "num_attention_heads": 32,
               "num_hidden_layers": 32, "vocab_size": 50432}
# https://huggingface.co/EleutherAI/pythia-12b/blob/main/config.json: pythia-1b's keys but for these
PYTHIA_12B = {**PYTHIA_1B, "hidden_size": 5120, "intermediate_size": 20480, "num_attention_heads": 40,
              "num_hidden_layers": 36, "vocab_size": 50688}
# https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json (no intermediate_size, max_position_embeddings
# or tie_word_embeddings: FalconConfig's 4 x hidden, 2048 and true)
FALCON_7B = {
    "architectures": ["FalconForCausalLM"], "model_type": "falcon", "alibi": False,
    "apply_residual_connection_post_layernorm": False, "bias": False, "hidden_size": 4544,
    "layer_norm_epsilon": 1e-05, "multi_query": True, "new_decoder_architecture": False,
    "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True, "torch_dtype": "bfloat16",
    "vocab_size": 65024,
}
# https://huggingface.co/tiiuae/falcon-40b/blob/main/config.json: falcon-7b's keys but for these
FALCON_40B = {**FALCON_7B, "hidden_size": 8192, "new_decoder_architecture": True, "num_attention_heads": 128,
              "num_hidden_layers": 60, "num_kv_heads": 8}

#: case -> (family, published config.json, transformers config class)
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "qwen3-30b-a3b": ("qwen3_moe", QWEN3_30B_A3B, "Qwen3MoeConfig"),
    "qwen1.5-moe-a2.7b": ("qwen2_moe", QWEN15_MOE_A27B, "Qwen2MoeConfig"),
    "qwen2-57b-a14b": ("qwen2_moe", QWEN2_57B_A14B, "Qwen2MoeConfig"),
    "gpt-oss-20b": ("gpt_oss", GPT_OSS_20B, "GptOssConfig"),
    "gpt-oss-120b": ("gpt_oss", GPT_OSS_120B, "GptOssConfig"),
    "llama-4-scout": ("llama4", LLAMA4_SCOUT, "Llama4Config"),
    "llama-4-maverick": ("llama4", LLAMA4_MAVERICK, "Llama4Config"),
    "gemma-3-27b": ("gemma3", GEMMA3_27B, "Gemma3Config"),
    "gemma-3-12b": ("gemma3", GEMMA3_12B, "Gemma3Config"),
    "phi-3.5-moe": ("phimoe", PHI35_MOE, "PhimoeConfig"),
    "olmo-2-7b": ("olmo2", OLMO2_7B, "Olmo2Config"),
    "olmo-2-13b": ("olmo2", OLMO2_13B, "Olmo2Config"),
    "granite-3.1-8b": ("granite", GRANITE31_8B, "GraniteConfig"),
    "starcoder2-3b": ("starcoder2", STARCODER2_3B, "Starcoder2Config"),
    "starcoder2-7b": ("starcoder2", STARCODER2_7B, "Starcoder2Config"),
    "starcoder2-15b": ("starcoder2", STARCODER2_15B, "Starcoder2Config"),
    "phi-2": ("phi", PHI2, "PhiConfig"),
    "pythia-1b": ("gpt_neox", PYTHIA_1B, "GPTNeoXConfig"),
    "pythia-6.9b": ("gpt_neox", PYTHIA_6_9B, "GPTNeoXConfig"),
    "pythia-12b": ("gpt_neox", PYTHIA_12B, "GPTNeoXConfig"),
    "falcon-7b": ("falcon", FALCON_7B, "FalconConfig"),
    "falcon-40b": ("falcon", FALCON_40B, "FalconConfig"),
}

#: Published totals, billions: (figure, relative tolerance, source). 0.5 % where the figure has three or
#: more digits; a figure given to fewer digits is held to the rounding of its last digit.
PUBLISHED_TOTAL: dict[str, tuple[float, float, str]] = {
    "qwen3-30b-a3b": (30.5, 0.005, "https://huggingface.co/Qwen/Qwen3-30B-A3B (model card: 30.5B in total)"),
    "qwen1.5-moe-a2.7b": (14.3, 0.005, "https://qwenlm.github.io/blog/qwen-moe/ (14.3B parameters)"),
    "qwen2-57b-a14b": (57.0, 0.5 / 57, "https://huggingface.co/Qwen/Qwen2-57B-A14B (57B total, to the billion)"),
    "gpt-oss-20b": (20.91, 0.005, "https://arxiv.org/abs/2508.10925 (gpt-oss model card, Table 1)"),
    "gpt-oss-120b": (116.83, 0.005, "https://arxiv.org/abs/2508.10925 (gpt-oss model card, Table 1)"),
    # Gemma 3 technical report Table 1: embedding 1,416 M + non-embedding 25,600 M (the vision encoder's
    # 417 M apart); its "embedding" column also holds the 1152 x hidden image projection.
    "gemma-3-27b": (27.016, 0.005, "https://arxiv.org/abs/2503.19786 (Gemma 3 report, Table 1)"),
    "gemma-3-12b": (11.771, 0.005, "https://arxiv.org/abs/2503.19786 (Gemma 3 report, Table 1: 1,012 M + 10,759 M)"),
    "phi-3.5-moe": (41.9, 0.005, "https://huggingface.co/microsoft/Phi-3.5-MoE-instruct (41.9B params)"),
    "olmo-2-7b": (7.30, 0.005, "https://huggingface.co/allenai/OLMo-2-1124-7B (7.3B params)"),
    "olmo-2-13b": (13.7, 0.005, "https://huggingface.co/allenai/OLMo-2-1124-13B (13.7B params)"),
    "granite-3.1-8b": (8.17, 0.005, "https://huggingface.co/ibm-granite/granite-3.1-8b-instruct (8.17B params)"),
    # the Pythia suite's table of models gives every parameter, to the unit
    "pythia-1b": (1.011781632, 1e-9, "https://github.com/EleutherAI/pythia (models table: 1,011,781,632)"),
    "pythia-6.9b": (6.857302016, 1e-9, "https://github.com/EleutherAI/pythia (models table: 6,857,302,016)"),
    "pythia-12b": (11.846072320, 1e-9, "https://github.com/EleutherAI/pythia (models table: 11,846,072,320)"),
}
#: Published active counts, billions (figure, relative tolerance, source). gpt-oss counts the unembedding
#: but not the embedding as active (model card, Table 1 caption); the others count both tables.
PUBLISHED_ACTIVE: dict[str, tuple[float, float, str]] = {
    # "3.3B activated" is given to two digits; the per-token count is 3.353 B (+1.6 %): held to 2 %
    # here, and exactly to transformers' modules in test_total_parameters_match_transformers_on_meta.
    "qwen3-30b-a3b": (3.3, 0.02, "https://huggingface.co/Qwen/Qwen3-30B-A3B (3.3B activated)"),
    "qwen1.5-moe-a2.7b": (2.7, 0.05 / 2.7, "https://qwenlm.github.io/blog/qwen-moe/ (2.7B activated)"),
    "qwen2-57b-a14b": (14.0, 0.5 / 14, "https://huggingface.co/Qwen/Qwen2-57B-A14B (14B activated)"),
    "gpt-oss-20b": (3.61, 0.005, "https://arxiv.org/abs/2508.10925 (gpt-oss model card, Table 1)"),
    "gpt-oss-120b": (5.13, 0.005, "https://arxiv.org/abs/2508.10925 (gpt-oss model card, Table 1)"),
    "llama-4-scout": (17.0, 0.5 / 17, "https://github.com/meta-llama/llama-models (Llama 4 model card: 17B)"),
    "llama-4-maverick": (17.0, 0.5 / 17, "https://github.com/meta-llama/llama-models (Llama 4 model card: 17B)"),
    "phi-3.5-moe": (6.6, 0.05 / 6.6, "https://huggingface.co/microsoft/Phi-3.5-MoE-instruct (6.6B active)"),
}
_EMBEDDING_NOT_ACTIVE = {"gpt-oss-20b", "gpt-oss-120b"}


@pytest.fixture(scope="module")
def transformers() -> Any:
    return pytest.importorskip("transformers")


def _through_transformers(transformers: Any, case: str) -> dict[str, Any]:
    """The published config passed through transformers' config class, as ``to_dict()`` gives it back."""
    _, published, cls = CASES[case]
    return dict(getattr(transformers, cls)(**published).to_dict())


def _meta_params(transformers: Any, config: Any) -> int:
    import torch

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", sorted(CASES))
def test_published_config_is_read_as_its_family(case):
    family, published, _ = CASES[case]
    assert from_hf_config(published).architecture == family


@pytest.mark.parametrize("case", sorted(PUBLISHED_TOTAL))
def test_total_parameters_match_the_published_count(transformers, case):
    figure, rel, _source = PUBLISHED_TOTAL[case]
    spec = from_hf_config(_through_transformers(transformers, case))
    assert spec.num_params / 1e9 == pytest.approx(figure, rel=rel)


def _llama4_with_vision(transformers: Any, published: dict[str, Any]) -> float:
    """Billions: autoopt's text-decoder count plus the vision encoder and projector that transformers
    builds (on the meta device) from the published vision_config."""
    import torch

    cfg = transformers.Llama4Config(**published)
    with torch.device("meta"):
        model = transformers.Llama4ForConditionalGeneration(cfg)
    vision = sum(p.numel() for n, p in model.named_parameters() if "vision" in n or "multi_modal_projector" in n)
    return (from_hf_config(cfg.to_dict()).num_params + vision) / 1e9


def test_llama4_scout_total_matches_the_published_109_billion_with_its_vision_encoder(transformers):
    # "109B total" (Llama 4 model card) is the whole checkpoint; autoopt plans the text decoder
    assert _llama4_with_vision(transformers, LLAMA4_SCOUT) == pytest.approx(109.0, rel=0.005)


@pytest.mark.parametrize("case", sorted(PUBLISHED_ACTIVE))
def test_active_parameters_match_the_published_count(transformers, case):
    figure, rel, _source = PUBLISHED_ACTIVE[case]
    spec = from_hf_config(_through_transformers(transformers, case))
    active = spec.active_params - (spec.embedding_params if case in _EMBEDDING_NOT_ACTIVE else 0)
    assert active / 1e9 == pytest.approx(figure, rel=rel)


@pytest.mark.parametrize("case", sorted(CASES))
def test_total_parameters_match_transformers_on_meta(transformers, case):
    """Exact: every weight transformers builds, tied ones once (Phi-3.5-MoE's and Phi-2's lm_head bias too)."""
    _, published, cls = CASES[case]
    config = getattr(transformers, cls)(**published)
    text = config.get_text_config()  # the decoder of a multimodal config, else the config itself
    spec = from_hf_config(config.to_dict())
    assert spec.num_params == pytest.approx(_meta_params(transformers, text), rel=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_raw_config_json_and_its_transformers_config_plan_the_same_model(transformers, case):
    """Family defaults stand in for what a published config.json leaves to transformers' defaults."""
    assert from_hf_config(CASES[case][1]) == from_hf_config(_through_transformers(transformers, case))


def test_gpt_oss_alternates_a_128_token_window_with_full_attention_from_layer_zero():
    spec = from_hf_config(GPT_OSS_20B)
    assert [spec.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    assert (spec.kv_len(0, 100_000), spec.kv_len(1, 100_000)) == (128, 100_000)


def test_gpt_oss_kv_cache_holds_128_tokens_on_its_local_layers():
    # 24 layers, 8 KV heads x 64 x (K, V) x 2 bytes = 2048 B per token per layer;
    # 12 local layers cache 128 tokens, 12 global ones all 131072.
    spec = from_hf_config(GPT_OSS_20B)
    assert kv_cache_bytes(spec, batch=1, context=131_072) == (12 * 128 + 12 * 131_072) * 2048


def test_gpt_oss_experts_are_mxfp4_while_the_rest_is_bf16():
    spec = from_hf_config(GPT_OSS_120B)
    assert (spec.dtype, spec.expert_dtype) == ("bf16", "mxfp4")


def test_gpt_oss_layer_has_attention_biases_sinks_and_expert_biases():
    # per layer: q/k/v/o weights 2 x 2880 x 4096 + 2 x 2880 x 512 and biases 4096 + 2 x 512 + 2880,
    # 64 sinks; 32 experts x (3 x 2880 x 2880 + 2 x 2880 + 2880); router 32 x 2880 + 32; 2 norms of 2880
    spec = from_hf_config(GPT_OSS_20B)
    attention = 2 * 2880 * 4096 + 2 * 2880 * 512 + 4096 + 2 * 512 + 2880 + 64
    experts = 32 * (3 * 2880 * 2880 + 3 * 2880)
    assert spec.layer_params(0) == attention + experts + 32 * 2880 + 32 + 2 * 2880


def test_gemma3_has_five_local_layers_for_each_global_one():
    spec = from_hf_config(GEMMA3_27B)
    assert [spec.is_local_layer(i) for i in range(12)] == [True] * 5 + [False] + [True] * 5 + [False]
    assert (spec.sliding_window, spec.tied_embeddings, spec.norms_per_layer) == (1024, True, 4)


def test_gemma3_kv_cache_caps_local_layers_at_the_1024_token_window():
    # 62 layers, globals at 5, 11, ..., 59: 10 of them; 16 KV heads x 128 x (K, V) x 2 bytes = 8192 B
    spec = from_hf_config(GEMMA3_27B)
    assert kv_cache_bytes(spec, batch=1, context=32_768) == (52 * 1024 + 10 * 32_768) * 8192


def test_gemma3_12b_head_dim_is_transformers_default_not_hidden_over_heads():
    assert from_hf_config(GEMMA3_12B).head_dim == 256  # 3840 / 16 would be 240


def test_llama4_attends_in_8192_token_chunks_on_three_layers_of_four():
    spec = from_hf_config(LLAMA4_SCOUT)
    assert [spec.is_local_layer(i) for i in range(8)] == [True, True, True, False] * 2
    assert (spec.kv_len(0, 1_000_000), spec.kv_len(3, 1_000_000)) == (8192, 1_000_000)


def test_llama4_routes_to_one_of_16_experts_beside_one_shared_expert_of_the_same_width():
    spec = from_hf_config(LLAMA4_SCOUT)
    assert (spec.num_experts, spec.experts_per_token, spec.num_shared_experts) == (16, 1, 1)
    assert (spec.moe_intermediate_size, spec.intermediate_size, spec.first_k_dense_replace) == (8192, 16384, 0)


def test_llama4_maverick_runs_experts_on_every_second_layer_and_dense_mlps_between():
    spec = from_hf_config(LLAMA4_MAVERICK)
    assert [spec.is_moe_layer(i) for i in range(6)] == [False, True] * 3
    assert (spec.count_layers(range(48), moe=True), spec.count_layers(range(48), moe=False)) == (24, 24)
    # chunked attention on three layers of four: 12 of the 24 MoE layers are local
    assert spec.count_layers(range(48), moe=True, local=True) == 12
    assert spec.count_layers(range(5, 13), moe=True) == sum(spec.is_moe_layer(i) for i in range(5, 13)) == 4


def test_llama4_maverick_total_matches_the_published_400_billion_with_its_vision_encoder(transformers):
    assert _llama4_with_vision(transformers, LLAMA4_MAVERICK) == pytest.approx(400.0, rel=0.005)


def test_moe_layers_in_a_pattern_not_modelled_are_refused_naming_the_field():
    odd = {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "moe_layers": [1, 2, 5, 40]}}
    with pytest.raises(ModelError, match="pattern autoopt does not model") as exc:
        from_hf_config(odd)
    assert exc.value.field == "moe_layers"


def test_qwen2_moe_shared_expert_counts_as_four_routed_widths_behind_a_gate():
    spec = from_hf_config(QWEN15_MOE_A27B)  # shared_expert_intermediate_size 5632 = 4 x 1408
    assert (spec.num_shared_experts, spec.moe_intermediate_size, spec.shared_expert_gate) == (4, 1408, True)
    assert (spec.qkv_bias, spec.o_bias) == (True, False)


def test_qwen3_moe_layer_ops_normalise_q_and_k_per_head():
    spec = from_hf_config(QWEN3_30B_A3B)
    ops = {o.name: o for o in spec.layer_ops(0, batch=1, q_len=16, context=16)}
    assert (ops["q_norm"].shape, ops["k_norm"].shape) == ((16 * 32, 128), (16 * 4, 128))


def test_phimoe_uses_layernorms_with_a_bias():
    spec = from_hf_config(PHI35_MOE)
    assert spec.norm == "layernorm"
    assert spec.layer_params(0) - spec.linear_params(0) == 2 * 2 * 4096 + 16 * 4096  # 2 norms x (w, b) + router


def test_olmo2_normalises_all_of_q_and_all_of_k_and_keeps_fp32_weights():
    spec = from_hf_config(OLMO2_7B)
    assert (spec.qk_norm, spec.dtype) == ("full", "fp32")
    assert spec.layer_params(0) - spec.linear_params(0) == 2 * 4096 + (32 + 32) * 128


def test_granite_multipliers_leave_the_parameter_count_unchanged():
    plain = {k: v for k, v in GRANITE31_8B.items() if not k.endswith(("multiplier", "scaling"))}
    assert from_hf_config(GRANITE31_8B).num_params == from_hf_config(plain).num_params


# -- a model_type nobody described ------------------------------------------------
STARLING = {  # a made-up family with standard decoder fields
    "architectures": ["StarlingForCausalLM"], "model_type": "starling", "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 4,
    "vocab_size": 32000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def test_unknown_model_type_is_planned_from_its_standard_fields():
    spec = from_hf_config(STARLING)
    # 16 x (q, o 2 x 2048^2 + k, v 2 x 2048 x 512 + MLP 3 x 2048 x 8192 + 2 norms) + tied 32000 x 2048 + norm
    per_layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048
    assert (spec.architecture, spec.head_dim) == ("starling", 128)
    assert spec.num_params == 16 * per_layer + 32000 * 2048 + 2048


def test_unknown_model_type_warns_naming_what_was_assumed(caplog):
    with caplog.at_level(logging.WARNING, logger="autoopt.planning.model"):
        from_hf_config(STARLING)
    message = caplog.records[-1].getMessage()
    assert "'starling' is not a described family" in message
    assert "head_dim taken as hidden_size / heads" in message and "gated silu MLP of 8192" in message


def test_unknown_moe_model_type_reads_the_expert_fields():
    spec = from_hf_config({**STARLING, "num_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1024})
    assert (spec.num_experts, spec.experts_per_token, spec.moe_intermediate_size) == (64, 6, 1024)


def test_unknown_model_type_without_required_fields_is_refused_naming_each():
    config = {k: v for k, v in STARLING.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(ModelError, match=r"hidden_size \(the residual width\), vocab_size") as exc:
        from_hf_config(config)
    assert exc.value.field == "hidden_size"


def test_a_config_with_gpt2_names_is_told_which_names_autoopt_reads():
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "vocab_size": 50257}
    with pytest.raises(ModelError, match="'n_embd' for hidden_size") as exc:
        from_hf_config(gpt2)
    assert exc.value.field == "hidden_size"


def test_a_hybrid_linear_attention_model_type_is_refused_by_name():
    with pytest.raises(ModelError, match="not a decoder-only transformer") as exc:
        from_hf_config({**STARLING, "model_type": "qwen3_next"})
    assert exc.value.field == "model_type"


def test_layer_types_autoopt_cannot_model_are_refused():
    config = {**STARLING, "layer_types": ["linear_attention", "full_attention"] * 8}
    with pytest.raises(ModelError, match="linear_attention") as exc:
        from_hf_config(config)
    assert exc.value.field == "layer_types"


# -- ModelSpec's new fields ----------------------------------------------------------
@pytest.mark.parametrize("config", [GPT_OSS_20B, FALCON_40B], ids=["gpt-oss-20b", "falcon-40b"])
def test_a_new_family_spec_round_trips_through_its_dict(config):
    spec = from_hf_config(config)
    assert ModelSpec.from_dict(spec.to_dict()) == spec


#: a spec dict written before a set of fields -> (config, those fields, the weights they add)
_BEFORE = {
    "MoE extras": (QWEN15_MOE_A27B, ("o_bias", "qk_norm", "attention_sinks", "shared_expert_gate", "moe_bias",
                                     "expert_dtype"), 24 * 2048),  # the 24 shared-expert gates
    # LayerNorm keeps its bias (norm_bias None resolves to it); the lm_head bias goes
    "layer structure": (PHI35_MOE, ("mlp", "mlp_bias", "norm_bias", "norm_unit_offset", "parallel_block",
                                    "lm_head_bias"), 32064),
}


@pytest.mark.parametrize("before", sorted(_BEFORE))
def test_a_spec_dict_written_before_the_new_fields_still_loads(before):
    config, new, added = _BEFORE[before]
    spec = from_hf_config(config)
    old = {k: v for k, v in spec.to_dict().items() if k not in new}
    assert ModelSpec.from_dict(old).num_params == spec.num_params - added


def test_an_expert_dtype_without_experts_is_refused():
    with pytest.raises(ModelError, match="without num_experts") as exc:
        dataclasses.replace(from_hf_config(STARLING), expert_dtype="mxfp4")
    assert exc.value.field == "expert_dtype"


def _attention_flops(spec, layer, *, q_len, context):
    return next(o for o in spec.layer_ops(layer, batch=1, q_len=q_len, context=context) if o.name == "attention").flops


def test_llama4_chunked_layers_see_their_own_chunk_not_a_sliding_window():
    spec = from_hf_config(LLAMA4_SCOUT)
    assert spec.chunked_attention and spec.sliding_window == 8192
    # a 16384-token prefill: in the chunked layer 0 each query sees p % 8192 + 1 keys (8192 * 8193 per
    # chunk, two chunks); the global layer 3 sees p + 1 (16384 * 16385 / 2): 1.9999x the chunked work
    chunked, full = (_attention_flops(spec, i, q_len=16384, context=16384) for i in (0, 3))
    assert full / chunked == pytest.approx(16384 * 16385 / 2 / (2 * 8192 * 8193 / 2), rel=1e-6)


def test_decode_in_a_chunked_layer_attends_to_the_chunk_so_far():
    spec = from_hf_config(LLAMA4_SCOUT)
    # position 8291 is the 100th token of its chunk: the same work as a global layer at 100 tokens
    assert _attention_flops(spec, 0, q_len=1, context=8192 + 100) == _attention_flops(spec, 3, q_len=1, context=100)


# -- plain-MLP families: structure ---------------------------------------------------------
def test_starcoder2_layer_is_a_plain_mlp_with_biases_and_two_layernorms():
    # q, o: 2 x (3072^2 + 3072); k, v (2 KV heads of 128): 2 x (3072 x 256 + 256); c_fc: 3072 x 12288 + 12288;
    # c_proj: 12288 x 3072 + 3072; input and post-attention LayerNorm: 2 x (3072 + 3072)
    spec = from_hf_config(STARCODER2_3B)
    attention = 2 * (3072 * 3072 + 3072) + 2 * (3072 * 256 + 256)
    mlp = 3072 * 12288 + 12288 + 12288 * 3072 + 3072
    assert (spec.mlp, spec.mlp_bias, spec.norm, spec.norm_bias) == ("plain", True, "layernorm", True)
    assert spec.layer_params(0) == attention + mlp + 2 * 2 * 3072


def test_issue_26_eight_layer_starcoder2_is_planned_at_transformers_count_not_as_a_gated_mlp(transformers):
    # the report: 1.372 B planned (gated MLP, RMSNorm, no biases) against 1.070 B in transformers
    config = {**STARCODER2_3B, "num_hidden_layers": 8, "tie_word_embeddings": False}
    expected = _meta_params(transformers, transformers.Starcoder2Config(**config))
    assert from_hf_config(config).num_params == expected == 1_069_828_096


def test_plain_mlp_layer_ops_are_fc1_an_activation_and_fc2():
    ops = {o.name: o for o in from_hf_config(STARCODER2_3B).layer_ops(0, batch=2, q_len=64, context=64)}
    assert "gate_up_proj" not in ops and "down_proj" not in ops
    assert (ops["fc1"].shape, ops["fc2"].shape) == ((128, 12288, 3072), (128, 3072, 12288))
    assert (ops["mlp_act"].kind, ops["mlp_act"].shape) == ("gelu", (128, 12288))
    assert ops["mlp_act"].bytes == 2 * 128 * 12288 * 2  # reads fc1's output, writes the activation: bf16


def test_phi2_attention_and_mlp_share_one_layernorm_and_join_the_residual_together():
    spec = from_hf_config(PHI2)
    assert (spec.parallel_block, spec.norms_per_layer, spec.lm_head_bias) == (True, 1, True)
    names = [o.name for o in spec.layer_ops(0, batch=1, q_len=8, context=8)]
    assert [n for n in names if n.endswith("norm")] == ["input_norm"]
    assert names.count("residual_add") == 2 and names.index("residual_add") > names.index("fc2")


def test_phi2_head_has_a_bias_beside_its_untied_weights():
    assert from_hf_config(PHI2).lm_head_params == 51200 * 2560 + 51200


def test_pythia_mlp_normalises_the_layer_input_itself_in_a_parallel_block():
    spec = from_hf_config(PYTHIA_1B)
    assert (spec.parallel_block, spec.norms_per_layer, spec.tied_embeddings) == (True, 2, False)
    names = [o.name for o in spec.layer_ops(0, batch=1, q_len=8, context=8)]
    assert names.index("pre_mlp_norm") < names.index("fc1") and names.index("residual_add") > names.index("fc2")


def test_falcon_7b_is_multi_query_attention_with_one_kv_head():
    spec = from_hf_config(FALCON_7B)
    assert (spec.num_kv_heads, spec.head_dim, spec.intermediate_size) == (1, 64, 4 * 4544)
    ops = {o.name: o for o in spec.layer_ops(0, batch=1, q_len=1, context=2048)}
    assert ops["qkv_proj"].shape == (1, (71 + 2) * 64, 4544)
    # K and V of one head of 64, 2 bytes each, per token per layer
    assert kv_cache_bytes(spec, batch=1, context=2048) == 32 * 2048 * 2 * 64 * 2


def test_falcon_40b_has_eight_kv_heads_and_its_own_norm_for_the_mlp():
    spec = from_hf_config(FALCON_40B)
    assert (spec.num_kv_heads, spec.norms_per_layer, spec.parallel_block) == (8, 2, True)


def test_gemma_norms_scale_by_one_plus_weight_without_more_weights():
    spec = from_hf_config(GEMMA3_27B)
    assert spec.norm_unit_offset and not spec.norm_bias
    plain = dataclasses.replace(spec, norm_unit_offset=False)
    assert plain.num_params == spec.num_params


#: layouts beyond the published configs, each a rule of from_hf_config checked against transformers' model
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "starcoder2 use_bias false": ("Starcoder2Config", {**STARCODER2_3B, "num_hidden_layers": 2, "use_bias": False}),
    "phi qk_layernorm": ("PhiConfig", {**PHI2, "num_hidden_layers": 2, "qk_layernorm": True}),
    "phi grouped kv heads": ("PhiConfig", {**PHI2, "num_hidden_layers": 2, "num_key_value_heads": 8}),
    "gpt_neox sequential without attention bias": (
        "GPTNeoXConfig", {**PYTHIA_1B, "num_hidden_layers": 2, "use_parallel_residual": False,
                          "attention_bias": False}),
    "gpt_neox tied head": ("GPTNeoXConfig", {**PYTHIA_1B, "num_hidden_layers": 2, "tie_word_embeddings": True}),
    "falcon-rw sequential multi-head with biases": (
        "FalconConfig", {**FALCON_7B, "hidden_size": 2048, "num_attention_heads": 32, "num_hidden_layers": 2,
                         "multi_query": False, "parallel_attn": False, "bias": True, "alibi": True,
                         "vocab_size": 50304}),
    "falcon new decoder one norm": ("FalconConfig", {**FALCON_40B, "num_hidden_layers": 2,
                                                     "num_ln_in_parallel_attn": 1}),
    "falcon ffn_hidden_size": ("FalconConfig", {**FALCON_7B, "num_hidden_layers": 2, "ffn_hidden_size": 8192}),
    "falcon untied": ("FalconConfig", {**FALCON_7B, "num_hidden_layers": 2, "tie_word_embeddings": False}),
    "granite gated mlp_bias": ("GraniteConfig", {**GRANITE31_8B, "num_hidden_layers": 2, "mlp_bias": True}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_layout_variants_match_transformers_on_meta(transformers, variant):
    cls, config = VARIANTS[variant]
    assert from_hf_config(config).num_params == _meta_params(transformers, getattr(transformers, cls)(**config))


# -- what autoopt cannot size exactly is refused, naming the key ----------------------------
def _deepseek_v3() -> dict[str, Any]:
    from autoopt.planning.catalog import _entries

    return dict(_entries()["deepseek-v3"]["config"])


#: behaviour -> (config, what the message says, the key it names)
REFUSALS: dict[str, tuple[Any, str, str]] = {
    "use_parallel_residual on a family that does not read it": (
        lambda: {**OLMO2_7B, "use_parallel_residual": True}, "autoopt reads it for gpt_neox only",
        "use_parallel_residual"),
    "a structural key in a model_type nobody described": (
        lambda: {**STARLING, "use_bias": True}, "a model_type nobody described with it cannot", "use_bias"),
    "an mlp_type starcoder2 does not build": (
        lambda: {**STARCODER2_3B, "mlp_type": "gated"}, "c_fc/c_proj", "mlp_type"),
    "a norm_type starcoder2 does not build": (
        lambda: {**STARCODER2_3B, "norm_type": "rms_norm"}, r"nn\.LayerNorm", "norm_type"),
    "an activation autoopt does not cost": (
        lambda: {**PHI2, "hidden_act": "relu"}, "'relu' is not one autoopt models", "hidden_act"),
    "falcon's activation, read from its own key": (
        lambda: {**FALCON_7B, "activation": "relu"}, "'relu'", "activation"),
    "a gelu mlp in a model_type nobody described (plain or gated unknown)": (
        lambda: {**STARLING, "hidden_act": "gelu_new"}, "plain in some families", "hidden_act"),
    "falcon new_decoder_architecture without parallel_attn": (
        lambda: {**FALCON_40B, "parallel_attn": False}, "no checkpoint has this layout", "parallel_attn"),
    "falcon two parallel norms without the new decoder architecture": (
        lambda: {**FALCON_7B, "num_ln_in_parallel_attn": 2}, "builds norms FalconDecoderLayer does not run",
        "num_ln_in_parallel_attn"),
    "biases on latent attention": (
        lambda: {**_deepseek_v3(), "attention_bias": True}, "multi-head latent attention", "attention_bias"),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_what_autoopt_cannot_size_exactly_is_refused_naming_the_key(refusal):
    config, message, key = REFUSALS[refusal]
    with pytest.raises(ModelError, match=message) as exc:
        from_hf_config(config())
    assert exc.value.field == key


def test_a_structural_key_set_false_where_it_is_not_read_changes_nothing():
    assert from_hf_config({**OLMO2_7B, "use_parallel_residual": False}) == from_hf_config(OLMO2_7B)
