"""Roofline chart of benchmark rows: each kernel at its arithmetic intensity and achieved rate.

Log-log axes: x is FLOP per byte at the floor (``OpSpec.intensity``), y is
TFLOP/s achieved. The memory ceiling is ``bandwidth * intensity``; one flat
compute ceiling per dtype present. matplotlib is imported lazily with the Agg
backend (no display needed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import BackendError
from ..profile import GPUProfile

log = logging.getLogger(__name__)

__all__ = ["roofline_png"]


def roofline_png(rows: Iterable[Any], gpu: GPUProfile, path: str | Path) -> Path:
    """Write a roofline PNG of ``rows`` (``BenchRow`` or ``Result``) under ``gpu``'s ceilings."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BackendError("roofline_png needs matplotlib (pip install 'autoopt[gpu]')") from None
    points = []
    for row in rows:
        res = getattr(row, "result", row)
        if res.us and res.tflops:
            points.append((res.op.intensity, res.tflops, res))
    if not points:
        raise BackendError("roofline_png: no row has a time (measured or predicted) to plot")
    bw = gpu.bandwidth_gbs
    xs = [p[0] for p in points]
    lo, hi = min(xs) / 4, max(xs) * 4
    fig, ax = plt.subplots(figsize=(10, 6.5))
    if bw:
        ax.plot([lo, hi], [bw * lo / 1e3, bw * hi / 1e3], color="black", lw=1.2,
                label=f"memory {bw:.0f} GB/s")
    dtypes = sorted({("tf32" if p[2].op.is_matmul and p[2].op.dtype == "fp32" else p[2].op.dtype)
                     if p[2].op.is_matmul else "fp32" for p in points})
    for dt in dtypes:
        peak = gpu.tflops(dt)
        if peak:
            ax.axhline(peak, ls="--", lw=1, color="gray")
            ax.text(hi, peak, f" {dt} {peak:.0f} TFLOP/s", va="bottom", ha="right", fontsize=8)
    markers = {"measured": "o", "withheld": "x", "predicted": "^"}
    best: dict[tuple, Any] = {}  # label only the fastest config of each op, or the chart is unreadable
    for _, y, res in points:
        key = (res.op.kind, res.op.shape, res.op.dtype)
        if key not in best or y > best[key].tflops:
            best[key] = res
    for x, y, res in points:
        is_best = best[(res.op.kind, res.op.shape, res.op.dtype)] is res
        ax.scatter([x], [y], marker=markers.get(res.label, "s"), s=30 if is_best else 10,
                   alpha=1.0 if is_best else 0.35)
        if not is_best:
            continue
        ax.annotate(f"{res.op.kind} {'x'.join(map(str, res.op.shape))}\n{res.config.kernel} "
                    f"{res.roofline_pct or 0:.0f}%", (x, y), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte at the floor)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"roofline on {gpu.name}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    out = Path(path)
    fig.savefig(out, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return out
