"""Timing one model step through pipeline stages: eagerly or with one CUDA graph per stage.

A step's wall time is taken between full synchronisations of every device it uses; the stage and
boundary-copy spans inside it come from CUDA events on each device's stream (the host clock on a CPU
run). torch is imported inside the functions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autoopt.validation.llama import LlamaLike, Stages

__all__ = ["Marks", "Step", "StepTiming", "eager_step", "graphed_step", "pipeline_forward", "sync", "time_step"]


class Marks:
    """Named timestamps on a device's current stream (CUDA events) or the host clock (CPU)."""

    def __init__(self) -> None:
        self.points: dict[str, tuple[torch.device, Any]] = {}

    def mark(self, name: str, device: torch.device) -> None:
        if device.type == "cuda":
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(device))
            self.points[name] = (device, ev)
        else:
            self.points[name] = (device, time.perf_counter())

    def elapsed_ms(self, start: str, end: str) -> float:
        (_, a), (_, b) = self.points[start], self.points[end]
        if isinstance(a, float):
            return float((b - a) * 1e3)
        return float(a.elapsed_time(b))

    def spans(self) -> dict[str, float]:
        """``stageK`` and ``xferK`` spans present in the marks, in ms."""
        out = {}
        for name in self.points:
            if name.endswith("_start") and name[:-6] + "_end" in self.points:
                out[name[:-6]] = self.elapsed_ms(name, name[:-6] + "_end")
        return out


#: one model step; it records its stage and transfer spans in the marks it is given.
Step = Callable[[Marks], "torch.Tensor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming:
    """Wall time of a step over ``reps`` runs (ms), and the median of each stage and transfer span."""

    median_ms: float
    min_ms: float
    max_ms: float
    reps: int
    spans_median_ms: Mapping[str, float]
    method: str = "wall clock between torch.cuda.synchronize of every device used; spans from CUDA events"

    def to_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "reps": self.reps,
                "spans_median_ms": dict(self.spans_median_ms), "method": self.method}


def sync(devices: Sequence[torch.device]) -> None:
    """Wait for every CUDA device in ``devices`` (CPU devices need nothing)."""
    for d in devices:
        if d.type == "cuda":
            import torch

            torch.cuda.synchronize(d)


def pipeline_forward(model: LlamaLike, ids: torch.Tensor, pos: int, stages: Stages,
                     marks: Marks) -> torch.Tensor:
    """One step through the stages; the hidden state crosses each boundary with ``.to(next device)``."""
    h: Any = ids
    last = len(stages) - 1
    for k, (rng, dev) in enumerate(stages):
        if k:
            src = h.device
            marks.mark(f"xfer{k - 1}_start", src)
            h = h.to(dev)  # cross-device copy: enqueued on the source device's stream (P2P when enabled)
            marks.mark(f"xfer{k - 1}_end", src)
        marks.mark(f"stage{k}_start", dev)
        if k == 0:
            h = model.embed(h)
        h = model.run_layers(h, rng, pos)
        if k == last:
            h = model.head(h)
        marks.mark(f"stage{k}_end", dev)
    return h


def eager_step(model: LlamaLike, ids: torch.Tensor, pos: int, stages: Stages) -> Step:
    """The step as Python launches it, kernel by kernel."""
    return lambda marks: pipeline_forward(model, ids, pos, stages, marks)


def graphed_step(model: LlamaLike, ids: torch.Tensor, pos: int, stages: Stages) -> Step:
    """One CUDA graph per stage (static input/output), the boundary copy done eagerly between replays."""
    import torch

    graphs: list[tuple[Any, torch.Tensor, torch.Tensor, torch.device]] = []
    last = len(stages) - 1
    inp: torch.Tensor = ids
    for k, (rng, dev) in enumerate(stages):
        if k:
            inp = torch.zeros_like(graphs[-1][2], device=dev)

        def fn(x: torch.Tensor = inp, k: int = k, rng: range = rng) -> torch.Tensor:
            h = model.embed(x) if k == 0 else x
            h = model.run_layers(h, rng, pos)
            return model.head(h) if k == last else h

        with torch.cuda.device(dev):
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream(dev).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = fn()
        graphs.append((g, inp, out, dev))

    def step(marks: Marks) -> torch.Tensor:
        for k, (g, x, _, dev) in enumerate(graphs):
            if k:
                prev_out, prev_dev = graphs[k - 1][2], graphs[k - 1][3]
                marks.mark(f"xfer{k - 1}_start", prev_dev)
                x.copy_(prev_out)
                marks.mark(f"xfer{k - 1}_end", prev_dev)
            marks.mark(f"stage{k}_start", dev)
            with torch.cuda.device(dev):
                g.replay()
            marks.mark(f"stage{k}_end", dev)
        return graphs[-1][2]

    return step


def time_step(step: Step, devices: Sequence[torch.device], *, warmup: int, reps: int) -> StepTiming:
    """Median wall time of ``step`` between full synchronisations of ``devices``, and median stage spans."""
    for _ in range(warmup):
        step(Marks())
    sync(devices)
    walls: list[float] = []
    spans: list[dict[str, float]] = []
    for _ in range(reps):
        marks = Marks()
        sync(devices)
        t0 = time.perf_counter()
        step(marks)
        sync(devices)
        walls.append((time.perf_counter() - t0) * 1e3)
        spans.append(marks.spans())
    names = sorted(spans[0]) if spans else []
    return StepTiming(median_ms=statistics.median(walls), min_ms=min(walls), max_ms=max(walls), reps=reps,
                      spans_median_ms={n: statistics.median(s[n] for s in spans) for n in names})
