"""Whole-model recommendation: format, memory, split, per-op kernel configs and a per-layer plan.

:func:`recommend` works from the hardware profile and the cost model only (no GPU
timing), as a pipeline of steps, each a function below:

1. **fit** (:func:`_fit`): pick a weight format (:mod:`autoopt.planning.quant`) that
   fits somewhere (:mod:`autoopt.planning.memory`) and lay the model over the devices
   (:mod:`autoopt.planning.split`);
2. **per-layer costs** (:func:`_layer_costs`): price every op of each distinct layer in
   every activation mode with :func:`autoopt.search.ranking.rank` (cached per GPU and
   op) or the roofline. Each layer runs its GEMMs with bf16 activations or, where the
   format is native FP8/FP4, with fp8 activations. Under the ``autoopt`` runtime a format its
   own kernels run (fp8, fp8-weight-only, int8, int4) prices each layer GEMM as the op
   ``autoopt.optimize(weights=...)`` runs, ``OpSpec(weight=...)`` ranked over the quantized
   templates (the LM head stays 16-bit, as optimize() keeps it);
3. **chain plan** (:func:`_chain_plan`): choose a mode per layer (:mod:`autoopt.planning.chain`);
   neighbouring layers in different modes pay a cast of the hidden state (read + write
   at the GPU's bandwidth). The exact DP plan is used; with ``compare_wfc`` (the CLI asks
   for it) the WFC search is reported beside it on the same problem, a diagnostic a runtime
   starting up does not need (~4 ms of a cold 70B-on-8-GPUs call on the 2-core CI box);
4. **head** (:func:`_head_ops`): price the final norm and LM head after the last layer;
5. **op choices** (:func:`_op_choices`): the kernel config of every distinct op of the
   chosen plan and the implementation per kernel class;
6. **totals** (:func:`_totals`): predicted prefill, decode-step and request times.

:class:`_Fit` and :class:`_LayerCosts` carry what the later steps read. Every time is ``predicted``.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError, ModelError, RuntimeRuleError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.attention import decode_attention_choice, in_step_us, supported_head_dim
from autoopt.kernels.constants import GRAPH_LAUNCH_US, INDUCTOR_NORM_MAX_ROWS
from autoopt.kernels.ops import OpSpec
from autoopt.planning.catalog import parse_model
from autoopt.planning.chain import ChainProblem, ChainSolution, solve_dp, solve_wfc
from autoopt.planning.memory import MemoryEstimate, estimate_memory
from autoopt.planning.model import LayerOp, ModelSpec
from autoopt.planning.quant import QuantChoice, QuantFormat, choose_format
from autoopt.planning.split import (
    CPU,
    NO_RESERVE,
    Device,
    SplitPlan,
    Workload,
    candidate_splits,
    devices_of,
    tp_step_comm_us,
)
from autoopt.runtimes.registry import get_runtime
from autoopt.runtimes.spec import RuntimeSpec

if TYPE_CHECKING:
    from autoopt.kernels.config import Candidate
    from autoopt.planning.moe_configs import MoeChooser
    from autoopt.planning.offload import OffloadPlan
    from autoopt.planning.replicas import ReplicaOption

__all__ = ["OpChoice", "Recommendation", "recommend"]

log = get_logger(__name__)

#: GEMMs whose output dimension (N) is split over tensor-parallel ranks (Megatron column-parallel).
_COLUMN_PARALLEL = {"qkv_proj", "gate_up_proj", "fc1", "q_b_proj", "kv_b_proj", "shared_gate_up", "expert_gate_up",
                    "lm_head", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
#: runtimes that run a checkpoint's q/k/v and gate/up linears as separate GEMMs (priced so: five GEMMs where
#: autoopt, vLLM and SGLang run two). transformers does, compiled or not: its Llama-3-8B decode step traced on
#: the H100 launched 386 GEMM kernels a step (12 a layer, with cuBLAS's split-K reductions) against 130 (4 a
#: layer) for an optimize()d model (benchmarks/results/h100/quant_trace.json).
UNFUSED_PROJECTIONS = frozenset({"transformers"})
#: GEMMs whose reduction dimension (K) is split (row-parallel, followed by an all-reduce).
_ROW_PARALLEL = {"o_proj", "down_proj", "fc2", "shared_down", "expert_down"}
#: activation op kinds costed by the roofline (gated GELU; a plain MLP's GELU or SiLU): (rows, intermediate)
_ROOFLINE_ACTIVATIONS = {"gelu_mul", "gelu", "silu"}
#: rank() per (GPU content, op, top): its best candidate, or the error it raised (asked again, it raises again).
_RANK_CACHE: dict[tuple[Any, ...], Candidate | AutooptError] = {}
#: while not None, every (GPU, op) :func:`_rank` is asked about is appended here: how
#: :mod:`autoopt.planning.startup` learns which ops the shipped rank cache must hold
_RECORD: list[tuple[GPUProfile, OpSpec]] | None = None
#: whether _rank() ranked an op since the last flush of the learned rank cache
_LEARNED = False


@dataclass(frozen=True, slots=True, kw_only=True)
class OpChoice:
    """One distinct op of one phase: its best config (from rank()) and predicted time."""

    phase: str
    name: str
    mode: str
    gpu: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    occurrences: int
    kernel_class: str
    predicted_us: float
    bound: str
    #: "rank" (template + cost model), "roofline" (no template kind for the op), "fit" (a kernel priced by its fit
    #: to measured timings: decode attention), "vendor" (cuBLAS, F.linear or a W8A8 fp8 GEMM's act_quant +
    #: torch._scaled_mm, which optimize()'s dispatch runs where it is predicted faster than rank()'s config), or
    #: where a measured
    #: winner came from ("measured:memory" / "measured:store" / "measured:shipped": the results store)
    source: str
    config: Mapping[str, int] = field(default_factory=dict)
    kernel: str = ""
    template: str = ""
    path: str = ""
    roofline_pct: float = 0.0
    reason: str = ""
    #: the chosen config's checked timing on this device and stack, when the results store has one
    #: (the plan's times stay the cost model's, so ops compare like with like)
    measured_us: float | None = None

    @property
    def total_us(self) -> float:
        return self.predicted_us * self.occurrences

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "name": self.name, "mode": self.mode, "gpu": self.gpu, "kind": self.kind,
                "shape": list(self.shape), "dtype": self.dtype, "occurrences": self.occurrences,
                "kernel_class": self.kernel_class, "predicted_us": round(self.predicted_us, 4),
                "total_us": round(self.total_us, 3),
                "label": "predicted" if self.measured_us is None else "measured",
                "measured_us": None if self.measured_us is None else round(self.measured_us, 4), "bound": self.bound,
                "source": self.source, "config": dict(self.config), "kernel": self.kernel,
                "template": self.template, "path": self.path, "roofline_pct": round(self.roofline_pct, 2),
                "reason": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    """Everything recommend() decided, JSON-ready through :meth:`to_dict`; :meth:`explain` reads it out."""

    profile: str
    model: ModelSpec
    workload: Workload
    preference: str
    quant: QuantChoice
    fits: bool
    split: SplitPlan | None
    memory: tuple[MemoryEstimate, ...]
    ops: tuple[OpChoice, ...]
    impls: tuple[Mapping[str, str], ...]
    plan: ChainSolution | None
    plan_alternative: ChainSolution | None
    layer_modes: tuple[str, ...]
    predicted: Mapping[str, float]
    notes: tuple[str, ...] = ()
    elapsed_ms: float = 0.0
    #: the serving runtime whose rules the plan follows (None: autoopt's default pool, no runtime rules)
    runtime: str | None = None
    #: layers run from host memory (llama.cpp -ngl, --cpu-offload-gb), when the GPUs cannot hold the model
    offload: OffloadPlan | None = None
    #: the same GPUs as data-parallel replicas of smaller splits, best throughput first (serving workloads)
    replicas: tuple[ReplicaOption, ...] = ()

    def to_runtime(self, runtime: str | None = None) -> dict[str, Any]:
        """What ``runtime`` (default: the one planned for) takes to run this plan: its command-line
        arguments (``args``, ready to paste) or keyword arguments (see :mod:`autoopt.runtimes.export`)."""
        from autoopt.runtimes.export import export

        return export(self.to_dict(), runtime or self.runtime or "autoopt")

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "runtime": self.runtime,
            "model": {**self.model.to_dict(), "num_params": self.model.num_params,
                      "active_params": self.model.active_params},
            "workload": self.workload.to_dict(),
            "preference": self.preference,
            "quant": self.quant.to_dict(),
            "fits": self.fits,
            "split": self.split.to_dict() if self.split else None,
            "memory": [m.to_dict() for m in self.memory],
            "ops": [o.to_dict() for o in self.ops],
            "impls": [dict(i) for i in self.impls],
            "plan": self.plan.to_dict() if self.plan else None,
            "plan_alternative": self.plan_alternative.to_dict() if self.plan_alternative else None,
            "layer_modes": _runs(self.layer_modes),
            "predicted": {k: round(v, 3) for k, v in self.predicted.items()},
            "label": "predicted",
            "offload": self.offload.to_dict() if self.offload else None,
            "replicas": [r.to_dict() for r in self.replicas],
            "notes": list(self.notes),
            "elapsed_ms": round(self.elapsed_ms, 3),
        }

    def explain(self) -> str:
        m, wl, q = self.model, self.workload, self.quant
        lines = [f"Recommendation for {m.summary()} on {self.profile}",
                 f"Workload: batch {wl.batch}, prompt {wl.prompt_len}, generate {wl.gen_len}, context "
                 f"{wl.max_context}, phase {wl.phase}, KV cache {wl.kv_dtype}; preference {self.preference}.",
                 f"Weights: {q.format.name} ({q.format.mode}, {q.format.bits_per_weight(m.hidden_size):.4g} "
                 f"bits/weight{' approx.' if q.format.approx else ''}) - {q.reason}."]
        if self.runtime:
            lines.append(f"Runtime: {self.runtime} (only the formats, splits and KV-cache types it runs).")
        if not self.fits:
            lines.append("DOES NOT FIT on this hardware with any split; memory of the best attempt below.")
        if self.offload:
            lines.append("Offload: " + self.offload.describe())
        if self.split:
            lines.append("Placement: " + self.split.describe())
        else:
            lines.extend("Memory: " + mm.describe() for mm in self.memory)
        p = self.predicted
        lines.append("Predicted (cost model, not measured): "
                     + ", ".join(f"{k.removesuffix('_us').replace('_', ' ')} {v / 1e3:.3f} ms" for k, v in p.items()))
        if self.plan:
            lines.append(f"Per-layer plan (exact DP over {len(self.layer_modes)} layers): "
                         + "; ".join(f"layers {a}-{b}: {mode}" for a, b, mode in _runs(self.layer_modes))
                         + f" - cost {self.plan.cost / 1e3:.3f} ms in {self.plan.elapsed_s * 1e3:.2f} ms")
            if self.plan_alternative:
                alt = self.plan_alternative
                gap = (alt.cost - self.plan.cost) / self.plan.cost * 100 if self.plan.cost else 0.0
                lines.append(f"  WFC search on the same chain: cost {alt.cost / 1e3:.3f} ms (+{gap:.2f}% vs DP) "
                             f"in {alt.elapsed_s * 1e3:.2f} ms, {alt.backtracks} backtracks")
        lines.append("Kernel configs per distinct op (predicted):")
        for o in self.ops:
            cfg = " ".join(f"{k}={v}" for k, v in o.config.items()) or "-"
            lines.append(f"  [{o.phase}] {o.name:<15} {o.kind}[{'x'.join(map(str, o.shape))}] {o.dtype} "
                         f"x{o.occurrences}: {o.predicted_us:.2f} us {o.bound}-bound via "
                         f"{o.path or o.source} ({o.mode}) {cfg}")
        lines.append("Implementations:")
        for i in self.impls:
            lines.append(f"  {i['kernel_class']}: {i['impl']} - {i['reason']}")
        if self.replicas:
            lines.append("Replicas vs sharding (predicted, best throughput first):")
            lines.extend("  " + r.describe() for r in self.replicas)
        lines.extend(f"Note: {n}" for n in self.notes)
        return "\n".join(lines)


def _runs(modes: tuple[str, ...]) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    for i, m in enumerate(modes):
        if out and out[-1][2] == m:
            out[-1] = (out[-1][0], i, m)
        else:
            out.append((i, i, m))
    return out


# -- the pipeline -----------------------------------------------------------------------
def recommend(profile: HardwareProfile | str | Path, model: Any, *, batch: int = 1, prompt_len: int = 1024,
              gen_len: int = 256, context: int | None = None, phase: str = "both", weight_dtype: str | None = None,
              kv_dtype: str | None = None, preference: str = "balanced", max_devices: int | None = None,
              include_cpu: bool = False, top: int = 3, compare_wfc: bool = False, runtime: Any = None,
              tensor_parallel: int | None = None, pipeline_parallel: int | None = None,
              cuda_graphs: bool = False, moe_chooser: MoeChooser | None = None) -> Recommendation:
    """Recommend how to run ``model`` on ``profile`` (see module docstring); predictions only.

    ``runtime`` (``"vllm"``, ``"sglang"``, ``"llama.cpp"``, ``"transformers"``, ``"autoopt"`` or a
    plugin's) limits the plan to what that runtime runs; ``tensor_parallel`` / ``pipeline_parallel``
    fix the degrees. ``cuda_graphs``: price decode steps as replayed from a CUDA graph (each kernel's
    launch at :data:`GRAPH_LAUNCH_US` instead of a standalone launch). Under vLLM or SGLang a MoE
    model's expert GEMMs are listed as the runtime's fused-MoE kernel with the config ``moe_chooser``
    (default: rank()'s, :func:`~autoopt.planning.moe_configs.rank_chooser`) gives for the phase's M.
    """
    t0 = time.perf_counter()
    if preference == "fastest" and weight_dtype is None:
        return _fastest(profile, model, batch=batch, prompt_len=prompt_len, gen_len=gen_len, context=context,
                        phase=phase, kv_dtype=kv_dtype, max_devices=max_devices, include_cpu=include_cpu, top=top,
                        compare_wfc=compare_wfc, runtime=runtime, tensor_parallel=tensor_parallel,
                        pipeline_parallel=pipeline_parallel, cuda_graphs=cuda_graphs, moe_chooser=moe_chooser)
    rt = _runtime(runtime, tensor_parallel, pipeline_parallel)
    hw = _profile(profile)
    if rt is not None:
        include_cpu = include_cpu or rt.offload == "cpu-compute"
    spec = parse_model(model)
    wl = _workload(hw.gpu, preference, batch=batch, prompt_len=prompt_len, gen_len=gen_len, context=context,
                   phase=phase, kv_dtype=_kv_dtype(rt, hw.gpu, kv_dtype, preference), cuda_graphs=cuda_graphs)
    shape = _Shape(rt=rt, tp=tensor_parallel, pp=pipeline_parallel)
    fit = _fit(hw, spec, wl, preference=preference, weight_dtype=weight_dtype, max_devices=max_devices,
               include_cpu=include_cpu, shape=shape)
    if fit.split is None and not include_cpu and (rt is None or rt.offload == "cpu-compute") \
            and any(d.kind == "cpu" for d in devices_of(hw, include_cpu=True)):
        # nothing fits on the GPUs: layers on the CPU (autoopt runs them there too) before giving up
        fit = _fit(hw, spec, wl, preference=preference, weight_dtype=weight_dtype, max_devices=max_devices,
                   include_cpu=True, shape=shape)
    costs = _layer_costs(spec, wl, fit, preference=preference, top=top, runtime=rt.name if rt else None)
    plan, alternative = _chain_plan(spec, wl, fit, costs, compare_wfc=compare_wfc)
    head = _head_ops(spec, wl, fit, costs, plan, top=top, runtime=rt.name if rt else None)
    ops, impls = _op_choices(fit, costs, plan, head)
    if rt is not None and spec.is_moe:
        ops = _runtime_moe_ops(ops, spec, wl, fit, rt.name, moe_chooser)
    predicted = _totals(fit, costs, plan, head, _step_comm(hw, spec, wl, fit, costs))
    predicted.update(_eager_host(rt.name if rt else None, spec, wl, predicted, fit.tp, fit.quant.format.name))
    predicted.update(_generate_token(rt.name if rt else None, wl, predicted))
    predicted.update(_request_with_host(predicted, costs.phases))
    offload = _offload(hw, spec, wl, fit, predicted, rt)
    replicas = _replicas(hw, spec, wl, fit, shape)
    _flush_learned()
    return Recommendation(profile=hw.name, model=spec, workload=wl, preference=preference, quant=fit.quant,
                          fits=fit.split is not None or offload is not None, split=fit.split, memory=fit.memory,
                          ops=ops, impls=impls, plan=plan, plan_alternative=alternative, layer_modes=plan.labels,
                          predicted=predicted, notes=fit.notes + costs.notes + _replica_notes(fit, replicas),
                          elapsed_ms=(time.perf_counter() - t0) * 1e3, runtime=rt.name if rt else None,
                          offload=offload, replicas=replicas)


#: transformers' ``generate()`` per decoded token beyond the step's GPU time, in us: its Python loop (input
#: preparation, the compiled call, logits processing, stopping criteria, which read a GPU value every token, so the
#: host's work does not overlap the next step). Fitted at batch 1 with a static cache as generate()'s time per token
#: less the same format's compiled step replayed from one CUDA graph, Llama-3-8B, the lent hosts:
#:
#: - ``transformers`` (its compiled call: Dynamo's guards and CUDA-graph trees, 1.1-1.2 ms a token of host time by
#:   themselves, benchmarks/results/h100/generate_host*.json): H100 bf16 1.85-2.12, fp8 1.64-1.95, int4 1.36-1.94 ms;
#:   H200 fp8 1.92, int4 1.68 ms (10 pairs, median 1.9 ms; {h100,h200}/quant_e2e*.json against quant_trace*.json,
#:   measured before optimize() had its own decode graphs); 1.79 ms again on 2026-11-28 (generate_host_fit.json).
#: - ``autoopt`` (an optimize()d model, whose decode step replays from autoopt.nn.decode_graphs, which also builds the
#:   4D attention mask inside the captured step): four same-run pairs on two lent H100s, 2026-11-28: int4 0.81
#:   (h100/generate_host_masks.json), int4 0.57, fp8 0.89, bf16 0.62 ms (h100/generate_host_fit_run2.json: generate()
#:   medians 3.99, 5.16, 6.87 ms over graphed steps of 3.41, 4.27, 6.25 ms); and four same-run pairs on the lent
#:   H200s, 2026-11-29: int4 0.30 and 0.35, fp8 0.40 and 0.36 ms (h200/step_variants_decode_layer_loads.json,
#:   step_variants_run80.json, step_variants_fp8_{before,after}.json: generate() 3.01, 3.05, 3.88, 3.68 ms over
#:   2.71, 2.70, 3.47, 3.33). Median of the eight: 0.49 ms (0.71, the H100's four alone, priced the H200's
#:   generate() 1.08-1.13x; at 0.49 both hosts' pairs come within 0.92-1.06x). Before the mask moved into the
#:   graph, 11 pairs from five runs gave 0.77-1.74 ms (median 1.33; the same file's older version,
#:   generate_host_graphs.json, quant_e2e_decode_graphs*.json). One process's three generate() calls spread
#:   0.54-1.70 ms (fp8): the loop, not the GPU, moves.
#:
#: A host CPU unlike those machines' moves it. Uncompiled, the step itself is the host's
#: (:data:`EAGER_HOST_LAYER_US`) and this loop comes on top.
GENERATE_HOST_US = {"transformers": 1900.0, "autoopt": 490.0}
#: the host's time a decoder layer of an uncompiled decode step, in us, for the runtimes whose layers are Python
#: modules issuing one launch per op (no CUDA graph): the step is then bound by the host, not the GPU, and
#: takes max(GPU time, layers x this). Fitted as medians, hosts of the lent machines (torch 2.11, Python 3.12):
#:
#: - ``autoopt`` (an optimize()d bf16 model: autoopt's ops through their Python dispatch, transformers'
#:   attention; quantized formats add :data:`AUTOOPT_QUANT_HOST_LAYER_US`): 1131 us, the geometric mean of two
#:   lent hosts' medians of the harness's own statistic (the least of five 20-step blocks of uncompiled steps of an
#:   8-layer model, :data:`autoopt.nn.e2e.EAGER_BLOCKS`), so that neither host is favoured: an H100 host 1049 us
#:   (16 such least-of-five, two processes x two builds, 2026-11-28, h100/eager_host_noise_p{1,2}.json) and an H200
#:   host 1220 us (31 one-GPU eager rows, Llama-3-8B and Qwen2.5-7B at batch 1-32, 2026-11-29,
#:   h200/regret_1gpu_layers8_run{4..8}.json, regret_qwen_1gpu_layers8_run{2..5}.json); both hosts report the same
#:   16-core Xeon, and 1070 (the H100 host's median block, before the harness took the least) priced the H200 rows
#:   0.84-0.90 of measured. The host's speed moves in phases of a second or more: 12-40 % of the blocks ran
#:   1.3-1.9x slower (13-19 ms), whether the collector was off or the process pinned to one core, with the enqueue
#:   still ~all of the step; a row whose five blocks all land in one is that much off. Earlier fits (1520 us,
#:   2026-11-27) were made while the SwiGLU a layer paid wrap_triton's eager dispatch (444 us of host a call at
#:   2048 rows, 68 us since kernels launch themselves outside tracing: h100/op_host.json, op_host_direct.json).
#: - ``transformers`` (its own modules, uncompiled): eager generate() less :data:`GENERATE_HOST_US`, per layer,
#:   Llama-3-8B H100 1.30 and 1.24, H200 0.67, 0.69, 0.74 and 0.71, Qwen2.5-7B H200 1.39 and 0.91 ms
#:   (e2e_*.json, batch 1 and 16): median 825 us.
EAGER_HOST_LAYER_US = {"autoopt": 1131.0, "transformers": 825.0}
#: what an uncompiled optimize()d layer's quantized linears add to :data:`EAGER_HOST_LAYER_US` ``["autoopt"]``, in
#: us, by weight format (the packed-weight checks and the launcher's binding; fp8's W8A8 path its activation
#: quantization): the same two hosts' geometric mean over bf16's, int4 1337 (H100 1189, H200 1503), fp8 1370 (1232,
#: 1524 us a layer). int8 was timed on the H200 host only (1392, 0.926 of int4's there): int4's pooled value at that
#: ratio, 1238.
AUTOOPT_QUANT_HOST_LAYER_US = {"int4": 206.0, "int8": 107.0, "fp8": 239.0}
#: the same for transformers' modules sharded by its ``tp_plan`` (DTensor dispatch on every rank, each collective
#: waiting for the slowest rank's host), as the regret harness runs tensor parallelism uncompiled, by ranks
#: (linear between the points, past the last its slope): the median 8-layer step over every committed table,
#: H100 and H200 hosts, Llama-3-8B and Qwen2.5-7B, batch 1 to 32 (bf16; regret_{,qwen_}{2,4}gpu_layers8*.json).
#: 2 ranks, 14 steps: H100 11.4-15.0 ms, H200 10.2-18.3 ms (the 2026-11-28 call 17.7-18.3, the 2026-11-29 one
#: 10.2-16.5): median 13.69 ms, 1711 us a layer. 4 ranks, 10 steps: H100 17.4-21.9, H200 14.1-19.3 ms: median
#: 19.81 ms, 2476 us. One constant for both (1940, fitted on the first H100 tables) priced 2 ranks 1.13x and
#: 4 ranks 0.78x of these medians. A host-bound step moves +-30 % between calls on one host: no constant
#: holds every run within 15 %.
EAGER_TP_HOST_LAYER_US = {2: 1711.0, 4: 2476.0}


def eager_tp_host_layer_us(ranks: int) -> float:
    """:data:`EAGER_TP_HOST_LAYER_US` at ``ranks`` tensor-parallel ranks."""
    return piecewise_linear(sorted(EAGER_TP_HOST_LAYER_US.items()), ranks, extrapolate=True)


#: the host time of an uncompiled decode step while ``n`` data-parallel replicas step at once on one host, as a
#: multiple of one process's (:data:`EAGER_HOST_LAYER_US`); between the points linear in ``n`` (1 at one process),
#: past the last the last slope. Each replica step measured over the single-process step of the same format and
#: batch in the same table (the same host in the same minutes, so the host's phase cancels), pooled over every
#: committed table, H100 and H200 hosts, Llama-3-8B and Qwen2.5-7B (regret_{,qwen_}{2,4}gpu_layers8*.json; every
#: replica a Python loop issuing ~1000 launches a step): 2 replicas, 56 pairs, median 1.151 (table medians
#: 1.02-1.49); 4 replicas, 40 pairs, median 1.253 (1.13-1.72). The earlier fit on the first two H100 Llama tables
#: (1.275 / 1.417) had the H200's 2026-11-29 call 1.02 / 1.06: a host-bound step moves +-30 % run to run, the
#: ratio with it.
EAGER_REPLICA_HOST_FACTOR = {2: 1.151, 4: 1.253}


def piecewise_linear(points: Sequence[tuple[float, float]], x: float, *, extrapolate: bool = False) -> float:
    """``points`` (sorted by x) joined by straight lines, at ``x``: flat before the first; past the last flat, or
    on the last segment's slope with ``extrapolate``."""
    (x0, y0) = points[0]
    if x <= x0 or len(points) == 1:
        return y0
    for (xa, ya), (xb, yb) in itertools.pairwise(points):
        if x <= xb:
            return ya + (yb - ya) * (x - xa) / (xb - xa)
    (xa, ya), (xb, yb) = points[-2], points[-1]
    return yb + (yb - ya) * (x - xb) / (xb - xa) if extrapolate else yb


def eager_replica_host_factor(replicas: int) -> float:
    """:data:`EAGER_REPLICA_HOST_FACTOR` at ``replicas`` processes (1 for one)."""
    return piecewise_linear([(1, 1.0), *sorted(EAGER_REPLICA_HOST_FACTOR.items())], replicas, extrapolate=True)


#: the host's extra time a decoder layer of an uncompiled transformers step spends in a quantized checkpoint's
#: linear modules, by weight format, in us (on top of :data:`EAGER_HOST_LAYER_US`): AutoAWQ's seven ``WQLinear``
#: modules a layer run their own Python forward and extra launches, so AWQ decodes slower than bf16 in
#: transformers though it reads a quarter of the bytes. Fitted from Qwen's published speed benchmark (A100 80GB,
#: transformers 4.46, AutoAWQ 0.2.6, batch 1, input 1, 2048 tokens; Qwen2.5 speed_benchmark.rst at 010c37c):
#: (1/AWQ - 1/BF16 tokens/s) / layers for the sizes outside the deployments table, 0.5B 244, 1.5B 227, 3B 196,
#: 14B 241, 32B 179 us: median 227. Held out, the table's 7B measures 231 and its 72B AWQ row is scored in
#: benchmarks/results/deployments.json. GPTQ-Int4 (exllama kernels) measured 37-113 us a layer *faster* than
#: bf16 in the same table, which a host-bound step does not explain; it gets no term (predicted as bf16).
TRANSFORMERS_QUANT_HOST_LAYER_US = {"awq": 227.0}
#: a runtime's per-format host time on top of :data:`EAGER_HOST_LAYER_US`, by runtime
_QUANT_HOST_LAYER_US = {"transformers": TRANSFORMERS_QUANT_HOST_LAYER_US, "autoopt": AUTOOPT_QUANT_HOST_LAYER_US}


def _eager_host(runtime: str | None, spec: ModelSpec, wl: Workload, predicted: Mapping[str, float], tp: int = 1,
                weight_format: str = "") -> dict[str, float]:
    """An uncompiled decode step of a runtime in :data:`EAGER_HOST_LAYER_US` as the larger of its GPU time
    (``decode_gpu_us``) and its host's (``decode_host_us``; transformers sharded by its ``tp_plan``:
    :data:`EAGER_TP_HOST_LAYER_US`; a quantized checkpoint's modules: :data:`TRANSFORMERS_QUANT_HOST_LAYER_US`;
    autoopt's quantized linears: :data:`AUTOOPT_QUANT_HOST_LAYER_US`);
    nothing for graphed steps and other runtimes."""
    per_layer = EAGER_HOST_LAYER_US.get(runtime or "")
    if per_layer is None or wl.cuda_graphs or "decode_step_us" not in predicted:
        return {}
    if runtime == "transformers" and tp > 1:
        per_layer = eager_tp_host_layer_us(tp)
    per_layer += _QUANT_HOST_LAYER_US.get(runtime or "", {}).get(weight_format, 0.0)
    gpu, host = predicted["decode_step_us"], spec.num_layers * per_layer
    return {"decode_step_us": max(gpu, host), "decode_gpu_us": gpu, "decode_host_us": host}


def _generate_token(runtime: str | None, wl: Workload, predicted: Mapping[str, float]) -> dict[str, float]:
    """``generate_token_us``: one token of the runtime's ``generate()``, the decode step (graphed, or bound by
    its host uncompiled) plus its per-token host loop (:data:`GENERATE_HOST_US`); only for the runtimes with
    such a loop."""
    host = GENERATE_HOST_US.get(runtime or "")
    if host is None or "decode_step_us" not in predicted:
        return {}
    return {"generate_token_us": predicted["decode_step_us"] + host, "generate_host_us": host}


def _request_with_host(predicted: Mapping[str, float], phases: tuple[_Phase, ...]) -> dict[str, float]:
    """``request_us`` with each decode step at its host-bound time (:func:`_eager_host`) and the runtime's
    per-token loop (:func:`_generate_token`): the layer costs it was summed from are GPU time only, so a
    transformers request would otherwise be priced as if its host kept up with the GPU."""
    decode = next((p for p in phases if p.name == "decode"), None)
    if decode is None or "request_us" not in predicted:
        return {}
    step = predicted.get("decode_step_us", 0.0)
    extra = step - predicted.get("decode_gpu_us", step) + predicted.get("generate_host_us", 0.0)
    return {"request_us": predicted["request_us"] + decode.runs * extra} if extra > 0 else {}


#: what ``preference="fastest"`` compares per phase: the predicted time of the phase asked for
_FASTEST_BY = {"decode": "decode_step_us", "prefill": "prefill_us", "both": "request_us"}


def _fastest(profile: HardwareProfile | str | Path, model: Any, **kw: Any) -> Recommendation:
    """``preference="fastest"``: the plan of every weight format that fits (as ``balanced`` lists them),
    the one predicted fastest for the phase kept, its reason naming the others' predictions."""
    t0 = time.perf_counter()
    hw, spec = _profile(profile), parse_model(model)  # read once, not once a format
    first = recommend(hw, spec, preference="balanced", **kw)
    key = _FASTEST_BY.get(first.workload.phase, "request_us")
    recs = [first if name == first.quant.format.name else
            recommend(hw, spec, preference="balanced", weight_dtype=name, **kw)
            for name, _, fits in first.quant.considered if fits]
    timed = [(float(r.predicted[key]), r) for r in recs if r.fits and r.predicted.get(key) is not None]
    if not timed:
        return first
    timed.sort(key=lambda t: t[0])
    best_us, best = timed[0]
    others = ", ".join(f"{r.quant.format.name} {us / 1e3:.3f} ms" for us, r in timed[1:])
    reason = f"fastest: {best.quant.format.name} predicted {best_us / 1e3:.3f} ms ({key})" + \
        (f" against {others}" if others else "")
    quant = dataclasses.replace(best.quant, reason=reason, considered=first.quant.considered)
    return dataclasses.replace(best, preference="fastest", quant=quant, elapsed_ms=(time.perf_counter() - t0) * 1e3)


# -- inputs ------------------------------------------------------------------------------
def _profile(profile: HardwareProfile | str | Path) -> HardwareProfile:
    """The profile itself, or the one a name or YAML path loads."""
    if isinstance(profile, HardwareProfile):
        return profile
    if isinstance(profile, (str, Path)):
        from autoopt.hardware.library import load_profile

        return load_profile(profile)
    raise AutooptError(f"profile must be a HardwareProfile, a profile name or a file path, "
                       f"got {type(profile).__name__}")


#: the request sizes recommend() plans for: far past any served batch (vLLM's default max_num_seqs is
#: 256) or context window (10M tokens, Llama 4 Scout's); beyond them the answer is a typo, not a plan
MAX_BATCH = 1 << 20
MAX_TOKENS = 10_000_000


def _workload(gpu: GPUProfile | None, preference: str, *, batch: int, prompt_len: int, gen_len: int,
              context: int | None, phase: str, kv_dtype: str | None, cuda_graphs: bool = False) -> Workload:
    """The request as asked. The KV cache defaults to fp8 for speed where the GPU has fp8, else to the
    16-bit type the GPU computes in."""
    if kv_dtype is None:
        kv_dtype = "fp8" if preference == "speed" and gpu is not None and gpu.features.fp8 else \
            ("bf16" if gpu is None or gpu.features.bf16 else "fp16")
    for name, value, top in (("batch", batch, MAX_BATCH), ("prompt_len", prompt_len, MAX_TOKENS),
                             ("gen_len", gen_len, MAX_TOKENS), ("context", context, MAX_TOKENS)):
        if value is None and name == "context":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ModelError(f"{name} must be an integer in 1..{top}, got {value!r}", field=name)
    if context is not None and context < prompt_len:
        raise ModelError(f"context {context} is shorter than the prompt ({prompt_len} tokens)", field="context")
    return Workload(batch=batch, prompt_len=prompt_len, gen_len=gen_len, phase=phase, kv_dtype=kv_dtype,
                    context=context, cuda_graphs=cuda_graphs)


# -- runtime rules -----------------------------------------------------------------------
def _runtime(runtime: Any, tp: int | None, pp: int | None) -> RuntimeSpec | None:
    """The runtime's rules (None: no runtime named), with the asked degrees checked against them."""
    for name, value in (("tensor_parallel", tp), ("pipeline_parallel", pp)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64):
            raise ModelError(f"{name} must be an integer in 1..64, got {value!r}", field=name)
    if runtime is None:
        return None
    rt = get_runtime(runtime)
    rt.check_split(tp=tp, pp=pp)
    return rt


def _kv_dtype(rt: RuntimeSpec | None, gpu: GPUProfile | None, asked: str | None, preference: str) -> str | None:
    """The KV-cache dtype: as asked (checked against the runtime's), else the default if the runtime
    takes it, else the runtime's first 16-bit one."""
    if rt is None:
        return asked
    if asked is not None:
        rt.kv_arg(asked, gpu)  # raises, naming the accepted dtypes
        return asked
    taken = [k.dtype for k in rt.kv_dtypes]
    if preference == "speed" and gpu is not None and gpu.features.fp8 and "fp8" in taken:
        return "fp8"
    if taken[0] == "fp16" or (gpu is not None and not gpu.features.bf16):  # the runtime's own default first
        return "fp16" if "fp16" in taken else taken[0]
    return "bf16" if "bf16" in taken else taken[0]


class _Shape:
    """The split shapes allowed: the runtime's parallelism and the degrees the caller fixed."""

    __slots__ = ("pp", "rt", "tp")

    def __init__(self, *, rt: RuntimeSpec | None, tp: int | None, pp: int | None) -> None:
        self.rt = rt
        self.tp = tp
        self.pp = pp

    def allows(self, p: SplitPlan) -> bool:
        if (self.tp is not None and p.tp != self.tp) or (self.pp is not None and p.pp != self.pp):
            return False
        if self.rt is None:
            return True
        tp_ok = p.tp == 1 or self.rt.tensor_parallel or (self.rt.tensor_parallel_on_request and self.tp == p.tp)
        return tp_ok and (p.pp == 1 or self.rt.pipeline_parallel)

    @property
    def reserve(self) -> tuple[float, int]:
        """The GPU memory the runtime keeps for itself (see :func:`autoopt.planning.split.devices_of`)."""
        return self.rt.reserve if self.rt is not None else NO_RESERVE

    def describe(self) -> str:
        parts = [f"{self.rt.display}'s parallelism" if self.rt else ""]
        parts += [f"tp={self.tp}" if self.tp else "", f"pp={self.pp}" if self.pp else ""]
        return ", ".join(p for p in parts if p)


def _offload(hw: HardwareProfile, spec: ModelSpec, wl: Workload, fit: _Fit, predicted: Mapping[str, float],
             rt: RuntimeSpec | None) -> OffloadPlan | None:
    """The offload the plan uses: a CPU stage of the split, or (streaming runtimes) weights from RAM."""
    if fit.split is not None and CPU not in fit.split.device_indices:
        return None  # every layer on a GPU (the usual plan: offload's module is not even imported)
    if fit.split is None and (rt is None or rt.offload != "weight-stream" or not hw.gpus):
        return None
    from autoopt.planning.offload import from_split, weight_stream

    step = predicted.get("decode_step_us", predicted.get("prefill_us", 0.0))
    if fit.split is not None:
        return from_split(fit.split, step, wl.batch)
    gpu = max(hw.gpus, key=lambda g: g.memory_total_bytes or 0)
    return weight_stream(fit.memory[0], gpu, num_layers=spec.num_layers,
                         ram_bytes=hw.cpu.ram_available_bytes or hw.cpu.ram_total_bytes, decode_step_us=step,
                         batch=wl.batch)


def _replicas(hw: HardwareProfile, spec: ModelSpec, wl: Workload, fit: _Fit, shape: _Shape
              ) -> tuple[ReplicaOption, ...]:
    """For a serving batch on several GPUs: the data-parallel alternatives to the plan's split."""
    gpus = len(hw.gpus)
    if gpus < 2 or wl.batch < 2 or fit.split is None or (shape.rt is not None and not shape.rt.data_parallel):
        return ()
    from autoopt.planning.replicas import compare_replicas  # only for serving batches: not at import

    free = _Shape(rt=shape.rt, tp=None, pp=None)
    return compare_replicas(hw, spec, fit.quant.format, wl, gpus=gpus, allowed=free.allows, reserve=shape.reserve)


def _replica_notes(fit: _Fit, replicas: tuple[ReplicaOption, ...]) -> tuple[str, ...]:
    if not replicas or fit.split is None:
        return ()
    best, one = replicas[0], next((r for r in replicas if r.replicas == 1), None)
    if one is None or best.replicas == 1:
        return ()
    gain = best.tokens_per_s / one.tokens_per_s - 1
    return (f"for throughput, {best.replicas} replicas of tp={best.split.tp} pp={best.split.pp} predict "
            f"{best.tokens_per_s:.0f} tokens/s, {gain:+.0%} over one instance on all GPUs "
            f"({one.tokens_per_s:.0f}); per request {best.request_us / 1e3:.1f} vs {one.request_us / 1e3:.1f} ms",)


# -- step 1: fit -------------------------------------------------------------------------
# The records the steps hand on stay inside this module, so they are plain slotted classes built with
# keywords: a frozen, slotted dataclass compiles six generated methods when the module loads (~0.9 ms
# a class on the 2-core box) and a NamedTuple evaluates one (~0.2 ms); a plain class costs ~0.01 ms.
# 7 classes: ~1.3 ms of a cold recommend() against NamedTuples, ~6 ms against dataclasses.
class _Fit:
    """Where the model goes: weight format, split, memory per stage, and per layer the device that runs
    it. With no fitting split (``split`` None) the model is still priced, on the largest device alone,
    so the report can say how fast it would be if it fit."""

    __slots__ = ("memory", "notes", "quant", "split", "stage_of", "tp")

    def __init__(self, *, quant: QuantChoice, split: SplitPlan | None, memory: tuple[MemoryEstimate, ...],
                 stage_of: tuple[Device, ...], tp: int, notes: tuple[str, ...]) -> None:
        self.quant = quant
        self.split = split
        self.memory = memory
        self.stage_of = stage_of  # per layer: the first device of the stage holding it
        self.tp = tp  # tensor-parallel ranks each op is sharded over
        self.notes = notes


def _runtime_formats(rt: RuntimeSpec, gpu: GPUProfile | None, spec: ModelSpec, requested: str | None
                     ) -> Collection[str]:
    """The weight formats ``rt`` can serve ``spec`` in on ``gpu``. A checkpoint that ships its experts
    quantized (gpt-oss: MXFP4 experts, bf16 elsewhere) is served as shipped: the runtimes read its
    quantization config and refuse another (vLLM: a --quantization that does not match the checkpoint's
    is an error), so the automatic choice is its own dtype, where the runtime has kernels for its experts."""
    offered = rt.formats_for(gpu)
    if requested is not None or spec.expert_dtype is None or spec.expert_dtype == spec.dtype:
        return offered
    if spec.expert_dtype not in offered:
        raise RuntimeRuleError(f"{spec.name} ships its experts in {spec.expert_dtype} and is served as shipped, "
                               f"but {rt.why_not(spec.expert_dtype, gpu)}", runtime=rt.name, rule="format")
    return [n for n in offered if n == spec.dtype]


def _fit(hw: HardwareProfile, spec: ModelSpec, wl: Workload, *, preference: str, weight_dtype: str | None,
         max_devices: int | None, include_cpu: bool, shape: _Shape | None = None) -> _Fit:
    """The format the preference asks for among those that fit some split, then the fastest fitting split
    of the shapes allowed (a runtime's parallelism, fixed degrees)."""
    shape = shape or _Shape(rt=None, tp=None, pp=None)
    devs = devices_of(hw, include_cpu=include_cpu, reserve=shape.reserve)
    if not devs:
        raise AutooptError(f"profile {hw.name!r} has no device with known memory size and bandwidth")
    rt = shape.rt
    # the format is chosen for the GPUs alone: a format that fits only with layers on the CPU loses to
    # a smaller one that fits on the GPUs (llama.cpp users pick Q4_K_M over offloading BF16 layers)
    gpu_devs = tuple(d for d in devs if d.kind == "gpu") or devs
    quant = choose_format(hw.gpu, spec, preference=preference, requested=weight_dtype,
                          fits=lambda f: _fits_somewhere(gpu_devs, spec, f, wl, max_devices),
                          names=None if rt is None else _runtime_formats(rt, hw.gpu, spec, weight_dtype),
                          runtime=rt.name if rt else None)
    if rt is not None and weight_dtype is None:
        offered = ", ".join(rt.formats_for(hw.gpu))
        quant = dataclasses.replace(quant, reason=f"{quant.reason} (runtime rule: {rt.display} runs {offered} on "
                                                  f"{hw.gpu.name if hw.gpu else 'the CPU'})")
    plans = candidate_splits(hw, spec, quant.format, wl, max_devices=max_devices, include_cpu=include_cpu,
                             reserve=shape.reserve)
    fitting = [p for p in plans if p.fits and shape.allows(p)]
    if fitting:
        return _placed(fitting, devs, quant)
    fit = _unplaced(hw, spec, wl, devs, quant, max_devices)
    if shape.describe():
        fit.notes = (*fit.notes, f"splits limited to {shape.describe()}")
    return fit


def _placed(fitting: Sequence[SplitPlan], devs: tuple[Device, ...], quant: QuantChoice) -> _Fit:
    """The first (fastest) fitting split; a note when a split on fewer devices would also fit."""
    split = fitting[0]
    by_index = {d.index: d for d in devs}
    stage_of = tuple(by_index[s.devices[0]] for s in split.stages for _ in range(*s.layers))
    notes: tuple[str, ...] = ()
    fewest = min(fitting, key=lambda p: (p.num_devices, p.predicted_us))
    if fewest is not split:
        notes = (f"fewest devices that fit: {fewest.num_devices} ({fewest.kind}, tp={fewest.tp}, "
                 f"pp={fewest.pp}), predicted {fewest.predicted_us / 1e3:.3f} ms; the plan uses "
                 f"{split.num_devices} for the lowest predicted time",)
    return _Fit(quant=quant, split=split, memory=tuple(s.memory for s in split.stages), stage_of=stage_of,
                tp=split.tp, notes=notes)


def _unplaced(hw: HardwareProfile, spec: ModelSpec, wl: Workload, devs: tuple[Device, ...], quant: QuantChoice,
              max_devices: int | None) -> _Fit:
    """Nothing fits: the largest device's memory shows by how much, and it stands in for the whole model."""
    d = max(devs, key=lambda d: d.capacity_bytes)
    fmt = quant.format
    memory = estimate_memory(spec, fmt, capacity_bytes=d.capacity_bytes, device=d.name, gpu=d.gpu, batch=wl.batch,
                             context=wl.max_context, prompt_len=wl.prompt_len, phase=wl.phase,
                             kv_dtype=wl.kv_dtype, cpu=d.kind == "cpu")
    note = (f"{spec.name} in {fmt.name} does not fit on {hw.name} with any split of up to "
            f"{max_devices or len(devs)} device(s)")
    return _Fit(quant=quant, split=None, memory=(memory,), stage_of=(d,) * spec.num_layers, tp=1, notes=(note,))


def _fits_somewhere(devs: tuple[Device, ...], model: ModelSpec, fmt: QuantFormat, wl: Workload,
                    max_devices: int | None) -> bool:
    """Cheap check: one device, or tensor parallel over identical GPUs, or a pipeline's summed room."""
    def mem(d: Device, tp: int, embed: bool = True, head: bool = True, layers: range | None = None) -> MemoryEstimate:
        return estimate_memory(model, fmt, capacity_bytes=d.capacity_bytes, gpu=d.gpu, batch=wl.batch,
                               context=wl.max_context, prompt_len=wl.prompt_len, phase=wl.phase,
                               kv_dtype=wl.kv_dtype, tp=tp, layers=layers, embed=embed, head=head,
                               cpu=d.kind == "cpu")
    limit = min(max_devices or len(devs), len(devs))
    if any(mem(d, 1).fits for d in devs[:limit] if limit):
        return True
    gpus = [d for d in devs if d.kind == "gpu"]
    if gpus:
        same = [d for d in gpus if d.name == gpus[0].name]
        tp = 1
        while tp * 2 <= min(len(same), limit) and model.num_attention_heads % (tp * 2) == 0:
            tp *= 2
        if tp > 1 and mem(same[0], tp).fits:
            return True
    room = sum(d.capacity_bytes - mem(d, 1, False, False, range(0)).total_bytes for d in devs[:limit])
    need = mem(devs[0], 1).total_bytes - mem(devs[0], 1, False, False, range(0)).total_bytes
    return limit > 1 and need <= room


# -- step 2: per-layer costs -------------------------------------------------------------
class _Phase:
    """One phase of a request as a layer sees it: ``q_len`` new tokens per sequence attending to
    ``context`` tokens, run ``runs`` times per request (decode: once per generated token)."""

    __slots__ = ("context", "graphed", "name", "q_len", "runs")

    def __init__(self, *, name: str, q_len: int, context: int, runs: float, graphed: bool = False) -> None:
        self.name = name
        self.q_len = q_len
        self.context = context
        self.runs = runs
        self.graphed = graphed


class _Mode:
    """An activation mode a layer can run in (fp8 or 16-bit activations, with the chosen weights)."""

    __slots__ = ("act_bytes", "gemm_dtype", "name", "weight", "weight_ratio")

    def __init__(self, *, name: str, gemm_dtype: str, act_bytes: int, weight_ratio: float,
                 weight: str | None = None) -> None:
        self.name = name
        self.gemm_dtype = gemm_dtype  # what the GEMMs are ranked at
        self.act_bytes = act_bytes  # bytes per element of the hidden state carried between layers
        self.weight_ratio = weight_ratio  # weight bytes of the format / weight bytes at the ranked dtype
        self.weight = weight  # the layer GEMMs' quantized weight (OpSpec.weight), None: ranked at gemm_dtype


class _OpTime:
    """One op of one phase as one tensor-parallel rank runs it on ``device`` in ``mode``, with its
    predicted time per run."""

    __slots__ = ("best", "bound", "device", "fit", "mode", "op", "phase", "us", "vendor")

    def __init__(self, *, phase: str, device: str, mode: _Mode, op: LayerOp, us: float, bound: str,
                 best: Candidate | None, fit: Mapping[str, int] | None = None, vendor: bool = False) -> None:
        self.phase = phase
        self.fit = fit  # the launch config of an op priced by a fitted kernel model (decode attention)
        # a matmul optimize()'s dispatch runs on cuBLAS, predicted below rank()'s best config (``best``, the config
        # it beat)
        self.vendor = vendor
        self.device = device  # its name
        self.mode = mode
        self.op = op
        self.us = us
        self.bound = bound  # "compute", "memory" or "latency" (a kernel's floor)
        self.best = best  # rank()'s best config; None where the roofline priced the op


class _LayerCost:
    """One layer priced in one mode."""

    __slots__ = ("ops", "phase_us", "request_us")

    def __init__(self, *, ops: tuple[_OpTime, ...], phase_us: Mapping[str, float], request_us: float) -> None:
        self.ops = ops  # every op of every phase, phase by phase
        self.phase_us = phase_us  # one run of each phase
        self.request_us = request_us  # the phases weighted by their runs per request


class _LayerCosts:
    """Every layer's cost in every mode. Layers of one kind on one device cost the same, so each such
    pair is priced once (``priced``) and its layers share those objects (``layers``)."""

    __slots__ = ("kinds", "layers", "modes", "notes", "phases", "priced")

    def __init__(self, *, phases: tuple[_Phase, ...], modes: tuple[_Mode, ...], kinds: tuple[str, ...],
                 priced: Mapping[tuple[str, str], tuple[_LayerCost, ...]], layers: tuple[tuple[_LayerCost, ...], ...],
                 notes: tuple[str, ...]) -> None:
        self.phases = phases
        self.modes = modes
        self.kinds = kinds  # per layer: ModelSpec.layer_kind
        self.priced = priced  # (kind, device name) -> per mode
        self.layers = layers  # per layer -> per mode
        self.notes = notes


def _layer_costs(spec: ModelSpec, wl: Workload, fit: _Fit, *, preference: str, top: int,
                 runtime: str | None = None) -> _LayerCosts:
    """Price each distinct (layer kind, device) in every mode the format, GPU, preference and runtime allow."""
    modes, notes = _modes(fit.quant.format, fit.stage_of[0].gpu, preference, runtime)
    phases = _phases(wl)
    kinds = tuple(spec.layer_kind(i) for i in range(spec.num_layers))
    priced: dict[tuple[str, str], tuple[_LayerCost, ...]] = {}
    for i, (kind, dev) in enumerate(zip(kinds, fit.stage_of, strict=True)):
        if (kind, dev.name) not in priced:  # the pair's first layer stands for all of them
            priced[(kind, dev.name)] = tuple(_cost_layer(spec, i, dev, m, phases, batch=wl.batch, tp=fit.tp, top=top,
                                                         runtime=runtime) for m in modes)
    layers = tuple(priced[(kind, dev.name)] for kind, dev in zip(kinds, fit.stage_of, strict=True))
    return _LayerCosts(phases=phases, modes=modes, kinds=kinds, priced=priced, layers=layers, notes=notes)


def _phases(wl: Workload) -> tuple[_Phase, ...]:
    """Prefill over the prompt and ``gen_len`` decode steps, each priced at the full context."""
    if wl.phase == "decode":  # the request is one decode step
        return (_Phase(name="decode", q_len=1, context=wl.max_context, runs=1.0, graphed=wl.cuda_graphs),)
    prefill = _Phase(name="prefill", q_len=wl.prompt_len, context=wl.prompt_len, runs=1.0)
    if wl.phase == "prefill":
        return (prefill,)
    return prefill, _Phase(name="decode", q_len=1, context=wl.max_context, runs=float(wl.gen_len),
                           graphed=wl.cuda_graphs)


#: recommend()'s format -> the weight (autoopt.kernels.quant spec) its GEMMs run under the autoopt runtime:
#: what autoopt.optimize(weights=...) quantizes into (W8A8 fp8 quantizes its activations inside the GEMM op,
#: so the hidden state between layers stays 16-bit)
AUTOOPT_WEIGHTS = {"fp8": "fp8", "fp8-weight-only": "fp8-wo", "int8": "int8", "int4": "int4"}


def _modes(fmt: QuantFormat, gpu: GPUProfile | None, preference: str, runtime: str | None = None
           ) -> tuple[tuple[_Mode, ...], tuple[str, ...]]:
    """The modes the layers may run in, and a note when the preference ruled one out."""
    base = "fp16" if gpu is not None and not gpu.features.bf16 else "bf16"
    if runtime == "autoopt" and fmt.name in AUTOOPT_WEIGHTS and gpu is not None:
        weight = AUTOOPT_WEIGHTS[fmt.name]
        notes: tuple[str, ...] = ()
        if weight == "fp8" and preference == "quality":
            weight, notes = "fp8-wo", ("quality: activations stay 16-bit (fp8-wo: no fp8 activation quantization)",)
        return (_Mode(name=f"w:{fmt.name} a:{base} (autoopt {weight})", gemm_dtype=base, act_bytes=2,
                      weight_ratio=1.0, weight=weight),), notes
    if fmt.mode == "native" and gpu is not None and gpu.features.fp8:
        # fp4 GEMMs are ranked as fp8 (OpSpec has no fp4 GEMM kind); bytes scaled to the format's bits.
        a16 = _Mode(name=f"w:{fmt.name} a:bf16 (weight-only)", gemm_dtype="bf16", act_bytes=2,
                    weight_ratio=fmt.bits / 16)
        if preference == "quality":
            return (a16,), ("quality: activations stay bf16 (no fp8 activation quantization)",)
        a8 = _Mode(name=f"w:{fmt.name} a:fp8", gemm_dtype="fp8", act_bytes=1, weight_ratio=fmt.bits / 8)
        return (a8, a16), ()
    ratio = (fmt.bits_per_weight(4096) / 16) if fmt.mode != "original" else fmt.bits / 16
    return (_Mode(name=f"w:{fmt.name} a:{base}", gemm_dtype=base, act_bytes=2, weight_ratio=ratio),), ()


def _cost_layer(spec: ModelSpec, i: int, dev: Device, mode: _Mode, phases: tuple[_Phase, ...], *, batch: int,
                tp: int, top: int, runtime: str | None = None) -> _LayerCost:
    """Layer ``i`` on ``dev`` in ``mode``: each op of each phase priced, as one tensor-parallel rank runs it,
    and the runtime's position-embedding and KV-cache glue around its attention."""
    ops: list[_OpTime] = []
    phase_us: dict[str, float] = {}
    request_us = 0.0
    for p in phases:
        us = 0.0
        layer = spec.layer_ops(i, batch=batch, q_len=p.q_len, context=p.context, dtype=mode.gemm_dtype,
                               fused=runtime not in UNFUSED_PROJECTIONS)
        experts = _fused_experts(spec, dev, layer, mode, runtime, tokens=batch * p.q_len, tp=tp, top=top,
                                 phase=p.name, graphed=p.graphed)
        if experts is not None:  # one fused launch per GEMM over every expert, in place of the per-expert ops
            layer = tuple(op for op in layer if op.name not in _FUSED_EXPERT_OPS)
            us += experts.us
            ops.append(experts)
        fused_add = p.graphed and runtime in INDUCTOR_FUSED_ADD_RUNTIMES and batch * p.q_len <= INDUCTOR_NORM_MAX_ROWS
        own_attention = p.q_len == 1 and runs_decode_attention(spec, runtime, tp=tp)
        for op in layer:
            if own_attention and op.kind == "attention":
                t = _decode_attention_time(p.name, dev, op, mode, spec.num_kv_heads, tp=tp, graphed=p.graphed)
            else:
                t = _op_time(p.name, dev, _shard(op, tp), mode, top, graphed=p.graphed, quantized=True,
                             against_vendor=runtime in VENDOR_DISPATCH_RUNTIMES)
            if fused_add and op.kind == "add":
                t = _fused_add(t, dev)
            us += t.us * t.op.count
            ops.append(t)
        glue = _attention_glue(dev, layer, spec.num_kv_heads, runtime, graphed=p.graphed, phase=p.name, mode=mode,
                               tp=tp, mla=spec.is_mla, own_attention=own_attention)
        if glue is not None:
            us += glue.us
            ops.append(glue)
        phase_us[p.name] = us
        request_us += p.runs * us
    return _LayerCost(ops=tuple(ops), phase_us=phase_us, request_us=request_us)


#: runtimes whose matmuls run cuBLAS where it is predicted faster than rank()'s config (optimize()'s dispatch,
#: autoopt.nn.dispatch: F.linear, or act_quant + torch._scaled_mm for a W8A8 fp8 GEMM; autoopt.kernels.vendor)
VENDOR_DISPATCH_RUNTIMES = frozenset({"autoopt"})
#: runtimes whose decode attention (one query token a row) is autoopt's split-key kernel where it takes the layer's
#: heads: optimize() points transformers' attention at it (autoopt.nn.attention), so K/V are read once per KV head
#: and transformers' repeat_kv copy is gone
DECODE_ATTENTION_RUNTIMES = frozenset({"autoopt"})


def runs_decode_attention(spec: ModelSpec, runtime: str | None, *, tp: int = 1) -> bool:
    """Whether ``runtime`` decodes ``spec``'s attention (one query token a row) on autoopt's kernel
    (:data:`DECODE_ATTENTION_RUNTIMES`): grouped heads it takes, whole KV heads on each tensor-parallel rank."""
    n, nkv = spec.num_attention_heads, spec.num_kv_heads
    return (runtime in DECODE_ATTENTION_RUNTIMES and not spec.is_mla and nkv > 0 and n % nkv == 0
            and nkv % tp == 0 and supported_head_dim(spec.head_dim))


def _decode_attention_time(phase: str, dev: Device, op: LayerOp, mode: _Mode, nkv: int, *, tp: int,
                           graphed: bool) -> _OpTime:
    """A decode attention on autoopt's kernel, the config optimize() launches and its price
    (:func:`~autoopt.kernels.attention.decode_attention_choice`: fit in a graph, two launches), a rank's heads
    under tensor parallelism; out of a graph its two launches cost a standalone launch each."""
    batch, n, _, keys, d = op.shape
    kv = max(1, nkv // tp)
    c = decode_attention_choice(dev.gpu, batch=batch, heads=n // tp, kv_heads=kv, keys=keys, head_dim=d)
    us = in_step_us(c, dev.gpu, batch=batch, kv_heads=kv, keys=keys, head_dim=d)
    if not graphed:
        us += 2 * max(0.0, _standalone_launch_us() - GRAPH_LAUNCH_US)
    return _OpTime(phase=phase, device=dev.name, mode=mode, op=op, us=us, bound=c.bound, best=None,
                   fit={"BLOCK_N": c.BLOCK_N, "splits": c.splits, "num_warps": c.num_warps})


#: runtimes whose graphed decode step Inductor compiles, taking each residual add into the RMSNorm after it (one
#: reduction kernel): transformers' own norm, and optimize()'s, which it leaves to Inductor up to
#: :data:`~autoopt.kernels.constants.INDUCTOR_NORM_MAX_ROWS` rows (tokens of a step)
INDUCTOR_FUSED_ADD_RUNTIMES = frozenset({"autoopt", "transformers"})
#: what fusing a residual add into Inductor's norm saved a graphed step, in us an add: H200, int4 Llama-3-8B, 64
#: adds, the compiled step replayed from a CUDA graph with autoopt's norm against Inductor's, same process: 2.987
#: → 2.934 ms and 3.108 → 3.059 ms (0.82 and 0.77 us an add; ``benchmarks/results/h200/step_variants.json``). Less
#: than the add's own graphed price (~2 us): Inductor's fused reduction runs longer than autoopt's norm alone.
INDUCTOR_ADD_FUSION_SAVES_US = 0.8


def _fused_add(t: _OpTime, dev: Device) -> _OpTime:
    """A residual add Inductor fused into the norm after it: its own graphed price less what the fusion measured
    to save (:data:`INDUCTOR_ADD_FUSION_SAVES_US`), never under its bytes at the device's bandwidth."""
    floor, _ = _roofline(dev, t.op, "bf16")
    t.us = max(floor, t.us - INDUCTOR_ADD_FUSION_SAVES_US)
    return t


#: runtimes whose MoE layers run ``fused_moe_kernel``: one launch per GEMM over every expert, the tokens sorted
#: by expert and padded per expert to BLOCK_SIZE_M. Their expert time is the fused-MoE template's
#: (autoopt.templates.moe, validated on vLLM's own kernel: it orders 144-config grids at 0.96 of the best, and
#: prices the config it picks at 1.17x measured, geomean over 48 (case, M) points of
#: benchmarks/results/h100/moe_runtime_configs.json, 1.15x over the other run's; benchmarks/replay_moe.py
#: prints both). Priced as separate GEMMs, a layer of Qwen3-235B-A22B at
#: TP 8 cost 180 us a decode step against the kernel's measured 64 us, and 2.9 ms a 1024-token prefill
#: against 281 us. The shard is the one the plan's export runs (expert parallelism over the TP GPUs, as
#: ``--enable-expert-parallel`` / ``--ep-size`` and ``export moe-configs --ep`` have it).
FUSED_MOE_RUNTIMES = frozenset({"vllm", "sglang"})
#: the per-expert ops the fused kernel replaces (router, softmax and shared experts stay)
_FUSED_EXPERT_OPS = frozenset({"expert_gate_up", "expert_act", "expert_down"})


def _fused_moe_dtype(mode: _Mode) -> str | None:
    """The runtimes' fused-MoE dtype for a layer mode: 16-bit, or FP8 W8A8 (None: weight-only and integer
    formats, which the runtimes run through other kernels, priced per expert)."""
    if mode.weight_ratio == 1.0 and mode.gemm_dtype in ("bf16", "fp16"):
        return mode.gemm_dtype
    if mode.gemm_dtype == "fp8" and abs(mode.weight_ratio - 1.0) < 0.01:
        return "fp8_w8a8"
    return None


def _fused_experts(spec: ModelSpec, dev: Device, layer: Sequence[LayerOp], mode: _Mode, runtime: str | None, *,
                   tokens: int, tp: int, top: int, phase: str, graphed: bool) -> _OpTime | None:
    """A MoE layer's routed experts as ``runtime``'s fused-MoE kernel (:data:`FUSED_MOE_RUNTIMES`), priced by
    rank() over the fused_moe op of its shard; None where it does not apply (another runtime, no routed experts
    in this layer, a format or shard the kernel does not take), so the per-expert ops are priced instead."""
    dtype = _fused_moe_dtype(mode)
    if runtime not in FUSED_MOE_RUNTIMES or dtype is None or dev.gpu is None \
            or not any(op.name == "expert_gate_up" for op in layer):
        return None
    from autoopt.planning.moe_configs import fused_moe_op, model_shards

    ep = tp if tp > 1 else 1
    try:
        shard = model_shards(spec, runtime, tp=tp, ep=ep, dtype=dtype)[0]
        # an EP rank runs the slots routed to its experts: M * topk / ep on average, priced as the busiest rank
        # (at decode one token's top-k spreads over the ranks; ceil(topk / ep) is the most one rank gets)
        topk = -(-shard.topk // ep)
        m = max(1, -(-tokens * shard.topk // (ep * topk)))
        op_spec = fused_moe_op(dataclasses.replace(shard, topk=min(topk, shard.experts)), m)
    except AutooptError as exc:
        log.info("%s's experts priced per expert under %s: %s", spec.name, runtime, exc)
        return None
    best = _rank(dev.gpu, op_spec, top)
    if isinstance(best, AutooptError):
        log.info("%s's experts priced per expert under %s: %s", spec.name, runtime, best)
        return None
    us = best.predicted_us
    if graphed:
        us = max(GRAPH_LAUNCH_US, us - 2 * _standalone_launch_us() + 2 * GRAPH_LAUNCH_US)  # one launch per GEMM
    parts = [op for op in layer if op.name in _FUSED_EXPERT_OPS]
    op = LayerOp(name="experts", kind="fused_moe", shape=op_spec.shape, flops=sum(o.flops * o.count for o in parts),
                 bytes=sum(o.bytes * o.count for o in parts), op=op_spec, kernel_class="moe")
    return _OpTime(phase=phase, device=dev.name, mode=mode, op=op, us=us, bound=best.bound, best=best)


# -- step 3: the per-layer chain ---------------------------------------------------------
#: the hidden state as the embedding hands it to the first layer and the head takes it from the last.
_EMBEDDING = _Mode(name="embedding output", gemm_dtype="bf16", act_bytes=2, weight_ratio=1.0)


def _chain_plan(spec: ModelSpec, wl: Workload, fit: _Fit, costs: _LayerCosts, *,
                compare_wfc: bool) -> tuple[ChainSolution, ChainSolution | None]:
    """The mode of every layer: the exact DP's plan, which is used, and the WFC search's on the same
    problem (when asked), reported beside it."""
    problem = _chain_problem(spec, wl, fit, costs)
    plan = solve_dp(problem)
    return plan, solve_wfc(problem) if compare_wfc else None


def _chain_problem(spec: ModelSpec, wl: Workload, fit: _Fit, costs: _LayerCosts) -> ChainProblem:
    """Layers are the stages and modes the states. A layer's unary cost is its request time, the first
    and last layer's plus the cast from and to the bf16 hidden state; a transition is the cast between
    two neighbouring layers' modes."""
    modes, stage_of, n = costs.modes, fit.stage_of, spec.num_layers
    # hidden-state elements crossing one layer boundary per request: every token of every phase run
    elems = sum(p.runs * wl.batch * p.q_len for p in costs.phases) * spec.hidden_size
    first_bw, last_bw = stage_of[0].bandwidth_gbs, stage_of[-1].bandwidth_gbs
    unary: list[tuple[float, ...]] = []
    for i, layer in enumerate(costs.layers):
        row = [c.request_us for c in layer]
        if i == 0:
            row = [c + _cast_us(elems, first_bw, _EMBEDDING, m) for c, m in zip(row, modes, strict=True)]
        if i == n - 1:
            row = [c + _cast_us(elems, last_bw, m, _EMBEDDING) for c, m in zip(row, modes, strict=True)]
        unary.append(tuple(row))
    # a transition depends on its layer's device only through the bandwidth: one matrix per bandwidth
    matrix = {bw: tuple(tuple(_cast_us(elems, bw, a, b) for b in modes) for a in modes)
              for bw in {d.bandwidth_gbs for d in stage_of}}
    transition = tuple(matrix[d.bandwidth_gbs] for d in stage_of[:-1])
    return ChainProblem(stages=tuple(f"layer {i} ({k})" for i, k in enumerate(costs.kinds)),
                        states=(tuple(m.name for m in modes),) * n, unary=tuple(unary), transition=transition)


def _cast_us(elems: float, bandwidth_gbs: float, a: _Mode, b: _Mode) -> float:
    """Casting ``elems`` hidden-state elements from mode ``a`` to ``b``: read + write at the device's
    bandwidth; free when both carry the same width."""
    if a.act_bytes == b.act_bytes:
        return 0.0
    return elems * (a.act_bytes + b.act_bytes) / (bandwidth_gbs * 1e3)


# -- step 4: the head --------------------------------------------------------------------
def _head_ops(spec: ModelSpec, wl: Workload, fit: _Fit, costs: _LayerCosts, plan: ChainSolution, *,
              top: int, runtime: str | None) -> tuple[_OpTime, ...]:
    """The final norm and LM head of every phase: outside the layer chain, so priced after it, on the
    last layer's device and in its mode (at 16 bits where the format covers the layers' linears only)."""
    dev, mode = fit.stage_of[-1], _head_mode(costs.modes[plan.assignment[-1]], fit.quant.format)
    ops = [_op_time(p.name, dev, _shard(op, fit.tp), mode, top, graphed=p.graphed,
                    against_vendor=runtime in VENDOR_DISPATCH_RUNTIMES)
           for p in costs.phases for op in spec.head_ops(batch=wl.batch, q_len=p.q_len)]
    if runtime in GREEDY_ARGMAX_RUNTIMES:
        ops += [_greedy_argmax(p.name, dev, mode, batch=wl.batch, vocab=spec.vocab_size) for p in costs.phases]
    return tuple(ops)


#: runtimes that pick each next token with ``torch.argmax`` over the step's logits (transformers' greedy
#: ``generate()``, and so an optimize()d model's; the regret harness's step does the same)
GREEDY_ARGMAX_RUNTIMES = frozenset({"autoopt", "transformers"})
#: ns a logit of one row costs PyTorch's argmax (``at::native::reduce_kernel``): one block reduces a row, so the
#: kernel is bound by that block's walk over the vocabulary, whatever the batch (rows run side by side). Llama-3-8B's
#: 128256 logits, compiled decode steps replayed from a CUDA graph under the profiler: H200 36.4 / 36.0 us at batch
#: 1 (int4 / fp8), 36.2 / 35.9 at 8 (int4 / bf16), 33.9 at 32 (2026-11-29, h200/quant_trace_b1_int4_fp8.json,
#: _b8_layers8.json, _b32_int4_layers8.json); H100 28.0-28.7 at batch 1 in six traces, 37.2 in one, 35.5-35.6 at 32
#: (h100/quant_trace*.json): 0.218-0.290 ns a logit, median of the fourteen 0.271. Unpriced before, it is 3 % of an
#: 8-layer int4 step at batch 8 (1.09 ms).
ARGMAX_NS_PER_LOGIT = 0.271


def _greedy_argmax(phase: str, dev: Device, mode: _Mode, *, batch: int, vocab: int) -> _OpTime:
    """The next token's argmax over each row's logits (:data:`ARGMAX_NS_PER_LOGIT`), never under its bytes (fp32
    logits) at the device's bandwidth."""
    floor = batch * vocab * 4 / (dev.bandwidth_gbs * 1e3)
    walk = vocab * ARGMAX_NS_PER_LOGIT * 1e-3
    op = LayerOp(name="argmax", kind="argmax", shape=(batch, vocab), flops=float(batch * vocab),
                 bytes=float(batch * vocab * 4), kernel_class="reduction")
    return _OpTime(phase=phase, device=dev.name, mode=mode, op=op, us=max(floor, walk),
                   bound="latency" if walk >= floor else "memory", best=None)


def _head_mode(mode: _Mode, fmt: QuantFormat) -> _Mode:
    """The mode the LM head runs in: a GPU format quantizes the layers' linears only, so the head's GEMM stays
    at the checkpoint's 16-bit dtype, as the memory plan counts it (:func:`autoopt.planning.quant.weight_bytes`, the
    same :attr:`~autoopt.planning.quant.QuantFormat.covers_every_weight`) and as optimize() and the runtimes run it.
    Priced in the layers' fp8 mode instead, Llama-3-8B's head on an H200 came to
    151.6 us, an fp8 GEMV over half the bytes it streams."""
    if fmt.covers_every_weight:
        return mode
    base = "fp16" if mode.gemm_dtype == "fp16" else "bf16"
    return _Mode(name=mode.name, gemm_dtype=base, act_bytes=2, weight_ratio=1.0)


# -- step 5: op choices ------------------------------------------------------------------
def _op_choices(fit: _Fit, costs: _LayerCosts, plan: ChainSolution,
                head: tuple[_OpTime, ...]) -> tuple[tuple[OpChoice, ...], tuple[Mapping[str, str], ...]]:
    """One :class:`OpChoice` per distinct op of the plan (prefill first, then longest total first), and
    the implementation of each kernel class they use on each GPU."""
    rows = _layer_op_choices(fit, costs, plan)
    for t in head:
        # count 1 and mode -1 in the key: a head op never merges with a layer op
        rows.setdefault((t.phase, t.device, t.op.name, t.op.shape, 1, -1), _op_choice(t, 1))
    ops = tuple(sorted(rows.values(), key=lambda o: (o.phase != "prefill", -o.total_us)))
    # the implementations follow the ops' first-seen order (layers, then head), not the sorted one
    return ops, _impls(fit.stage_of, fit.quant.format, rows.values())


def _layer_op_choices(fit: _Fit, costs: _LayerCosts, plan: ChainSolution) -> dict[tuple[Any, ...], OpChoice]:
    """The plan's layer ops, one per (phase, device, op, shape, count, mode) in first-seen order, with
    their occurrences summed over the layers."""
    # Layers of one kind on one device in one mode run the same ops: visit each such group once
    # (Counter keeps first-seen order, so the rows come out in the order a walk over the layers gives).
    groups = Counter(zip(costs.kinds, (d.name for d in fit.stage_of), plan.assignment, strict=True))
    first: dict[tuple[Any, ...], _OpTime] = {}
    occurrences: dict[tuple[Any, ...], int] = {}
    for (kind, dname, mi), layers in groups.items():
        for t in costs.priced[(kind, dname)][mi].ops:
            key = (t.phase, dname, t.op.name, t.op.shape, t.op.count, mi)
            first.setdefault(key, t)
            occurrences[key] = occurrences.get(key, 0) + t.op.count * layers
    return {key: _op_choice(t, occurrences[key]) for key, t in first.items()}


def _op_choice(t: _OpTime, occurrences: int) -> OpChoice:
    """The report row of one distinct op; a GEMM shows the dtype it was ranked at."""
    op, mode, dev = t.op, t.mode, t.device
    dtype = op.op.dtype if op.op is not None else "bf16"
    if op.op is not None and op.op.is_matmul:
        dtype = mode.gemm_dtype
    if t.fit is not None:
        return OpChoice(phase=t.phase, name=op.name, mode=mode.name, gpu=dev, kind=op.kind, shape=op.shape,
                        dtype=dtype, occurrences=occurrences, kernel_class=op.kernel_class, predicted_us=t.us,
                        bound=t.bound, source="fit", config=dict(t.fit), kernel="decode_attention",
                        reason="autoopt's split-key decode attention, the config optimize() launches, priced by "
                               "its fit to graph-replayed H200 timings (autoopt.kernels.attention)")
    if t.vendor and t.best is not None:
        scaled = mode.weight is not None  # a W8A8 fp8 GEMM: the only quantized op with a cuBLAS path
        return OpChoice(phase=t.phase, name=op.name, mode=mode.name, gpu=dev, kind=op.kind, shape=op.shape,
                        dtype=dtype, occurrences=occurrences, kernel_class=op.kernel_class, predicted_us=t.us,
                        bound=t.bound, source="vendor", kernel="torch._scaled_mm" if scaled else "F.linear",
                        reason=f"{'act_quant + torch._scaled_mm' if scaled else 'F.linear'} (cuBLAS), as optimize()'s "
                               f"dispatch runs it: predicted below {t.best.config.kernel} "
                               f"{t.best.config.describe()} ({t.best.predicted_us:.1f} us; autoopt.kernels.vendor)")
    if t.best is None:
        return OpChoice(phase=t.phase, name=op.name, mode=mode.name, gpu=dev, kind=op.kind, shape=op.shape,
                        dtype=dtype, occurrences=occurrences, kernel_class=op.kernel_class, predicted_us=t.us,
                        bound=t.bound, source="roofline",
                        reason="no template kind for this op: roofline of its FLOPs and bytes")
    cfg = t.best.config
    # the bound is rank()'s, also where a weight-only format rescaled the time
    return OpChoice(phase=t.phase, name=op.name, mode=mode.name, gpu=dev, kind=op.kind, shape=op.shape,
                    dtype=dtype, occurrences=occurrences, kernel_class=op.kernel_class, predicted_us=t.us,
                    bound=t.best.bound, source="rank" if t.best.measured_us is None else t.best.source,
                    config=dict(cfg.params), kernel=cfg.kernel, template=cfg.template, path=cfg.path,
                    roofline_pct=t.best.roofline_pct, reason=t.best.reason, measured_us=t.best.measured_us)


#: the expert GEMMs the runtimes run as one fused-MoE kernel launch each (both with one config)
_EXPERT_GEMMS = ("expert_gate_up", "expert_down")
#: recommend()'s format -> the runtimes' fused-MoE file selector (the formats whose experts run the
#: Triton fused_moe_kernel; int4/int8 checkpoints may run Marlin or other kernels instead)
_MOE_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8_w8a8"}


def _runtime_moe_ops(ops: tuple[OpChoice, ...], spec: ModelSpec, wl: Workload, fit: _Fit, runtime: str,
                     chooser: MoeChooser | None) -> tuple[OpChoice, ...]:
    """Under vLLM/SGLang, the expert GEMM rows as the runtime runs them: its ``fused_moe_kernel`` with the
    config of its file for the phase's M (the file ``autoopt export moe-configs`` writes; the nearest M
    key, as the runtime looks it up). Times are the fused-MoE template's (:func:`_fused_experts`), or the
    per-expert estimate where it does not apply. The shard follows the export's arguments: expert
    parallelism over the TP GPUs when TP > 1."""
    from autoopt.planning.moe_configs import model_shards
    from autoopt.runtimes.moe_configs import RUNTIMES, file_name, nearest_m

    dtype = _MOE_DTYPES.get(fit.quant.format.name)
    rows = (*_EXPERT_GEMMS, "experts")
    if runtime not in RUNTIMES or dtype is None or not any(o.name in rows for o in ops):
        return ops
    tp = fit.split.tp if fit.split else 1
    try:
        shard = model_shards(spec, runtime, tp=tp, ep=tp if tp > 1 else 1, dtype=dtype)[0]
    except AutooptError as exc:
        log.info("no fused-MoE shard for %s under %s: %s", spec.name, runtime, exc)
        return ops
    out: list[OpChoice] = []
    for o in ops:
        if o.name not in rows:
            out.append(o)
            continue
        timed = ("the fused-MoE template's estimate for this shard" if o.name == "experts"
                 else "autoopt's per-expert estimate")
        m = nearest_m(wl.batch * (wl.prompt_len if o.phase == "prefill" else 1))
        where = f"{runtime}'s file {file_name(runtime, shard, o.gpu)} at M={m}"
        try:
            entry = (chooser or _cached_chooser(_gpu_named(fit, o.gpu)))(shard, m)
        except AutooptError as exc:
            out.append(dataclasses.replace(o, kernel="fused_moe_kernel", template=runtime, path=runtime, config={},
                                           source="runtime", measured_us=None,
                                           reason=f"{runtime} runs the experts as fused_moe_kernel; its config "
                                                  f"comes from {where}, which autoopt cannot choose here ({exc})"))
            continue
        out.append(dataclasses.replace(o, kernel="fused_moe_kernel", template=runtime, path=runtime,
                                       config=dict(entry.params), source="runtime", measured_us=entry.measured_us,
                                       reason=f"{runtime} runs the experts as fused_moe_kernel with {where} "
                                              f"({entry.label}: {entry.source}); time: {timed}"))
    return tuple(out)


def _cached_chooser(gpu: GPUProfile) -> MoeChooser:
    """:func:`autoopt.planning.moe_configs.rank_chooser` answered through :func:`_rank`: the shipped rank
    cache first (a cold ``recommend()`` of a catalog MoE model under vLLM ranks nothing), rank() otherwise."""
    from autoopt.planning.moe_configs import fused_moe_op, moe_entry
    from autoopt.runtimes.moe_configs import MoeEntry

    def choose(shard: Any, m: int) -> MoeEntry:
        best = _rank(gpu, fused_moe_op(shard, m), 1)
        if isinstance(best, AutooptError):
            raise best
        return moe_entry(best)

    return choose


def _gpu_named(fit: _Fit, name: str) -> GPUProfile:
    gpu = next((d.gpu for d in fit.stage_of if d.name == name and d.gpu is not None), None)
    if gpu is None:
        raise AutooptError(f"no GPU called {name!r} in the plan")
    return gpu


def _impls(stage_of: Sequence[Device], fmt: QuantFormat, ops: Iterable[OpChoice]) -> tuple[Mapping[str, str], ...]:
    """The implementation choose_impl() picks on each distinct GPU for each kernel class the ops use."""
    from autoopt.kernels.choices import KERNEL_CLASSES
    from autoopt.plugins.choices import choose_impl

    classes = _kernel_classes(fmt, ops)
    out: list[Mapping[str, str]] = []
    seen: set[str] = set()
    for dev in stage_of:
        if dev.gpu is None or dev.name in seen:
            continue
        seen.add(dev.name)
        for kc in classes:
            if kc not in KERNEL_CLASSES:
                continue
            try:
                choice = choose_impl(dev.gpu, kc)
            except AutooptError as exc:
                log.info("no implementation choice for %s on %s: %s", kc, dev.name, exc)
                continue
            out.append({"gpu": dev.name, **choice.to_dict()})
    return tuple(out)


def _kernel_classes(fmt: QuantFormat, ops: Iterable[OpChoice]) -> list[str]:
    """The kernel classes the ops run as, in first-use order; a quantized format adds quantized_gemm."""
    classes: list[str] = []
    for o in ops:
        kc = {"gemm": "gemv" if o.kind == "gemv" else "gemm",
              "norm": "layernorm" if o.kind == "layernorm" else "rmsnorm", "moe": "softmax",
              "elementwise": "silu_mul" if o.kind == "silu_mul" else "elementwise"}.get(o.kernel_class,
                                                                                       o.kernel_class)
        if kc not in classes:
            classes.append(kc)
    if fmt.mode != "original" and "quantized_gemm" not in classes:
        classes.append("quantized_gemm")
    return classes


# -- step 6: totals ----------------------------------------------------------------------
def _step_comm(hw: HardwareProfile, spec: ModelSpec, wl: Workload, fit: _Fit, costs: _LayerCosts
               ) -> dict[str, float]:
    """Per phase, one step's tensor-parallel all-reduces (none without tensor parallelism)."""
    if fit.split is None or fit.split.tp <= 1:
        return {}
    return {p.name: tp_step_comm_us(hw, fit.split, spec.num_layers, spec.hidden_size, wl.batch * p.q_len)
            for p in costs.phases}


def _totals(fit: _Fit, costs: _LayerCosts, plan: ChainSolution, head: tuple[_OpTime, ...],
            step_comm: Mapping[str, float]) -> dict[str, float]:
    """Per phase: the plan's layers, its tensor-parallel all-reduces (``step_comm``) and the head. Per
    request: the plan's cost (casts included), the head weighted by its runs, and the split's
    communication."""
    predicted: dict[str, float] = {}
    head_us = 0.0
    for p in costs.phases:
        t = sum(layer[mi].phase_us[p.name] for layer, mi in zip(costs.layers, plan.assignment, strict=True))
        t += step_comm.get(p.name, 0.0)
        for h in head:
            if h.phase == p.name:
                t += h.us
                head_us += p.runs * h.us
        predicted["prefill_us" if p.name == "prefill" else "decode_step_us"] = t
    comm_us = fit.split.comm_us if fit.split else 0.0
    predicted["request_us"] = plan.cost + head_us + comm_us
    if comm_us:
        predicted["communication_us"] = comm_us
    return predicted


# -- pricing one op ----------------------------------------------------------------------


def _op_time(phase: str, dev: Device, op: LayerOp, mode: _Mode, top: int, *, graphed: bool = False,
             quantized: bool = False, against_vendor: bool = False) -> _OpTime:
    """rank()'s best config where a template covers the op on this GPU (GEMMs at the mode's dtype, a layer
    GEMM (``quantized``) over the mode's quantized weight where it has one), else the roofline of the op's
    FLOPs and bytes. ``graphed``: the op runs inside a replayed CUDA graph,
    so a ranked op's standalone launch becomes :data:`GRAPH_LAUNCH_US` (one launch an op: a split-K
    reduce's second launch stays standalone-priced) and a roofline-priced op, which has no launch term,
    gains one."""
    if op.op is not None and dev.gpu is not None:
        spec = op.op
        weight = mode.weight if quantized and spec.is_matmul and spec.layout == "nk" else None
        if spec.is_matmul and (spec.dtype != mode.gemm_dtype or weight is not None):
            spec = OpSpec(kind=spec.kind, shape=spec.shape, dtype=mode.gemm_dtype, weight=weight)
        best = _rank(dev.gpu, spec, top)
        if not isinstance(best, AutooptError):
            us, bound = best.predicted_us, best.bound
            if spec.is_matmul and mode.weight_ratio != 1.0:
                us, bound = _weight_only_us(dev.gpu, spec, mode, us, bound, top)
            vendor = _vendor_us(dev.gpu, spec) if against_vendor else None
            if vendor is not None and vendor < us:  # what optimize()'s dispatch runs instead (nn/dispatch.py)
                return _OpTime(phase=phase, device=dev.name, mode=mode, op=op, bound=bound, best=best,
                               us=_launches_as_run(best, vendor, graphed), vendor=True)
            us = _launches_as_run(best, us, graphed)
            return _OpTime(phase=phase, device=dev.name, mode=mode, op=op, us=us, bound=bound, best=best)
    us, bound = _roofline(dev, op, mode.gemm_dtype if op.kernel_class == "gemm" else "bf16")
    if op.kind == "attention" and op.shape[2] == 1 and us < ATTENTION_DECODE_MIN_US:
        us, bound = ATTENTION_DECODE_MIN_US, "latency"
    if graphed:
        us += GRAPH_LAUNCH_US
    return _OpTime(phase=phase, device=dev.name, mode=mode, op=op, us=us, bound=bound, best=None)


#: the shortest a decode attention kernel runs, in us, however few keys it reads: H100, batch 1, 32 query
#: heads over 8 KV heads, 129-197 keys (``benchmarks/results/h100/quant_trace.json``: cuDNN's SDPA flash kernel
#: under transformers, eager and compiled alike, 6.6-6.9 us a call against a ~0.4 us roofline). A block a
#: (batch, head) loads Q, walks the keys, reduces and writes: latency, not bandwidth, at short contexts.
ATTENTION_DECODE_MIN_US = 6.7
#: kernels a runtime launches per attention layer beyond the projections and the attention itself: rotary
#: embedding of q and k, the KV-cache write, and the views and casts around them. transformers (and autoopt,
#: which keeps transformers' attention) under torch.compile: 7 (quant_trace.json, compiled: 160 rotary + 64
#: other pointwise launches over 32 layers). vLLM and SGLang run one fused rotary kernel and one cache write
#: (``rotary_embedding``, ``reshape_and_cache_flash``): 2, the default.
ATTENTION_GLUE_KERNELS = {"autoopt": 7, "transformers": 7}
#: the same around autoopt's decode attention (one query token a row, :func:`runs_decode_attention`), compiled: 5.
#: Llama-3-8B, H200, profiler traces of the compiled step replayed from a CUDA graph: three rotary kernels, the
#: cache write and one add-copy a layer (5.35, 5.85 and 7.5 us a layer of kernel time at batch 1, 8 and 32;
#: 2026-11-29, h200/quant_trace_b1_int4_fp8.json, _b8_layers8.json, _b32_int4_layers8.json), where the 7 above (an
#: H100 trace of transformers' SDPA path) priced 10.8 us a layer
DECODE_ATTENTION_GLUE_KERNELS = 5
#: what each such tiny kernel costs on the GPU, in us: those 224 launches took 344.6 us of GPU time (1.54 us
#: each; H100, torch 2.11, Inductor's pointwise kernels), a latency floor far above their bytes
GLUE_KERNEL_US = 1.54
#: what transformers' modules cost uncompiled, beyond the compiled step this module prices, in us a decoder
#: layer replayed from a CUDA graph: Llama-3-8B bf16 on the H100 ran 9.0525 ms a graphed step eager against
#: 7.0648 ms compiled (1728 against 744 launches: unfused RMSNorm, rotary, SiLU and residual pointwise
#: kernels), 62.1 us a layer over 32 (benchmarks/results/h100/quant_trace.json). Those kernels are latency
#: bound, so a tensor-parallel shard pays them whole: the regret harness adds them to its tensor-parallel rows,
#: which run transformers' tp_plan uncompiled (regret_{2,4}gpu_layers8.json: predicted over measured went from
#: 0.33-0.57 to 0.56-0.84 with them).
UNCOMPILED_TRANSFORMERS_LAYER_US = 62.1
#: the reduction kernel of transformers' uncompiled RMSNorm (``hidden.pow(2).mean(-1)``: PyTorch's
#: ``reduce_kernel``), in us by rows, which the constant above holds at batch 1 only: its blocks walk several rows
#: each in turn, so it grows with the rows up to 32 and (more blocks) no further. Traced on two H200s replaying
#: transformers' tensor-parallel Llama-3-8B step from a CUDA graph (8 layers, 192 keys; 17 norms and the greedy
#: argmax a step at its price, :data:`ARGMAX_NS_PER_LOGIT`, taken out): 2.02, 5.08 and 9.01 us a norm at 1, 8 and
#: 32 rows; the same model unsharded on one GPU 2.39, 5.58 and 9.17 (h200/tp_trace_2gpu.json). Linear between the
#: points, flat past 32 (not measured). With it the traced step is priced 0.98 / 0.91 / 0.94 at batch 1 / 8 / 32
#: (0.88 / 0.89 at 8 / 32 without); the committed tables' 26 tensor-parallel graphed rows (H100 and H200) median
#: |ln| 0.066 -> 0.042, lowest 0.84 -> 0.89.
UNCOMPILED_NORM_REDUCE_US = {1: 2.02, 8: 5.08, 32: 9.01}


def uncompiled_norm_growth_us(rows: int) -> float:
    """What one uncompiled transformers RMSNorm costs at ``rows`` beyond its time at one row
    (:data:`UNCOMPILED_NORM_REDUCE_US`)."""
    points = sorted(UNCOMPILED_NORM_REDUCE_US.items())
    return piecewise_linear(points, rows) - points[0][1]


#: the same for an optimize()d model, whose norms, MLP and linears are autoopt's kernels already: what stays
#: uncompiled is transformers' attention glue (rotary, cache writes, the attention's views and casts). Eager
#: against compiled graphed step over 32 layers: H100 fp8 31.4 and 30.9, int4 31.2 and 32.6; H200 fp8 29.5,
#: int4 29.8 us a layer (quant_trace.json, quant_trace_fma_pipelined.json, h200/quant_trace.json). The regret
#: harness adds it to the options it times uncompiled: its graphed rows' median |ln(predicted / measured)|
#: went from 0.170 to 0.096 (60 rows, regret_{1,2,4}gpu_layers8.json, which did not fit it). Plus 1.6 us since
#: the compiled step leaves a decode step's RMSNorm to Inductor, which fuses the residual add into it: the compiled
#: step 1.66 and 1.53 us a layer faster in two same-run pairs, the eager one unchanged (H200, int4;
#: h200/step_variants.json).
UNCOMPILED_AUTOOPT_LAYER_US = 32.6
#: the same once optimize()'s decode attention runs the layer's attention (no repeat_kv copy), by batch (linear
#: between the points, flat past the last): eager against compiled step, both replayed from a CUDA graph, Llama-3-8B
#: on the H200 at this tree (2026-11-29): batch 1 26.0 (int4) and 26.1 us (fp8) a layer over 32 layers, batch 8
#: 32.3 (int4) and 34.6 (bf16), batch 32 33.0 (int4) over 8 (h200/quant_trace_b1_int4_fp8.json,
#: _b8_layers8.json, _b32_int4_layers8.json): the medians 26.05 at 1 and 33.0 from 8 on (eager's glue kernels
#: grow with the rows; Inductor's fused ones barely). The constant above less its repeat_kv share priced 28.7 at
#: every batch.
UNCOMPILED_DECODE_ATTENTION_LAYER_US = {1: 26.05, 8: 33.0}


def uncompiled_decode_attention_layer_us(batch: int) -> float:
    """:data:`UNCOMPILED_DECODE_ATTENTION_LAYER_US` at ``batch`` rows."""
    return piecewise_linear(sorted(UNCOMPILED_DECODE_ATTENTION_LAYER_US.items()), batch)


#: runtimes whose attention is transformers' SDPA path over a static cache, which always passes a mask: then
#: transformers (<= 5.23; the lent hosts ran 5.17) copies K and V to every query head (``repeat_kv``) before SDPA,
#: over the cache's whole length, since ``use_gqa_in_sdpa`` needs no mask (transformers/integrations/
#: sdpa_attention.py; 5.24 packs a single query's heads instead, when not compiled). The copy reads the cache
#: once and writes n_rep copies (:func:`repeat_kv_copy_bytes`); SDPA then reads n_rep copies, not one.
#: Negligible at batch 1; at batch 32 over 192 keys it is ~93 us a layer of Llama-3-8B on an H100
#: (quant_trace_b32_layers8.json: the compiled copy 43.8 us, SDPA 49.0 us).
REPEAT_KV_RUNTIMES = frozenset({"transformers", "autoopt"})
#: the fraction of the sustained rate at which cuDNN's SDPA flash kernel (transformers' attention) reads K/V
#: at decode: Llama-3-8B, batch 32, 192 keys, H100: 100.7 MB of repeated K/V a layer in 49.0 us compiled and
#: 48.8 us eager, 2.06 TB/s against the 2.95 TB/s this model sustains (the run's own copy: 3.00 TB/s;
#: quant_trace_b32_layers8.json). One query row per (batch, head): its 16-row tiles are mostly padding.
SDPA_DECODE_KV_EFFICIENCY = 0.70
#: GB/s at which the uncompiled repeat_kv copy runs (``expand`` + ``reshape``: PyTorch's strided
#: ``elementwise_kernel``, not a vectorised one). H100, batch 32, 192 keys: the graphed step took 109.3 (bf16)
#: and 104.4 (fp8) us a layer more uncompiled than compiled, against 28.6 us at batch 1
#: (:data:`UNCOMPILED_AUTOOPT_LAYER_US`'s glue); the rest, over the 122 MB more copy than at batch 1, puts the
#: uncompiled copy at 998 and 1040 GB/s (mean 1020), against 2.87 TB/s fused into Inductor's kernel
#: (quant_trace_b32_layers8.json, quant_trace.json).
UNCOMPILED_REPEAT_KV_GBS = 1020.0


def repeat_kv_copy_bytes(batch: int, keys: int, heads: int, kv_heads: int, head_dim: int, *, tp: int = 1) -> float:
    """Bytes transformers' ``repeat_kv`` moves a layer (16-bit K and V: read once, written once per query head
    of a KV head), 0 without grouped-query attention; a tensor-parallel shard moves its share."""
    if heads <= kv_heads or kv_heads <= 0:
        return 0.0
    kv = 2 * batch * keys * kv_heads * head_dim * 2 / max(1, tp)
    return (1 + heads // kv_heads) * kv


def _attention_glue(dev: Device, layer: Sequence[LayerOp], nkv: int, runtime: str | None, *, graphed: bool,
                    phase: str, mode: _Mode, tp: int, mla: bool = False, own_attention: bool = False) -> _OpTime | None:
    """The rotary embedding and KV-cache write around a layer's attention, as the runtime launches them: at
    least its kernels' latency floor, else the bytes they move (q and k read and written, k and v stored; under
    :data:`REPEAT_KV_RUNTIMES`, the K/V copies to every query head and SDPA's reads of them beyond the one
    read the attention op prices). ``own_attention``: autoopt's decode attention takes the cache as it is (no
    copies, :data:`DECODE_ATTENTION_GLUE_KERNELS`)."""
    att = next((op for op in layer if op.kind == "attention"), None)
    if att is None or dev.gpu is None:
        return None
    batch, n, q_len, keys, d = att.shape
    tokens = batch * q_len
    moved = tokens * d * 2 * (2 * (n + nkv) + 2 * nkv) / max(1, tp)  # 16-bit activations and cache
    extra_us = 0.0
    if runtime in REPEAT_KV_RUNTIMES and not (mla or own_attention) and n > nkv:
        copy = repeat_kv_copy_bytes(batch, keys, n, nkv, d, tp=tp)
        kv = copy / (1 + n // nkv)
        moved += copy + (n // nkv - 1) * kv
        # at decode SDPA reads the copies slower than a stream: the part beyond the stream's time
        eff = SDPA_DECODE_KV_EFFICIENCY if q_len == 1 else 1.0
        extra_us = (n // nkv) * kv * (1 / eff - 1) / (dev.bandwidth_gbs * 1e3)
    kernels = DECODE_ATTENTION_GLUE_KERNELS if own_attention else ATTENTION_GLUE_KERNELS.get(runtime or "", 2)
    per_kernel = GLUE_KERNEL_US if graphed else max(GLUE_KERNEL_US, _standalone_launch_us())
    us = max(kernels * per_kernel, moved / (dev.bandwidth_gbs * 1e3) + extra_us)
    op = LayerOp(name="rope_kv_cache", kind="rotary", shape=(tokens, n, d), flops=6.0 * tokens * (n + nkv) * d,
                 bytes=float(moved), kernel_class="rotary")
    return _OpTime(phase=phase, device=dev.name, mode=mode, op=op, us=us,
                   bound="latency" if kernels * per_kernel >= us else "memory", best=None)


def _vendor_us(gpu: GPUProfile, spec: OpSpec) -> float | None:
    """cuBLAS's predicted time for a matmul (:func:`~autoopt.kernels.vendor.predict_vendor_matmul`, on rank()'s
    standalone-launch basis), None where it has no price; imported here so a plan for another runtime does not
    load the cost model's modules at start-up."""
    from autoopt.kernels.vendor import predict_vendor_matmul

    return predict_vendor_matmul(gpu, spec)


def _launches_as_run(best: Candidate, us: float, graphed: bool) -> float:
    """``us`` (a ranked op's time) with its launches priced as the step runs them: a template that prices in-graph
    (``launch_in_graph`` in its breakdown: the quantized decode GEMV, which only optimize()'s decode runs) gains
    a standalone launch's extra per launch when the step is not graphed; any other drops one standalone launch
    for an in-graph one when it is (one an op: a split-K reduce's second launch stays standalone-priced)."""
    if best.breakdown.get("launch_in_graph"):
        if graphed:
            return us
        launches = best.breakdown.get("launch_us", GRAPH_LAUNCH_US) / GRAPH_LAUNCH_US
        return us + launches * (_standalone_launch_us() - GRAPH_LAUNCH_US)
    if graphed:
        return max(GRAPH_LAUNCH_US, us - _standalone_launch_us() + GRAPH_LAUNCH_US)
    return us


def _standalone_launch_us() -> float:
    from autoopt.kernels.constants import constants  # only graphed workloads need it: kept off the cold path

    return constants().launch_us


def _rank(gpu: GPUProfile, op: OpSpec, top: int) -> Candidate | AutooptError:
    """rank()'s best candidate for ``op`` on ``gpu`` (or the error it raises), cached per (GPU content, op):
    ``gpu_key`` holds every field the templates and the cost model read (rates included) and is kept
    per profile object. A first ask in the process is answered by the shipped rank cache where it
    holds the op (:mod:`autoopt.search.rank_cache`: the same answer, ~0.1 ms instead of ~2-5 ms of
    branch and bound per op), else by rank() itself."""
    from autoopt.kernels.gpu_key import gpu_key

    if _RECORD is not None:
        _RECORD.append((gpu, op))
    key = (gpu_key(gpu), op.kind, op.shape, op.dtype, op.weight, top)
    hit = _RANK_CACHE.get(key)
    if hit is None:
        from autoopt.search.rank_cache import best

        # the cache holds rank()'s answer for a valid ``top`` (any: the best is the same); rank() says
        # what is wrong with another
        hit = best(gpu, op) if isinstance(top, int) and not isinstance(top, bool) and top >= 1 else None
        if hit is None:
            from autoopt.search.rank_cache import learn
            from autoopt.search.ranking import rank

            try:
                hit = rank(gpu, op, top=top).candidates[0]
            except AutooptError as exc:
                hit = exc
            learn(gpu, op, hit)  # written by recommend() at its end: the next process reads it
            global _LEARNED
            _LEARNED = True
        if isinstance(hit, AutooptError):
            log.info("rank() has no config for %s on %s: %s", op.label(), gpu.name, hit)
        _RANK_CACHE[key] = hit
    return hit


def _flush_learned() -> None:
    """Write what rank() answered in this call into this machine's learned rank cache (one file write,
    only when something was ranked): the next process's start-up reads it instead of ranking."""
    global _LEARNED
    if _LEARNED:
        _LEARNED = False
        from autoopt.search.rank_cache import flush

        flush()


def _shard(op: LayerOp, tp: int) -> LayerOp:
    """The op as one tensor-parallel rank sees it."""
    if tp == 1 or op.op is None:
        if tp > 1:
            # an activation without a template kind runs on its rank's columns of the MLP's intermediate
            cols = (op.shape[0], max(1, op.shape[1] // tp)) if op.kind in _ROOFLINE_ACTIVATIONS else op.shape
            return LayerOp(name=op.name, kind=op.kind, shape=cols, count=op.count, flops=op.flops / tp,
                           bytes=op.bytes / tp, op=None, kernel_class=op.kernel_class)
        return op
    shape: tuple[int, ...]
    if op.op.is_matmul and (op.name in _COLUMN_PARALLEL or op.name in _ROW_PARALLEL):
        m, n, k = op.shape
        shape = (m, max(1, n // tp), k) if op.name in _COLUMN_PARALLEL else (m, n, max(1, k // tp))
    elif op.kind == "silu_mul":
        shape = (op.shape[0], max(1, op.shape[1] // tp))
    else:
        return op
    new = OpSpec(kind=op.op.kind, shape=shape, dtype=op.op.dtype)
    return LayerOp(name=op.name, kind=op.kind, shape=shape, count=op.count, flops=new.flops, bytes=new.min_bytes,
                   op=new, kernel_class=op.kernel_class)


def _roofline(dev: Device, op: LayerOp, compute: str) -> tuple[float, str]:
    """(us, bound): the larger of the op's FLOPs at the device's ``compute`` rate and its bytes at its bandwidth."""
    tf = dev.tflops(compute) * 1e6
    bw = dev.bandwidth_gbs * 1e3
    c, b = op.flops / tf, op.bytes / bw
    return max(c, b), "compute" if c >= b else "memory"


def _weight_only_us(gpu: GPUProfile, spec: OpSpec, mode: _Mode, us: float, bound: str, top: int) -> tuple[float, str]:
    """A weight-only GEMM: computes at the ranked dtype's rate, moves the format's weight bytes.

    With 8-bit weights on an FP8 GPU the bytes are exactly an fp8 GEMM's, so the
    time is the larger of the fp8 ranking (memory) and the bf16 one when that is
    compute bound. Otherwise a memory-bound prediction is scaled by the bytes moved.
    """
    if abs(mode.weight_ratio - 0.5) < 1e-9 and gpu.features.fp8 and spec.dtype != "fp8":
        c8 = _rank(gpu, OpSpec(kind=spec.kind, shape=spec.shape, dtype="fp8"), top)
        if not isinstance(c8, AutooptError):
            if bound == "compute" and us >= c8.predicted_us:
                return us, bound
            return c8.predicted_us, c8.bound
    if bound == "memory":
        m, n, k = spec.shape
        e = 1 if spec.dtype == "fp8" else 2
        act = (m * k + m * n) * e
        return us * (act + n * k * e * mode.weight_ratio) / (act + n * k * e), bound
    return us, bound
