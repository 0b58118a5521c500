"""Multi-device split: which devices hold which layers, at what tensor-parallel degree.

Candidates are every tensor-parallel degree ``tp`` (identical GPUs, dividing the
head count) times every pipeline depth ``pp`` over the fastest devices; each
pipeline cut is balanced by the devices' real rates (``gpu.tflops``,
``bandwidth_gbs``; CPUs by ``peak_gflops_fp32`` and ``mem_bandwidth_gbs``) under
each device's memory, and scored by predicted time: per layer a roofline
``max(FLOP / peak, bytes / bandwidth)`` over its ops, plus

- tensor parallel: two all-reduces per layer of ``tokens x hidden`` bf16, ring
  algorithm: ``lat + bytes * 2(t-1)/t / link_bw``, ``lat = 3.6 us + 2(t-1) x hop``
  with hop 0.47 us over NVLink, 1.0 us over PCIe (NCCL's tuning model,
  src/graph/tuning.cc, Ring/LL base and hardware latencies);
- pipeline: the hidden state crossing each stage boundary at the link's rate
  (``HardwareProfile.link_between`` -> NVLink; else PCIe from ``pcie_gen`` x
  ``pcie_width``; host<->GPU at PCIe), and the makespan of the dependency chain with
  ``m`` micro-batches: ``sum(stage) + sum(transfer) + (m-1) max(stage)`` (GPipe).

Kernel launch overheads are not modelled.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import ModelError, ProfileError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.constants import constants
from autoopt.planning.memory import FRAGMENTATION, MemoryEstimate, estimate_memory, kv_cache_bytes
from autoopt.planning.model import ModelSpec
from autoopt.planning.quant import QuantFormat, weight_bytes

__all__ = ["Device", "SplitPlan", "Stage", "Workload", "candidate_splits", "devices_of", "layer_time_us",
           "link_gbs", "pcie_gbs", "plan_split", "tp_step_comm_us"]

log = get_logger(__name__)

#: PCIe GB/s per lane per direction after line coding (PCIe base spec: 2.5/5 GT/s 8b/10b,
#: 8/16/32 GT/s 128b/130b, 64 GT/s FLIT mode).
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
#: NCCL ring/LL latency model (tuning.cc): base and per-step hardware latency, microseconds. Prices PCIe
#: all-reduces, and the extra ring steps of an NVLink group larger than the measured ones below.
NCCL_BASE_US = 3.6
NCCL_HOP_US = {"nvlink": 0.47, "pcie": 1.0}
#: NVLink all-reduce, measured: per group size, NCCL's three protocols as (latency us, bus GB/s); a message
#: takes the fastest, ``latency + bus bytes / bus GB/s`` with bus bytes ``2 (tp - 1) / tp`` of the message
#: (nccl-tests' busbw), as NCCL's tuner picks LL / LL128 / Simple. bf16 all-reduces of 16 KiB to 256 MiB
#: replayed from a CUDA graph (``benchmarks/nccl_allreduce.py``; NVLink4, 450 GB/s a direction; NCCL 2.28.9,
#: torch 2.11) on an H100 SXM host (``benchmarks/results/h100/nccl_allreduce_tp{2,4}.json``) and on H200
#: hosts (``benchmarks/results/h200/nccl_allreduce_tp2.json``, ``_tp2_run2.json``, ``_tp4.json``).
#: Refitted on both hosts by least max |ln| (latencies on a 0.5-3 us grid, rates on a 10-40 GB/s one): 2 GPUs,
#: 45 sizes over three files, 0.89-1.12x (max |ln| 0.113); 4 GPUs, 30 sizes over two, 0.88-1.11x (0.129). The
#: H100-only fit before (2: 8 / 10 / 25 us at 10 / 100 / 280 GB/s; 4: 13 / 16 / 25 us at 10 / 240 / 310)
#: priced the H200's 16 KiB on 2 GPUs 0.859x and its 256 KiB on 4 1.157x. (That fit, made on the even sizes
#: alone, put the odd ones within 14 % on 4 GPUs but 26 % low at 2 MiB on 2, where NCCL changes protocol.)
#: Bus GB/s scale with another link's rate; the old model, off by 0.38-0.76x here, did not see the protocols'
#: latencies (10-17 us for the smallest, not 4-7).
NCCL_NVLINK_PROTOCOLS: dict[int, tuple[tuple[float, float], ...]] = {
    2: ((8.5, 10.0), (11.0, 120.0), (22.0, 280.0)),
    4: ((13.0, 10.0), (15.0, 200.0), (22.0, 310.0)),
}
#: the per-direction NVLink GB/s the protocol table was measured on (H100 SXM, NVLink4)
NCCL_NVLINK_MEASURED_GBS = 450.0
CPU = -1  # device index of the host CPU


def pcie_gbs(gpu: GPUProfile) -> float | None:
    if gpu.pcie_gen is None or gpu.pcie_width is None or gpu.pcie_gen not in PCIE_LANE_GBS:
        return None
    return PCIE_LANE_GBS[gpu.pcie_gen] * gpu.pcie_width


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What one request does: ``batch`` sequences, ``prompt_len`` in, ``gen_len`` out."""

    batch: int = 1
    prompt_len: int = 512
    gen_len: int = 256
    phase: str = "both"
    kv_dtype: str = "bf16"
    context: int | None = None
    #: decode steps are replayed from a CUDA graph (vLLM, SGLang, a captured ``optimize``d model): each
    #: kernel then costs its in-graph launch, not a standalone one (see ``recommendation.GRAPH_LAUNCH_US``).
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        for f in ("batch", "prompt_len", "gen_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ModelError(f"must be a positive integer, got {v!r}", field=f)
        if self.context is not None and (not isinstance(self.context, int) or self.context <= 0):
            raise ModelError(f"must be a positive integer, got {self.context!r}", field="context")
        if self.phase not in ("prefill", "decode", "both"):
            raise ModelError(f"unknown phase {self.phase!r}; expected prefill, decode or both", field="phase")
        if not isinstance(self.cuda_graphs, bool):
            raise ModelError(f"must be a bool, got {self.cuda_graphs!r}", field="cuda_graphs")

    @property
    def max_context(self) -> int:
        return self.context or self.prompt_len + self.gen_len

    def points(self) -> tuple[tuple[int, int, float], ...]:
        """(new tokens per sequence, context, weight) of the steps the objective sums.

        prefill: one pass over the prompt; decode: one step at the full context;
        both: the prefill plus ``gen_len`` decode steps at the mean context.
        """
        if self.phase == "prefill":
            return ((self.prompt_len, self.prompt_len, 1.0),)
        if self.phase == "decode":
            return ((1, self.max_context, 1.0),)
        return ((self.prompt_len, self.prompt_len, 1.0),
                (1, self.prompt_len + max(1, self.gen_len // 2), float(self.gen_len)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"batch": self.batch, "prompt_len": self.prompt_len, "gen_len": self.gen_len,
                               "phase": self.phase, "kv_dtype": self.kv_dtype, "context": self.max_context}
        if self.cuda_graphs:  # only when set: plans and committed results written before it keep their shape
            out["cuda_graphs"] = True
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """A place layers can live: a GPU (index into the profile) or the host CPU (index -1)."""

    index: int
    name: str
    kind: str
    capacity_bytes: int
    bandwidth_gbs: float
    gpu: GPUProfile | None = None
    cpu_gflops: float | None = None

    def tflops(self, compute_dtype: str) -> float:
        if self.gpu is None:
            return (self.cpu_gflops or 0.0) / 1e3
        chain = {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "fp32": ("fp32",)}.get(
            compute_dtype, ("bf16", "fp16"))
        for d in chain:
            measured = self.gpu.measured_tflops.get(d)
            if measured:
                return measured
            v = self.gpu.tflops(d, measured=False)
            if v:
                # a datasheet peak is not sustained: scale it by the cost model's fitted share
                # (0.80 of the bf16 peak for well-shaped GEMMs on the H200 grid)
                return v * constants().tc_efficiency
        raise ProfileError(f"GPU {self.name} has no peak rate for {compute_dtype}", field="peak_tflops")

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "kind": self.kind, "capacity_bytes": self.capacity_bytes,
                "bandwidth_gbs": self.bandwidth_gbs}


#: (share of each GPU's memory, bytes of it held back) a serving runtime leaves to the plan: all of it
NO_RESERVE = (1.0, 0)


def devices_of(profile: HardwareProfile, *, include_cpu: bool = False,
               reserve: tuple[float, int] = NO_RESERVE) -> tuple[Device, ...]:
    """The profile's GPUs (and the CPU when asked and its rates are known). ``reserve`` cuts each GPU's
    capacity to what a runtime leaves (``share x memory - held back``); the GPU itself, its identity in
    the results store included, is unchanged."""
    share, held = reserve
    out = []
    for g in profile.gpus:
        if not g.memory_total_bytes or not g.bandwidth_gbs:
            log.warning("GPU %s lacks memory size or bandwidth; left out of the split", g.name)
            continue
        # sustained bandwidth: measured when the profile has it, else spec times the copy-like share
        bw = g.measured_bandwidth_gbs or g.bandwidth_gbs * constants().stream_dram_efficiency
        out.append(Device(index=g.index, name=g.name, kind="gpu",
                          capacity_bytes=max(0, int(g.memory_total_bytes * share) - held), bandwidth_gbs=bw, gpu=g))
    c = profile.cpu
    if include_cpu and c.mem_bandwidth_gbs and c.peak_gflops_fp32 and (c.ram_available_bytes or c.ram_total_bytes):
        out.append(Device(index=CPU, name=c.model, kind="cpu",
                          capacity_bytes=c.ram_available_bytes or c.ram_total_bytes,
                          bandwidth_gbs=c.mem_bandwidth_gbs, cpu_gflops=c.peak_gflops_fp32))
    return tuple(out)


def link_gbs(profile: HardwareProfile, a: Device, b: Device) -> tuple[float, str]:
    """Per-direction bandwidth between two devices and the kind of path (nvlink or pcie)."""
    if a.kind == "cpu" or b.kind == "cpu":
        g = b.gpu if a.kind == "cpu" else a.gpu
        bw = pcie_gbs(g) if g else None
        if bw is None:
            raise ProfileError(f"PCIe generation/width of {g.name if g else '?'} unknown: host<->GPU transfers "
                               "cannot be costed", field="pcie_gen")
        return bw, "pcie"
    link = profile.link_between(a.index, b.index)
    if link is not None and link.bandwidth_gbs:
        return link.bandwidth_gbs, "nvlink" if "nvlink" in link.kind.lower() or link.kind.upper().startswith("NV") \
            else "pcie"
    ga, gb = a.gpu, b.gpu
    if link is None and ga and gb and ga.nvlink_bandwidth_gbs and gb.nvlink_bandwidth_gbs and not profile.links:
        # No link table but NVLink on both: an NVSwitch baseboard (HGX) connects every pair at full rate.
        return min(ga.nvlink_bandwidth_gbs, gb.nvlink_bandwidth_gbs), "nvlink"
    bws = [x for x in (pcie_gbs(ga) if ga else None, pcie_gbs(gb) if gb else None) if x]
    if not bws:
        raise ProfileError(f"no NVLink and no PCIe figures between GPU {a.index} and GPU {b.index}",
                           field="links")
    return min(bws), "pcie"


def _gemm_bytes(m: int, n: int, k: int, fmt: QuantFormat, tp: int) -> float:
    act = 1 if fmt.compute_dtype in ("fp8", "fp4") else 2
    return n * k * fmt.bits_per_weight(k, n) / 8 / tp + (m * k + m * n / tp) * act


def layer_time_us(dev: Device, model: ModelSpec, i: int, fmt: QuantFormat, *, batch: int, q_len: int,
                  context: int, tp: int = 1) -> float:
    """Roofline time of layer ``i`` on one TP rank of ``dev`` (no communication)."""
    tf = dev.tflops(fmt.compute_dtype if fmt.mode == "native" else "bf16") * 1e6  # FLOP per us
    bw = dev.bandwidth_gbs * 1e3  # bytes per us
    return _layer_time(tf, bw, model, _kinds(model)[1][model.layer_kind(i)], fmt, batch, q_len, context, tp)


@lru_cache(maxsize=64)
def _kinds(model: ModelSpec) -> tuple[tuple[str, ...], dict[str, int]]:
    """Each layer's kind, and the first layer of each kind (layers of a kind cost the same)."""
    kinds = tuple(model.layer_kind(i) for i in range(model.num_layers))
    rep: dict[str, int] = {}
    for i, k in enumerate(kinds):
        rep.setdefault(k, i)
    return kinds, rep


@lru_cache(maxsize=4096)
def _layer_time(tf: float, bw: float, model: ModelSpec, i: int, fmt: QuantFormat, batch: int,
                q_len: int, context: int, tp: int) -> float:
    total = 0.0
    for op in model.layer_ops(i, batch=batch, q_len=q_len, context=context):
        if op.kind in ("gemm", "gemv"):
            m, n, k = op.shape
            flops, nbytes = op.flops / tp, _gemm_bytes(m, n, k, fmt, tp)
        else:
            flops, nbytes = op.flops / tp, op.bytes / tp
        total += op.count * max(flops / tf, nbytes / bw)
    return total


def _head_time_us(dev: Device, model: ModelSpec, fmt: QuantFormat, batch: int, tp: int) -> float:
    tf = dev.tflops("bf16") * 1e6
    flops = 2.0 * batch * model.vocab_size * model.hidden_size / tp
    nbytes = model.vocab_size * model.hidden_size * 2 / tp
    return max(flops / tf, nbytes / (dev.bandwidth_gbs * 1e3))


def allreduce_us(nbytes: float, tp: int, bw_gbs: float, path: str) -> float:
    """Predicted microseconds of an all-reduce of ``nbytes`` over ``tp`` GPUs joined by ``path`` links of
    ``bw_gbs`` a direction, replayed in a CUDA graph: NVLink from the measured protocol table (the
    largest measured group at most ``tp``, plus the ring steps beyond it), PCIe from NCCL's ring model."""
    if tp <= 1:
        return 0.0
    bus = nbytes * 2 * (tp - 1) / tp
    if path == "nvlink":
        size = max(g for g in NCCL_NVLINK_PROTOCOLS if g <= tp)
        extra = 2 * (tp - size) * NCCL_HOP_US["nvlink"]
        scale = bw_gbs / NCCL_NVLINK_MEASURED_GBS
        return min(lat + extra + bus / (gbs * scale * 1e3) for lat, gbs in NCCL_NVLINK_PROTOCOLS[size])
    lat = NCCL_BASE_US + 2 * (tp - 1) * NCCL_HOP_US[path]
    return lat + bus / (bw_gbs * 1e3)


def layer_allreduces_us(profile: HardwareProfile, group: Sequence[Device], hidden: int, tokens: int) -> float:
    """A tensor-parallel layer's two all-reduces of ``tokens`` bf16 rows of ``hidden`` (after the attention's
    output projection and the MLP's down projection) over ``group``'s slowest link."""
    tp = len(group)
    bw, path = min(link_gbs(profile, group[j], group[(j + 1) % tp]) for j in range(tp))
    return 2 * allreduce_us(tokens * hidden * 2, tp, bw, path)


def tp_step_comm_us(profile: HardwareProfile, split: SplitPlan, layers: int, hidden: int, tokens: int) -> float:
    """The all-reduces of one forward step of ``tokens`` rows under ``split``'s tensor parallelism, over the
    first stage's group (:func:`layer_allreduces_us` a layer); 0 without tensor parallelism."""
    if split.tp <= 1:
        return 0.0
    by_index = {d.index: d for d in devices_of(profile, include_cpu=True)}
    group = [by_index[i] for i in split.stages[0].devices if i in by_index]
    return layers * layer_allreduces_us(profile, group, hidden, tokens) if len(group) == split.tp else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """A pipeline stage: a contiguous range of layers on a TP group of identical devices."""

    devices: tuple[int, ...]
    device_name: str
    layers: tuple[int, int]  # [start, stop)
    time_us: float
    memory: MemoryEstimate

    def to_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "device_name": self.device_name, "layers": list(self.layers),
                "predicted_us": round(self.time_us, 3), "memory": self.memory.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitPlan:
    """How the model is laid over devices, and its predicted time."""

    kind: str  # single | tensor | pipeline | pipeline+tensor
    tp: int
    pp: int
    stages: tuple[Stage, ...]
    predicted_us: float
    comm_us: float
    microbatches: int = 1
    fits: bool = True
    reason: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def num_devices(self) -> int:
        return sum(len(s.devices) for s in self.stages)

    @property
    def device_indices(self) -> tuple[int, ...]:
        return tuple(d for s in self.stages for d in s.devices)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tp": self.tp, "pp": self.pp, "num_devices": self.num_devices,
                "microbatches": self.microbatches, "predicted_us": round(self.predicted_us, 3),
                "label": "predicted", "comm_us": round(self.comm_us, 3), "fits": self.fits,
                "reason": self.reason, "stages": [s.to_dict() for s in self.stages], "notes": list(self.notes)}

    def describe(self) -> str:
        parts = [f"{self.kind} (tp={self.tp}, pp={self.pp}, {self.num_devices} device(s)): predicted "
                 f"{self.predicted_us / 1e3:.3f} ms, of which communication {self.comm_us / 1e3:.3f} ms"]
        for s in self.stages:
            parts.append(f"  layers {s.layers[0]}-{s.layers[1] - 1} on {s.device_name} {list(s.devices)}: "
                         f"{s.time_us / 1e3:.3f} ms; {s.memory.describe()}")
        return "\n".join(parts)


class _Costs:
    """Per-layer time and memory on each device for one (model, format, workload, tp)."""

    def __init__(self, model: ModelSpec, fmt: QuantFormat, wl: Workload, tp: int) -> None:
        self.model, self.fmt, self.wl, self.tp = model, fmt, wl, tp
        self.kinds, self.rep = _kinds(model)
        self._time: dict[tuple[Any, ...], list[float]] = {}
        ctx = wl.max_context
        per_kind = {k: weight_bytes(model, fmt, range(i, i + 1), embed=False, head=False, tp=tp)
                    + (1 + FRAGMENTATION) * kv_cache_bytes(model, batch=wl.batch, context=ctx, kv_dtype=wl.kv_dtype,
                                                           tp=tp, layers=range(i, i + 1))
                    for k, i in self.rep.items()}
        self.layer_mem = [per_kind[k] for k in self.kinds]
        self.mem_prefix = list(itertools.accumulate(self.layer_mem, initial=0.0))

    def times(self, dev: Device, batch: int | None = None) -> list[float]:
        """Time of every layer on ``dev`` summed over the workload's steps."""
        b = batch or self.wl.batch
        key = (dev.name, dev.kind, b)
        if key not in self._time:
            per_kind = {k: sum(w * layer_time_us(dev, self.model, i, self.fmt, batch=b, q_len=q, context=c,
                                                 tp=self.tp) for q, c, w in self.wl.points())
                        for k, i in self.rep.items()}
            self._time[key] = [per_kind[k] for k in self.kinds]
        return self._time[key]


def _tokens_moved(wl: Workload, batch: int) -> float:
    """Hidden-state tokens crossing a boundary over the objective's steps."""
    return sum(w * batch * q for q, _, w in wl.points())


def _fixed_memory(model: ModelSpec, fmt: QuantFormat, wl: Workload, dev: Device, tp: int, embed: bool,
                  head: bool) -> float:
    est = estimate_memory(model, fmt, capacity_bytes=dev.capacity_bytes, gpu=dev.gpu, batch=wl.batch,
                          context=wl.max_context, prompt_len=wl.prompt_len, phase=wl.phase, kv_dtype=wl.kv_dtype,
                          tp=tp, layers=range(0), embed=embed, head=head, cpu=dev.kind == "cpu")
    return est.total_bytes


def _partition(costs: _Costs, devs: Sequence[Device], fixed: Sequence[float],
               extra: Sequence[float] | None = None) -> list[tuple[int, int]] | None:
    """Contiguous layer ranges over ``devs`` in order minimising the slowest stage, memory respected.

    ``extra[k]`` is time stage ``k`` spends besides its layers (the LM head on the last
    stage), so the balance counts it: on 2 x H200, 8 Llama-3-8B layers at decode split
    5/3 rather than 4/4 once the head's ~220 us sits on the second stage.

    Binary search on the stage-time cap; for a cap, filling each device greedily
    as far as time and memory allow is feasible iff any partition is (both limits
    grow with the range), so the search finds the optimal cap.
    """
    n = costs.model.num_layers
    tpre = [list(itertools.accumulate(costs.times(d), initial=0.0)) for d in devs]
    mpre = costs.mem_prefix
    extra = list(extra) if extra is not None else [0.0] * len(devs)

    def fill(cap: float) -> list[tuple[int, int]] | None:
        out, i = [], 0
        for k, d in enumerate(devs):
            # Furthest stop within the time cap and the memory left; leave a layer for each later device.
            stop = n - (len(devs) - 1 - k)
            j_t = bisect.bisect_right(tpre[k], tpre[k][i] + cap - extra[k], i, stop + 1) - 1
            j_m = bisect.bisect_right(mpre, mpre[i] + d.capacity_bytes - fixed[k], i, stop + 1) - 1
            j = min(j_t, j_m, stop)
            if j <= i:
                return None
            out.append((i, j))
            i = j
        return out if i == n else None

    times = [t[-1] + x for t, x in zip(tpre, extra, strict=True)]
    hi = max(times)
    # the slowest single layer on the device that runs it fastest: no cap below it is feasible (the same
    # differences as tpre[k][i + 1] - tpre[k][i], column-wise: ~7000 min() calls fewer per cold recommend)
    lo = max(map(min, zip(*([b - a for a, b in itertools.pairwise(t)] for t in tpre), strict=True)))
    if fill(hi * (1 + 1e-9)) is None:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        if fill(mid) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-6 * hi:
            break
    return fill(hi * (1 + 1e-9))


def _evaluate(profile: HardwareProfile, model: ModelSpec, fmt: QuantFormat, wl: Workload,
              groups: Sequence[Sequence[Device]], tp: int, costs: _Costs | None = None) -> SplitPlan | None:
    """Score pipeline stages ``groups`` (each a TP group of identical devices); ``costs``: the
    layer costs at this ``tp``, shared by every pipeline depth (made here when not given)."""
    costs = costs if costs is not None else _Costs(model, fmt, wl, tp)
    lead = [g[0] for g in groups]
    pp = len(groups)
    fixed = [_fixed_memory(model, fmt, wl, d, tp, embed=k == 0, head=k == pp - 1) for k, d in enumerate(lead)]
    head_us = sum(w * _head_time_us(lead[-1], model, fmt, wl.batch, tp) for _, _, w in wl.points())
    ranges = _partition(costs, lead, fixed, [0.0] * (pp - 1) + [head_us])
    if ranges is None:
        return None
    # Tensor-parallel communication: two all-reduces per layer over the group's slowest link.
    tp_us_per_layer = 0.0
    if tp > 1:
        tp_us_per_layer = sum(w * layer_allreduces_us(profile, groups[0], model.hidden_size, wl.batch * q)
                              for q, _, w in wl.points())
    stages, stage_t = [], []
    for k, ((a, b), g) in enumerate(zip(ranges, groups, strict=True)):
        t = sum(costs.times(lead[k])[a:b]) + (b - a) * tp_us_per_layer
        if k == pp - 1:
            t += head_us
        mem = estimate_memory(model, fmt, capacity_bytes=lead[k].capacity_bytes, device=lead[k].name,
                              gpu=lead[k].gpu, batch=wl.batch, context=wl.max_context, prompt_len=wl.prompt_len,
                              phase=wl.phase, kv_dtype=wl.kv_dtype, tp=tp, layers=range(a, b), embed=k == 0,
                              head=k == pp - 1, cpu=lead[k].kind == "cpu")
        stages.append(Stage(devices=tuple(d.index for d in g), device_name=lead[k].name, layers=(a, b),
                            time_us=t, memory=mem))
        stage_t.append(t)
    xfer = 0.0
    for k in range(pp - 1):
        bw, _ = link_gbs(profile, lead[k], lead[k + 1])
        xfer += _tokens_moved(wl, wl.batch) * model.hidden_size * 2 / (bw * 1e3)
    comm = xfer + tp_us_per_layer * model.num_layers
    best_m, best = 1, sum(stage_t) + xfer
    if pp > 1 and wl.batch > 1:
        # Micro-batching: each stage runs m micro-batches of batch/m; makespan of the chain (GPipe).
        for m in sorted({min(wl.batch, pp), min(wl.batch, 2 * pp)}):
            mb = math.ceil(wl.batch / m)
            st = []
            for k, (a, b) in enumerate(ranges):
                st.append(sum(costs.times(lead[k], mb)[a:b]) + (b - a) * tp_us_per_layer
                          * mb / wl.batch)
            total = sum(st) + xfer + (m - 1) * max(st)
            if total < best:
                best_m, best = m, total
    kind = "single" if pp == 1 and tp == 1 else "tensor" if pp == 1 else "pipeline" if tp == 1 \
        else "pipeline+tensor"
    fits = all(s.memory.fits for s in stages)
    return SplitPlan(kind=kind, tp=tp, pp=pp, stages=tuple(stages), predicted_us=best, comm_us=comm,
                     microbatches=best_m, fits=fits,
                     reason=f"{kind}: layers balanced by device rates under each device's memory")


_SPLIT_CACHE: dict[tuple[Any, ...], tuple[SplitPlan, ...]] = {}


def hardware_key(profile: HardwareProfile) -> tuple[Any, ...]:
    """What of a profile the split depends on (hashable): each GPU's size, rates and links, the CPU's rates."""
    c = profile.cpu
    return (tuple((g.index, g.name, g.memory_total_bytes, g.bandwidth_gbs, tuple(sorted(g.peak_tflops.items())),
                   tuple(sorted(g.measured_tflops.items())), g.pcie_gen, g.pcie_width, g.nvlink_bandwidth_gbs,
                   g.cc_major, g.cc_minor, g.vendor) for g in profile.gpus),
            profile.links, (c.model, c.mem_bandwidth_gbs, c.peak_gflops_fp32, c.ram_total_bytes,
                            c.ram_available_bytes))


def candidate_splits(profile: HardwareProfile, model: ModelSpec, fmt: QuantFormat, wl: Workload, *,
                     max_devices: int | None = None, include_cpu: bool = False,
                     reserve: tuple[float, int] = NO_RESERVE) -> tuple[SplitPlan, ...]:
    """Every feasible split, fastest first (cached per hardware content, model, format and workload);
    ``reserve`` as for :func:`devices_of`."""
    key = (hardware_key(profile), model, fmt, wl, max_devices, include_cpu, reserve)
    hit = _SPLIT_CACHE.get(key)
    if hit is None:
        hit = _candidate_splits(profile, model, fmt, wl, max_devices=max_devices, include_cpu=include_cpu,
                                reserve=reserve)
        if len(_SPLIT_CACHE) >= 256:
            _SPLIT_CACHE.clear()
        _SPLIT_CACHE[key] = hit
    return hit


def _candidate_splits(profile: HardwareProfile, model: ModelSpec, fmt: QuantFormat, wl: Workload, *,
                      max_devices: int | None, include_cpu: bool, reserve: tuple[float, int]
                      ) -> tuple[SplitPlan, ...]:
    devs = list(devices_of(profile, include_cpu=include_cpu, reserve=reserve))
    if not devs:
        raise ProfileError("no device with known memory size and bandwidth to place the model on", field="gpus")
    limit = min(max_devices or len(devs), len(devs))
    speed = {id(d): d.bandwidth_gbs for d in devs}
    ordered = sorted(devs, key=lambda d: (d.kind != "gpu", -speed[id(d)], d.index))
    plans: list[SplitPlan] = []
    heads = model.num_attention_heads
    for tp in (1, 2, 4, 8, 16):
        if tp > limit or heads % tp:
            continue
        costs = _Costs(model, fmt, wl, tp)  # every pipeline depth at this TP degree reads the same layers
        for pp in range(1, limit // tp + 1):
            # TP groups of identical GPUs, fastest first; the CPU only as a TP-1 stage.
            pool = [d for d in ordered if tp == 1 or d.kind == "gpu"]
            groups: list[list[Device]] = []
            used: set[int] = set()
            for d in pool:
                if id(d) in used:
                    continue
                same = [x for x in pool if id(x) not in used and x.name == d.name and x.kind == d.kind][:tp]
                if len(same) < tp:
                    continue
                groups.append(same)
                used.update(id(x) for x in same)
                if len(groups) == pp:
                    break
            if len(groups) < pp:
                continue
            try:
                plan = _evaluate(profile, model, fmt, wl, groups, tp, costs)
            except ProfileError as exc:
                log.info("split tp=%d pp=%d skipped: %s", tp, pp, exc)
                continue
            if plan is not None:
                plans.append(plan)
    plans.sort(key=lambda p: (not p.fits, p.predicted_us, p.num_devices))
    return tuple(plans)


def plan_split(profile: HardwareProfile, model: ModelSpec, fmt: QuantFormat, wl: Workload, *,
               max_devices: int | None = None, include_cpu: bool = False,
               objective: str = "latency") -> SplitPlan | None:
    """The best split: ``latency`` = fastest that fits; ``devices`` = fewest devices that fit, then fastest."""
    plans = [p for p in candidate_splits(profile, model, fmt, wl, max_devices=max_devices,
                                         include_cpu=include_cpu) if p.fits]
    if not plans:
        return None
    if objective == "devices":
        return min(plans, key=lambda p: (p.num_devices, p.predicted_us))
    if objective != "latency":
        raise ModelError(f"unknown objective {objective!r}; expected 'latency' or 'devices'", field="objective")
    return plans[0]
