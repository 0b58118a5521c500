"""Measure every alternative and score recommend()'s pick against the fastest: regret, predicted vs measured.

Per workload (one batch): recommend()'s pick is the weight format it chooses under the ``autoopt`` runtime
(``optimize(weights="auto")``'s answer) with CUDA graphs where it predicts them faster. Each runnable
:class:`~autoopt.regret.options.Option` is built fresh (the catalog model with random bf16 weights, ``layers``
decoder layers), optimised into its format and timed as a decode step (``autoopt.nn.e2e.decode_step_ms``).
Regret is the recommended option's measured step over the fastest measured one, less 1 (0: the pick was
the fastest), i.e. the best tokens/s over the recommended tokens/s, less 1. Predictions come from
``recommend()`` for the same model (its layer count), batch, format and graphs, on ``hardware``: when that
profile is not the measuring device the run says so and its predicted/measured ratios mean nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoopt.errors import AutooptError
from autoopt.hardware.profile import HardwareProfile
from autoopt.regret.options import FORMATS, Option, enumerate_options

__all__ = ["Measured", "RegretRun", "Workload", "predicted_ms", "recommended", "run_regret"]

#: tokens of context behind each measured decode step (the static cache holds them)
PROMPT = 128
#: timed decode steps per option unless told (``--steps``)
STEPS = 20
#: the keys behind the uncompiled-glue constants' measurement (quant_trace.py's cache: prompt 128 + 64)
GLUE_FIT_KEYS = 192


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """One option: predicted and measured decode step in ms (None with ``why`` where not available); an
    uncompiled one-GPU step keeps each timed block (``measured_ms`` is the least,
    :data:`autoopt.nn.e2e.EAGER_BLOCKS`): the lent hosts' Python runs in phases up to 1.9x apart, which the
    blocks' spread shows."""

    option: Option
    predicted_ms: float | None = None
    measured_ms: float | None = None
    why: str = ""
    measured_blocks_ms: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"option": self.option.to_dict(), "label": self.option.label,
                               "predicted_ms": self.predicted_ms,
                               "measured_ms": self.measured_ms, "why": self.why,
                               "predicted_over_measured": (round(self.predicted_ms / self.measured_ms, 4)
                                                           if self.predicted_ms and self.measured_ms else None)}
        if self.measured_blocks_ms:
            out["measured_blocks_ms"] = [round(t, 4) for t in self.measured_blocks_ms]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One batch: recommend()'s pick, the fastest measured option, the regret, every option's row."""

    batch: int
    recommended: str | None
    recommended_reason: str
    best: str | None
    regret: float | None
    rows: tuple[Measured, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "recommended": self.recommended, "recommended_reason": self.recommended_reason,
                "measured_best": self.best, "regret": self.regret, "options": [r.to_dict() for r in self.rows]}


@dataclass(frozen=True, slots=True, kw_only=True)
class RegretRun:
    """The whole run: what was measured where, per workload, and how close the predictions were."""

    model: str
    layers: int | None
    device: str
    predicted_for: str
    workloads: tuple[Workload, ...]
    elapsed_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the software the measurements ran on (:func:`autoopt.backend.software.versions`)
    env: dict[str, Any] = field(default_factory=dict)
    #: the HardwareProfile the predictions were made for (its GPUs and links: a re-score needs them)
    hardware: dict[str, Any] = field(default_factory=dict)

    def prediction_stats(self) -> dict[str, Any]:
        logs = [math.log(r.predicted_ms / r.measured_ms) for w in self.workloads for r in w.rows
                if r.predicted_ms and r.measured_ms]
        if not logs:
            return {"n": 0}
        return {"n": len(logs), "median_abs_ln": round(statistics.median(abs(x) for x in logs), 4),
                "worst_ratio": round(math.exp(max(logs, key=abs)), 4)}

    def to_dict(self) -> dict[str, Any]:
        regrets = [w.regret for w in self.workloads if w.regret is not None]
        return {"model": self.model, "layers": self.layers, "device": self.device, "env": dict(self.env),
                "predicted_for": self.predicted_for, "elapsed_s": round(self.elapsed_s, 1),
                "regret": {"n": len(regrets), "max": max(regrets) if regrets else None,
                           "median": statistics.median(regrets) if regrets else None},
                "prediction": self.prediction_stats(), "notes": list(self.notes),
                "workloads": [w.to_dict() for w in self.workloads], "label": "measured (regret), predicted (recommend)",
                "hardware": dict(self.hardware)}


def model_spec(model: str, layers: int | None) -> Any:
    """The catalog model's spec, with ``layers`` decoder layers when given (what the harness builds)."""
    from autoopt.planning.catalog import get_model

    spec = get_model(model)
    return dataclasses.replace(spec, num_layers=layers) if layers else spec


def predicted_ms(hardware: HardwareProfile, spec: Any, option: Option, *, steps: int = STEPS) -> float:
    """recommend()'s decode step for ``option``, in ms, over the cache the harness allocates (``steps``), plus
    what the harness's models run uncompiled and recommend() prices compiled (:func:`_uncompiled_layer_us`):
    one GPU (runtime ``autoopt``); tensor-parallel over its GPUs (runtime ``transformers`` at that degree, its
    ``tp_plan``: separate q/k/v and gate/up GEMMs, plus all of transformers' modules' glue, which a shard pays
    whole); replicas: one GPU's step at the replica's share of the batch (they run at once), an uncompiled one
    at the host time of that many processes stepping together (``eager_replica_host_factor``)."""
    from autoopt.nn.e2e import CACHE_SLACK
    from autoopt.planning.recommendation import eager_replica_host_factor, recommend

    kw: dict[str, Any] = dict(prompt_len=PROMPT, gen_len=steps + CACHE_SLACK, phase="decode",
                              weight_dtype=option.weights, cuda_graphs=option.cuda_graphs)
    tp = option.gpus if option.layout == "tensor-parallel" else 1
    batch = math.ceil(option.batch / option.gpus) if option.layout == "replicas" else option.batch
    if tp > 1:  # transformers' own modules, sharded by its tp_plan
        rec = recommend(hardware, spec, batch=batch, max_devices=tp, tensor_parallel=tp, runtime="transformers",
                        **kw)
    else:
        rec = recommend(hardware, spec, batch=batch, runtime="autoopt", max_devices=1, **kw)
    p = rec.predicted  # uncompiled: the larger of the GPU's time (with the glue) and the host's (recommend()'s)
    # transformers' SDPA walks the whole static cache decode_step_ms allocates: these are the keys it reads
    glue = _uncompiled_layer_us(hardware, spec, batch=batch, keys=PROMPT + steps + CACHE_SLACK, tp=tp)
    gpu = float(p.get("decode_gpu_us", p["decode_step_us"])) + spec.num_layers * glue
    host = float(p.get("decode_host_us", 0.0))
    if option.layout == "replicas":  # the replicas' Python loops step at once on one host
        host *= eager_replica_host_factor(option.gpus)
    return max(gpu, host) / 1e3


def _uncompiled_layer_us(hardware: HardwareProfile, spec: Any, *, batch: int, keys: int, tp: int) -> float:
    """What a decoder layer costs uncompiled beyond the compiled step recommend() prices: the glue kernels'
    latency (transformers' modules under tensor parallelism, only its attention's once optimize() has run),
    plus transformers' repeat_kv copy at its uncompiled rate instead of the stream rate recommend() gives it
    and its norms' reduction beyond one row (under tensor parallelism; on one GPU optimize()'s decode attention
    makes no copy and its norms are autoopt's).
    Both latency constants were measured on one GPU at batch 1 over :data:`GLUE_FIT_KEYS` keys, which holds
    that copy's share already: only the copy beyond it is added."""
    from autoopt.planning.recommendation import (
        UNCOMPILED_AUTOOPT_LAYER_US,
        UNCOMPILED_REPEAT_KV_GBS,
        UNCOMPILED_TRANSFORMERS_LAYER_US,
        repeat_kv_copy_bytes,
        runs_decode_attention,
        uncompiled_decode_attention_layer_us,
        uncompiled_norm_growth_us,
    )
    from autoopt.planning.split import devices_of

    latency = UNCOMPILED_TRANSFORMERS_LAYER_US if tp > 1 else UNCOMPILED_AUTOOPT_LAYER_US
    gpus = devices_of(hardware)
    if spec.is_mla or not gpus:
        return latency
    if tp == 1 and runs_decode_attention(spec, "autoopt"):
        # optimize()'s decode attention reads K/V once per KV head: no copy, measured so by batch
        return uncompiled_decode_attention_layer_us(batch)
    heads = (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim)
    at_fit = repeat_kv_copy_bytes(1, GLUE_FIT_KEYS, *heads)
    beyond_fit = repeat_kv_copy_bytes(batch, keys, *heads, tp=tp) - at_fit
    # transformers' own two norms a layer, whose reduction grows with the rows beyond the batch-1 fit
    norms = 2 * uncompiled_norm_growth_us(batch) if tp > 1 else 0.0
    return latency + norms + beyond_fit * (1 / UNCOMPILED_REPEAT_KV_GBS - 1 / gpus[0].bandwidth_gbs) / 1e3


def recommended(hardware: HardwareProfile, spec: Any, batch: int, predicted: Mapping[Option, float | None]
                ) -> tuple[Option | None, str]:
    """recommend()'s pick among the options ``predicted`` prices for ``batch``: on each layout, the weight
    format recommend() keeps under ``preference="fastest"`` for the batch one GPU of it runs (a replica's
    share: every format that fits priced, the fastest decode step kept; the default ``balanced`` takes FP8 on
    Hopper for its accuracy, whatever the times); tensor parallelism runs 16-bit modules whatever it keeps.
    Of those, the layout and CUDA-graphs setting predicted fastest."""
    chosen: dict[int, tuple[str, str]] = {}  # per-GPU batch -> (format, recommend()'s reason)
    candidates = []
    for o, us in predicted.items():
        if o.batch != batch or us is None:
            continue
        share = math.ceil(batch / o.gpus) if o.layout == "replicas" else batch
        if share not in chosen:
            try:
                chosen[share] = _fastest_format(hardware, spec, share)
            except AutooptError as exc:
                return None, f"recommend() could not plan batch {share}: {exc}"
        if o.layout == "tensor-parallel" or o.weights == chosen[share][0]:
            candidates.append(o)
    if not candidates:
        return None, f"recommend() chose {chosen[batch][0] if batch in chosen else '?'}, which is not among the " \
                     "runnable options here"
    pick = min(candidates, key=lambda o: predicted[o] or math.inf)
    fmt, why = chosen[math.ceil(batch / pick.gpus) if pick.layout == "replicas" else batch]
    where = "" if pick.gpus == 1 else f"; {pick.layout} over {pick.gpus} GPUs (predicted fastest)"
    return pick, (f"recommend(): {fmt} ({why}); {'with' if pick.cuda_graphs else 'without'} CUDA graphs{where}")


def _fastest_format(hardware: HardwareProfile, spec: Any, batch: int) -> tuple[str, str]:
    """(format, reason) recommend() keeps for one GPU at ``batch`` under ``preference="fastest"``."""
    from autoopt.nn.e2e import CACHE_SLACK
    from autoopt.planning.recommendation import recommend

    rec = recommend(hardware, spec, batch=batch, prompt_len=PROMPT, gen_len=STEPS + CACHE_SLACK, phase="decode",
                    runtime="autoopt", max_devices=1, preference="fastest", cuda_graphs=True)
    return rec.quant.format.name, rec.quant.reason


def measure_ms(model: str, option: Option, *, device: str, layers: int | None, tiny: bool, steps: int,
               blocks_ms: list[float] | None = None) -> float:
    """Build ``model``, optimise it into ``option``'s format and time its decode step on one GPU (the
    multi-GPU layouts are measured together, :func:`measure_layouts`); an uncompiled step's blocks go to
    ``blocks_ms`` when given."""
    import torch

    from autoopt.nn.e2e import build_model, decode_step_ms
    from autoopt.nn.optimize import optimize

    net = build_model(model, dtype="bf16", device=device, tiny=tiny, layers=layers)
    try:
        optimize(net, weights=FORMATS[option.weights])
        return decode_step_ms(net, option.batch, PROMPT, steps, graphed=option.cuda_graphs, blocks_ms=blocks_ms)
    finally:
        del net
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


#: seconds a torchrun group may take to start, build and load, plus seconds per option it times
LAYOUT_TIMEOUT_S, LAYOUT_OPTION_S = 600, 120


def measure_layouts(model: str, options: list[Option], *, layers: int | None, tiny: bool,
                    steps: int) -> dict[Option, float | str]:
    """Every multi-GPU option of one GPU count in one torchrun group running :mod:`autoopt.regret.distributed`
    (gloo on a machine without CUDA): each option's slowest rank's time, or why it failed."""
    import subprocess
    import tempfile

    gpus = {o.gpus for o in options}
    if len(gpus) != 1 or min(gpus) < 2:
        raise ValueError(f"measure_layouts takes options of one GPU count from 2, got {sorted(gpus)}")
    plan = [{"layout": o.layout, "weights": FORMATS[o.weights], "batch": o.batch, "graphs": o.cuda_graphs}
            for o in options]
    timeout_s = LAYOUT_TIMEOUT_S + LAYOUT_OPTION_S * len(options)
    with tempfile.TemporaryDirectory(prefix="autoopt-regret-") as tmp:
        out, plan_file = Path(tmp) / "result.json", Path(tmp) / "plan.json"
        plan_file.write_text(json.dumps(plan))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={min(gpus)}",
               "-m", "autoopt.regret.distributed", "--model", model, "--plan", str(plan_file),
               "--prompt", str(PROMPT), "--steps", str(steps), "--ckpt", str(Path(tmp) / "ckpt"), "--out", str(out)]
        cmd += (["--tiny"] if tiny else []) + (["--layers", str(layers)] if layers else [])
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return dict.fromkeys(options, f"torchrun did not finish in {timeout_s:g} s")
        # rank 0 writes the results after every rank's times are gathered: a group that failed in its
        # teardown afterwards (gloo has aborted there on this project's CPU machine) still measured
        if not out.is_file():
            return dict.fromkeys(options, f"torchrun exited {run.returncode}: {_root_cause(run.stderr or run.stdout)}")
        results = json.loads(out.read_text())["results"]
    return {o: (r["measured_ms"] if r["measured_ms"] is not None else str(r["why"]))
            for o, r in zip(options, results, strict=True)}


def _root_cause(log: str) -> str:
    """The failing rank's exception line from a torchrun log (``[rank0]: ValueError: ...``), else its tail."""
    import re

    errors = re.findall(r"^\[rank\d+\]:\s*([\w.]*(?:Error|Exception)\b.*)$", log, flags=re.MULTILINE)
    return errors[0][:400] if errors else " ".join(log.split()[-40:])


def _device_name(device: str) -> str:
    """The name of the device the measurements run on, as the profiles name GPUs (torch's name)."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return str(torch.cuda.get_device_name(torch.device(device)))


def _measured(model: str, opt: Option, predicted: float | None, *, layouts: dict[Option, float | str] | None = None,
              **kw: Any) -> Measured:
    """One option's row: its measured step, or why it could not be measured (the run goes on); a multi-GPU
    option's result comes from ``layouts`` (:func:`measure_layouts`)."""
    if opt.gpus > 1:
        got = (layouts or {}).get(opt, "not measured: no torchrun group ran it")
        if isinstance(got, str):
            return Measured(option=opt, predicted_ms=predicted, why=got)
        return Measured(option=opt, predicted_ms=predicted, measured_ms=got)
    blocks: list[float] = []
    try:
        ms = measure_ms(model, opt, blocks_ms=blocks, **kw)
        return Measured(option=opt, predicted_ms=predicted, measured_ms=ms, measured_blocks_ms=tuple(blocks))
    except Exception as exc:  # an option that fails to build, quantize or run (OOM) is data, not the end
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return Measured(option=opt, predicted_ms=predicted, why=why)


def _workload(batch: int, rows: list[Measured], pick: Option | None, reason: str) -> Workload:
    timed = [r for r in rows if r.measured_ms is not None]
    best = min(timed, key=lambda r: r.measured_ms or math.inf) if timed else None
    mine = next((r for r in timed if pick is not None and r.option == pick), None)
    regret = (round(mine.measured_ms / best.measured_ms - 1.0, 4)
              if mine is not None and best is not None and mine.measured_ms and best.measured_ms else None)
    return Workload(batch=batch, recommended=pick.label if pick else None, recommended_reason=reason,
                    best=best.option.label if best else None, regret=regret, rows=tuple(rows))


#: the run's clock (seconds; a test steps it)
_clock = time.monotonic


def run_regret(model: str, hardware: HardwareProfile, *, device: str, gpus: int = 1,
               batches: tuple[int, ...] = (1, 8, 32), formats: tuple[str, ...] | None = None,
               layers: int | None = None, tiny: bool = False, steps: int = 20,
               on_progress: Callable[[RegretRun], None] | None = None,
               budget_s: float | None = None) -> RegretRun:
    """Enumerate, predict, measure and score every batch of ``batches`` for ``model`` on ``device``.
    ``on_progress`` gets the run so far after each batch (a note says how many are left), so a run cut short
    (a lent machine's time limit) keeps what it measured. ``budget_s``: measure batch by batch, the multi-GPU
    layouts too (one torchrun group a batch instead of one for all), and start no batch that the slowest so far
    says would end past the budget (the first always runs); the notes name the batches left out."""
    from autoopt.backend.software import versions

    t0 = _clock()
    cuda = device.startswith("cuda")
    gpu = hardware.gpu if cuda else None
    options = enumerate_options(gpu, gpus=gpus, batches=batches, formats=formats)
    spec = model_spec(model, layers)
    measuring = _device_name(device)
    planned = hardware.gpu.name if hardware.gpu else hardware.name
    notes = []
    if planned != measuring:
        notes.append(f"predictions are for {planned}, measurements on {measuring}: their ratios test the code "
                     "path, not the model")
    multi = [o for o in options if o.gpus > 1 and o.runnable]
    layouts = measure_layouts(model, multi, layers=layers, tiny=tiny, steps=steps) if multi and budget_s is None \
        else {}
    workloads: list[Workload] = []
    slowest = 0.0

    def so_far(more: list[str]) -> RegretRun:
        return RegretRun(model=model, layers=layers, device=measuring,
                         predicted_for=hardware.gpu.name if hardware.gpu else hardware.name,
                         workloads=tuple(workloads), elapsed_s=_clock() - t0, notes=tuple(notes + more),
                         env=versions(), hardware=hardware.to_dict())

    for batch in batches:
        started = _clock()
        if workloads and started - t0 + slowest > (budget_s or math.inf):
            notes.append(f"budget: batches {', '.join(map(str, batches[len(workloads):]))} not measured "
                         f"({started - t0:.0f} s spent, the slowest batch took {slowest:.0f} s, budget {budget_s:g} s)")
            break
        mine = [o for o in multi if o.batch == batch]
        if budget_s is not None and mine:
            layouts = measure_layouts(model, mine, layers=layers, tiny=tiny, steps=steps)
        predicted: dict[Option, float | None] = {}
        for opt in (o for o in options if o.batch == batch and o.runnable):
            try:
                predicted[opt] = predicted_ms(hardware, spec, opt, steps=steps)
            except AutooptError as exc:
                predicted[opt] = None
                notes.append(f"{opt.label}: no prediction ({exc})")
        pick, reason = recommended(hardware, spec, batch, predicted)
        rows = [Measured(option=o, why=o.why) if not o.runnable else
                _measured(model, o, predicted[o], layouts=layouts, device=device, layers=layers, tiny=tiny,
                          steps=steps)
                for o in options if o.batch == batch]
        workloads.append(_workload(batch, rows, pick, reason))
        slowest = max(slowest, _clock() - started)
        left = len(batches) - len(workloads)
        if on_progress is not None and left:
            on_progress(so_far([f"partial: {left} of {len(batches)} batches not measured yet"]))
    return so_far([])

