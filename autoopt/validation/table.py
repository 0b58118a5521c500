"""The model checks' result as a text table: one line per compared quantity, predicted, measured, verdict.

Works on the result file's dict form (``CheckRun.to_dict()`` or a saved JSON), so committed results can
be shown again without rerunning them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["summary_table"]


def _fmt(v: Any, scale: float = 1.0, unit: str = "") -> str:
    if v is None:
        return "-"
    return f"{v / scale:.3f}{unit}"


def summary_table(result: Mapping[str, Any]) -> str:
    """Memory terms (GB) and the allocator peak, then every timed step (ms), each with its verdict."""
    w = 52
    lines = [f"{'check':<9} {'quantity':<{w}} {'predicted':>12} {'measured':>12} {'ratio':>7} "
             f"{'target':>7}  pass"]
    mem = result.get("memory") or {}
    if "terms" in mem:
        for k, t in mem["terms"].items():
            lines.append(f"{'memory':<9} {k + ' (GB)':<{w}} {_fmt(t['predicted_bytes'], 1e9):>12} "
                         f"{_fmt(t['measured_bytes'], 1e9):>12} {_fmt(t['ratio']):>7} {'':>7}")
        t = mem["total"]
        lines.append(f"{'memory':<9} {'allocator peak (GB)':<{w}} {_fmt(t['predicted_bytes'], 1e9):>12} "
                     f"{_fmt(t['measured_peak_bytes'], 1e9):>12} {_fmt(t['ratio']):>7} "
                     f"{'+-' + str(int(t['target_pct'])) + '%':>7}  {'PASS' if t['pass'] else 'FAIL'}")
    elif mem:
        lines.append(f"{'memory':<9} {mem.get('skipped') or mem.get('error', '')}")
    pipe = result.get("pipeline") or {}
    for r in pipe.get("rows", []):
        q = f"{r['layout']} {r['step']} [{r['profile']}] (ms)"
        lines.append(f"{'time':<9} {q:<{w}} {_fmt(r['predicted_us'], 1e3):>12} "
                     f"{_fmt(r['measured_us'], 1e3):>12} "
                     f"{_fmt(r['ratio']):>7} {'+-' + str(int(r['target_pct'])) + '%':>7}  "
                     f"{'PASS' if r['pass'] else 'FAIL'}")
    if pipe and "rows" not in pipe:
        lines.append(f"{'pipeline':<9} {pipe.get('skipped') or pipe.get('error', '')}")
    return "\n".join(lines)
