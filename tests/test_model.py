"""ModelSpec: parsing (HF config, catalog, torch Module), validation, parameter counts, op lists."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autoopt.errors import ModelError
from autoopt.planning.catalog import get_model, model_names, parse_model
from autoopt.planning.model import ModelSpec, from_hf_config

LLAMA3_8B_HF = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

# Published totals (model cards / papers), billions.
PUBLISHED_TOTAL = {"llama-3-8b": 8.03, "llama-3-70b": 70.6, "mistral-7b": 7.24, "mixtral-8x7b": 46.7,
                   "qwen2.5-7b": 7.62, "qwen2.5-72b": 72.7, "gemma-2-9b": 9.24, "deepseek-v3": 671.0,
                   # model cards / technical reports (sources in models.yaml); Scout: the text model
                   # (107.8 B of the 109 B, the rest is the vision encoder), Gemma 3: report Table 1;
                   # Maverick: 400 B with its vision encoder (tests/test_model_families.py adds it)
                   "qwen3-30b-a3b": 30.5, "qwen3-235b-a22b": 235.0, "gpt-oss-20b": 20.91, "gpt-oss-120b": 116.83,
                   "gemma-3-27b": 27.0,
                   "llama-4-scout": 107.8, "llama-4-maverick": 400.0,
                   # plain-MLP families (model cards; Pythia: its suite's models table, to the unit)
                   "starcoder2-3b": 3.03, "phi-2": 2.78, "pythia-1b": 1.011781632, "falcon-7b": 6.92,
                   # the Hub's safetensors total for Qwen/Qwen3-8B, to the unit (its card: 8.2B)
                   "qwen3-8b": 8.190735360}


def test_qwen3_8b_is_sized_to_the_parameter_and_qwen3_235b_activates_22_billion():
    assert get_model("qwen3-8b").num_params == 8_190_735_360
    assert get_model("qwen3-235b-a22b").active_params / 1e9 == pytest.approx(22.0, rel=0.5 / 22)


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_parameter_count_matches_published_total(name):
    assert get_model(name).num_params / 1e9 == pytest.approx(PUBLISHED_TOTAL[name], rel=0.015)


def test_mixtral_active_parameters_are_12_9_billion():
    # 32 x (attention 41.94 M + 2 experts x 176.16 M + router 32768) + 2 x 131.07 M embeddings = 12.88 B
    assert get_model("mixtral-8x7b").active_params / 1e9 == pytest.approx(12.9, rel=0.015)


def test_deepseek_v3_active_parameters_are_37_billion():
    # 3 dense layers + 58 MoE layers with 8 routed + 1 shared expert, MLA, both embeddings: 37.55 B
    # (the paper's "37 B" is rounded to the billion; 37.55/37 = +1.49 %).
    assert get_model("deepseek-v3").active_params / 1e9 == pytest.approx(37.0, rel=0.015)


def test_llama3_8b_exact_parameter_count():
    # embed + head: 2 x 128256 x 4096 = 1,050,673,152; per layer: q,o 2 x 4096^2 + k,v 2 x 4096 x 1024
    # + mlp 3 x 4096 x 14336 + 2 norms x 4096 = 218,112,000; x 32 = 6,979,584,000; + final norm 4096.
    assert get_model("llama-3-8b").num_params == 1_050_673_152 + 6_979_584_000 + 4096


def test_hf_config_dict_parses_to_catalog_spec():
    spec = from_hf_config(LLAMA3_8B_HF, name="llama-3-8b")
    cat = get_model("llama-3-8b")
    assert (spec.hidden_size, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (4096, 8, 128, 128256)
    assert spec.num_params == cat.num_params


def test_hf_config_path_parses(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B_HF))
    assert parse_model(tmp_path / "config.json").num_layers == 32
    assert parse_model(str(tmp_path)).num_layers == 32


def test_missing_field_names_it():
    cfg = {k: v for k, v in LLAMA3_8B_HF.items() if k != "intermediate_size"}
    with pytest.raises(ModelError) as exc:
        from_hf_config(cfg)
    assert exc.value.field == "intermediate_size"


def test_zero_size_is_refused():
    with pytest.raises(ModelError) as exc:
        from_hf_config({**LLAMA3_8B_HF, "num_hidden_layers": 0})
    assert exc.value.field == "num_hidden_layers"


def test_heads_must_divide_hidden_without_explicit_head_dim():
    with pytest.raises(ModelError) as exc:
        from_hf_config({**LLAMA3_8B_HF, "num_attention_heads": 30, "num_key_value_heads": 10})
    assert exc.value.field == "num_attention_heads"


def test_explicit_head_dim_allows_heads_not_dividing_hidden():
    gemma = get_model("gemma-2-9b")  # 16 heads x 256 = 4096 != hidden 3584
    assert (gemma.num_attention_heads * gemma.head_dim, gemma.hidden_size) == (4096, 3584)


def test_kv_heads_must_divide_heads():
    with pytest.raises(ModelError) as exc:
        from_hf_config({**LLAMA3_8B_HF, "num_key_value_heads": 5})
    assert exc.value.field == "num_key_value_heads"


def test_unknown_architecture_is_refused():
    with pytest.raises(ModelError) as exc:
        from_hf_config({**LLAMA3_8B_HF, "model_type": "mamba", "architectures": ["MambaForCausalLM"]})
    assert exc.value.field == "model_type"


def test_unknown_catalog_name_suggests_close_names():
    with pytest.raises(ModelError, match="llama-3-8b"):
        parse_model("llama-3-8")


def test_catalog_lists_the_models_with_published_counts():
    assert set(model_names()) == set(PUBLISHED_TOTAL)


def test_gemma2_alternates_local_and_global_layers_from_layer_zero():
    g = get_model("gemma-2-9b")
    assert [g.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    assert g.kv_len(0, 8192) == 4096 and g.kv_len(1, 8192) == 8192


def test_qwen_sliding_window_is_off_when_use_sliding_window_false():
    assert get_model("qwen2.5-7b").sliding_window is None


def test_deepseek_v3_is_fp8_mla_with_three_dense_layers():
    d = get_model("deepseek-v3")
    assert d.dtype == "fp8" and d.is_mla
    assert [d.is_moe_layer(i) for i in (0, 2, 3, 60)] == [False, False, True, True]


def test_round_trip_through_dict():
    spec = get_model("mixtral-8x7b")
    assert ModelSpec.from_dict(spec.to_dict()) == spec


def test_from_dict_unknown_field_is_named():
    with pytest.raises(ModelError) as exc:
        ModelSpec.from_dict({**get_model("llama-3-8b").to_dict(), "hiden_size": 1})
    assert exc.value.field == "hiden_size"


@pytest.mark.parametrize("value", [0, 49, True])
def test_an_moe_layer_step_outside_1_to_the_layer_count_is_named(value):
    with pytest.raises(ModelError, match=r"1\.\.num_layers \(48\)") as exc:
        dataclasses.replace(get_model("llama-4-maverick"), moe_layer_step=value)
    assert exc.value.field == "moe_layer_step"


def test_chunked_attention_without_a_chunk_length_is_named():
    with pytest.raises(ModelError, match="only with sliding_window") as exc:
        dataclasses.replace(get_model("llama-3-8b"), chunked_attention=True)
    assert exc.value.field == "chunked_attention"


def test_llama_layer_ops_are_the_projection_gemms():
    ops = {o.name: o for o in get_model("llama-3-8b").layer_ops(0, batch=2, q_len=128, context=128)}
    # qkv: N = (32 + 2 x 8) x 128 = 6144; gate_up: N = 2 x 14336
    assert ops["qkv_proj"].shape == (256, 6144, 4096)
    assert ops["o_proj"].shape == (256, 4096, 4096)
    assert ops["gate_up_proj"].shape == (256, 28672, 4096)
    assert ops["down_proj"].shape == (256, 4096, 14336)
    assert ops["attention"].op is None and ops["input_norm"].op.kind == "rmsnorm"


def test_decode_ops_use_gemv():
    ops = {o.name: o for o in get_model("llama-3-8b").layer_ops(0, batch=1, q_len=1, context=4096)}
    assert ops["qkv_proj"].kind == "gemv" and ops["qkv_proj"].shape == (1, 6144, 4096)


def test_moe_decode_touches_top_k_experts_with_one_token_each():
    ops = {o.name: o for o in get_model("mixtral-8x7b").layer_ops(0, batch=1, q_len=1, context=512)}
    # one token, top-2 of 8: E(1-(1-k/E)^1) = 2 experts, 1 token each
    assert ops["expert_gate_up"].count == 2 and ops["expert_gate_up"].shape == (1, 28672, 4096)
    assert ops["router"].shape == (1, 8, 4096)


def test_mla_decode_attends_over_the_latent():
    ops = {o.name: o for o in get_model("deepseek-v3").layer_ops(3, batch=1, q_len=1, context=1000)}
    assert ops["attention"].shape == (1, 128, 1, 1000, 512 + 64)
    assert ops["shared_gate_up"].shape == (1, 4096, 7168)


def test_torch_module_is_walked_without_running():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_heads, self.head_dim = 4, 16
            self.q_proj, self.k_proj = nn.Linear(64, 64, bias=False), nn.Linear(64, 32, bias=False)
            self.v_proj, self.o_proj = nn.Linear(64, 32, bias=False), nn.Linear(64, 64, bias=False)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attn()
            self.gate_proj, self.up_proj = nn.Linear(64, 160, bias=False), nn.Linear(64, 160, bias=False)
            self.down_proj = nn.Linear(160, 64, bias=False)
            self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(64), nn.RMSNorm(64)

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(1000, 64)
            self.layers = nn.ModuleList([Block() for _ in range(3)])
            self.lm_head = nn.Linear(64, 1000, bias=False)

    with torch.device("meta"):
        m = Tiny()
    spec = parse_model(m)
    assert (spec.hidden_size, spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim,
            spec.intermediate_size, spec.vocab_size, spec.tied_embeddings) == (64, 3, 4, 2, 16, 160, 1000, False)
    # walk count equals the module's own parameter count
    assert spec.num_params == sum(p.numel() for p in m.parameters()) + 64  # + final norm the module lacks


@pytest.mark.parametrize("make", [lambda tmp: Path("/dev/urandom"), lambda tmp: tmp,
                                  lambda tmp: _fifo(tmp), lambda tmp: _huge(tmp), lambda tmp: _binary(tmp)])
def test_a_config_path_that_is_not_a_small_regular_json_file_is_refused_without_reading_it(tmp_path, make):
    from autoopt.errors import ModelError
    from autoopt.planning.model import from_hf_config as read

    with pytest.raises(ModelError, match=r"regular file|at most|not UTF-8|no config file"):
        read(make(tmp_path))


def _fifo(tmp):
    import os

    path = tmp / "config.json"
    os.mkfifo(path)
    return path


def _huge(tmp):
    path = tmp / "big.json"
    with path.open("wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of nothing
    return path


def _binary(tmp):
    path = tmp / "bin.json"
    path.write_bytes(b"\xff\xfe\x00junk")
    return path
