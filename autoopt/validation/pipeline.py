"""Pipeline step time: the split planner's prediction for one request against a timed 2-stage run.

The stage boundaries are those autoopt's split planner proposes for a 2-stage pipeline
(:func:`autoopt.planning.split.candidate_splits`); the hidden state crosses to the second GPU with
``.to("cuda:1")`` (NVLink P2P). A prefill and a decode step (eager, and with one CUDA graph per stage) are
timed against the planner's prediction for one request through the chain, ``sum(stage) + transfer``, with
the one-GPU layout as a reference (also predicted by :func:`autoopt.planning.recommendation.recommend`'s
per-op cost model). Target: within 20 %.

On the committed 2 x H200 run (8 layers, batch 4 x prompt 1024) the planner's datasheet prefill
prediction was 0.81 of the measured step, 0.91 with measured rates; eager decode is dominated by launch
gaps the roofline leaves out (see ``PipelineCheck.notes``).
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autoopt._log import get_logger
from autoopt.errors import BackendError
from autoopt.hardware.profile import HardwareProfile
from autoopt.planning.model import ModelSpec
from autoopt.planning.quant import get_format
from autoopt.planning.split import SplitPlan, Workload, candidate_splits
from autoopt.validation.timing import StepTiming
from autoopt.validation.verdict import Verdict, verdict
from autoopt.validation.workload import CheckOptions, check_buildable, llama_spec, spec_summary

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["ComparisonRow", "PartVerdict", "PipelineCheck", "PipelinePrediction", "PlacedStage", "PlanSummary",
           "ProfileVerdict", "StagePlan", "StepMeasurement", "check_pipeline", "phase_workload", "pipeline_analysis",
           "plan_summary", "predict_pipeline", "recommend_single", "stage_breakdown", "stages_for"]

log = get_logger(__name__)

PHASES = ("prefill", "decode")
LAYOUTS = ("single", "pipeline")

PREDICTED_QUANTITY = (
    "For one request through a 2-stage pipeline the stages run one after the other, so the step "
    "time is sum(stage times) + transfer ('sequential_us' = the planner's GPipe makespan "
    "sum(stage) + sum(transfer) + (m-1)*max(stage) at m = 1 micro-batch). The planner's "
    "'plan_predicted_us' may use m > 1 micro-batches (it does for batch > 1); this run does not "
    "micro-batch, so sequential_us is what is compared. Single-GPU: the one stage plus the LM "
    "head.")

NOTES = ("the split planner's roofline leaves out kernel launch overheads (autoopt.split "
         "docstring): eager decode pays ~40 launches per layer from Python, the cuda_graph rows "
         "remove the launch "
         "gaps but not the fixed GPU time of each small kernel",
         "the embedding lookup is timed in stage 0 but not predicted by the planner")


# ----------------------------------------------------------------------------- records

@dataclass(frozen=True, slots=True, kw_only=True)
class StagePlan:
    """One stage of a plan: layers ``[start, stop)``, the profile's devices, its predicted time."""

    layers: tuple[int, int]
    profile_devices: tuple[int, ...]
    device_name: str
    predicted_us: float

    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "profile_devices": list(self.profile_devices),
                "device_name": self.device_name, "predicted_us": self.predicted_us}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSummary:
    """The planner's numbers for one plan and the one-request time ``sequential_us`` (GPipe with m = 1)."""

    kind: str
    tp: int
    pp: int
    fits: bool
    stages: tuple[StagePlan, ...]
    transfer_us: float
    sequential_us: float
    plan_predicted_us: float
    plan_microbatches: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tp": self.tp, "pp": self.pp, "fits": self.fits,
                "stages": [s.to_dict() for s in self.stages], "transfer_us": self.transfer_us,
                "sequential_us": self.sequential_us, "plan_predicted_us": self.plan_predicted_us,
                "plan_microbatches": self.plan_microbatches}


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePrediction:
    """The planner's single-GPU and 2-stage pipeline plans for one phase, and every plan it considered."""

    workload: Mapping[str, Any]
    pipeline: PlanSummary | None
    single: PlanSummary | None
    considered: tuple[str, ...]

    def layout(self, name: str) -> PlanSummary | None:
        """The plan of layout ``single`` or ``pipeline``."""
        return self.pipeline if name == "pipeline" else self.single

    def to_dict(self) -> dict[str, Any]:
        return {"workload": dict(self.workload), "pipeline": self.pipeline.to_dict() if self.pipeline else None,
                "single": self.single.to_dict() if self.single else None, "considered": list(self.considered)}


@dataclass(frozen=True, slots=True, kw_only=True)
class PartVerdict:
    """One stage or the boundary transfer of a timed step against its predicted time."""

    part: str
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, **self.verdict.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileVerdict:
    """A timed step against one profile's prediction; ``stages`` per part (None: no breakdown kept)."""

    verdict: Verdict
    stages: tuple[PartVerdict, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = self.verdict.to_dict()
        if self.stages is not None:
            out["stages"] = [s.to_dict() for s in self.stages]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacedStage:
    """Layers ``[start, stop)`` on a torch device, as they ran."""

    layers: tuple[int, int]
    device: str

    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "device": self.device}


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMeasurement:
    """One timed step of one layout: where it ran, its timing (or why not), and each profile's verdict."""

    stages: tuple[PlacedStage, ...]
    placement: str
    error: str | None = None
    timing: StepTiming | None = None
    vs: Mapping[str, ProfileVerdict] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stages": [s.to_dict() for s in self.stages], "placement": self.placement}
        if self.error is not None:
            out["error"] = self.error
        if self.timing is not None:
            out["timing"] = self.timing.to_dict()
            out["vs"] = {k: v.to_dict() for k, v in self.vs.items()}
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ComparisonRow:
    """One line of the result table: a layout's step against one profile's prediction."""

    layout: str
    step: str
    profile: str
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "step": self.step, "profile": self.profile, **self.verdict.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineCheck:
    """The pipeline check's result: predictions per profile and phase, measurements per layout and step."""

    model: Mapping[str, Any]
    devices: tuple[str, ...]
    p2p: bool | None
    workload: Mapping[str, Any]
    predictions: Mapping[str, Mapping[str, PipelinePrediction]]
    recommend_single_gpu_us: Mapping[str, Mapping[str, float | str | None]]
    measurements: Mapping[str, Mapping[str, StepMeasurement]]
    rows: tuple[ComparisonRow, ...]
    analysis: str
    notes: tuple[str, ...] = NOTES

    def to_dict(self) -> dict[str, Any]:
        return {"model": dict(self.model), "devices": list(self.devices), "p2p": self.p2p,
                "workload": dict(self.workload), "predicted_quantity": PREDICTED_QUANTITY,
                "predictions": {n: {ph: p.to_dict() for ph, p in by.items()} for n, by in self.predictions.items()},
                "recommend_single_gpu_us": {n: dict(by) for n, by in self.recommend_single_gpu_us.items()},
                "measurements": {lay: {k: m.to_dict() for k, m in by.items()}
                                 for lay, by in self.measurements.items()},
                "rows": [r.to_dict() for r in self.rows], "analysis": self.analysis, "notes": list(self.notes)}


# ----------------------------------------------------------------------------- prediction

def phase_workload(phase: str, *, batch: int, prompt_len: int) -> Workload:
    """prefill: one pass over the prompt; decode: the first decode step (prompt_len + 1 keys)."""
    return Workload(batch=batch, prompt_len=prompt_len, gen_len=1, phase=phase, kv_dtype="bf16")


def plan_summary(plan: SplitPlan) -> PlanSummary:
    """The planner's numbers and the one-request time: ``sum(stage) + transfer`` (GPipe with m = 1)."""
    seq = sum(s.time_us for s in plan.stages) + plan.comm_us
    return PlanSummary(kind=plan.kind, tp=plan.tp, pp=plan.pp, fits=plan.fits,
                       stages=tuple(StagePlan(layers=s.layers, profile_devices=s.devices, device_name=s.device_name,
                                              predicted_us=s.time_us) for s in plan.stages),
                       transfer_us=plan.comm_us, sequential_us=seq, plan_predicted_us=plan.predicted_us,
                       plan_microbatches=plan.microbatches)


def predict_pipeline(profile: HardwareProfile, spec: ModelSpec, *, phase: str, batch: int,
                     prompt_len: int) -> PipelinePrediction:
    """The planner's single-GPU and 2-stage pipeline plans for one phase (``candidate_splits``, <= 2 devices)."""
    wl = phase_workload(phase, batch=batch, prompt_len=prompt_len)
    plans = candidate_splits(profile, spec, get_format("bf16"), wl, max_devices=2)
    pipe = next((p for p in plans if p.kind == "pipeline" and p.pp == 2), None)
    single = next((p for p in plans if p.kind == "single"), None)
    return PipelinePrediction(workload=wl.to_dict(), pipeline=plan_summary(pipe) if pipe else None,
                              single=plan_summary(single) if single else None,
                              considered=tuple(f"{p.kind} tp={p.tp} pp={p.pp}: {p.predicted_us:.1f} us"
                                               for p in plans))


def recommend_single(profile: HardwareProfile, spec: ModelSpec, *, phase: str, batch: int,
                     prompt_len: int) -> float | None:
    """autoopt.recommend's per-op cost-model step time on one GPU (kernel templates + calibrated constants)."""
    from autoopt.planning.recommendation import recommend

    r = recommend(profile, spec, batch=batch, prompt_len=prompt_len, gen_len=1, phase=phase, weight_dtype="bf16",
                  kv_dtype="bf16", max_devices=1, compare_wfc=False)
    return r.predicted.get("prefill_us" if phase == "prefill" else "decode_step_us")


def stages_for(plan: PlanSummary | None, num_layers: int,
               devices: Sequence[torch.device]) -> tuple[list[tuple[range, torch.device]], str]:
    """Stage k of the plan on torch device k (identical GPUs); an even split when there is no plan."""
    if plan is not None:
        return ([(range(*s.layers), devices[k]) for k, s in enumerate(plan.stages)],
                "the planner's stage boundaries")
    half = num_layers // 2
    return ([(range(0, half), devices[0]), (range(half, num_layers), devices[1])],
            "even split (the planner proposed no 2-stage pipeline)")


# ----------------------------------------------------------------------------- comparison

def stage_breakdown(plan: PlanSummary | None, timing: StepTiming) -> tuple[PartVerdict, ...]:
    """Each predicted stage and the boundary transfer against its measured span."""
    spans = timing.spans_median_ms
    rows = [PartVerdict(part=f"stage{k} layers {s.layers[0]}-{s.layers[1] - 1}",
                        verdict=verdict(s.predicted_us, spans.get(f"stage{k}")))
            for k, s in enumerate(plan.stages if plan else ())]
    if plan and "xfer0" in spans:
        rows.append(PartVerdict(part="transfer", verdict=verdict(plan.transfer_us, spans["xfer0"])))
    return tuple(rows)


def pipeline_analysis(rows: Sequence[ComparisonRow], layouts: Mapping[str, Mapping[str, StepMeasurement]],
                      primary: str) -> str:
    """What the numbers say: each step against the planner, the launch overhead graphs removed, the transfer."""
    parts = []
    for r in rows:
        if r.profile != primary:
            continue
        v = r.verdict
        if v.measured_us is None:
            parts.append(f"{r.layout} {r.step}: not measured (see its error).")
            continue
        if v.predicted_us is None or v.ratio is None:
            parts.append(f"{r.layout} {r.step}: measured {v.measured_us / 1e3:.3f} ms, not predicted (the "
                         "planner proposed no such plan).")
            continue
        parts.append(f"{r.layout} {r.step}: predicted {v.predicted_us / 1e3:.3f} ms, measured "
                     f"{v.measured_us / 1e3:.3f} ms (ratio {v.ratio:.3f}: the run reached "
                     f"{100 * v.ratio:.0f} % of the planner's roofline speed; "
                     f"{'pass' if v.passed else 'FAIL'} at +/-{v.target_pct:.0f} %).")
    for layout, entries in layouts.items():
        eager, graph = entries.get("decode_eager"), entries.get("decode_cuda_graph")
        if eager and graph and eager.timing and graph.timing:
            e, g = eager.timing.median_ms, graph.timing.median_ms
            parts.append(f"{layout} decode: CUDA graphs took the step from {e:.3f} to {g:.3f} ms, so "
                         f"{e - g:.3f} ms of the eager step is host-side launch overhead, which the planner "
                         "does not model.")
    for key, entry in layouts.get("pipeline", {}).items():
        pv = entry.vs.get(primary)
        for part in (pv.stages or ()) if pv else ():
            pvd = part.verdict
            if part.part == "transfer" and pvd.measured_us is not None:
                parts.append(f"pipeline {key} boundary copy: predicted {pvd.predicted_us or 0:.1f} us, measured "
                             f"{pvd.measured_us:.1f} us (CUDA events on the source stream).")
    return " ".join(parts)


# ----------------------------------------------------------------------------- the check

def check_pipeline(options: CheckOptions | None = None, *, profiles: Mapping[str, HardwareProfile] | None = None,
                   devices: Sequence[Any] | None = None, spec: ModelSpec | None = None) -> PipelineCheck:
    """Time the single-GPU and the planner's 2-stage layout, prefill and decode, against each profile.

    ``devices``: default cuda:0 and cuda:1 (:class:`~autoopt.errors.BackendError` without 2 CUDA devices);
    CPU devices run the same code, eagerly. ``profiles``: label -> profile to predict with, the first one
    primary (placement and analysis follow it); default this machine detected, and with measured rates.
    ``spec``: default ``options.model`` with ``options.pipeline_layers`` layers.
    """
    import torch

    from autoopt.validation.device import device_name, require_cuda, resolve_device
    from autoopt.validation.llama import build_model, place
    from autoopt.validation.timing import Marks, eager_step, graphed_step, pipeline_forward, time_step

    options = options or CheckOptions()
    spec = spec or llama_spec(options.pipeline_layers, options.model)
    check_buildable(spec)
    if devices is None:
        n = require_cuda()
        if n < 2:
            raise BackendError(f"the pipeline check needs 2 GPUs; torch sees {n}")
        devices = (torch.device("cuda", 0), torch.device("cuda", 1))
    devs = [resolve_device(d) for d in devices]
    if profiles is None:
        from autoopt.validation.profiles import add_measured_profile, detected_profiles

        detected, raw = detected_profiles()
        add_measured_profile(detected, raw)
        profiles = detected
    cuda = devs[0].type == "cuda"
    b, p = options.batch, options.prompt_len
    primary = next(iter(profiles))
    preds = {name: {ph: predict_pipeline(prof, spec, phase=ph, batch=b, prompt_len=p) for ph in PHASES}
             for name, prof in profiles.items()}
    recommend_us: dict[str, dict[str, float | str | None]] = {}
    for name, prof in profiles.items():
        recommend_us[name] = {}
        for ph in PHASES:
            try:
                recommend_us[name][ph] = recommend_single(prof, spec, phase=ph, batch=b, prompt_len=p)
            except Exception as exc:  # an extra reference number: never fatal
                recommend_us[name][ph] = f"failed: {type(exc).__name__}: {exc}"
    log.info("pipeline: building %s on %s", spec.name, devs[0])
    model = build_model(spec, device=devs[0], max_context=p + 1, seed=options.seed)
    model.allocate_kv(b, p + 1)
    gen = torch.Generator(device=devs[0]).manual_seed(options.seed)
    ids = torch.randint(spec.vocab_size, (b, p), device=devs[0], generator=gen)
    ids1 = torch.randint(spec.vocab_size, (b, 1), device=devs[0], generator=gen)
    single_stages = [(range(spec.num_layers), devs[0])]
    where = "cuda:0" if cuda else str(devs[0])
    layouts: dict[str, dict[str, StepMeasurement]] = {lay: {} for lay in LAYOUTS}
    rows: list[ComparisonRow] = []
    # Every eager run first: a failed CUDA-graph capture cannot then spoil them.
    jobs = [(lay, ph, "eager") for lay in LAYOUTS for ph in PHASES]
    if cuda and options.cuda_graphs:
        jobs += [("single", "decode", "cuda_graph"), ("pipeline", "decode", "cuda_graph")]
    for layout, ph, mode in jobs:
        plan = preds[primary][ph].layout(layout)
        if layout == "single":
            stages, how = single_stages, f"whole model on {where}"
        else:
            stages, how = stages_for(plan, spec.num_layers, devs)
        place(model, stages)  # outside inference_mode: moved parameters stay ordinary tensors
        used = sorted({d for _, d in stages}, key=str)
        log.info("%s %s %s: stages %s", layout, ph, mode, [(r.start, r.stop, str(d)) for r, d in stages])
        x, pos, reps = (ids, 0, options.reps_prefill) if ph == "prefill" else (ids1, p, options.reps_decode)
        key = f"{ph}_{mode}" if ph == "decode" else ph
        placed = tuple(PlacedStage(layers=(r.start, r.stop), device=str(d)) for r, d in stages)
        try:
            with torch.inference_mode():
                if ph == "decode":  # fill the cache first (its content does not change the timing)
                    pipeline_forward(model, ids, 0, stages, Marks())
                make = eager_step if mode == "eager" else graphed_step
                step = make(model, x, pos, stages)
                timing = time_step(step, used, warmup=options.warmup, reps=reps)
                del step
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            layouts[layout][key] = StepMeasurement(stages=placed, placement=how, error=error)
            log.warning("%s %s: %s", layout, key, error)
            rows.append(ComparisonRow(layout=layout, step=key, profile=primary, verdict=verdict(None, None)))
            continue
        finally:
            gc.collect()
            torch.cuda.empty_cache()
        vs: dict[str, ProfileVerdict] = {}
        for name in profiles:
            s = preds[name][ph].layout(layout)
            v = verdict(s.sequential_us if s else None, timing.median_ms)
            vs[name] = ProfileVerdict(verdict=v, stages=stage_breakdown(s, timing) if layout == "pipeline" else ())
            rows.append(ComparisonRow(layout=layout, step=key, profile=name, verdict=v))
        if layout == "single":
            for name in profiles:
                rec = recommend_us[name][ph]
                if isinstance(rec, float):
                    v = verdict(rec, timing.median_ms)
                    vs[f"{name}/recommend"] = ProfileVerdict(verdict=v)
                    rows.append(ComparisonRow(layout=layout, step=key, profile=f"{name}/recommend", verdict=v))
        layouts[layout][key] = StepMeasurement(stages=placed, placement=how, timing=timing, vs=vs)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return PipelineCheck(model=spec_summary(spec), devices=tuple(device_name(d) for d in devs),
                         p2p=torch.cuda.can_device_access_peer(devs[0], devs[1]) if cuda else None,
                         workload={"batch": b, "prompt_len": p, "decode_context": p + 1},
                         predictions=preds, recommend_single_gpu_us=recommend_us, measurements=layouts,
                         rows=tuple(rows), analysis=pipeline_analysis(rows, layouts, primary))
