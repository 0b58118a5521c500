"""The alternatives recommend() weighs for one model on this host, as data.

An :class:`Option` is one way to run a decode workload: the weight format ``optimize()`` quantizes into, the
step replayed from a CUDA graph or not, the batch, and the GPU layout. :func:`enumerate_options` lists
what recommend() weighs that this host can run, layouts over several GPUs included (tensor parallelism
through transformers' ``tp_plan="auto"`` under ``torchrun``, data-parallel replicas: one process a GPU); an
option this host cannot run is listed with its reason, so a table never silently drops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoopt._serde import from_plain, to_plain
from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile
from autoopt.runtimes.registry import get_runtime

__all__ = ["BATCHES", "FORMATS", "LAYOUTS", "Option", "RegretOptionError", "enumerate_options", "parse_batches"]

#: the batches the issue's workloads name: a chat user, a small server, a busy one
BATCHES = (1, 8, 32)
#: recommend()'s format names (autoopt runtime) -> the ``weights=`` optimize() quantizes into (None: 16-bit)
FORMATS = {"bf16": None, "fp8": "fp8", "int8": "int8", "int4": "int4"}
LAYOUTS = ("single", "tensor-parallel", "replicas")


class RegretOptionError(AutooptError, ValueError):
    """A regret option (batch list, format, GPU count) is out of range; the message names the accepted values."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One alternative: ``weights`` (recommend()'s format name), ``cuda_graphs``, ``batch``, ``gpus`` and
    ``layout``; ``runnable`` False with ``why`` when this harness cannot run it here."""

    weights: str
    cuda_graphs: bool
    batch: int
    gpus: int = 1
    layout: str = "single"
    runnable: bool = True
    why: str = ""

    @property
    def label(self) -> str:
        graphs = "graphs" if self.cuda_graphs else "eager"
        where = "" if self.gpus == 1 else f" {self.layout} x{self.gpus}"
        return f"{self.weights} {graphs} b{self.batch}{where}"

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Option:
        return from_plain(cls, data, lambda msg, where: RegretOptionError(f"option {where}: {msg}"))


def parse_batches(text: str) -> tuple[int, ...]:
    """``"1,8,32"`` -> (1, 8, 32); RegretOptionError for anything but positive integers up to 4096."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() and 1 <= int(p) <= 4096 for p in parts):
        raise RegretOptionError(f"batches {text!r}: expected comma-separated integers from 1 to 4096, e.g. 1,8,32")
    return tuple(sorted({int(p) for p in parts}))


def _formats_here(gpu: GPUProfile | None, asked: tuple[str, ...] | None) -> tuple[str, ...]:
    """The formats of :data:`FORMATS` the ``autoopt`` runtime runs on ``gpu`` (None: the CPU), in that order."""
    runs = get_runtime("autoopt").formats_for(gpu)
    names = tuple(f for f in FORMATS if f in runs or f == "bf16")
    if asked is None:
        return names
    bad = [f for f in asked if f not in FORMATS]
    if bad:
        raise RegretOptionError(f"formats {', '.join(bad)}: expected some of {', '.join(FORMATS)}")
    return tuple(f for f in names if f in asked)


def enumerate_options(gpu: GPUProfile | None, *, gpus: int = 1, batches: tuple[int, ...] = BATCHES,
                      formats: tuple[str, ...] | None = None) -> tuple[Option, ...]:
    """Every alternative for ``batches`` on a host with ``gpus`` GPUs like ``gpu`` (None: CPU only): each format
    the autoopt runtime runs there, with and without CUDA graphs (CUDA only), and on 2+ GPUs the
    multi-GPU layouts (tensor-parallel in bf16 only, replicas in every format)."""
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= 64:
        raise RegretOptionError(f"gpus={gpus!r}: expected an integer from 1 to 64")
    out = []
    graphs = (False, True) if gpu is not None else (False,)
    for batch in batches:
        for fmt in _formats_here(gpu, formats):
            out += [Option(weights=fmt, cuda_graphs=g, batch=batch) for g in graphs]
            if gpus > 1:
                out += [_layout_option(fmt, g, batch, gpus, layout) for layout in LAYOUTS[1:] for g in graphs]
    return tuple(out)


def _layout_option(fmt: str, graphs: bool, batch: int, gpus: int, layout: str) -> Option:
    """A multi-GPU option, run under torchrun (:mod:`autoopt.regret.distributed`): replicas in every format;
    tensor parallelism through transformers' own ``tp_plan="auto"``, which shards 16-bit modules only
    (optimize()'s fused and quantized modules take no DTensor shards), so bf16 alone."""
    if layout == "tensor-parallel" and fmt != "bf16":
        return Option(weights=fmt, cuda_graphs=graphs, batch=batch, gpus=gpus, layout=layout, runnable=False,
                      why="transformers' tp_plan shards 16-bit modules; optimize()'s quantized ones take no "
                          "DTensor shards")
    return Option(weights=fmt, cuda_graphs=graphs, batch=batch, gpus=gpus, layout=layout)
