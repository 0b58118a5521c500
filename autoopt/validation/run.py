"""One run of the model checks on this machine: the memory check, the pipeline check or both, as one record.

The record (:class:`CheckRun`) is what ``autoopt check --out`` and ``benchmarks/model_checks.py`` write:
the software versions and devices, the options, the profiles predicted with, and each check's result,
or why it did not run. A check that raises is recorded, not propagated, so one failure keeps the other.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoopt.backend.software import versions
from autoopt.hardware.profile import HardwareProfile
from autoopt.validation.memory import MemoryCheck, check_memory
from autoopt.validation.pipeline import PipelineCheck, check_pipeline
from autoopt.validation.profiles import add_measured_profile, detected_profiles, profile_info
from autoopt.validation.workload import CheckOptions, OptionError, check_buildable, llama_spec

__all__ = ["CHECKS", "CheckRun", "NotRun", "run_checks", "versions"]

log = logging.getLogger(__name__)

CHECKS = ("memory", "pipeline", "all")


@dataclass(frozen=True, slots=True, kw_only=True)
class NotRun:
    """A check that did not run: ``skipped`` (this machine cannot run it) or it raised (``reason`` says what)."""

    reason: str
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"skipped" if self.skipped else "error": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRun:
    """Everything one run produced; ``to_dict()`` is the result file."""

    meta: Mapping[str, Any]
    args: Mapping[str, Any]
    profiles: Mapping[str, HardwareProfile]
    memory: MemoryCheck | NotRun | None = None
    pipeline: PipelineCheck | NotRun | None = None
    elapsed_s: float | None = None

    @property
    def failed(self) -> bool:
        """Whether a check raised (a skipped check is not a failure)."""
        return any(isinstance(c, NotRun) and not c.skipped for c in (self.memory, self.pipeline))

    def to_dict(self) -> dict[str, Any]:
        meta = dict(self.meta)
        if self.elapsed_s is not None:
            meta["elapsed_s"] = self.elapsed_s
        out: dict[str, Any] = {"meta": meta, "args": dict(self.args),
                               "profiles": {k: profile_info(p) for k, p in self.profiles.items()}}
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        if self.pipeline is not None:
            out["pipeline"] = self.pipeline.to_dict()
        return out


def _failed(what: str, exc: Exception) -> NotRun:
    # the traceback only where diagnostics were asked for (the benchmark script logs at INFO, the CLI with -v)
    log.error("%s check failed: %s: %s", what, type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.INFO))
    return NotRun(reason=f"{type(exc).__name__}: {exc}")


def run_checks(which: str = "all", options: CheckOptions | None = None, *,
               profiles: Mapping[str, HardwareProfile] | None = None, measure_profile: bool = True,
               args: Mapping[str, Any] | None = None, argv: Sequence[str] = (),
               on_partial: Callable[[CheckRun], None] | None = None) -> CheckRun:
    """Run ``which`` of ``memory``, ``pipeline`` or ``all`` on this machine's CUDA GPUs.

    ``profiles``: label -> profile to predict with (default: this machine detected, then for the pipeline
    also with measured rates unless ``measure_profile`` is false; a given profile is never re-measured).
    ``args`` and ``argv`` are recorded as given (default args: the options). ``on_partial`` gets the record
    after the memory check, so a caller can keep it even if the pipeline check brings the process down.
    Raises :class:`~autoopt.errors.BackendError` when torch sees no CUDA device (nothing is measured).
    """
    from autoopt.validation.device import require_cuda

    if which not in CHECKS:
        raise OptionError(f"unknown check {which!r}; known: {', '.join(CHECKS)}")
    options = options or CheckOptions()
    for layers in (options.layers, options.pipeline_layers):
        check_buildable(llama_spec(layers, options.model))  # a bad model is refused before any GPU work
    n = require_cuda()
    import torch

    t0 = time.perf_counter()
    meta = {**versions(), "argv": list(argv), "devices": [torch.cuda.get_device_name(i) for i in range(n)],
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    record = dict(args) if args is not None else {"check": which, **options.to_dict()}
    raw: Mapping[str, Any] | None = None
    if profiles is None:
        chosen, raw = detected_profiles()
    else:
        chosen = dict(profiles)
    primary = next(iter(chosen.values()))
    memory: MemoryCheck | NotRun | None = None
    pipeline: PipelineCheck | NotRun | None = None
    if which in ("memory", "all"):
        try:
            memory = check_memory(options, profile=primary)
        except Exception as exc:
            memory = _failed("memory", exc)
        gc.collect()
        torch.cuda.empty_cache()
        if on_partial is not None:
            on_partial(CheckRun(meta=meta, args=record, profiles=dict(chosen), memory=memory))
    if which in ("pipeline", "all"):
        if n < 2:
            pipeline = NotRun(reason=f"needs 2 GPUs; torch sees {n}", skipped=True)
        else:
            if measure_profile:
                add_measured_profile(chosen, raw)
            try:
                pipeline = check_pipeline(options, profiles=chosen)
            except Exception as exc:
                pipeline = _failed("pipeline", exc)
    return CheckRun(meta=meta, args=record, profiles=chosen, memory=memory, pipeline=pipeline,
                    elapsed_s=round(time.perf_counter() - t0, 1))
