"""A recommendation in a runtime's own terms: vLLM / SGLang engine arguments, llama.cpp flags,
transformers ``from_pretrained`` keyword arguments with a real ``device_map``.

Works from ``Recommendation.to_dict()`` (plain data), so this stage never imports the planner.
:func:`export` returns ``{"runtime", "command", "args", "kwargs", "env", "notes"}``: ``args`` is the argument
list ready to paste after ``command``; ``kwargs`` the same settings as a mapping (the transformers
export is only kwargs). Flag names follow each runtime's documentation (sources in
:mod:`autoopt.runtimes.builtin`; the tests hold the table they are checked against).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autoopt.errors import RuntimeRuleError
from autoopt.runtimes.registry import get_runtime
from autoopt.runtimes.spec import RuntimeSpec

__all__ = ["export", "format_args", "transformers_device_map"]

_CPU = -1


def _rule(rules: tuple[Any, ...], attr: str, value: str, rt: RuntimeSpec, what: str) -> Any:
    """The runtime's rule whose ``attr`` is ``value``; a typed error when the plan used something else."""
    found = next((r for r in rules if getattr(r, attr) == value), None)
    if found is None:
        raise RuntimeRuleError(f"has no {value} {what}; re-plan with runtime={rt.name!r}", runtime=rt.name, rule=what)
    return found


def _format_arg(rec: Mapping[str, Any], rt: RuntimeSpec) -> str | None:
    """The runtime's name for the plan's weight format. A checkpoint served as shipped with quantized
    experts (gpt-oss) is named by its expert format: vLLM's --quantization must match the checkpoint's
    (mxfp4), and llama.cpp's GGUF of it is the MXFP4 file."""
    model = rec["model"]
    fmt = rec["quant"]["format"]
    expert = model.get("expert_dtype")
    if expert and expert != model.get("dtype") and fmt == model.get("dtype"):
        fmt = expert
    arg: str | None = _rule(rt.formats, "format", fmt, rt, "format").arg
    return arg


def _kv_arg(rec: Mapping[str, Any], rt: RuntimeSpec) -> str:
    arg: str = _rule(rt.kv_dtypes, "dtype", rec["workload"]["kv_dtype"], rt, "kv_dtype").arg
    return arg


def _split(rec: Mapping[str, Any]) -> tuple[int, int, list[dict[str, Any]]]:
    split = rec.get("split") or {"tp": 1, "pp": 1, "stages": []}
    return split["tp"], split["pp"], split["stages"]


def _model_id(rec: Mapping[str, Any], model_id: str | None) -> str:
    """The name the runtime loads: ``model_id`` when given, else the plan's checkpoint (a Hugging Face
    repo id, or the local folder its config came from), else the model's name (see :func:`_unnamed`)."""
    return model_id or rec["model"].get("checkpoint") or rec["model"]["name"]


def _unnamed(rec: Mapping[str, Any], model_id: str | None) -> list[str]:
    """A note when the export could only name the model: no runtime can fetch a bare autoopt name."""
    if model_id or rec["model"].get("checkpoint"):
        return []
    return [f"{rec['model']['name']!r} is autoopt's name for the model, not a checkpoint: replace it with the "
            "Hugging Face repo id or local folder to load (or pass --model-id)"]


def _gguf_stem(rec: Mapping[str, Any], model_id: str | None) -> str:
    """llama.cpp loads a local GGUF file: name it after the checkpoint's last path part
    (mistralai/Mixtral-8x7B-v0.1 -> Mixtral-8x7B-v0.1-Q4_K_M.gguf, as the GGUF conversions are named)."""
    return _model_id(rec, model_id).rstrip("/").rsplit("/", 1)[-1]


def _serving(rec: Mapping[str, Any], rt: RuntimeSpec, model_id: str | None, flags: Mapping[str, str]
             ) -> tuple[list[str], dict[str, Any], dict[str, Any] | None]:
    """vLLM and SGLang share the shape of their arguments; ``flags`` maps autoopt's names to theirs."""
    tp, pp, stages = _split(rec)
    if any(_CPU in s["devices"] for s in stages):
        raise RuntimeRuleError("cannot run layers on the CPU; re-plan with this runtime named", runtime=rt.name,
                               rule="offload")
    kw: dict[str, Any] = {flags["model"]: _model_id(rec, model_id), flags["tp"]: tp, flags["pp"]: pp}
    quant = _format_arg(rec, rt)
    if quant:
        kw[flags["quantization"]] = quant
    kw[flags["kv"]] = _kv_arg(rec, rt)
    kw[flags["context"]] = rec["workload"]["context"]
    kw[flags["memory"]] = rt.memory_utilization
    kw[flags["seqs"]] = rec["workload"]["batch"]
    if rec["model"].get("num_experts") and tp > 1:
        kw[flags["ep"]] = True if flags["ep"].startswith("--enable") else tp
    offload = rec.get("offload")
    if offload and offload["kind"] == "weight-stream":
        kw[flags["offload"]] = round(offload["offload_bytes"] / 1e9 + 0.5)
    replicas = rec.get("replicas") or []
    alternative = None
    if replicas and replicas[0]["replicas"] > 1 and rec["workload"]["batch"] > 1:
        best = replicas[0]  # the data-parallel layout predicted to give the most tokens/s
        alternative = {flags["dp"]: best["replicas"], flags["tp"]: best["tp"], flags["pp"]: best["pp"]}
    args = [x for k, v in kw.items() for x in _flag(k, v)]
    return args, kw, alternative


def _flag(key: str, value: Any) -> list[str]:
    if value is True:
        return [key]
    return [key, str(value)]


_VLLM = {"model": "--model", "tp": "--tensor-parallel-size", "pp": "--pipeline-parallel-size",
         "quantization": "--quantization", "kv": "--kv-cache-dtype", "context": "--max-model-len",
         "memory": "--gpu-memory-utilization", "seqs": "--max-num-seqs", "ep": "--enable-expert-parallel",
         "offload": "--cpu-offload-gb", "dp": "--data-parallel-size"}
_SGLANG = {"model": "--model-path", "tp": "--tp-size", "pp": "--pp-size", "quantization": "--quantization",
           "kv": "--kv-cache-dtype", "context": "--context-length", "memory": "--mem-fraction-static",
           "seqs": "--max-running-requests", "ep": "--ep-size", "offload": "--cpu-offload-gb",
           "dp": "--dp-size"}


def _vllm(rec: Mapping[str, Any], rt: RuntimeSpec, model_id: str | None, profile: Mapping[str, Any]
          ) -> dict[str, Any]:
    args, kw, alt = _serving(rec, rt, model_id, _VLLM)
    # `vllm serve` takes the model as its positional argument (engine_args.html: "vllm serve <model>")
    return {"command": "vllm serve", "args": [kw["--model"], *args[2:]], "kwargs": kw,
            "throughput_alternative": alt}


def _sglang(rec: Mapping[str, Any], rt: RuntimeSpec, model_id: str | None, profile: Mapping[str, Any]
            ) -> dict[str, Any]:
    args, kw, alt = _serving(rec, rt, model_id, _SGLANG)
    return {"command": "python -m sglang.launch_server", "args": args, "kwargs": kw,
            "throughput_alternative": alt}


def _llama_cpp(rec: Mapping[str, Any], rt: RuntimeSpec, model_id: str | None, profile: Mapping[str, Any]
               ) -> dict[str, Any]:
    """``llama-server``: the GGUF file, ``-ngl`` (all layers + the output layer when nothing is on the
    CPU), context, batch, threads (the CPU's physical cores), and the layer split over several GPUs."""
    _, _, stages = _split(rec)
    layers = rec["model"]["num_layers"]
    gpu_stages = [s for s in stages if _CPU not in s["devices"]]
    gpu_layers = sum(s["layers"][1] - s["layers"][0] for s in gpu_stages)
    ngl = layers + 1 if gpu_layers == layers else gpu_layers
    quant = _format_arg(rec, rt) or "F16"
    kw: dict[str, Any] = {"-m": f"{_gguf_stem(rec, model_id)}-{quant}.gguf", "-ngl": ngl,
                          "-c": rec["workload"]["context"] * rec["workload"]["batch"], "-b": rt.max_batch_tokens,
                          "-np": rec["workload"]["batch"]}
    cores = (profile.get("cpu") or {}).get("physical_cores")
    if cores:
        kw["-t"] = cores
    kv = _kv_arg(rec, rt)
    if kv != "f16":
        kw["-ctk"] = kw["-ctv"] = kv
    if len(gpu_stages) > 1:
        kw["--split-mode"] = "layer"
        kw["--tensor-split"] = ",".join(str(s["layers"][1] - s["layers"][0]) for s in gpu_stages)
    args = [x for k, v in kw.items() for x in _flag(k, v)]
    return {"command": "llama-server", "args": args, "kwargs": kw}


def transformers_device_map(rec: Mapping[str, Any]) -> dict[str, int | str]:
    """Module name -> device for ``from_pretrained(device_map=...)`` (Llama-style module names:
    ``model.embed_tokens``, ``model.layers.N``, ``model.norm``, ``model.rotary_emb``, ``lm_head``);
    layers beyond what the GPUs hold go to ``"cpu"`` (accelerate streams them)."""
    _, _, stages = _split(rec)
    layers = rec["model"]["num_layers"]
    where: list[int | str] = [0] * layers
    for s in stages:
        dev: int | str = "cpu" if _CPU in s["devices"] else s["devices"][0]
        for i in range(*s["layers"]):
            where[i] = dev
    offload = rec.get("offload")
    if offload and offload["kind"] == "weight-stream":
        for i in range(layers - offload["cpu_layers"], layers):
            where[i] = "cpu"
    first = next((w for w in where if w != "cpu"), 0)
    last = next((w for w in reversed(where) if w != "cpu"), first)
    dmap: dict[str, int | str] = {"model.embed_tokens": first, "model.rotary_emb": first}
    dmap.update({f"model.layers.{i}": w for i, w in enumerate(where)})
    dmap.update({"model.norm": last, "lm_head": last})
    return dmap


_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _transformers(rec: Mapping[str, Any], rt: RuntimeSpec, model_id: str | None, profile: Mapping[str, Any]
                  ) -> dict[str, Any]:
    quant = _format_arg(rec, rt)
    fmt = rec["quant"]["format"]
    dtype = _TORCH_DTYPES.get(fmt, _TORCH_DTYPES.get(rec["model"].get("dtype", "bf16"), "bfloat16"))
    kw: dict[str, Any] = {"pretrained_model_name_or_path": _model_id(rec, model_id), "dtype": dtype}
    tp, _, _ = _split(rec)
    if tp > 1:  # its tensor parallelism: one process a GPU, each loading its shard
        kw["tp_plan"] = "auto"
    else:
        kw["device_map"] = transformers_device_map(rec)
    if quant:
        kw["quantization_config"] = quant
    out: dict[str, Any] = {"command": "transformers.AutoModelForCausalLM.from_pretrained", "args": [], "kwargs": kw}
    if tp > 1:
        out["launch"] = f"torchrun --nproc-per-node {tp} SCRIPT.py"
    return out


def _autoopt(rec: Mapping[str, Any], rt: RuntimeSpec, model_id: str | None, profile: Mapping[str, Any]
             ) -> dict[str, Any]:
    kw = {"model": _model_id(rec, model_id), "weights": rec["quant"]["format"], "split": rec.get("split")}
    return {"command": "autoopt.optimize", "args": [], "kwargs": kw}


_EXPORTERS: dict[str, Callable[..., dict[str, Any]]] = {
    "vllm": _vllm, "sglang": _sglang, "llama.cpp": _llama_cpp, "transformers": _transformers, "autoopt": _autoopt}


def _moe_env(rec: Mapping[str, Any], rt: RuntimeSpec, folder: str | None, profile: Mapping[str, Any]
             ) -> tuple[dict[str, str], list[str]]:
    """For a MoE model under vLLM/SGLang: the variable pointing the runtime at ``folder`` (the ``--out`` of
    ``autoopt export moe-configs``) and a note naming the file it will look for there; without a folder,
    a note saying how to write one."""
    from autoopt.runtimes.moe_configs import ENV_VARS, RUNTIMES, config_folder, file_name, moe_shards

    model = rec["model"]
    if rt.name not in RUNTIMES or not model.get("num_experts"):
        return {}, []
    tp, _, _ = _split(rec)
    if folder is None:
        return {}, [f"{model['name']} runs its experts through {rt.name}'s fused-MoE kernel: write its configs with "
                    f"`autoopt export moe-configs --model {model['name']} --runtime {rt.name} --tp {tp}"
                    f"{f' --ep {tp}' if tp > 1 else ''} --out DIR` and pass --moe-configs DIR"]
    from pathlib import Path

    path = str(Path(folder).expanduser().resolve())
    notes = []
    gpu = (profile.get("gpus") or [{}])[0].get("name") if profile else None
    selector = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8_w8a8"}.get(rec["quant"]["format"])
    if gpu and selector:
        shard = moe_shards(rt.name, experts=model["num_experts"],
                           intermediate=model.get("moe_intermediate_size") or model["intermediate_size"],
                           hidden=model["hidden_size"], topk=model["experts_per_token"], tp=tp,
                           ep=tp if tp > 1 else 1, dtype=selector)[0]
        where = path if rt.name == "vllm" else str(config_folder(rt.name, path, "0.0.0").parent) + "/triton_<x_y_z>"
        notes.append(f"{rt.name} reads its fused-MoE configs from {where}/{file_name(rt.name, shard, gpu)} "
                     "(`autoopt export moe-configs` writes it)")
    return {ENV_VARS[rt.name]: path}, notes


def export(rec: Mapping[str, Any], runtime: str | RuntimeSpec, *, model_id: str | None = None,
           profile: Mapping[str, Any] | None = None, moe_configs: str | None = None) -> dict[str, Any]:
    """``rec`` (a ``Recommendation.to_dict()``) as ``runtime``'s arguments; a typed error when the plan
    uses something that runtime cannot run (plan again with the runtime named). ``moe_configs``: the
    folder of fused-MoE config files for a MoE model under vLLM/SGLang, exported as ``env``."""
    rt = get_runtime(runtime)
    if rec.get("runtime") not in (None, rt.name):
        raise RuntimeRuleError(f"the plan was made for {rec['runtime']}; plan again with runtime={rt.name!r}",
                               runtime=rt.name, rule="plan")
    if not rec.get("fits"):
        raise RuntimeRuleError(f"{rec['model']['name']} does not fit on {rec['profile']}: nothing to run "
                               "(more devices, a smaller format or offload would)", runtime=rt.name, rule="fit")
    fn = _EXPORTERS.get(rt.name)
    if fn is None:
        raise RuntimeRuleError("has no exporter (a plugin runtime is planned for but not exported)",
                               runtime=rt.name, rule="export")
    out = fn(rec, rt, model_id, profile or {})
    env, moe_notes = _moe_env(rec, rt, moe_configs, profile or {})
    notes = [f"predicted: {k} {v / 1e3:.3f} ms" for k, v in rec.get("predicted", {}).items()]
    if "launch" in out:
        notes.append(f"run it in one process a GPU: {out['launch']} (the script making this call)")
    return {"runtime": rt.name, **out, "env": env, "notes": [*notes, *_unnamed(rec, model_id), *moe_notes]}


def format_args(exported: Mapping[str, Any]) -> str:
    """One shell line (or, for transformers, one Python call) ready to paste; the ``env`` variables
    (a MoE model's config folder) come first, ``VAR=value command ...``."""
    import shlex

    if exported["args"]:
        env = [f"{k}={shlex.quote(str(v))}" for k, v in (exported.get("env") or {}).items()]
        return " ".join([*env, exported["command"], *(shlex.quote(str(a)) for a in exported["args"])])
    kw = ", ".join(f"{k}={v!r}" for k, v in exported["kwargs"].items())
    return f"{exported['command']}({kw})"
