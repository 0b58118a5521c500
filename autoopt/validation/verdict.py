"""Predicted against measured: the ratio, the targets, and the verdict record every time comparison yields.

A ratio is ``predicted / measured``: below 1 the run was slower than autoopt said (``ratio`` is then the
fraction of the predicted speed the run reached), above 1 faster. A comparison passes when the ratio is
within the target of 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MEMORY_TARGET", "TIME_TARGET", "Verdict", "ratio", "verdict"]

#: the allocator peak must be predicted within 5 %, a step time within 20 %.
MEMORY_TARGET = 0.05
TIME_TARGET = 0.20


def ratio(pred: float | None, meas: float | None) -> float | None:
    """``pred / meas``; ``None`` when either is unknown or nothing was measured."""
    return None if pred is None or meas is None or meas == 0 else pred / meas


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """One predicted time against one measured time (µs), and whether it is within ``target_pct``."""

    predicted_us: float | None
    measured_us: float | None
    ratio: float | None
    error_pct: float | None
    target_pct: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"predicted_us": self.predicted_us, "measured_us": self.measured_us, "ratio": self.ratio,
                "error_pct": self.error_pct, "target_pct": self.target_pct, "pass": self.passed}


def verdict(pred_us: float | None, meas_ms: float | None, target: float = TIME_TARGET) -> Verdict:
    """Compare a prediction in µs with a measurement in ms (timers report ms, the planner µs)."""
    meas_us = None if meas_ms is None else meas_ms * 1e3
    r = ratio(pred_us, meas_us)
    return Verdict(predicted_us=pred_us, measured_us=meas_us, ratio=r,
                   error_pct=None if r is None else 100 * (r - 1), target_pct=100 * target,
                   passed=r is not None and abs(r - 1) <= target)
