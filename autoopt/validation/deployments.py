"""Plans checked against published deployments (``tests/data/deployments.yaml``).

For one published deployment (model, GPUs, runtime, the settings its source states and, where
published, measured tokens/s or memory) :func:`evaluate` plans twice with the runtime named:

- **autoopt's plan**: what ``recommend()`` picks; it must be runnable (fits with the runtime's own
  memory overheads);
- **the published setting**: the same request with the source's format and tensor-parallel degree
  fixed, priced by the same cost model.

It reports whether autoopt's plan is predicted at least as fast as the published one (and, when not,
the reason the plan gives for its choice), and predicted over measured for tokens/s and memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autoopt.errors import AutooptError
from autoopt.hardware.library import load_profile
from autoopt.hardware.profile import HardwareProfile
from autoopt.planning.recommendation import Recommendation, recommend

__all__ = ["evaluate", "hardware_for", "workload_for"]

#: the published quantization names -> autoopt's format names (ollama's "q4" tags are Q4 K-quants
#: for the models in the table)
_FORMAT = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "awq": "awq", "gptq": "gptq", "q4_k_m": "q4_k_m",
           "q4": "q4_k_m", "q5_k_m": "q5_k_m", "q6_k": "q6_k", "q8_0": "q8_0", "mxfp4": "mxfp4"}


def hardware_for(row: Mapping[str, Any]) -> HardwareProfile:
    """The row's GPUs as a profile: the named one, or its single GPU repeated ``count`` times
    (NVLink peers on an NVSwitch board when the GPU has NVLink, as the split planner assumes)."""
    gpus = row["gpus"]
    hw = load_profile(gpus["profile"])
    count = int(gpus.get("count", 1))
    if len(hw.gpus) == count:
        return hw
    one = hw.gpus[0]
    return dataclasses.replace(hw, name=f"{hw.name} x{count}",
                               gpus=tuple(dataclasses.replace(one, index=i) for i in range(count)))


def workload_for(row: Mapping[str, Any]) -> dict[str, Any]:
    """recommend()'s request arguments from what the source states (defaults where it is silent)."""
    s, m = row.get("settings") or {}, row.get("measured") or {}
    # a measured batch is what ran; otherwise one sequence at the longest context the server allows
    # (vLLM refuses to start unless one max_model_len sequence fits; max_num_seqs is a cap, and a paged
    # KV cache does not reserve the full context for every one of them)
    batch = int(m.get("batch") or 1)
    prompt = int(m.get("input_len") or 512)
    gen = int(m.get("output_len") or 256)
    context = s.get("max_model_len") or s.get("context")
    out: dict[str, Any] = {"batch": batch, "prompt_len": prompt, "gen_len": gen}
    if context and int(context) >= prompt:
        out["context"] = int(context)
    return out


def _summary(rec: Recommendation) -> dict[str, Any]:
    # a runtime whose tokens come out of transformers' generate() loop: a token is its step plus that loop
    step = rec.predicted.get("generate_token_us", rec.predicted.get("decode_step_us", 0.0))
    tokens_s = rec.offload.tokens_per_s if rec.offload else (rec.workload.batch * 1e6 / step if step else 0.0)
    return {"format": rec.quant.format.name, "tp": rec.split.tp if rec.split else None,
            "pp": rec.split.pp if rec.split else None, "fits": rec.fits,
            "gpu_layers": rec.offload.gpu_layers if rec.offload else None,
            "request_ms": round(rec.predicted["request_us"] / 1e3, 3),
            "decode_tokens_per_s": round(tokens_s, 2),
            "memory_gb_per_gpu": round(max(m.total_bytes for m in rec.memory) / 1e9, 2),
            "reason": rec.quant.reason, "notes": list(rec.notes)}


def evaluate(row: Mapping[str, Any]) -> dict[str, Any]:
    """autoopt's plan and the published setting for one deployment row (see the module docstring)."""
    hw = hardware_for(row)
    req = workload_for(row)
    runtime = row["runtime"]
    out: dict[str, Any] = {"id": row["id"], "profile": hw.name, "runtime": runtime, "request": req,
                           "source": row["source"]}
    plan = recommend(hw, row["catalog"], runtime=runtime, compare_wfc=False, **req)
    out["autoopt"] = _summary(plan)
    s = row.get("settings") or {}
    fixed: dict[str, Any] = {}
    if s.get("quantization") is not None and s["quantization"] == plan.model.expert_dtype:
        # the checkpoint's own expert format (gpt-oss: MXFP4 experts, bf16 elsewhere): served as shipped
        fixed["weight_dtype"] = plan.model.dtype
    elif s.get("quantization") in _FORMAT:
        fixed["weight_dtype"] = _FORMAT[s["quantization"]]
    if s.get("tensor_parallel"):
        fixed["tensor_parallel"] = int(s["tensor_parallel"])
    try:
        published = recommend(hw, row["catalog"], runtime=runtime, compare_wfc=False, **req, **fixed)
    except AutooptError as exc:
        out["published"] = {"error": str(exc), "settings": fixed}
        return out
    out["published"] = {**_summary(published), "settings": fixed}
    mine, theirs = plan.predicted["request_us"], published.predicted["request_us"]
    out["autoopt_vs_published"] = round(theirs / mine, 3) if mine else None
    out["measured"] = _against_measured(row, published)
    if row.get("far_off_because"):
        out["far_off_because"] = " ".join(str(row["far_off_because"]).split())
    return out


def _against_measured(row: Mapping[str, Any], published: Recommendation) -> dict[str, Any]:
    """Predicted / measured for the published setting, where the source measured."""
    m = row.get("measured") or {}
    out: dict[str, Any] = {}
    if "output_tokens_per_s" in m or "output_tokens_per_s_range" in m:
        measured = m.get("output_tokens_per_s") or sum(m["output_tokens_per_s_range"]) / 2
        if m.get("batch"):  # aggregate throughput at an unknown concurrency cannot be compared
            pred = _summary(published)["decode_tokens_per_s"]
            out["tokens_per_s"] = {"measured": measured, "predicted": pred, "ratio": round(pred / measured, 3)}
    if "memory_gb" in m:
        rec_mem = sum(x.weights_bytes + x.kv_cache_bytes + x.activation_bytes for x in published.memory) / 1e9
        out["memory_gb"] = {"measured": m["memory_gb"], "predicted": round(rec_mem, 2),
                            "ratio": round(rec_mem / m["memory_gb"], 3)}
    return out
