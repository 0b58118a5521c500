"""Memory: autoopt's predicted bytes for a model run against what torch's allocator held, term by term.

The run (one GPU): from an empty caching allocator, build the model, allocate the KV cache, prefill
``batch x prompt_len`` and decode ``gen_len`` steps; ``torch.cuda.max_memory_allocated`` and the
allocations after the weights / after the KV cache are compared with
:func:`autoopt.planning.memory.estimate_memory` (weights + KV + activations + cuBLAS workspace; the CUDA
context and driver reserve are outside what the allocator counts, so they are reported apart).
Target: within 5 % of the measured peak.

On the committed H200 run (Llama-3-8B shapes, 4 layers, batch 4 x prompt 1024) the prediction was
0.993 of the peak, weights and KV cache exact, activations 0.930: this model follows transformers'
Llama layer, which keeps 3 hidden-size tensors live at the MLP peak where autoopt counts 2.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autoopt._log import get_logger
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.planning.memory import PREFILL_CHUNK, MemoryEstimate, estimate_memory
from autoopt.planning.model import ModelSpec
from autoopt.planning.quant import get_format
from autoopt.validation.verdict import MEMORY_TARGET, ratio
from autoopt.validation.workload import CheckOptions, check_buildable, llama_spec, spec_summary

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autoopt.validation.counters import MemoryCounter

__all__ = ["ALLOCATOR_SCOPE", "MemoryCheck", "MemoryComparison", "MemoryMeasurement", "MemoryPrediction",
           "MemoryTerm", "MemoryTotal", "check_memory", "compare_memory", "measure_memory", "predict_memory"]

log = get_logger(__name__)

ALLOCATOR_SCOPE = ("torch.cuda.max_memory_allocated counts the bytes of live tensors in torch's caching "
                   "allocator (cuBLAS workspaces included, which torch allocates through it); it excludes the "
                   "CUDA context, the driver's reservation and cached-but-free blocks (fragmentation), so those "
                   "autoopt terms are reported apart, not compared with the peak")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPrediction:
    """autoopt's memory terms (bytes) for one run; ``allocator_visible`` is what the allocator peak holds."""

    weights: float
    kv_cache: float
    activations: float
    workspace: float
    allocator_visible: float
    reserve: float
    fragmentation: float
    total: float
    activation_tokens: int
    estimate: MemoryEstimate

    def to_dict(self) -> dict[str, Any]:
        """The terms (the full estimate is left out: ``estimate.to_dict()`` has it)."""
        return {"weights": self.weights, "kv_cache": self.kv_cache, "activations": self.activations,
                "workspace": self.workspace, "allocator_visible": self.allocator_visible, "reserve": self.reserve,
                "fragmentation": self.fragmentation, "total": self.total,
                "activation_tokens": self.activation_tokens}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryMeasurement:
    """Allocator readings (bytes) between the steps of one run (see :func:`measure_memory`)."""

    baseline_bytes: int
    after_weights_bytes: int
    after_kv_bytes: int
    param_bytes: int
    rope_table_bytes: int
    kv_tensor_bytes: int
    prefill_peak_bytes: int
    decode_peak_bytes: int
    peak_bytes: int
    workspace_bytes: int | None  # None: this torch cannot drop its cuBLAS workspaces to count them
    reserved_peak_bytes: int
    prefill_logits_finite: bool
    peak_phase: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTerm:
    """One term of the peak, predicted and measured (``predicted_bytes`` None: autoopt has no such term)."""

    predicted_bytes: int | None
    measured_bytes: int | None
    gap_bytes: int | None
    ratio: float | None
    measured_how: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTotal:
    """The allocator-visible prediction against the measured peak, judged against ``target_pct``."""

    predicted_bytes: int
    measured_peak_bytes: int
    ratio: float | None
    error_pct: float | None
    target_pct: float
    passed: bool
    predicted_is: str

    def to_dict(self) -> dict[str, Any]:
        return {"predicted_bytes": self.predicted_bytes, "measured_peak_bytes": self.measured_peak_bytes,
                "ratio": self.ratio, "error_pct": self.error_pct, "target_pct": self.target_pct,
                "pass": self.passed, "predicted_is": self.predicted_is}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryComparison:
    """Term by term and in total, with what the allocator counts and a reading of the gaps."""

    scope: str
    terms: Mapping[str, MemoryTerm]
    total: MemoryTotal
    analysis: str

    def to_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "terms": {k: t.to_dict() for k, t in self.terms.items()},
                "total": self.total.to_dict(), "analysis": self.analysis}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryCheck:
    """The memory check's result: model, workload, both sides, their comparison, and what lies outside it."""

    model: Mapping[str, Any]
    device: str
    workload: Mapping[str, Any]
    predicted: MemoryPrediction
    measured: MemoryMeasurement
    comparison: MemoryComparison
    outside_allocator: Mapping[str, Any]

    @property
    def passed(self) -> bool:
        return self.comparison.total.passed

    def to_dict(self) -> dict[str, Any]:
        return {"model": dict(self.model), "device": self.device, "workload": dict(self.workload),
                "predicted": self.predicted.to_dict(), "measured": self.measured.to_dict(),
                **self.comparison.to_dict(), "outside_allocator": dict(self.outside_allocator)}


def predict_memory(spec: ModelSpec, *, gpu: GPUProfile | None, batch: int, prompt_len: int,
                   gen_len: int) -> MemoryPrediction:
    """autoopt's memory terms for the run :func:`measure_memory` does (bf16 weights and KV, phase both)."""
    capacity = int(gpu.memory_total_bytes or 0) if gpu else 0
    est = estimate_memory(spec, get_format("bf16"), capacity_bytes=capacity,
                          device=gpu.name if gpu else "gpu", gpu=gpu, batch=batch, context=prompt_len + gen_len,
                          prompt_len=prompt_len, phase="both", kv_dtype="bf16")
    visible = est.weights_bytes + est.kv_cache_bytes + est.activation_bytes + est.workspace_bytes
    return MemoryPrediction(weights=est.weights_bytes, kv_cache=est.kv_cache_bytes,
                            activations=est.activation_bytes, workspace=est.workspace_bytes,
                            allocator_visible=visible, reserve=est.reserve_bytes,
                            fragmentation=est.fragmentation_bytes, total=est.total_bytes,
                            activation_tokens=max(batch, min(batch * prompt_len, PREFILL_CHUNK)), estimate=est)


def measure_memory(spec: ModelSpec, *, device: Any, batch: int, prompt_len: int, gen_len: int,
                   mem: MemoryCounter, seed: int = 0, dtype: torch.dtype | None = None) -> MemoryMeasurement:
    """Build, allocate the KV cache, prefill and decode, reading ``mem`` between the steps (dtype: bf16)."""
    import torch

    from autoopt.validation.device import resolve_device
    from autoopt.validation.llama import build_model

    device = resolve_device(device)
    dtype = torch.bfloat16 if dtype is None else dtype
    ctx = prompt_len + gen_len
    with mem:
        mem.start()
        baseline = mem.allocated()
        model = build_model(spec, device=device, dtype=dtype, max_context=ctx, seed=seed)
        mem.sync()
        after_weights = mem.allocated()
        kv_bytes = model.allocate_kv(batch, ctx)
        mem.sync()
        after_kv = mem.allocated()
        with torch.inference_mode():
            ids = torch.randint(spec.vocab_size, (batch, prompt_len), device=device)
            logits = model(ids, pos=0)
            mem.sync()
            prefill_peak = mem.peak()
            reserved_prefill = mem.reserved_peak()
            finite = bool(torch.isfinite(logits).all())  # random weights must still give usable logits
            nxt = logits.argmax(-1, keepdim=True)
            del logits, ids
            mem.reset_peak()
            for step in range(gen_len):
                logits = model(nxt, pos=prompt_len + step)
                nxt = logits.argmax(-1, keepdim=True)
                del logits
            mem.sync()
            decode_peak = mem.peak()
            reserved_decode = mem.reserved_peak()
        workspace = mem.free_workspaces()
        out = MemoryMeasurement(
            baseline_bytes=baseline, after_weights_bytes=after_weights, after_kv_bytes=after_kv,
            param_bytes=model.param_bytes(), rope_table_bytes=model.rope_bytes(), kv_tensor_bytes=kv_bytes,
            prefill_peak_bytes=prefill_peak, decode_peak_bytes=decode_peak,
            peak_bytes=max(prefill_peak, decode_peak), workspace_bytes=workspace,
            reserved_peak_bytes=max(reserved_prefill, reserved_decode), prefill_logits_finite=finite,
            peak_phase="prefill" if prefill_peak >= decode_peak else "decode")
        del model, nxt
    gc.collect()
    return out


def _term(p: float | None, m: int | None, how: str) -> MemoryTerm:
    return MemoryTerm(predicted_bytes=None if p is None else round(p), measured_bytes=m,
                      gap_bytes=None if p is None or m is None else round(p - m),
                      ratio=ratio(p, m) if p else None, measured_how=how)


def compare_memory(spec: ModelSpec, predicted: MemoryPrediction, measured: MemoryMeasurement, *,
                   batch: int, target: float = MEMORY_TARGET) -> MemoryComparison:
    """Term-by-term comparison; the measured terms add up to the measured peak exactly.

    weights = parameter bytes; kv_cache = what allocating the cache added; workspace = what dropping torch's
    cuBLAS workspaces freed; unmodelled = allocator contents before the run, RoPE tables and block rounding
    (autoopt predicts 0 for them); activations = the rest of the peak.
    """
    peak = measured.peak_bytes
    ws = measured.workspace_bytes
    weights_m = measured.param_bytes
    kv_m = measured.after_kv_bytes - measured.after_weights_bytes
    unmodelled = measured.after_weights_bytes - weights_m
    act_m = peak - measured.after_kv_bytes - (ws or 0)
    terms = {
        "weights": _term(predicted.weights, weights_m, "sum of parameter tensor bytes"),
        "kv_cache": _term(predicted.kv_cache, kv_m, "memory_allocated after the cache minus after the weights"),
        "activations": _term(predicted.activations, act_m,
                             "peak minus allocated after the KV cache, minus the cuBLAS workspace" if ws is not None
                             else "peak minus allocated after the KV cache (cuBLAS workspace could not be "
                                  "separated: included here)"),
        "workspace": _term(predicted.workspace if ws is not None else None, ws,
                           "bytes freed by torch._C._cuda_clearCublasWorkspaces after the run"),
        "unmodelled": _term(0.0, unmodelled, "allocated before the run + RoPE tables + allocator block rounding"),
    }
    if ws is None:  # autoopt's workspace is then compared inside the activations term
        act_p = round(predicted.activations + predicted.workspace)
        terms["activations"] = MemoryTerm(predicted_bytes=act_p, measured_bytes=act_m, gap_bytes=act_p - act_m,
                                          ratio=ratio(act_p, act_m), measured_how=terms["activations"].measured_how)
    r = ratio(predicted.allocator_visible, peak)
    total = MemoryTotal(predicted_bytes=round(predicted.allocator_visible), measured_peak_bytes=peak, ratio=r,
                        error_pct=None if r is None else 100 * (r - 1), target_pct=100 * target,
                        passed=r is not None and abs(r - 1) <= target,
                        predicted_is="weights + kv_cache + activations + workspace")
    return MemoryComparison(scope=ALLOCATOR_SCOPE, terms=terms, total=total,
                            analysis=_memory_analysis(spec, predicted, terms, total, batch=batch))


def _memory_analysis(spec: ModelSpec, predicted: MemoryPrediction, terms: Mapping[str, MemoryTerm],
                     total: MemoryTotal, *, batch: int) -> str:
    gaps = {k: t.gap_bytes for k, t in terms.items() if t.gap_bytes is not None}
    total_gap = total.predicted_bytes - total.measured_peak_bytes
    worst = max(gaps, key=lambda k: abs(gaps[k]))
    error = "n/a" if total.error_pct is None else f"{total.error_pct:+.2f}"
    parts = [f"allocator-visible prediction {total.predicted_bytes / 1e9:.3f} GB vs measured peak "
             f"{total.measured_peak_bytes / 1e9:.3f} GB ({error} %, target +/-"
             f"{total.target_pct:.0f} %: {'pass' if total.passed else 'FAIL'}).",
             f"Largest term gap: {worst} ({gaps[worst] / 1e6:+.1f} MB of the {total_gap / 1e6:+.1f} MB total)."]
    for k in ("weights", "kv_cache"):
        if gaps.get(k) == 0:
            parts.append(f"{k} predicted exactly.")
    act = terms["activations"]
    tokens = predicted.activation_tokens
    if act.ratio is not None and abs(act.ratio - 1) > 0.02 and tokens \
            and act.measured_bytes is not None and act.predicted_bytes is not None:
        # Express the measured activation peak in bf16 elements per token and take off the widest stage
        # autoopt assumes (max of attention and 3 x MLP width) and the fp32 logits: the rest, in hidden-size
        # units, is how many hidden-wide tensors were live at the peak (autoopt: 2, residual + normed input).
        h, i = spec.hidden_size, spec.intermediate_size
        widest = max((2 * spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim, 3 * i)
        elems = act.measured_bytes / 2 / tokens
        logits = batch * spec.vocab_size * 4
        parts.append(f"activations measured {act.measured_bytes / 1e6:.1f} MB vs predicted "
                     f"{act.predicted_bytes / 1e6:.1f} MB (ratio {act.ratio:.3f}): "
                     f"{elems:.0f} bf16 elements per token at the peak; if the peak is the MLP stage "
                     f"({widest} wide), {(elems - widest) / h:.2f} hidden-size tensors were live besides it, "
                     f"autoopt assumes 2 (residual + normed input) and adds {logits / 1e6:.2f} MB of fp32 "
                     "logits, "
                     "which are not live at that point. This plain-torch model follows transformers' Llama "
                     "layer, whose caller keeps each layer's input alive for the whole layer (3 hidden-size "
                     "tensors at the MLP peak).")
    if terms["unmodelled"].measured_bytes:
        parts.append(f"unmodelled {(terms['unmodelled'].measured_bytes or 0) / 1e6:.2f} MB (RoPE tables, rounding).")
    return " ".join(parts)


def check_memory(options: CheckOptions | None = None, *, profile: HardwareProfile | None = None,
                 device: Any = None, spec: ModelSpec | None = None) -> MemoryCheck:
    """Run the memory check and compare it with autoopt's prediction for ``profile``'s first GPU.

    ``device``: default cuda:0 (:class:`~autoopt.errors.BackendError` when torch sees no CUDA device); a CPU
    device counts live tensors instead of the allocator, to run the same code path without a GPU.
    ``profile``: default this machine, detected. ``spec``: default ``options.model`` with ``options.layers``.
    """
    import torch

    from autoopt.validation.counters import CudaMemory, LiveTensorMemory
    from autoopt.validation.device import device_name, require_cuda, resolve_device

    options = options or CheckOptions()
    spec = spec or llama_spec(options.layers, options.model)
    check_buildable(spec)
    if device is None:
        require_cuda()
        device = torch.device("cuda", 0)
    device = resolve_device(device)
    if profile is None:
        from autoopt.validation.profiles import detected_profiles

        profile = detected_profiles()[0]["detected"]
    gpu = profile.gpu
    cuda = device.type == "cuda"
    free0, total0 = torch.cuda.mem_get_info(device) if cuda else (None, None)
    b, p, g = options.batch, options.prompt_len, options.gen_len
    counter: MemoryCounter = CudaMemory(device) if cuda else LiveTensorMemory()
    measured = measure_memory(spec, device=device, batch=b, prompt_len=p, gen_len=g, mem=counter,
                              seed=options.seed)
    predicted = predict_memory(spec, gpu=gpu, batch=b, prompt_len=p, gen_len=g)
    cmp = compare_memory(spec, predicted, measured, batch=b)
    torch.cuda.empty_cache()
    torch_total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    nvml_total = gpu.memory_total_bytes if gpu else None
    outside = {
        "note": "not compared with the target: outside what max_memory_allocated counts",
        "predicted_reserve_bytes": round(predicted.reserve),
        "predicted_fragmentation_bytes": round(predicted.fragmentation),
        "predicted_total_bytes": round(predicted.total),
        "measured_reserved_peak_bytes": measured.reserved_peak_bytes,
        "measured_reserved_minus_allocated_peak_bytes": measured.reserved_peak_bytes - measured.peak_bytes,
        "device_used_before_run_bytes": None if total0 is None or free0 is None else total0 - free0,
        "device_used_before_run_note": "cudaMemGetInfo used after CUDA init, before any allocation: this "
                                       "process's CUDA context plus any other process on the GPU",
        "nvml_total_bytes": nvml_total, "torch_total_memory_bytes": torch_total,
        "driver_reserved_measured_bytes": None if nvml_total is None or torch_total is None
        else nvml_total - torch_total,
    }
    return MemoryCheck(model=spec_summary(spec), device=device_name(device),
                       workload={"batch": b, "prompt_len": p, "gen_len": g, "context": p + g, "prefill_tokens": b * p},
                       predicted=predicted, measured=measured, comparison=cmp, outside_allocator=outside)
