"""recommend(): worked examples with hand-checked numbers, and the shape of a Recommendation."""

from __future__ import annotations

import json
import statistics

import pytest
from _recommend_hw import H100, RTX3070, one

from autoopt.errors import ModelError
from autoopt.hardware.library import known_names, load_profile
from autoopt.planning.catalog import get_model
from autoopt.planning.quant import choose_format
from autoopt.planning.recommendation import recommend


@pytest.fixture(scope="module")
def llama8b_h100():
    # batch 8, 7168-token prompts + 1024 generated = 8192 context, weights forced to BF16.
    return recommend("h100-sxm", "llama-3-8b", batch=8, prompt_len=7168, gen_len=1024, weight_dtype="bf16",
                     compare_wfc=True)


def test_llama3_8b_bf16_fits_one_h100_with_stated_headroom(llama8b_h100):
    # weights 16,060,522,496 + KV 32 x 8 x 128 x 2 x 8192 x 8 x 2 B = 8,589,934,592
    # + activations 842,964,992 + workspace 33,554,432 + reserve 1,003,316,480 + fragmentation 471,644,979.2
    # = 27,001,937,971.2 of 85,520,809,984 B -> 58,518,872,012.8 B (68.43 %) left for more KV.
    rec = llama8b_h100
    assert rec.fits and rec.split.kind == "single"
    (mem,) = rec.memory
    assert mem.kv_cache_bytes == 8_589_934_592
    assert mem.headroom_bytes == pytest.approx(58_518_872_012.8)
    assert mem.headroom_pct == pytest.approx(68.43, abs=0.01)


def test_ops_are_deduplicated_across_layers_and_labelled_predicted(llama8b_h100):
    d = llama8b_h100.to_dict()
    qkv = [o for o in d["ops"] if o["name"] == "qkv_proj" and o["phase"] == "prefill"]
    assert len(qkv) == 1 and qkv[0]["occurrences"] == 32 and qkv[0]["label"] == "predicted"
    # 57344 x 6144 x 4096 > 2^40 elements: beyond one launch's indexing, so costed by the roofline
    assert qkv[0]["shape"] == [8 * 7168, 6144, 4096] and qkv[0]["source"] == "roofline"
    decode_qkv = next(o for o in d["ops"] if o["name"] == "qkv_proj" and o["phase"] == "decode")
    assert decode_qkv["kind"] == "gemv" and decode_qkv["shape"] == [8, 6144, 4096]
    assert decode_qkv["source"] == "rank" and decode_qkv["config"] and decode_qkv["predicted_us"] > 0


def test_recommendation_is_json_and_explains_itself(llama8b_h100):
    d = json.loads(json.dumps(llama8b_h100.to_dict()))
    assert d["quant"]["format"] == "bf16" and d["label"] == "predicted"
    text = llama8b_h100.explain()
    assert "llama-3-8b" in text and "fits" in text and "Kernel configs" in text and "WFC" in text


def test_per_layer_plan_dp_is_no_worse_than_wfc(llama8b_h100):
    rec = llama8b_h100
    assert len(rec.layer_modes) == 32
    assert rec.plan.cost <= rec.plan_alternative.cost + 1e-6


def test_the_wfc_comparison_is_made_only_when_asked():
    # a runtime's start-up call skips the diagnostic second solver; the plan is the DP's either way
    plain = recommend("h100-sxm", "llama-3-8b")
    asked = recommend("h100-sxm", "llama-3-8b", compare_wfc=True)
    assert plain.plan_alternative is None and "WFC" not in plain.explain()
    assert asked.plan_alternative is not None and asked.plan_alternative.solver == "wfc"
    assert plain.layer_modes == asked.layer_modes and plain.plan.cost == asked.plan.cost


def test_kernel_implementation_is_chosen_per_class(llama8b_h100):
    classes = {i["kernel_class"] for i in llama8b_h100.impls}
    assert {"gemm", "gemv", "attention", "rmsnorm"} <= classes


def test_llama3_70b_bf16_does_not_fit_one_h100():
    rec = recommend(one(H100, "h100"), "llama-3-70b", weight_dtype="bf16", prompt_len=512, gen_len=64,
                    compare_wfc=False)
    assert not rec.fits and rec.split is None and not rec.memory[0].fits


def test_llama3_70b_bf16_splits_over_two_or_four_h100():
    rec = recommend("h100-sxm-8x", "llama-3-70b", weight_dtype="bf16", prompt_len=512, gen_len=64,
                    max_devices=4)
    assert rec.fits and rec.split.num_devices in (2, 4)
    assert all(m.fits for m in rec.memory)


def test_seven_b_model_on_an_8gb_gpu_gets_a_4_bit_format():
    rec = recommend(one(RTX3070, "rtx-3070"), "mistral-7b", preference="speed", prompt_len=512, gen_len=64)
    assert rec.quant.format.name == "q4_k_m" and rec.fits
    assert rec.memory[0].total_bytes <= 8 * 1024**3


def test_balanced_on_8gb_goes_to_4_bit_when_long_context_needs_the_room():
    # 4 x 8192 tokens of Mistral KV (window 4096): 32 x 8 x 128 x 2 x 4096 x 4 x 2 B = 2.15 GB
    fmt = recommend(one(RTX3070, "rtx-3070"), "mistral-7b", batch=4, prompt_len=4096, gen_len=4096,
                    compare_wfc=False).quant.format
    assert fmt.name in ("q4_k_m", "q5_k_m") and fmt.bits < 6


def test_nvfp4_is_never_chosen_below_sm100():
    for name in known_names():
        hw = load_profile(name)
        gpu = hw.gpu
        if gpu is None or gpu.vendor != "nvidia" or gpu.cc is None or gpu.cc >= (10, 0):
            continue
        for pref in ("speed", "balanced", "quality"):
            fmt = choose_format(gpu, get_model("llama-3-8b"), preference=pref).format
            assert fmt.name not in ("nvfp4", "mxfp4"), (name, pref)


def test_nvfp4_is_the_speed_choice_on_blackwell():
    b200 = load_profile("b200").gpu
    assert choose_format(b200, get_model("llama-3-70b"), preference="speed").format.name == "nvfp4"


def test_hf_config_and_profile_file_are_accepted(tmp_path):
    path = tmp_path / "h100.json"
    path.write_text(load_profile("h100-sxm").to_json())
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    rec = recommend(str(path), cfg, batch=8, prompt_len=7168, gen_len=1024, weight_dtype="bf16", compare_wfc=False)
    assert rec.fits and rec.model.num_params == get_model("llama-3-8b").num_params


def test_a_plain_mlp_splits_fc1_by_columns_and_fc2_by_rows_under_tensor_parallelism():
    rec = recommend("h100-sxm-8x", "pythia-1b", tensor_parallel=2, compare_wfc=False, top=1)
    ops = {o.name: o for o in rec.ops if o.phase == "decode"}
    # GPTNeoXMLP: 2048 -> 8192 -> 2048; each of 2 ranks holds half of the 8192 columns
    assert rec.split is not None and rec.split.tp == 2
    assert (ops["fc1"].shape, ops["fc2"].shape, ops["mlp_act"].shape) == ((1, 4096, 2048), (1, 2048, 4096),
                                                                           (1, 4096))


def test_bad_model_is_a_model_error():
    with pytest.raises(ModelError):
        recommend("h100-sxm", "no-such-model")


@pytest.mark.parametrize("kwargs, field", [({"batch": 10**12}, "batch"), ({"batch": 0}, "batch"),
                                           ({"prompt_len": -1}, "prompt_len"), ({"context": 10**9}, "context"),
                                           ({"gen_len": 2.5}, "gen_len")])
def test_an_out_of_range_request_names_the_option_and_the_accepted_range(kwargs, field):
    from autoopt.errors import ModelError
    from autoopt.hardware.library import load_profile as load
    from autoopt.planning.recommendation import recommend as rec

    with pytest.raises(ModelError, match=rf"{field} must be an integer in 1\.\.\d+") as info:
        rec(load("h100-sxm"), "llama-3-8b", **kwargs)
    assert info.value.field == field


# -- decode replayed from a CUDA graph ---------------------------------------------------------------------------

def _decode(**kw):
    return recommend(load_profile("h100-sxm"), "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                     weight_dtype="bf16", max_devices=1, **kw)


def test_cuda_graphs_price_each_decode_kernel_at_its_in_graph_launch():
    from autoopt.kernels.constants import constants
    from autoopt.planning.recommendation import GLUE_KERNEL_US, GRAPH_LAUNCH_US

    plain, graphed = _decode(), _decode(cuda_graphs=True)
    saved = plain.predicted["decode_step_us"] - graphed.predicted["decode_step_us"]
    per_launch = constants().launch_us - GRAPH_LAUNCH_US
    # ranked ops (one kernel each) drop a standalone launch for an in-graph one; roofline-priced ones
    # (attention) gain one; the rotary/KV-cache glue's 2 kernels drop from a standalone launch to their floor
    attention = sum(o.occurrences for o in plain.ops if o.kernel_class == "attention")
    glue = sum(o.occurrences for o in plain.ops if o.kernel_class == "rotary")
    kernels = sum(o.occurrences for o in plain.ops) - attention - glue
    expected = kernels * per_launch - attention * GRAPH_LAUNCH_US + glue * 2 * (constants().launch_us - GLUE_KERNEL_US)
    assert glue == 32
    assert saved == pytest.approx(expected, rel=1e-6)
    assert graphed.workload.to_dict()["cuda_graphs"] is True and "cuda_graphs" not in plain.workload.to_dict()


def _residual_adds(batch, cuda_graphs, runtime="autoopt"):
    rec = recommend(load_profile("h100-sxm"), "llama-3-8b", batch=batch, prompt_len=128, gen_len=128,
                    phase="decode", weight_dtype="bf16", max_devices=1, runtime=runtime, cuda_graphs=cuda_graphs)
    return [o for o in rec.ops if o.name == "residual_add"]


@pytest.mark.parametrize("runtime", ["autoopt", "transformers"])
def test_a_graphed_decode_steps_residual_add_is_priced_fused_into_inductors_norm(runtime):
    # the add's own graphed price less the 0.8 us a fused add measured to save a step (H200, step_variants.json)
    from autoopt.planning.recommendation import INDUCTOR_ADD_FUSION_SAVES_US

    (fused,) = _residual_adds(1, True, runtime)
    (own,) = _residual_adds(1, True, None)  # no runtime named: no Inductor assumed
    assert fused.predicted_us == pytest.approx(own.predicted_us - INDUCTOR_ADD_FUSION_SAVES_US)
    assert INDUCTOR_ADD_FUSION_SAVES_US == 0.8 and fused.occurrences == 64


@pytest.mark.parametrize("batch,graphs", [(1, False), (32, True)])
def test_an_uncompiled_or_batched_steps_residual_add_stays_its_own_kernel(batch, graphs):
    (add,) = _residual_adds(batch, graphs)
    (plain,) = _residual_adds(batch, graphs, None)
    assert add.source == "rank" and add.predicted_us == plain.predicted_us


def test_cuda_graphs_leave_prefill_alone():
    kw = dict(batch=1, prompt_len=2048, gen_len=1, phase="prefill", weight_dtype="bf16", max_devices=1)
    h100 = load_profile("h100-sxm")
    assert recommend(h100, "llama-3-8b", cuda_graphs=True, **kw).predicted == \
        recommend(h100, "llama-3-8b", **kw).predicted


def test_cuda_graphs_must_be_a_bool():
    with pytest.raises(ModelError, match="field 'cuda_graphs': must be a bool, got 'yes'"):
        _decode(cuda_graphs="yes")


def test_a_decode_attention_is_priced_at_least_at_its_measured_latency_floor():
    from autoopt.planning.recommendation import ATTENTION_DECODE_MIN_US

    att = [o for o in _decode().ops if o.kernel_class == "attention"]
    assert att and all(o.predicted_us == pytest.approx(ATTENTION_DECODE_MIN_US) for o in att)


def test_transformers_attention_is_priced_with_the_seven_glue_kernels_it_launches_under_compile():
    from autoopt.planning.recommendation import GLUE_KERNEL_US

    glue = [o for o in _decode(runtime="transformers", cuda_graphs=True).ops if o.kernel_class == "rotary"]
    assert [o.occurrences for o in glue] == [32]
    assert glue[0].predicted_us == pytest.approx(7 * GLUE_KERNEL_US)


def test_autoopts_decode_attention_is_priced_with_the_five_glue_kernels_its_compiled_step_launches():
    # three rotary kernels, the cache write and an add-copy a layer in the H200's compiled traces
    from autoopt.planning.recommendation import GLUE_KERNEL_US

    glue = [o for o in _decode(runtime="autoopt", cuda_graphs=True).ops if o.kernel_class == "rotary"]
    assert [o.occurrences for o in glue] == [32]
    assert glue[0].predicted_us == pytest.approx(5 * GLUE_KERNEL_US)


@pytest.mark.parametrize("runtime", ["autoopt", "transformers"])
def test_a_greedy_runtimes_decode_step_prices_torchs_argmax_over_the_vocabulary(runtime):
    # one block walks a row's 128256 logits: 0.271 ns a logit, 34.8 us, at any batch (H100 28-37, H200 34-36 us)
    from autoopt.planning.recommendation import ARGMAX_NS_PER_LOGIT

    for batch in (1, 32):
        rec = recommend("h200", "llama-3-8b", batch=batch, prompt_len=128, gen_len=64, phase="decode",
                        runtime=runtime, weight_dtype="bf16", max_devices=1, cuda_graphs=True)
        (argmax,) = [o for o in rec.ops if o.name == "argmax"]
        assert argmax.occurrences == 1 and argmax.kernel_class == "reduction"
        assert argmax.predicted_us == pytest.approx(128256 * ARGMAX_NS_PER_LOGIT * 1e-3)
        assert argmax.predicted_us == pytest.approx(34.76, abs=0.01)


def test_a_serving_runtime_has_no_argmax_priced_in_its_step():
    rec = recommend("h200", "llama-3-8b", batch=1, prompt_len=128, gen_len=64, phase="decode", runtime="vllm",
                    weight_dtype="bf16", max_devices=1, cuda_graphs=True)
    assert not [o for o in rec.ops if o.name == "argmax"]


def test_under_optimize_decode_attention_is_autoopts_kernel_at_its_choice_and_in_step_price_without_the_copy():
    from autoopt.kernels.attention import decode_attention_choice, in_step_us
    from autoopt.planning.recommendation import GLUE_KERNEL_US

    rec = recommend("h200", "llama-3-8b", batch=32, prompt_len=128, gen_len=64, phase="decode",
                    runtime="autoopt", weight_dtype="bf16", max_devices=1, cuda_graphs=True)
    glue = next(o for o in rec.ops if o.kernel_class == "rotary")
    attention = next(o for o in rec.ops if o.kernel_class == "attention")
    keys = attention.shape[3]
    choice = decode_attention_choice(load_profile("h200").gpus[0], batch=32, heads=32, kv_heads=8, keys=keys,
                                     head_dim=128)
    in_step = in_step_us(choice, load_profile("h200").gpus[0], batch=32, kv_heads=8, keys=keys, head_dim=128)
    assert attention.predicted_us == pytest.approx(in_step) and attention.source == "fit"
    assert attention.config == {"BLOCK_N": choice.BLOCK_N, "splits": choice.splits, "num_warps": 4}
    assert glue.predicted_us == pytest.approx(5 * GLUE_KERNEL_US)  # no repeat_kv copy: the kernels' latency floor


def test_at_batch_32_the_glue_prices_repeat_kv_and_sdpa_reading_its_copies_at_the_measured_rate():
    # Llama-3-8B, batch 32 over 192 keys: 25.2 MB of K/V a layer; the copy moves 5x, SDPA reads 4x (one of
    # them priced by the attention op) at 0.70 of the 2948 GB/s stream: 92.9 us with q/k/v's own bytes
    # (quant_trace_b32_layers8.json measured 43.8 us of copy + 49.0 us of SDPA)
    rec = recommend("h100-sxm", "llama-3-8b", batch=32, prompt_len=128, gen_len=64, phase="decode",
                    runtime="transformers", weight_dtype="bf16", max_devices=1, cuda_graphs=True)
    glue = next(o for o in rec.ops if o.kernel_class == "rotary")
    attention = next(o for o in rec.ops if o.kernel_class == "attention")
    assert glue.predicted_us == pytest.approx(83.2, abs=0.1)
    assert glue.predicted_us + attention.predicted_us == pytest.approx(92.9, abs=0.1)


def test_sdpa_efficiency_applies_to_decode_only():
    from autoopt.planning.recommendation import SDPA_DECODE_KV_EFFICIENCY

    kw = dict(batch=1, prompt_len=2048, gen_len=1, phase="prefill", weight_dtype="bf16", max_devices=1,
              runtime="autoopt")
    glue = next(o for o in recommend("h100-sxm", "llama-3-8b", **kw).ops if o.kernel_class == "rotary")
    # 2048 tokens: 50.3 MB of q/k/v and cache writes plus 8 x 8.4 MB of K/V copies and their reads, all at the
    # stream rate (117.4 MB at 2948 GB/s); at 0.70 the reads would add 11.4 us
    assert SDPA_DECODE_KV_EFFICIENCY == 0.70
    assert glue.predicted_us == pytest.approx(39.84, abs=0.01)


def test_fastest_preference_keeps_the_format_predicted_fastest_and_names_the_others():
    kw = dict(batch=8, phase="decode", runtime="autoopt", max_devices=1, cuda_graphs=True)
    rec = recommend("h100-sxm", "llama-3-8b", preference="fastest", **kw)
    fitting = [name for name, _, fits in rec.quant.considered if fits]
    times = {n: recommend("h100-sxm", "llama-3-8b", weight_dtype=n, **kw).predicted["decode_step_us"] for n in fitting}
    assert rec.preference == "fastest" and rec.quant.format.name == min(times, key=times.get)
    assert rec.predicted["decode_step_us"] == pytest.approx(min(times.values()))
    assert rec.quant.reason.startswith(f"fastest: {rec.quant.format.name} predicted")
    assert all(n in rec.quant.reason for n in fitting)


def test_fastest_preference_with_a_requested_format_plans_that_format():
    rec = recommend("h100-sxm", "llama-3-8b", preference="fastest", weight_dtype="bf16", runtime="autoopt")
    assert rec.quant.format.name == "bf16"


# -- generate()'s per-token host loop ------------------------------------------------------------------------

def test_transformers_generate_is_the_graphed_step_plus_its_host_loop():
    from autoopt.planning.recommendation import GENERATE_HOST_US

    rec = recommend("h100-sxm", "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                    weight_dtype="bf16", cuda_graphs=True, runtime="transformers")
    p = rec.predicted
    assert p["generate_token_us"] == pytest.approx(p["decode_step_us"] + GENERATE_HOST_US["transformers"])
    assert p["generate_host_us"] == GENERATE_HOST_US["transformers"]


@pytest.mark.parametrize("runtime", [None, "vllm"])
def test_no_generate_time_without_a_generate_loop(runtime):
    rec = recommend("h100-sxm", "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                    weight_dtype="bf16", cuda_graphs=True, runtime=runtime)
    assert "generate_token_us" not in rec.predicted


# -- uncompiled steps: bound by the host --------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", ["autoopt", "transformers"])
def test_an_uncompiled_step_takes_the_larger_of_its_gpu_and_host_times(runtime):
    from autoopt.planning.recommendation import EAGER_HOST_LAYER_US

    rec = recommend("h100-sxm", "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                    weight_dtype="bf16", runtime=runtime)
    p = rec.predicted
    assert p["decode_host_us"] == 32 * EAGER_HOST_LAYER_US[runtime]
    assert p["decode_step_us"] == max(p["decode_gpu_us"], p["decode_host_us"]) == p["decode_host_us"]
    assert p["generate_token_us"] == p["decode_step_us"] + p["generate_host_us"]


def test_an_awq_checkpoint_in_transformers_adds_its_modules_host_time_to_every_layer():
    from autoopt.planning.recommendation import EAGER_HOST_LAYER_US, TRANSFORMERS_QUANT_HOST_LAYER_US

    rec = recommend("a100-sxm-80gb", "qwen2.5-7b", batch=1, prompt_len=1, gen_len=2048, weight_dtype="awq",
                    runtime="transformers")
    assert rec.predicted["decode_host_us"] == 28 * (EAGER_HOST_LAYER_US["transformers"]
                                                    + TRANSFORMERS_QUANT_HOST_LAYER_US["awq"])


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_an_uncompiled_quantized_optimize_layer_adds_its_formats_host_time(fmt):
    # the eager_host_noise probe: bf16 8.58, int4 9.95, fp8 10.72 ms an 8-layer step on one H100 host
    from autoopt.planning.recommendation import AUTOOPT_QUANT_HOST_LAYER_US, EAGER_HOST_LAYER_US

    rec = recommend("h100-sxm", "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                    weight_dtype=fmt, runtime="autoopt")
    assert rec.predicted["decode_host_us"] == 32 * (EAGER_HOST_LAYER_US["autoopt"] + AUTOOPT_QUANT_HOST_LAYER_US[fmt])


def test_awq_in_transformers_is_predicted_slower_than_bf16_as_qwen_measured_it():
    # Qwen's speed benchmark, A100, transformers 4.46: Qwen2.5-7B bf16 40.38 tok/s, AWQ 32.03 (held out of the fit)
    tokens_s = {}
    for fmt in ("bf16", "awq"):
        rec = recommend("a100-sxm-80gb", "qwen2.5-7b", batch=1, prompt_len=1, gen_len=2048, weight_dtype=fmt,
                        runtime="transformers")
        tokens_s[fmt] = 1e6 / rec.predicted["generate_token_us"]
    assert tokens_s["awq"] < tokens_s["bf16"]
    assert tokens_s["awq"] == pytest.approx(32.03, rel=0.05) and tokens_s["bf16"] == pytest.approx(40.38, rel=0.05)


def test_a_host_bound_request_is_priced_at_its_host_bound_steps_and_generate_loop():
    rec = recommend("h100-sxm", "llama-3-8b", batch=1, prompt_len=128, gen_len=128, weight_dtype="bf16",
                    runtime="transformers")
    p = rec.predicted
    assert p["request_us"] >= 128 * p["generate_token_us"]
    assert p["request_us"] - p["prefill_us"] == pytest.approx(128 * p["generate_token_us"], rel=0.02)


def _glue_bytes(runtime, batch, model="llama-3-8b"):
    """Bytes the attention glue of layer 0 moves at decode over 144 keys, as ``runtime`` runs it."""
    from autoopt.hardware.library import load_profile
    from autoopt.planning import recommendation as r

    spec = r.parse_model(model)
    dev = r.devices_of(load_profile("h100-sxm"))[0]
    layer = spec.layer_ops(0, batch=batch, q_len=1, context=144, dtype="bf16")
    mode = r._Mode(name="bf16", gemm_dtype="bf16", act_bytes=2, weight_ratio=1.0)
    return r._attention_glue(dev, layer, spec.num_kv_heads, runtime, graphed=True, phase="decode", mode=mode, tp=1,
                             mla=spec.is_mla).op.bytes


def test_transformers_attention_moves_its_kv_copies_to_every_query_head():
    # Llama-3-8B: 32 query heads over 8 KV heads (n_rep 4), 144 keys of 128 dims at batch 32: 2 x 4 x K/V bytes
    kv = 2 * 32 * 144 * 8 * 128 * 2
    assert _glue_bytes("transformers", 32) - _glue_bytes("vllm", 32) == 2 * 4 * kv
    assert _glue_bytes("autoopt", 32) == _glue_bytes("transformers", 32)


def test_an_mla_model_has_no_kv_copies_priced():
    assert _glue_bytes("transformers", 8, "deepseek-v3") == _glue_bytes("vllm", 8, "deepseek-v3")


@pytest.mark.parametrize("runtime", [None, "vllm"])
def test_runtimes_without_python_modules_have_no_host_bound_step(runtime):
    rec = recommend("h100-sxm", "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                    weight_dtype="bf16", runtime=runtime)
    assert "decode_host_us" not in rec.predicted


def test_a_graphed_step_is_not_bound_by_the_host():
    rec = recommend("h100-sxm", "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                    weight_dtype="bf16", runtime="autoopt", cuda_graphs=True)
    from autoopt.planning.recommendation import EAGER_HOST_LAYER_US

    assert "decode_host_us" not in rec.predicted
    assert rec.predicted["decode_step_us"] < 32 * EAGER_HOST_LAYER_US["autoopt"]


def test_eager_generate_predictions_are_within_the_host_noise_below_the_older_eager_runs():
    # out of sample: eager generate() of the whole model on an H100 and two H200 hosts, measured while the SwiGLU a
    # layer still paid wrap_triton's eager dispatch (~0.38 ms a layer of host more than today's code, which
    # EAGER_HOST_LAYER_US["autoopt"] prices): today's price sits at or below them, within the +-30 % a host-bound
    # step moves run to run
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    ratios = []
    for profile, name in (("h100-sxm", "h100/e2e_llama-3-8b.json"), ("h200", "h200/e2e_llama-3-8b.json"),
                          ("h200", "h200/e2e_llama-3-8b_eager_optimize.json")):
        measured = json.loads((results / name).read_text())["variants"]["optimize"]["decode_ms_per_token"]
        for batch, ms in measured.items():
            rec = recommend(profile, "llama-3-8b", batch=int(batch), prompt_len=128, gen_len=128, phase="decode",
                            weight_dtype="bf16", runtime="autoopt")
            ratios.append(rec.predicted["generate_token_us"] / 1e3 / ms)
    assert len(ratios) == 6 and all(0.7 <= r <= 1.5 for r in ratios)
    assert 0.75 <= sorted(ratios)[3] <= 1.0  # the upper median


#: committed generate() runs whose optimize()d rows ran transformers' own compiled call (before autoopt's decode
#: graphs): their autoopt rows priced a 1.9 ms loop that optimize() no longer pays, and are not checked
BEFORE_DECODE_GRAPHS = {"quant_e2e.json", "quant_e2e_run3.json", "quant_e2e_int4_torchao.json",
                        "quant_e2e_int4_pairdot.json", "quant_e2e_int4_pairdot_run2.json"}
#: committed runs whose int4 row decoded on the per-byte PTX (``int4_pair_dot``), before the word path the model
#: now prices (``int4_word_dot``: its GEMVs 10.7 % faster in one H200 decode step, ``quant_trace_int4_*_ingraph``)
BEFORE_INT4_WORDS = {"h100/quant_e2e_decode_graphs.json", "h100/quant_e2e_decode_graphs_run2.json",
                     "h100/quant_e2e_decode_graphs_run3.json", "h200/quant_e2e_dqtraced.json"}


def _generate_ratios() -> dict[tuple[str, str], float]:
    """predicted / measured generate() ms a token for every committed run's transformers and autoopt rows."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    files = ["quant_e2e.json", "quant_e2e_run3.json", "quant_e2e_int4_torchao.json", "quant_e2e_int4_pairdot.json",
             "quant_e2e_int4_pairdot_run2.json", "quant_e2e_decode_graphs.json", "quant_e2e_decode_graphs_run2.json",
             "quant_e2e_decode_graphs_run3.json"]
    h200 = ["quant_e2e.json", "quant_e2e_dqtraced.json", "quant_e2e_int4words.json", "quant_e2e_int4words_picks.json",
            "quant_e2e_norm_foreach.json", "quant_e2e_attention.json"]
    runs = [("h100-sxm", results / "h100" / f) for f in files] + [("h200", results / "h200" / f) for f in h200]
    ratios = {}
    for profile, path in runs:
        for name, row in json.loads(path.read_text())["variants"].items():
            impl, fmt = name.split()
            if impl not in ("transformers", "autoopt") or "measured_generate_ms_per_token_median" not in row:
                continue
            key = (f"{path.parent.name}/{path.name}", name)
            stale = impl == "autoopt" and (path.name in BEFORE_DECODE_GRAPHS or key[0] in BEFORE_GRAPH_MASK)
            if stale or (fmt == "int4" and key[0] in BEFORE_INT4_WORDS):
                continue
            rec = recommend(profile, "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                            weight_dtype=fmt, cuda_graphs=True, runtime=impl)
            ratios[key] = rec.predicted["generate_token_us"] / 1e3 / row["measured_generate_ms_per_token_median"]
    return ratios


#: the one committed generate() row beyond 15 %: the H200 host of 2026-11-28's evening ran every variant faster
#: than the model's loop constants (its bf16 + compile 7.08 ms a token against 8.15 on the morning's host), and
#: the decode attention had just moved into the compiled step: int4 priced 1.17x its 3.01 ms
FASTER_HOST = {("h200/quant_e2e_attention.json", "autoopt int4"): 1.17}
#: committed runs whose optimize()d rows' generate() loop ran before the 4D mask moved into the captured step (a
#: token over the graphed step then 0.77-1.74 ms, against the 0.49 ms priced since): their autoopt rows are not
#: checked against today's loop either
BEFORE_GRAPH_MASK = {"h100/quant_e2e_decode_graphs.json", "h100/quant_e2e_decode_graphs_run2.json",
                     "h100/quant_e2e_decode_graphs_run3.json"}


def test_generate_predictions_are_within_15_percent_of_every_committed_generate_run_but_one():
    # measured through transformers' generate() (static cache, compiled), one process a file
    ratios = _generate_ratios()
    assert len(ratios) == 22
    assert all(0.85 <= r <= FASTER_HOST.get(key, 1.15) for key, r in ratios.items()), ratios


def test_generate_predictions_follow_the_decode_graph_probe_run():
    # the run the autoopt loop was first fitted on (generate_host_fit.json), before the 4D mask moved into the
    # captured step: its autoopt rows' loop (0.57-0.89 ms over the graphed step) runs longer than the 0.49 ms the
    # loop is priced at since (eight same-run pairs after the move), so they are held to 20 % under, the
    # transformers rows to 15 %
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h100" / "generate_host_fit.json"
    rows = json.loads(path.read_text())["variants"]
    ratios = []
    for row in rows:
        impl, fmt = row["format"].split()
        timing = row if impl == "transformers" else row["with_decode_graphs"]
        rec = recommend("h100-sxm", "llama-3-8b", batch=1, prompt_len=128, gen_len=128, phase="decode",
                        weight_dtype=fmt, cuda_graphs=True, runtime=impl)
        ratios.append((impl, rec.predicted["generate_token_us"] / 1e3 / statistics.median(
            timing["measured_generate_ms_per_token"])))
    assert len(ratios) == 4
    assert all((0.85 if impl == "transformers" else 0.80) <= r <= 1.15 for impl, r in ratios), ratios


# -- tensor parallelism's all-reduces are part of each step ----------------------------------------------------

def test_a_tensor_parallel_decode_step_includes_its_two_all_reduces_a_layer():
    from autoopt.hardware.library import load_profile
    from autoopt.planning.split import allreduce_us, devices_of, link_gbs

    hw = load_profile("h100-sxm-8x")
    rec = recommend(hw, "llama-3-8b", tensor_parallel=4, batch=8, prompt_len=128, gen_len=16, phase="decode",
                    weight_dtype="bf16", compare_wfc=False, top=1)
    bw, path = link_gbs(hw, *devices_of(hw)[:2])
    comm = 2 * 32 * allreduce_us(8 * 4096 * 2, 4, bw, path)  # 8 rows of 4096 bf16 after o_proj and down_proj
    assert rec.predicted["communication_us"] == pytest.approx(comm)
    assert rec.predicted["decode_step_us"] == pytest.approx(rec.predicted["request_us"])


@pytest.mark.parametrize(("model", "runtime", "tp", "runs"), [
    ("llama-3-8b", "autoopt", 1, True), ("llama-3-8b", "transformers", 1, False), ("llama-3-8b", "autoopt", 16, False),
    ("deepseek-v3", "autoopt", 1, False),  # MLA: no grouped K/V heads to read
])
def test_which_plans_decode_attention_on_autoopts_kernel(model, runtime, tp, runs):
    from autoopt.planning.recommendation import runs_decode_attention

    assert runs_decode_attention(get_model(model), runtime, tp=tp) is runs


def _decode_gemms(model, batch, weights="fp8"):
    rec = recommend(load_profile("h200"), model, batch=batch, prompt_len=128, gen_len=64, phase="decode",
                    weight_dtype=weights, cuda_graphs=True, runtime="autoopt", max_devices=1)
    return {o.name: o for o in rec.ops if o.phase == "decode" and o.kernel_class == "gemm"}


@pytest.mark.parametrize("model", ["llama-3-8b", "qwen2.5-7b"])
def test_the_plan_names_the_bf16_gemms_the_dispatch_runs_on_cublas(model):
    # h200/quant_trace_{llama,qwen}_b32_layers8_scaled_mm.json (autoopt-bf16, batch 32): cuBLAS's nvjet kernels
    # for qkv, gate_up, down and the LM head, autoopt's _gemm_kernel once a layer (o_proj)
    kernels = {name: o.kernel for name, o in _decode_gemms(model, 32, "bf16").items()}
    assert kernels == {"qkv_proj": "F.linear", "gate_up_proj": "F.linear", "down_proj": "F.linear",
                       "o_proj": "gemm", "lm_head": "F.linear"}


def test_a_w8a8_gemm_the_dispatch_runs_on_cublas_is_priced_and_named_as_cublas():
    # Qwen2.5-7B's o_proj at batch 32 on the H200: act_quant + _scaled_mm predicted below autoopt's quant_gemm,
    # so optimize() runs cuBLASLt there and the plan says so (the other three GEMMs stay autoopt's)
    ops = _decode_gemms("qwen2.5-7b", 32)
    assert ops["o_proj"].source == "vendor" and ops["o_proj"].kernel == "torch._scaled_mm"
    assert {ops[n].kernel for n in ("qkv_proj", "gate_up_proj", "down_proj")} == {"quant_gemm"}


def test_at_batch_32_llama_3_8b_fp8_gemms_stay_on_autoopts_kernel():
    # h200/quant_kernels_m32_graph.json: quant_gemm measured faster than act_quant + _scaled_mm on all four
    assert {o.kernel for o in _decode_gemms("llama-3-8b", 32).values() if o.name != "lm_head"} == {"quant_gemm"}


def _head(weights: str) -> object:
    rec = recommend(load_profile("h200"), "llama-3-8b", batch=1, prompt_len=128, gen_len=64, phase="decode",
                    weight_dtype=weights, max_devices=1, compare_wfc=False)
    return next(o for o in rec.ops if o.phase == "decode" and o.name == "lm_head")


def test_an_fp8_plan_prices_the_lm_head_at_16_bits_as_its_memory_plan_counts_it():
    # GPU formats quantize the layers' linears; priced in the layers' fp8 mode, the head came to 151.6 us, an fp8
    # GEMV over half the bytes the 16-bit head streams
    fp8, bf16 = _head("fp8"), _head("bf16")
    assert fp8.dtype == "bf16" and fp8.predicted_us == pytest.approx(bf16.predicted_us)


def test_a_whole_model_gguf_plan_prices_its_quantized_lm_head():
    # a GGUF K-quant's bits cover every parameter, the head too (and the memory plan counts it so)
    assert _head("q4_k_m").predicted_us < 0.5 * _head("bf16").predicted_us
