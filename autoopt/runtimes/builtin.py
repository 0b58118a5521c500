"""The built-in runtime descriptions: vLLM, SGLang, llama.cpp, transformers and autoopt's own kernels.

Plain data in the schema :meth:`autoopt.runtimes.spec.RuntimeSpec.from_dict` reads (a plugin's
``autoopt_runtimes`` hook returns the same dicts). Python literals rather than YAML so that loading
them costs no parser at start-up. Each entry names the documents its rules come from; compute
capabilities are the minimum the runtime's kernels for that format need (7.5 Turing, 8.0 Ampere,
8.9 Ada, 9.0 Hopper, 10.0 Blackwell).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BUILTIN_RUNTIMES"]

#: GGUF types offered (Q4_0 and the IQ types exist too; the K-quants are llama.cpp's recommended ones)
_GGUF = ("bf16", "fp16", "q8_0", "q6_k", "q5_k_m", "q4_k_m")

BUILTIN_RUNTIMES: tuple[dict[str, Any], ...] = (
    {
        "name": "vllm", "display": "vLLM",
        "sources": ("https://docs.vllm.ai/en/latest/features/quantization/supported_hardware.html",
                    "https://docs.vllm.ai/en/latest/configuration/engine_args.html",
                    "https://docs.vllm.ai/en/latest/configuration/optimization.html"),
        "formats": (
            {"format": "bf16", "min_cc": 8.0}, {"format": "fp16", "min_cc": 7.0},
            {"format": "fp8", "arg": "fp8", "min_cc": 8.9, "note": "W8A8 FP8 (CUTLASS)"},
            {"format": "fp8-weight-only", "arg": "fp8", "min_cc": 8.0, "note": "FP8 Marlin, weight-only on Ampere"},
            {"format": "awq", "arg": "awq_marlin", "min_cc": 8.0, "note": "AWQ int4 checkpoint, Marlin kernels"},
            {"format": "gptq", "arg": "gptq_marlin", "min_cc": 8.0, "note": "GPTQ int4 checkpoint, Marlin kernels"},
            {"format": "w8a8_int8", "arg": "compressed-tensors", "min_cc": 7.5, "note": "compressed-tensors W8A8 int8"},
            {"format": "int8", "arg": "compressed-tensors", "min_cc": 8.0, "note": "compressed-tensors W8A16"},
            {"format": "nf4", "arg": "bitsandbytes", "min_cc": 7.0, "note": "bitsandbytes 4-bit"},
            {"format": "nvfp4", "arg": "modelopt_fp4", "min_cc": 10.0, "note": "ModelOpt NVFP4 checkpoint"},
            # MXFP4 MoE (gpt-oss experts): native on sm_100, its Triton backend on sm_90, Marlin weight-only
            # below (vllm/model_executor/layers/quantization/mxfp4.py backend selection, vllm#31085)
            {"format": "mxfp4", "arg": "mxfp4", "min_cc": 8.0, "note": "MXFP4 experts (gpt-oss): Marlin/Triton/native"},
        ),
        "kv_dtypes": ({"dtype": "bf16", "arg": "auto"}, {"dtype": "fp16", "arg": "auto"},
                      {"dtype": "fp8", "arg": "fp8", "min_cc": 8.0}),
        "tensor_parallel": True, "pipeline_parallel": True, "expert_parallel": True, "data_parallel": True,
        "offload": "weight-stream",
        # --gpu-memory-utilization defaults to 0.9 of the whole GPU; inside it, CUDA graphs (~0.5-1 GiB at
        # the default capture sizes) and the profiling run's activation peak at max_num_batched_tokens
        "memory_utilization": 0.9, "reserved_gib": 1.5, "max_batch_tokens": 8192,
    },
    {
        "name": "sglang", "display": "SGLang",
        "sources": ("https://docs.sglang.ai/advanced_features/server_arguments.html",
                    "https://docs.sglang.ai/advanced_features/quantization.html"),
        "formats": (
            {"format": "bf16", "min_cc": 8.0}, {"format": "fp16", "min_cc": 7.0},
            {"format": "fp8", "arg": "fp8", "min_cc": 8.9},
            {"format": "awq", "arg": "awq_marlin", "min_cc": 8.0},
            {"format": "gptq", "arg": "gptq_marlin", "min_cc": 8.0},
            {"format": "w8a8_int8", "arg": "w8a8_int8", "min_cc": 8.0},
            {"format": "nf4", "arg": "bitsandbytes", "min_cc": 8.0},
            {"format": "nvfp4", "arg": "modelopt_fp4", "min_cc": 10.0},
            # gpt-oss's MXFP4 experts through triton_kernels on Hopper, native on Blackwell
            {"format": "mxfp4", "arg": "mxfp4", "min_cc": 9.0},
        ),
        "kv_dtypes": ({"dtype": "bf16", "arg": "auto"}, {"dtype": "fp16", "arg": "auto"},
                      {"dtype": "fp8", "arg": "fp8_e4m3", "min_cc": 8.9}),
        "tensor_parallel": True, "pipeline_parallel": True, "expert_parallel": True, "data_parallel": True,
        "offload": "weight-stream",
        # --mem-fraction-static: the share for weights + KV pool (0.88 is its usual default on 80 GB cards)
        "memory_utilization": 0.88, "reserved_gib": 1.0, "max_batch_tokens": 8192,
    },
    {
        "name": "llama.cpp", "display": "llama.cpp",
        "sources": ("https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md",
                    "https://github.com/ggml-org/llama.cpp/blob/master/docs/build.md"),
        # MXFP4: ggml's type for gpt-oss's shipped experts (the ggml-org gpt-oss GGUFs), on CPU and CUDA
        "formats": tuple({"format": f, "arg": f.upper(), "min_cc": 5.0, "cpu": True} for f in (*_GGUF, "mxfp4")),
        "kv_dtypes": ({"dtype": "fp16", "arg": "f16"}, {"dtype": "bf16", "arg": "bf16"},
                      {"dtype": "q8_0", "arg": "q8_0"}, {"dtype": "q4_0", "arg": "q4_0"}),
        # several GPUs: --split-mode layer (layers over GPUs, one at a time), no tensor parallelism here
        "tensor_parallel": False, "pipeline_parallel": True, "expert_parallel": False, "data_parallel": False,
        "offload": "cpu-compute",
        # CUDA context + compute buffers at the default -b 2048 (~0.5-1 GB for 7-70B models)
        "memory_utilization": 1.0, "reserved_gib": 1.0, "max_batch_tokens": 2048,
        "note": "GGUF checkpoints; -ngl layers on the GPU(s), the rest on the CPU",
    },
    {
        "name": "transformers", "display": "transformers",
        "sources": ("https://huggingface.co/docs/transformers/main/en/quantization/overview",
                    "https://huggingface.co/docs/accelerate/en/concept_guides/big_model_inference"),
        "formats": (
            {"format": "bf16", "min_cc": 8.0, "cpu": True}, {"format": "fp16", "min_cc": 7.0},
            {"format": "fp32", "cpu": True},
            {"format": "fp8", "arg": "FineGrainedFP8Config", "min_cc": 8.9},
            {"format": "awq", "arg": "AwqConfig", "min_cc": 7.5},
            {"format": "gptq", "arg": "GPTQConfig", "min_cc": 7.0},
            {"format": "bnb_int8", "arg": "BitsAndBytesConfig(load_in_8bit=True)", "min_cc": 7.0},
            {"format": "nf4", "arg": "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4')",
             "min_cc": 7.0},
            # gpt-oss's MXFP4 experts run through the kernels hub's triton kernels from Hopper on; below
            # it transformers dequantizes them to bf16 (four times the expert memory)
            {"format": "mxfp4", "arg": "Mxfp4Config", "min_cc": 9.0},
        ),
        "kv_dtypes": ({"dtype": "bf16", "arg": "auto"}, {"dtype": "fp16", "arg": "auto"},
                      {"dtype": "fp32", "arg": "auto"}),
        # tp_plan="auto" under torchrun, when a degree is asked for; the planner splits layers by itself
        "tensor_parallel": False, "tensor_parallel_on_request": True, "pipeline_parallel": True,
        "expert_parallel": False, "data_parallel": False,
        "offload": "weight-stream",
        "memory_utilization": 1.0, "reserved_gib": 1.0, "max_batch_tokens": 4096,
        "note": "device_map places layers on GPUs in turn (sequential, no overlap); 'cpu' entries stream over PCIe",
    },
    {
        "name": "autoopt", "display": "autoopt (its own Triton kernels)",
        "sources": ("ARCHITECTURE.md", "autoopt/kernels/quant.py", "templates/quant.py"),
        # what autoopt.optimize(weights=...) runs: its own quantized kernels (W8A8 fp8 on FP8 tensor cores,
        # weight-only fp8/int8/int4 from Ampere on, where bf16 activations run); on the CPU a quantized
        # layer runs torch on its dequantized weight (correct, slow): weight-only formats only there
        "formats": (
            {"format": "fp32", "cpu": True}, {"format": "bf16", "cpu": True}, {"format": "fp16", "cpu": True},
            {"format": "fp8", "min_cc": 8.9, "note": "W8A8: e4m3 weights, per-token e4m3 activations"},
            {"format": "fp8-weight-only", "arg": "fp8-wo", "min_cc": 8.0},
            {"format": "int8", "min_cc": 8.0, "cpu": True, "note": "W8A16, fp32 per-channel scales"},
            {"format": "int4", "min_cc": 8.0, "cpu": True, "note": "W4A16, group 128"},
        ),
        "kv_dtypes": ({"dtype": "bf16", "arg": "bf16"}, {"dtype": "fp16", "arg": "fp16"},
                      {"dtype": "fp8", "arg": "fp8", "min_cc": 8.9}, {"dtype": "fp32", "arg": "fp32"}),
        "tensor_parallel": True, "pipeline_parallel": True, "expert_parallel": True, "data_parallel": True,
        "offload": "cpu-compute",
    },
)
