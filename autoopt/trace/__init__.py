"""Profiler traces: where one run spends GPU time, and how two runs of the same model differ.

- :mod:`~autoopt.trace.reader`: Chrome/Perfetto trace JSON (gzipped or not) streamed into a compact
  kernel sequence;
- :mod:`~autoopt.trace.classify`: kernel name -> op class, rules as data (plugins add rules through
  ``autoopt_trace_rules``), Inductor's fused-op names read;
- :mod:`~autoopt.trace.analysis`: summary by class and step, comparison, fusion differences.
"""

from __future__ import annotations

from typing import Any

from autoopt.trace.analysis import TraceSummary, compare, summarize
from autoopt.trace.classify import CLASSES, classify, inductor_ops, rules_with_plugins
from autoopt.trace.reader import TraceEvents, read

__all__ = ["CLASSES", "TraceEvents", "TraceSummary", "classify", "compare", "inductor_ops", "read", "rules",
           "summarize", "summary_of"]


def rules() -> tuple[tuple[str, str], ...]:
    """The kernel-name rules in force: every plugin's valid rules first, then the built-ins."""
    from autoopt.plugins.manager import get_plugin_manager

    pm = get_plugin_manager()
    extra: list[dict[str, Any]] = []
    for plugin, result in pm.call_each("autoopt_trace_rules", _check_rules):
        for rule in result:
            try:
                rules_with_plugins([rule])
            except (ValueError, TypeError, AttributeError) as exc:
                pm.report(plugin, "autoopt_trace_rules", str(exc))
                continue
            extra.append(rule)
    return rules_with_plugins(extra)


def _check_rules(result: Any) -> str | None:
    if not isinstance(result, (list, tuple)) or not all(isinstance(r, dict) for r in result):
        return f"returned {type(result).__name__}, expected a list of {{'class', 'pattern'}} dicts"
    return None


def summary_of(path: Any) -> TraceSummary:
    """Read and summarize one trace file with the rules in force."""
    return summarize(read(path), rules=rules())
