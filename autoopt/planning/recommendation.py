"""Whole-model recommendation: format, memory, split, per-op kernel configs and a per-layer plan.

:func:`recommend` works from the hardware profile and the cost model only (no GPU
timing): it picks a weight format (:mod:`autoopt.quant`), checks memory
(:mod:`autoopt.memory`), lays the model over the devices (:mod:`autoopt.split`),
ranks every distinct op of every phase with :func:`autoopt.ranking.rank` (cached per
GPU and op) and solves the per-layer plan (:mod:`autoopt.plan`): each layer runs
its GEMMs with bf16 activations or, where the format is native FP8/FP4, with fp8
activations; neighbouring layers in different modes pay a cast of the hidden
state (read + write at the GPU's bandwidth). The exact DP plan is used; the WFC
search is reported beside it on the same problem. Every time is ``predicted``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoopt.errors import AutooptError, ModelError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.planning.catalog import parse_model
from autoopt.planning.chain import ChainProblem, ChainSolution, solve_dp, solve_wfc
from autoopt.planning.memory import MemoryEstimate, estimate_memory
from autoopt.planning.model import LayerOp, ModelSpec
from autoopt.planning.quant import QuantChoice, QuantFormat, choose_format
from autoopt.planning.split import Device, SplitPlan, Workload, candidate_splits, devices_of

__all__ = ["OpChoice", "Recommendation", "recommend"]

log = logging.getLogger(__name__)

#: GEMMs whose output dimension (N) is split over tensor-parallel ranks (Megatron column-parallel).
_COLUMN_PARALLEL = {"qkv_proj", "gate_up_proj", "q_b_proj", "kv_b_proj", "shared_gate_up", "expert_gate_up",
                    "lm_head"}
#: GEMMs whose reduction dimension (K) is split (row-parallel, followed by an all-reduce).
_ROW_PARALLEL = {"o_proj", "down_proj", "shared_down", "expert_down"}
_RANK_CACHE: dict[tuple[Any, ...], Any] = {}


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
    source: str  # "rank" (template + cost model) or "roofline" (no template kind for the op)
    config: Mapping[str, int] = field(default_factory=dict)
    kernel: str = ""
    template: str = ""
    path: str = ""
    roofline_pct: float = 0.0
    reason: str = ""

    @property
    def total_us(self) -> float:
        return self.predicted_us * self.occurrences

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "name": self.name, "mode": self.mode, "gpu": self.gpu, "kind": self.kind,
                "shape": list(self.shape), "dtype": self.dtype, "occurrences": self.occurrences,
                "kernel_class": self.kernel_class, "predicted_us": round(self.predicted_us, 4),
                "total_us": round(self.total_us, 3), "label": "predicted", "bound": self.bound,
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
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
        if not self.fits:
            lines.append("DOES NOT FIT on this hardware with any split; memory of the best attempt below.")
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


# -- inputs ----------------------------------------------------------------------
def _profile(profile: HardwareProfile | str | Path) -> HardwareProfile:
    if isinstance(profile, HardwareProfile):
        return profile
    if isinstance(profile, (str, Path)):
        from autoopt.hardware.library import load_profile

        return load_profile(profile)
    raise AutooptError(f"profile must be a HardwareProfile, a profile name or a file path, "
                       f"got {type(profile).__name__}")


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


def _rank(gpu: GPUProfile, op: Any, top: int) -> Any:
    """rank(), cached per (GPU content, op): ``gpu_key`` holds every field the templates and the cost
    model read (rates included) and is kept per profile object, where ``fingerprint`` hashed a
    string with sha256 on every call (48 calls per recommend) and left out the datasheet rates."""
    from autoopt.kernels.pruning import gpu_key

    key = (gpu_key(gpu), op.kind, op.shape, op.dtype, top)
    hit = _RANK_CACHE.get(key)
    if hit is None:
        from autoopt.search.ranking import rank

        try:
            hit = rank(gpu, op, top=top)
        except AutooptError as exc:
            log.info("rank() has no config for %s on %s: %s", op.label(), gpu.name, exc)
            hit = exc
        _RANK_CACHE[key] = hit
    return hit


def _shard(op: LayerOp, tp: int) -> LayerOp:
    """The op as one tensor-parallel rank sees it."""
    if tp == 1 or op.op is None:
        if tp > 1:
            return LayerOp(name=op.name, kind=op.kind, shape=op.shape, count=op.count, flops=op.flops / tp,
                           bytes=op.bytes / tp, op=None, kernel_class=op.kernel_class)
        return op
    from autoopt.kernels.ops import OpSpec

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
    tf = dev.tflops(compute) * 1e6
    bw = dev.bandwidth_gbs * 1e3
    c, b = op.flops / tf, op.bytes / bw
    return max(c, b), "compute" if c >= b else "memory"


@dataclass(slots=True)
class _Mode:
    name: str
    gemm_dtype: str       # what the GEMMs are ranked at
    act_bytes: int        # bytes per element of the hidden state carried between layers
    weight_ratio: float   # weight bytes of the format / weight bytes at the ranked dtype


def _modes(fmt: QuantFormat, gpu: GPUProfile | None) -> list[_Mode]:
    if fmt.mode == "native" and gpu is not None and gpu.features.fp8:
        # fp4 GEMMs are ranked as fp8 (OpSpec has no fp4 GEMM kind); bytes scaled to the format's bits.
        a8 = _Mode(f"w:{fmt.name} a:fp8", "fp8", 1, fmt.bits / 8)
        a16 = _Mode(f"w:{fmt.name} a:bf16 (weight-only)", "bf16", 2, fmt.bits / 16)
        return [a8, a16]
    base = "fp16" if gpu is not None and not gpu.features.bf16 else "bf16"
    ratio = (fmt.bits_per_weight(4096) / 16) if fmt.mode != "original" else fmt.bits / 16
    return [_Mode(f"w:{fmt.name} a:{base}", base, 2, ratio)]


def _weight_only_us(gpu: GPUProfile, spec: Any, mode: _Mode, us: float, bound: str, top: int) -> tuple[float, str]:
    """A weight-only GEMM: computes at the ranked dtype's rate, moves the format's weight bytes.

    With 8-bit weights on an FP8 GPU the bytes are exactly an fp8 GEMM's, so the
    time is the larger of the fp8 ranking (memory) and the bf16 one when that is
    compute bound. Otherwise a memory-bound prediction is scaled by the bytes moved.
    """
    from autoopt.kernels.ops import OpSpec

    if abs(mode.weight_ratio - 0.5) < 1e-9 and gpu.features.fp8 and spec.dtype != "fp8":
        r8 = _rank(gpu, OpSpec(kind=spec.kind, shape=spec.shape, dtype="fp8"), top)
        if not isinstance(r8, Exception):
            c8 = r8.candidates[0]
            if bound == "compute" and us >= c8.predicted_us:
                return us, bound
            return c8.predicted_us, c8.bound
    if bound == "memory":
        m, n, k = spec.shape
        e = 1 if spec.dtype == "fp8" else 2
        act = (m * k + m * n) * e
        return us * (act + n * k * e * mode.weight_ratio) / (act + n * k * e), bound
    return us, bound


def _op_time(dev: Device, op: LayerOp, mode: _Mode, top: int) -> tuple[float, str, Any]:
    """(predicted us for one run, bound, rank candidate or None)."""
    if op.op is not None and dev.gpu is not None:
        spec = op.op
        if spec.is_matmul and spec.dtype != mode.gemm_dtype:
            from autoopt.kernels.ops import OpSpec

            spec = OpSpec(kind=spec.kind, shape=spec.shape, dtype=mode.gemm_dtype)
        r = _rank(dev.gpu, spec, top)
        if not isinstance(r, Exception):
            best = r.candidates[0]
            us, bound = best.predicted_us, best.bound
            if spec.is_matmul and mode.weight_ratio != 1.0:
                us, bound = _weight_only_us(dev.gpu, spec, mode, us, bound, top)
            return us, bound, best
    t, bound = _roofline(dev, op, mode.gemm_dtype if op.kernel_class == "gemm" else "bf16")
    return t, bound, None


def recommend(profile: HardwareProfile | str | Path, model: Any, *, batch: int = 1, prompt_len: int = 1024,
              gen_len: int = 256, context: int | None = None, phase: str = "both", weight_dtype: str | None = None,
              kv_dtype: str | None = None, preference: str = "balanced", max_devices: int | None = None,
              include_cpu: bool = False, top: int = 3, compare_wfc: bool = True) -> Recommendation:
    """Recommend how to run ``model`` on ``profile`` (see module docstring); predictions only."""
    t0 = time.perf_counter()
    hw = _profile(profile)
    spec = parse_model(model)
    gpu0 = hw.gpu
    if kv_dtype is None:
        kv_dtype = "fp8" if preference == "speed" and gpu0 is not None and gpu0.features.fp8 else \
            ("bf16" if gpu0 is None or gpu0.features.bf16 else "fp16")
    if context is not None and context < prompt_len:
        raise ModelError(f"context {context} is shorter than the prompt ({prompt_len} tokens)", field="context")
    wl = Workload(batch=batch, prompt_len=prompt_len, gen_len=gen_len, phase=phase, kv_dtype=kv_dtype,
                  context=context)
    devs = devices_of(hw, include_cpu=include_cpu)
    if not devs:
        raise AutooptError(f"profile {hw.name!r} has no device with known memory size and bandwidth")
    notes: list[str] = []
    quant = choose_format(gpu0, spec, preference=preference, requested=weight_dtype,
                          fits=lambda f: _fits_somewhere(devs, spec, f, wl, max_devices))
    fmt = quant.format
    plans = candidate_splits(hw, spec, fmt, wl, max_devices=max_devices, include_cpu=include_cpu)
    fitting = [p for p in plans if p.fits]
    split = fitting[0] if fitting else None
    if split is None:
        d = max(devs, key=lambda d: d.capacity_bytes)
        memory: tuple[MemoryEstimate, ...] = (estimate_memory(
            spec, fmt, capacity_bytes=d.capacity_bytes, device=d.name, gpu=d.gpu, batch=wl.batch,
            context=wl.max_context, prompt_len=wl.prompt_len, phase=wl.phase, kv_dtype=wl.kv_dtype,
            cpu=d.kind == "cpu"),)
        notes.append(f"{spec.name} in {fmt.name} does not fit on {hw.name} with any split of up to "
                     f"{max_devices or len(devs)} device(s)")
        stage_of = [d] * spec.num_layers
        tp = 1
    else:
        memory = tuple(s.memory for s in split.stages)
        by_index = {d.index: d for d in devs}
        stage_of = []
        for s in split.stages:
            stage_of.extend([by_index[s.devices[0]]] * (s.layers[1] - s.layers[0]))
        tp = split.tp
        fewest = min(fitting, key=lambda p: (p.num_devices, p.predicted_us))
        if fewest is not split:
            notes.append(f"fewest devices that fit: {fewest.num_devices} ({fewest.kind}, tp={fewest.tp}, "
                         f"pp={fewest.pp}), predicted {fewest.predicted_us / 1e3:.3f} ms; the plan uses "
                         f"{split.num_devices} for the lowest predicted time")

    # -- per-op choices and per-layer costs ------------------------------------------
    phases = [("prefill", wl.prompt_len, wl.prompt_len, 1.0), ("decode", 1, wl.max_context, float(wl.gen_len))]
    if wl.phase == "prefill":
        phases = phases[:1]
    elif wl.phase == "decode":
        phases = [("decode", 1, wl.max_context, 1.0)]
    modes = _modes(fmt, stage_of[0].gpu)
    if preference == "quality" and len(modes) > 1:
        modes = modes[1:]  # quality keeps activations in bf16
        notes.append("quality: activations stay bf16 (no fp8 activation quantization)")
    n = spec.num_layers
    kinds = [spec.layer_kind(i) for i in range(n)]
    rep: dict[tuple[str, str], int] = {}
    for i, k in enumerate(kinds):
        rep.setdefault((k, stage_of[i].name), i)
    layer_cost: dict[tuple[str, str, int], float] = {}  # (kind, device, mode) -> us, weighted over phases
    phase_cost: dict[tuple[str, str, str, int], float] = {}
    layer_rows: dict[tuple[str, str, int], list[tuple[str, LayerOp, float, str, Any]]] = {}
    for (k, dname), i in rep.items():
        dev = stage_of[i]
        for mi, mode in enumerate(modes):
            total = 0.0
            rows = layer_rows.setdefault((k, dname, mi), [])
            for pname, q, ctx, w in phases:
                pt = 0.0
                for op in spec.layer_ops(i, batch=wl.batch, q_len=q, context=ctx, dtype=mode.gemm_dtype):
                    sop = _shard(op, tp)
                    us, bound, cand = _op_time(dev, sop, mode, top)
                    pt += us * sop.count
                    rows.append((pname, sop, us, bound, cand))
                phase_cost[(k, dname, pname, mi)] = pt
                total += w * pt
            layer_cost[(k, dname, mi)] = total

    # -- the per-layer chain -----------------------------------------------------------
    def cast_us(dev: Device, a: _Mode, b: _Mode) -> float:
        if a.act_bytes == b.act_bytes:
            return 0.0
        elems = sum(w * wl.batch * q for _, q, _, w in phases) * spec.hidden_size
        return elems * (a.act_bytes + b.act_bytes) / (dev.bandwidth_gbs * 1e3)

    bf16_in = _Mode("embedding output", "bf16", 2, 1.0)
    unary = []
    for i in range(n):
        row = [layer_cost[(kinds[i], stage_of[i].name, mi)] for mi in range(len(modes))]
        if i == 0:
            row = [c + cast_us(stage_of[0], bf16_in, m) for c, m in zip(row, modes)]
        if i == n - 1:
            row = [c + cast_us(stage_of[-1], m, bf16_in) for c, m in zip(row, modes)]
        unary.append(tuple(row))
    trans = tuple(tuple(tuple(cast_us(stage_of[i], a, b) for b in modes) for a in modes) for i in range(n - 1))
    problem = ChainProblem(stages=tuple(f"layer {i} ({kinds[i]})" for i in range(n)),
                           states=tuple(tuple(m.name for m in modes) for _ in range(n)), unary=tuple(unary),
                           transition=trans)
    plan = solve_dp(problem)
    alt = solve_wfc(problem) if compare_wfc else None
    layer_modes = plan.labels

    # -- de-duplicated op choices of the chosen plan ---------------------------------
    first_row: dict[tuple[Any, ...], tuple[int, str, LayerOp, float, str, Any]] = {}
    occurrences: dict[tuple[Any, ...], int] = {}
    for i in range(n):
        mi = plan.assignment[i]
        for pname, sop, us, bound, cand in layer_rows[(kinds[i], stage_of[i].name, mi)]:
            key = (pname, stage_of[i].name, sop.name, sop.shape, sop.count, mi)
            if key not in first_row:
                first_row[key] = (mi, pname, sop, us, bound, cand)
            occurrences[key] = occurrences.get(key, 0) + sop.count
    op_rows: dict[tuple[Any, ...], OpChoice] = {
        key: _op_choice(pname, key[1], sop, modes[mi], occurrences[key], us, bound, cand)
        for key, (mi, pname, sop, us, bound, cand) in first_row.items()}

    # -- totals ---------------------------------------------------------------------------
    predicted: dict[str, float] = {}
    head_dev = stage_of[-1]
    head_mode = modes[plan.assignment[-1]]
    head_total = 0.0
    for pname, q, ctx, w in phases:
        t = sum(phase_cost[(kinds[i], stage_of[i].name, pname, plan.assignment[i])] for i in range(n))
        for op in spec.head_ops(batch=wl.batch, q_len=q):
            sop = _shard(op, tp)
            us, bound, cand = _op_time(head_dev, sop, head_mode, top)
            t += us
            head_total += w * us
            key = (pname, head_dev.name, sop.name, sop.shape, 1, -1)
            op_rows.setdefault(key, _op_choice(pname, head_dev.name, sop, head_mode, 1, us, bound, cand))
        predicted["prefill_us" if pname == "prefill" else "decode_step_us"] = t
    predicted["request_us"] = plan.cost + head_total + (split.comm_us if split else 0.0)
    if split and split.comm_us:
        predicted["communication_us"] = split.comm_us

    impls = _impls(stage_of, fmt, op_rows.values())
    return Recommendation(profile=hw.name, model=spec, workload=wl, preference=preference, quant=quant,
                          fits=split is not None, split=split, memory=memory,
                          ops=tuple(sorted(op_rows.values(), key=lambda o: (o.phase != "prefill", -o.total_us))),
                          impls=impls, plan=plan, plan_alternative=alt, layer_modes=layer_modes,
                          predicted=predicted, notes=tuple(notes), elapsed_ms=(time.perf_counter() - t0) * 1e3)


def _op_choice(phase: str, dev: str, op: LayerOp, mode: _Mode, occ: int, us: float, bound: str,
               cand: Any) -> OpChoice:
    dtype = op.op.dtype if op.op is not None else "bf16"
    if op.op is not None and op.op.is_matmul:
        dtype = mode.gemm_dtype
    if cand is None:
        return OpChoice(phase=phase, name=op.name, mode=mode.name, gpu=dev, kind=op.kind, shape=op.shape,
                        dtype=dtype, occurrences=occ, kernel_class=op.kernel_class, predicted_us=us, bound=bound,
                        source="roofline", reason="no template kind for this op: roofline of its FLOPs and bytes")
    cfg = cand.config
    return OpChoice(phase=phase, name=op.name, mode=mode.name, gpu=dev, kind=op.kind, shape=op.shape, dtype=dtype,
                    occurrences=occ, kernel_class=op.kernel_class, predicted_us=us, bound=cand.bound,
                    source="rank", config=dict(cfg.params), kernel=cfg.kernel, template=cfg.template,
                    path=cfg.path, roofline_pct=cand.roofline_pct, reason=cand.reason)


def _impls(stage_of: list[Device], fmt: QuantFormat, ops: Any) -> tuple[Mapping[str, str], ...]:
    from autoopt.kernels.choices import KERNEL_CLASSES
    from autoopt.plugins.choices import choose_impl

    classes: list[str] = []
    for o in ops:
        kc = {"gemm": "gemv" if o.kind == "gemv" else "gemm", "norm": "rmsnorm", "moe": "softmax",
              "elementwise": "silu_mul" if o.kind == "silu_mul" else "elementwise"}.get(o.kernel_class,
                                                                                       o.kernel_class)
        if kc not in classes:
            classes.append(kc)
    if fmt.mode != "original" and "quantized_gemm" not in classes:
        classes.append("quantized_gemm")
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
