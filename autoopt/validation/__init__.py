"""Does the plan hold on silicon: autoopt's whole-model predictions against a real GPU run.

A Llama-shaped model in plain torch (Llama-3-8B's shapes, a few layers, random bf16 weights) is run and
measured, and what autoopt predicted for the same workload is compared with it:

- :func:`check_memory` (one GPU): the allocator's peak over a prefill and some decode steps against
  :func:`autoopt.planning.memory.estimate_memory`, term by term. Target: within 5 %.
- :func:`check_pipeline` (two GPUs): a prefill and a decode step on one GPU and split over two at the
  split planner's boundaries, against the planner's step time. Target: within 20 %.
- :func:`run_checks`: either or both as one record (:class:`CheckRun`), what ``autoopt check`` and
  ``benchmarks/model_checks.py`` write; :func:`summary_table` shows it.

Everything is imported lazily: ``import autoopt.validation`` imports neither torch nor the checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoopt._lazy import lazy_attributes

_LAZY = {
    "CheckOptions": "autoopt.validation.workload",
    "check_memory": "autoopt.validation.memory",
    "MemoryCheck": "autoopt.validation.memory",
    "check_pipeline": "autoopt.validation.pipeline",
    "PipelineCheck": "autoopt.validation.pipeline",
    "run_checks": "autoopt.validation.run",
    "CheckRun": "autoopt.validation.run",
    "summary_table": "autoopt.validation.table",
}

__all__ = ["CheckOptions", "CheckRun", "MemoryCheck", "PipelineCheck", "check_memory", "check_pipeline",
           "run_checks", "summary_table"]

if TYPE_CHECKING:  # pragma: no cover
    from autoopt.validation.memory import MemoryCheck, check_memory
    from autoopt.validation.pipeline import PipelineCheck, check_pipeline
    from autoopt.validation.run import CheckRun, run_checks
    from autoopt.validation.table import summary_table
    from autoopt.validation.workload import CheckOptions


__getattr__, __dir__ = lazy_attributes("autoopt.validation", _LAZY, globals(), __all__)
