"""Recommendations in the runtimes' own terms: formats, splits, KV caches, offload, replicas, export."""

from __future__ import annotations

import pytest

from autoopt.errors import AutooptError, RuntimeRuleError
from autoopt.hardware.library import load_profile
from autoopt.planning.recommendation import recommend
from autoopt.runtimes import get_runtime, runtime_names
from autoopt.runtimes.export import export, format_args, transformers_device_map
from autoopt.runtimes.spec import RuntimeSpec

GGUF = {"bf16", "fp16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "mxfp4"}

# Engine flags as the runtimes document them (checked 2026-11-23):
# vLLM: https://docs.vllm.ai/en/latest/configuration/engine_args.html
VLLM_FLAGS = {"--model", "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
              "--quantization", "--kv-cache-dtype", "--max-model-len", "--gpu-memory-utilization", "--max-num-seqs",
              "--enable-expert-parallel", "--cpu-offload-gb"}
# SGLang: https://docs.sglang.ai/advanced_features/server_arguments.html
SGLANG_FLAGS = {"--model-path", "--tp-size", "--pp-size", "--dp-size", "--ep-size", "--quantization",
                "--kv-cache-dtype", "--context-length", "--mem-fraction-static", "--max-running-requests",
                "--cpu-offload-gb"}
# llama.cpp server: https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md
LLAMA_CPP_FLAGS = {"-m", "-ngl", "-c", "-b", "-t", "-np", "-ctk", "-ctv", "--split-mode", "--tensor-split"}
# vLLM --quantization choices and --kv-cache-dtype choices (engine_args.html)
VLLM_QUANT = {"fp8", "awq_marlin", "gptq_marlin", "compressed-tensors", "bitsandbytes", "modelopt_fp4", "mxfp4"}
VLLM_KV = {"auto", "fp8"}


def _flags(args: list[str]) -> set[str]:
    return {a for a in args if a.startswith("-")}


def test_the_builtin_runtimes_are_known_by_name():
    assert {"vllm", "sglang", "llama.cpp", "transformers", "autoopt"} <= set(runtime_names())


def test_an_unknown_runtime_is_a_typed_error_naming_the_known_ones():
    with pytest.raises(RuntimeRuleError, match=r"unknown runtime 'tensorrt'.*vllm, sglang"):
        get_runtime("tensorrt")


def test_vllm_offers_fp8_matmuls_on_hopper_but_only_weight_only_fp8_on_ampere():
    vllm = get_runtime("vllm")
    assert "fp8" in vllm.formats_for(load_profile("h200").gpu)
    ampere = vllm.formats_for(load_profile("a100-sxm-80gb").gpu)
    assert "fp8" not in ampere and "fp8-weight-only" in ampere


def test_deepseek_v3_on_four_h200_under_vllm_gets_a_format_vllm_runs_not_gguf():
    rec = recommend("h200-4x", "deepseek-v3", runtime="vllm")
    assert rec.fits and rec.runtime == "vllm"
    assert rec.quant.format.name in get_runtime("vllm").formats_for(load_profile("h200-4x").gpu)
    assert rec.quant.format.name not in GGUF


def test_mixtral_on_a_4090_under_llama_cpp_offloads_layers_to_the_cpu():
    rec = recommend("rtx-4090", "mixtral-8x7b", runtime="llama.cpp")
    assert rec.fits and rec.quant.format.name in GGUF
    assert rec.offload is not None and rec.offload.kind == "cpu-compute"
    assert 0 < rec.offload.gpu_layers < rec.model.num_layers
    assert 1 < rec.offload.tokens_per_s < 100  # published: ~15 tokens/s on a 3090 with 23 of 33 layers


def test_mixtral_on_a_4090_under_vllm_streams_the_overflow_over_pcie():
    rec = recommend("rtx-4090", "mixtral-8x7b", runtime="vllm")
    assert rec.offload is not None and rec.offload.kind == "weight-stream"
    assert rec.offload.offload_bytes > 0 and rec.offload.link_gbs == pytest.approx(31.5, rel=0.01)


def test_llama_cpp_with_a_tensor_parallel_degree_is_refused_saying_what_works():
    with pytest.raises(RuntimeRuleError, match=r"no tensor parallelism.*vllm or sglang"):
        recommend("h100-sxm-8x", "llama-3-70b", runtime="llama.cpp", tensor_parallel=8)


def test_a_kv_cache_dtype_the_runtime_lacks_is_refused_naming_the_accepted_ones():
    with pytest.raises(RuntimeRuleError, match="no q4_0 KV cache here; it takes bf16, fp16, fp8"):
        recommend("h100-sxm", "llama-3-8b", runtime="vllm", kv_dtype="q4_0")


def test_a_format_the_runtime_lacks_is_refused_naming_what_it_runs():
    with pytest.raises(RuntimeRuleError, match="has no q4_k_m kernels"):
        recommend("h100-sxm", "llama-3-8b", runtime="vllm", weight_dtype="q4_k_m")


def test_a_fixed_tensor_parallel_degree_is_the_one_planned():
    rec = recommend("h100-sxm-8x", "llama-3-70b", runtime="vllm", tensor_parallel=4)
    assert rec.split is not None and rec.split.tp == 4


def test_a_tensor_parallel_degree_out_of_range_names_the_range():
    with pytest.raises(AutooptError, match=r"tensor_parallel must be an integer in 1\.\.64, got 0"):
        recommend("h100-sxm-8x", "llama-3-70b", runtime="vllm", tensor_parallel=0)


def test_a_serving_batch_on_eight_gpus_compares_replicas_with_one_big_instance():
    rec = recommend("h100-sxm-8x", "llama-3-70b", runtime="vllm", batch=64, context=8192)
    by_replicas = {r.replicas: r for r in rec.replicas}
    assert {1, 2} <= set(by_replicas)
    assert by_replicas[2].split.tp * 2 <= 8 and by_replicas[2].batch_per_replica == 32
    assert all(r.tokens_per_s > 0 for r in rec.replicas)
    assert rec.replicas == tuple(sorted(rec.replicas, key=lambda r: -r.tokens_per_s))


def test_vllm_export_uses_only_documented_flags_and_values():
    rec = recommend("h100-sxm-8x", "mixtral-8x7b", runtime="vllm", batch=32)
    out = export(rec.to_dict(), "vllm")
    assert _flags(out["args"]) <= VLLM_FLAGS
    kw = out["kwargs"]
    assert kw["--tensor-parallel-size"] == rec.split.tp and kw["--kv-cache-dtype"] in VLLM_KV
    assert kw.get("--quantization", "fp8") in VLLM_QUANT
    assert format_args(out).startswith("vllm serve mistralai/Mixtral-8x7B-v0.1 --tensor-parallel-size ")


def test_every_catalog_model_names_the_hugging_face_repo_a_runtime_loads():
    from autoopt.planning.catalog import get_model, model_names

    repos = {name: get_model(name).checkpoint for name in model_names()}
    assert repos["mixtral-8x7b"] == "mistralai/Mixtral-8x7B-v0.1"
    assert all(r.count("/") == 1 and " " not in r for r in repos.values()), repos


def test_sglang_and_transformers_exports_load_the_catalog_models_repo():
    rec = recommend("h100-sxm-8x", "mixtral-8x7b", runtime="sglang")
    assert export(rec.to_dict(), "sglang")["kwargs"]["--model-path"] == "mistralai/Mixtral-8x7B-v0.1"
    rec = recommend("h100-sxm-8x", "mixtral-8x7b", runtime="transformers")
    kw = export(rec.to_dict(), "transformers")["kwargs"]
    assert kw["pretrained_model_name_or_path"] == "mistralai/Mixtral-8x7B-v0.1"


@pytest.mark.parametrize("given", ["folder", "config.json"])
def test_a_model_read_from_a_local_config_is_served_from_its_folder(tmp_path, given):
    import json

    from autoopt.planning.catalog import _entries

    folder = tmp_path / "my-mixtral"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_entries()["mixtral-8x7b"]["config"]))
    model = str(folder if given == "folder" else folder / "config.json")
    rec = recommend("h100-sxm-8x", model, runtime="vllm")
    out = export(rec.to_dict(), "vllm")
    assert out["args"][0] == str(folder)
    assert not [n for n in out["notes"] if "replace it" in n]


def test_a_config_mapping_without_a_repo_id_is_exported_by_name_with_a_note():
    from autoopt.planning.catalog import _entries

    rec = recommend("h100-sxm-8x", dict(_entries()["mixtral-8x7b"]["config"]), runtime="vllm")
    out = export(rec.to_dict(), "vllm")
    assert out["args"][0] == rec.model.name
    assert any("not a checkpoint: replace it with the Hugging Face repo id" in n for n in out["notes"])


def test_a_config_mapping_saved_by_transformers_is_served_from_its_name_or_path():
    from autoopt.planning.catalog import _entries

    cfg = {**_entries()["mixtral-8x7b"]["config"], "_name_or_path": "me/my-mixtral-finetune"}
    out = export(recommend("h100-sxm-8x", cfg, runtime="vllm").to_dict(), "vllm")
    assert out["args"][0] == "me/my-mixtral-finetune"


def test_sglang_export_uses_only_documented_flags():
    rec = recommend("h200-4x", "deepseek-v3", runtime="sglang")
    out = export(rec.to_dict(), "sglang", model_id="deepseek-ai/DeepSeek-V3")
    assert _flags(out["args"]) <= SGLANG_FLAGS
    assert out["kwargs"]["--model-path"] == "deepseek-ai/DeepSeek-V3"


def test_llama_cpp_export_gives_the_gpu_layer_count_and_the_gguf_file():
    rec = recommend("rtx-4090", "mixtral-8x7b", runtime="llama.cpp")
    out = export(rec.to_dict(), "llama.cpp", profile={"cpu": {"physical_cores": 16}})
    assert _flags(out["args"]) <= LLAMA_CPP_FLAGS
    assert out["kwargs"]["-ngl"] == rec.offload.gpu_layers and out["kwargs"]["-t"] == 16
    assert out["kwargs"]["-m"] == "Mixtral-8x7B-v0.1-Q4_K_M.gguf"


def test_exporting_a_plan_made_for_another_runtime_is_refused():
    rec = recommend("rtx-4090", "mixtral-8x7b", runtime="llama.cpp")
    with pytest.raises(RuntimeRuleError, match=r"made for llama\.cpp; plan again"):
        export(rec.to_dict(), "vllm")


def test_the_transformers_device_map_dispatches_a_real_model():
    """The map's module names are the model's own: accelerate dispatches a real (tiny) Llama with it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    rec = recommend("h100-sxm-8x", "llama-3-70b", runtime="transformers", weight_dtype="bf16")
    dmap = transformers_device_map(rec.to_dict())
    assert len(set(dmap.values())) >= 2  # 141 GB of bf16 weights: layers over several 80 GB GPUs
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=80,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    with accelerate.init_empty_weights():
        empty = transformers.AutoModelForCausalLM.from_config(config)
    accelerate.utils.check_device_map(empty, dmap)  # every parameter is placed
    model = transformers.AutoModelForCausalLM.from_config(config)
    on_cpu = {k: "cpu" for k in dmap}  # the CI machine has no GPU: the same keys, host devices
    model = accelerate.dispatch_model(model, device_map=on_cpu)
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 128)


def test_a_plugin_runtime_is_planned_for_and_a_bad_one_is_skipped():
    from autoopt.plugins.hookspecs import hookimpl
    from autoopt.plugins.manager import get_plugin_manager, reset_plugin_manager

    class Plugin:
        @hookimpl
        def autoopt_runtimes(self):
            return [{"name": "trtllm", "display": "TensorRT-LLM", "formats": [{"format": "fp8", "min_cc": 8.9}],
                     "kv_dtypes": [{"dtype": "fp8", "arg": "fp8"}], "tensor_parallel": True},
                    {"name": "broken", "formats": "fp8"}]

    reset_plugin_manager()
    try:
        get_plugin_manager().register(Plugin(), name="trt-plugin")
        rec = recommend("h100-sxm", "llama-3-8b", runtime="trtllm")
        assert rec.quant.format.name == "fp8" and rec.workload.kv_dtype == "fp8"
        assert "broken" not in runtime_names()
        assert any("broken" in str(p) or "formats" in str(p) for p in get_plugin_manager().problems)
    finally:
        reset_plugin_manager()


def test_a_runtime_description_with_a_bad_field_names_it():
    with pytest.raises(RuntimeRuleError, match=r"memory_utilization must be in 0\.1\.\.1\.0"):
        RuntimeSpec.from_dict({"name": "x", "formats": [{"format": "bf16"}], "kv_dtypes": [],
                               "memory_utilization": 3})


def test_every_runtime_leaves_its_memory_overheads_out_of_the_plan():
    """vLLM plans into 0.9 of the GPU less its CUDA-graph and activation reserve."""
    plain = recommend("h100-sxm", "llama-3-8b", runtime="autoopt")
    vllm = recommend("h100-sxm", "llama-3-8b", runtime="vllm")
    assert vllm.memory[0].capacity_bytes < 0.9 * plain.memory[0].capacity_bytes


def _runnable_by_rules(rec, rt, profile) -> str | None:
    """Why ``rec`` breaks ``rt``'s rules (None: it is runnable by them)."""
    gpu = profile.gpu
    if rec.quant.format.name not in rt.formats_for(gpu) and not (gpu is None and rec.quant.format.name in
                                                                 rt.formats_for(None)):
        return f"format {rec.quant.format.name} not offered"
    if rec.workload.kv_dtype not in {k.dtype for k in rt.kv_dtypes}:
        return f"kv {rec.workload.kv_dtype} not offered"
    if rec.split is not None:
        if rec.split.tp > 1 and not rt.tensor_parallel:
            return "tensor parallel"
        if rec.split.pp > 1 and not rt.pipeline_parallel:
            return "pipeline parallel"
        if any(-1 in s.devices for s in rec.split.stages) and rt.offload != "cpu-compute":
            return "CPU stage"
        if not all(m.fits for m in rec.memory):
            return "memory"
    if rec.offload is not None and rec.offload.kind != rt.offload:
        return f"offload {rec.offload.kind}"
    return None


@pytest.mark.parametrize("runtime", ["vllm", "sglang", "llama.cpp", "transformers", "autoopt"])
def test_every_catalog_model_on_every_profile_is_runnable_by_the_runtime_or_says_why_not(runtime):
    """The whole cross product (catalog x built-in profiles) for one runtime: a plan within its rules,
    or ``fits`` False with a note naming what did not fit, or a typed error naming the rule."""
    from autoopt.hardware.library import known_names
    from autoopt.planning.catalog import model_names

    rt = get_runtime(runtime)
    broken = []
    for profile_name in known_names():
        profile = load_profile(profile_name)
        for model in model_names():
            try:
                rec = recommend(profile, model, runtime=runtime, compare_wfc=False, top=1)
            except RuntimeRuleError as exc:
                assert exc.rule in ("format", "kv_dtype"), exc
                continue
            if not rec.fits:
                assert any("does not fit" in n for n in rec.notes), (profile_name, model)
                continue
            why = _runnable_by_rules(rec, rt, profile)
            if why:
                broken.append((profile_name, model, why))
    assert broken == []


def test_cli_prints_the_runtimes_own_arguments_ready_to_paste(capsys):
    from autoopt.cli import main

    assert main(["recommend", "--model", "mixtral-8x7b", "--profile", "rtx-4090", "--runtime", "llama.cpp",
                 "--format", "args"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("llama-server -m Mixtral-8x7B-v0.1-Q4_K_M.gguf -ngl ") and out.count("\n") == 0


@pytest.mark.parametrize(("argv", "needle"), [
    (["--runtime", "llama.cpp", "--tensor-parallel", "8"], "no tensor parallelism"),
    (["--runtime", "tgi"], "unknown runtime 'tgi'"),
    (["--runtime", "vllm", "--kv-dtype", "q4_0"], "it takes bf16, fp16, fp8"),
    (["--format", "args"], "--format args needs --runtime"),
    (["--runtime", "vllm", "--tensor-parallel", "0"], "tensor_parallel must be an integer in 1..64"),
])
def test_cli_contradictory_or_unknown_runtime_options_are_one_line_exit_2(capsys, argv, needle):
    from autoopt.cli import main

    assert main(["recommend", "--model", "llama-3-70b", "--profile", "h100-sxm-8x", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_a_kv_rule_with_a_non_numeric_capability_is_refused_by_name():
    with pytest.raises(RuntimeRuleError, match=r"min_cc must be a number like 8\.9, got 'hopper'"):
        RuntimeSpec.from_dict({"name": "x", "formats": [{"format": "bf16"}],
                               "kv_dtypes": [{"dtype": "fp8", "arg": "fp8", "min_cc": "hopper"}]})


def test_gpt_oss_is_served_as_shipped_with_its_mxfp4_experts_under_vllm_on_hopper():
    # vLLM refuses a --quantization that does not match the checkpoint's (mxfp4): requantizing to fp8
    # is no runnable plan; on sm_90 vLLM runs MXFP4 experts through its Triton backend
    rec = recommend(load_profile("h100-sxm"), "gpt-oss-120b", runtime="vllm", compare_wfc=False, top=1)
    assert rec.quant.format.name == "bf16" and rec.model.expert_dtype == "mxfp4" and rec.fits
    args = export(rec.to_dict(), "vllm")["args"]
    assert args[args.index("--quantization") + 1] == "mxfp4"


def test_gpt_oss_under_llama_cpp_loads_the_mxfp4_gguf():
    rec = recommend(load_profile("h100-sxm"), "gpt-oss-120b", runtime="llama.cpp", compare_wfc=False, top=1)
    kw = export(rec.to_dict(), "llama.cpp")["kwargs"]
    assert kw["-m"] == "gpt-oss-120b-MXFP4.gguf"


def test_gpt_oss_where_the_runtime_has_no_mxfp4_kernels_is_refused_naming_the_rule():
    with pytest.raises(RuntimeRuleError, match=r"ships its experts in mxfp4.*SGLang runs mxfp4 from compute "
                                               r"capability 9\.0") as exc:
        recommend(load_profile("a100-sxm-80gb"), "gpt-oss-120b", runtime="sglang", compare_wfc=False, top=1)
    assert exc.value.rule == "format"


# -- transformers' tensor parallelism: when a degree is asked for, never chosen unasked ---------------------------

def test_transformers_plans_its_tp_plan_when_a_degree_is_asked_for():
    rec = recommend("h100-sxm-8x", "llama-3-8b", runtime="transformers", tensor_parallel=2, batch=1, prompt_len=128,
                    gen_len=16, phase="decode", weight_dtype="bf16", compare_wfc=False, top=1)
    assert rec.split is not None and rec.split.tp == 2


def test_transformers_never_chooses_tensor_parallelism_unasked():
    rec = recommend("h100-sxm-8x", "llama-3-70b", runtime="transformers", batch=1, prompt_len=128, gen_len=16,
                    phase="decode", weight_dtype="bf16", compare_wfc=False, top=1)
    assert rec.split is not None and rec.split.tp == 1 and rec.split.pp > 1


def test_a_tensor_parallel_transformers_plan_exports_tp_plan_and_torchrun():
    rec = recommend("h100-sxm-8x", "llama-3-8b", runtime="transformers", tensor_parallel=4, batch=1, prompt_len=128,
                    gen_len=16, phase="decode", weight_dtype="bf16", compare_wfc=False, top=1)
    out = export(rec.to_dict(), "transformers")
    assert out["kwargs"]["tp_plan"] == "auto" and "device_map" not in out["kwargs"]
    assert "run it in one process a GPU: torchrun --nproc-per-node 4 SCRIPT.py" in " ".join(out["notes"])


def test_tensor_parallel_on_request_round_trips_and_is_a_runtime_rule():
    spec = get_runtime("transformers")
    assert spec.tensor_parallel_on_request and not spec.tensor_parallel
    assert RuntimeSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(RuntimeRuleError, match="runs no tensor parallelism"):
        get_runtime("llama.cpp").check_split(tp=2, pp=None)


def test_transformers_runs_q_k_v_and_gate_up_as_separate_gemms():
    rec = recommend("h100-sxm", "llama-3-8b", runtime="transformers", batch=1, prompt_len=128, gen_len=16,
                    phase="decode", weight_dtype="bf16", compare_wfc=False, top=1)
    names = {o.name for o in rec.ops}
    assert {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"} <= names and "qkv_proj" not in names
    fused = recommend("h100-sxm", "llama-3-8b", runtime="autoopt", batch=1, prompt_len=128, gen_len=16,
                      phase="decode", weight_dtype="bf16", compare_wfc=False, top=1)
    assert {"qkv_proj", "gate_up_proj"} <= {o.name for o in fused.ops}


def test_recommend_args_for_transformers_tensor_parallel_puts_the_call_on_stdout_and_torchrun_on_stderr(capsys):
    from autoopt.cli import main

    rc = main(["recommend", "--model", "llama-3-8b", "--profile", "h100-sxm-8x", "--runtime", "transformers",
               "--tensor-parallel", "2", "--weight-dtype", "bf16", "--format", "args"])
    out = capsys.readouterr()
    assert rc == 0 and out.out.startswith("transformers.AutoModelForCausalLM.from_pretrained(")
    assert "tp_plan='auto'" in out.out
    assert out.err.strip() == "autoopt: run it in one process a GPU: torchrun --nproc-per-node 2 SCRIPT.py"
