"""Roofline chart of measured benchmark rows, with a numbered table under it.

Log-log axes: x is FLOP per byte at the floor (``OpSpec.intensity``), y is the
achieved TFLOP/s. Each roof is ``min(bandwidth * intensity, peak)``, one per
compute ceiling present (matmuls on tensor cores at their dtype, elementwise and
norm math at fp32 on CUDA cores, as in ``runner.floor_us``): datasheet ceilings
solid, measured ones dashed when the profile has them. Points are coloured and
marked by op kind and carry a small index keyed to the table (op, shape, kernel,
µs, TFLOP/s, % of each roof). Only rows labelled ``measured`` are drawn: a
prediction or a withheld time is no point on a roofline. matplotlib is imported
lazily with the Agg backend (no display needed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from autoopt._log import get_logger
from autoopt.backend.runner import Result, floor_us
from autoopt.errors import BackendError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.ops import OpSpec

log = get_logger(__name__)

__all__ = ["DPI", "FIG_SIZE_IN", "roofline_png"]

#: a fixed page: the PNG is always FIG_SIZE_IN * DPI pixels (1440 x 1080).
FIG_SIZE_IN = (12.0, 9.0)
DPI = 120

#: op kind -> (colour, marker); kinds not listed get grey stars.
_KIND_STYLE: dict[str, tuple[str, str]] = {
    "gemm": ("tab:blue", "o"), "gemv": ("tab:orange", "s"), "silu_mul": ("tab:green", "^"),
    "add": ("tab:red", "v"), "rmsnorm": ("tab:purple", "D"), "layernorm": ("tab:brown", "P"),
    "softmax": ("tab:pink", "X"),
}
_OTHER_STYLE = ("tab:gray", "*")
_ROOF_COLOURS = ("black", "tab:olive", "tab:cyan", "darkred")

_LABEL_PT = 7.0  # index labels next to the points
_TABLE_PT = 7.0  # table text
_ROW_IN = 0.19  # table row height at 7 pt: legible without crowding
_ROWS_PER_BLOCK = 15  # a block is one table; more rows go into blocks side by side (3 at most)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Roof:
    """One ceiling line: bandwidth (GB/s) and peak (TFLOP/s), either possibly unknown."""

    dtype: str
    bw: float | None
    peak: float | None
    measured: bool
    label: str

    def at(self, intensity: float) -> float | None:
        ys = [v for v in ((self.bw * intensity / 1e3) if self.bw else None, self.peak) if v]
        return min(ys) if ys else None


def _compute_dtype(op: OpSpec) -> str:
    # Same rule as runner._peak_tflops: fp32 matmuls run as TF32 on tensor cores;
    # elementwise/norm math is fp32 on the CUDA cores whatever the storage dtype.
    return ("tf32" if op.dtype == "fp32" else op.dtype) if op.uses_tensor_cores else "fp32"


def _spec_only(gpu: GPUProfile) -> GPUProfile:
    return gpu.with_(measured_bandwidth_gbs=None, measured_tflops={})


def _roofs(gpu: GPUProfile, dtypes: list[str]) -> list[_Roof]:
    """Spec roof per dtype, then a measured roof where the profile measured its bandwidth or peak."""
    roofs = []
    spec_bw, meas_bw = gpu.mem_bandwidth_gbs, gpu.measured_bandwidth_gbs
    for dt in dtypes:
        peak = gpu.tflops(dt, measured=False)
        if spec_bw or peak:
            roofs.append(_Roof(dtype=dt, bw=spec_bw, peak=peak, measured=False,
                               label=f"spec {dt}: {_num(spec_bw, 'GB/s')} · {_num(peak, 'TFLOP/s')}"))
        meas_peak = gpu.tflops(dt) if gpu.tflops(dt) != peak else None
        if meas_bw or meas_peak:
            bw_text = _num(meas_bw, "GB/s") if meas_bw else f"{_num(spec_bw, 'GB/s')} (spec)"
            pk_text = _num(meas_peak, "TFLOP/s") if meas_peak else f"{_num(peak, 'TFLOP/s')} (spec)"
            roofs.append(_Roof(dtype=dt, bw=meas_bw or spec_bw, peak=meas_peak or peak, measured=True,
                               label=f"measured {dt}: {bw_text} · {pk_text}"))
    return roofs


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return f"? {unit}"
    return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"  # the number as given: 4800, 4221.3


def _as_result(row: Any) -> Result:
    if isinstance(row, Mapping):  # a saved BenchRow.to_dict() / Result.to_dict()
        return Result.from_dict(row)
    return getattr(row, "result", row)


def _pct(op: OpSpec, us: float, gpu: GPUProfile) -> str:
    floor = floor_us(op, gpu)
    return "-" if floor is None else f"{100.0 * floor / us:.0f}"


def _place_labels(ax: Any, pts: list[tuple[float, float]], texts: list[str], dpi: float) -> None:
    """Put each index beside its point where it hits no other label or marker (leader line if far).

    Greedy: rings of 16 directions at growing radii, first free box wins; with ~30
    points in a cluster of markers this keeps every number readable. Points whose
    markers coincide (closer than half a marker) share one label, "17,18".
    """
    s = dpi / 72.0  # points -> pixels
    marker_r = 4.5 * s
    groups: list[tuple[list[float], list[str], list[tuple[float, float]]]] = []  # first, texts, members
    for (x, y), text in zip(ax.transData.transform(pts), texts, strict=True):
        near = next((g for g in groups if math.hypot(g[0][0] - x, g[0][1] - y) < 0.6 * marker_r), None)
        if near:
            near[1].append(text)
            near[2].append((x, y))
        else:
            groups.append(([x, y], [text], [(x, y)]))
    px = [(sum(m[0] for m in g[2]) / len(g[2]), sum(m[1] for m in g[2]) / len(g[2])) for g in groups]
    texts = [",".join(g[1]) for g in groups]
    box = ax.get_window_extent()
    h = (_LABEL_PT + 2) * s
    placed: list[tuple[float, float, float, float]] = []

    def free(x0: float, y0: float, x1: float, y1: float) -> bool:
        if x0 < box.x0 or x1 > box.x1 or y0 < box.y0 or y1 > box.y1:
            return False
        if any(x0 < b[2] and b[0] < x1 and y0 < b[3] and b[1] < y1 for b in placed):
            return False
        return not any(x0 - marker_r < mx < x1 + marker_r and y0 - marker_r < my < y1 + marker_r
                       for mx, my in px)

    def own(cx: float, cy: float, x: float, y: float) -> bool:
        # the label's centre is nearer its own marker than any other, so it reads as that marker's
        d = math.hypot(cx - x, cy - y)
        return all(math.hypot(cx - mx, cy - my) > d for mx, my in px if (mx, my) != (x, y))

    for (x, y), text in zip(px, texts, strict=True):
        w = (0.62 * _LABEL_PT * len(text) + 2) * s
        chosen = None
        for r_pt in (9, 13, 18, 24, 32, 42, 54, 68):
            r = r_pt * s
            for k in range(16):
                a = math.pi / 4 + 2 * math.pi * k / 16  # start up-right, the usual empty side
                cx, cy = x + r * math.cos(a), y + r * math.sin(a)
                cand = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
                if free(*cand) and (r_pt > 24 or own(cx, cy, x, y)):
                    chosen = (cx, cy)
                    break
            if chosen:
                break
        if chosen is None:  # nowhere free: overlap rather than drop the number
            chosen = (x + 7 * s, y + 7 * s)
        placed.append((chosen[0] - w / 2, chosen[1] - h / 2, chosen[0] + w / 2, chosen[1] + h / 2))
        dx, dy = (chosen[0] - x) / s, (chosen[1] - y) / s
        # a leader on every label: in a cluster, nearness alone does not say which marker is meant
        ax.annotate(text, ax.transData.inverted().transform((x, y)), xytext=(dx, dy),
                    textcoords="offset points", ha="center", va="center", fontsize=_LABEL_PT,
                    arrowprops=dict(arrowstyle="-", lw=0.6, color="0.3", shrinkA=1, shrinkB=3))


def _table(fig: Any, rows: list[list[str]], head: list[str], colours: list[str], top: float) -> None:
    """The numbered table in blocks side by side under the plot (``top`` is its upper edge, figure units)."""
    n_blocks = min(3, max(1, math.ceil(len(rows) / _ROWS_PER_BLOCK)))
    per = math.ceil(len(rows) / n_blocks)
    row_h = min(_ROW_IN / FIG_SIZE_IN[1], (top - 0.01) / (per + 1))
    font = _TABLE_PT if row_h * FIG_SIZE_IN[1] >= _ROW_IN * 0.99 else _TABLE_PT * row_h * FIG_SIZE_IN[1] / _ROW_IN
    widths = [len(h) for h in head]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
    gap, left, width = 0.015, 0.03, 0.94
    bw = min((width - gap * (n_blocks - 1)) / n_blocks, (width - gap) / 2)  # a lone block stays half-width
    for b in range(n_blocks):
        chunk = rows[b * per:(b + 1) * per]
        if not chunk:
            continue
        height = row_h * (len(chunk) + 1)
        tax = fig.add_axes([left + b * (bw + gap), top - height, bw, height])
        tax.axis("off")
        tab = tax.table(cellText=chunk, colLabels=head, cellLoc="right", colLoc="right", bbox=[0, 0, 1, 1],
                        colWidths=[w + 1.5 for w in widths])
        tab.auto_set_font_size(False)
        tab.set_fontsize(font)
        for (i, j), cell in tab.get_celld().items():
            cell.set_linewidth(0.3)
            cell.set_edgecolor("0.75")
            if j in (1, 2, 3):
                cell.set_text_props(ha="left")
                cell.PAD = 0.03
            if i == 0:
                cell.set_text_props(weight="bold")
                cell.set_facecolor("0.92")
            elif j == 0:
                cell.set_facecolor(colours[b * per + i - 1])
                cell.set_alpha(0.35)


def roofline_png(rows: Iterable[Any], gpu: GPUProfile, path: str | Path) -> Path:
    """Write a roofline PNG of the ``measured`` rows (``BenchRow``, ``Result`` or their dicts) under ``gpu``.

    The figure is FIG_SIZE_IN at DPI. % of roof in the table is against the plotted
    ceilings (spec, and measured when the profile has them), not the number stored in
    the row, which was taken against whatever profile the benchmark ran with.
    """
    results = [_as_result(r) for r in rows]
    # (row, µs, TFLOP/s) of every row timed on a GPU: both numbers known and positive
    measured = [(r, r.us, r.tflops) for r in results if r.label == "measured" and r.us and r.us > 0 and r.tflops]
    points = [r for r, _, _ in measured]
    if not points:
        labels = sorted({r.label for r in results})
        raise BackendError(f"roofline_png: no row has a time measured on a GPU (label 'measured' with µs); "
                           f"got {len(results)} rows labelled {', '.join(labels) or 'nothing'}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        raise BackendError("roofline_png needs matplotlib >= 3.7 (pip install matplotlib, "
                           "or pip install 'autoopt[gpu]')") from None

    dtypes = sorted({_compute_dtype(r.op) for r in points}, key=lambda d: (d == "fp32", d))
    roofs = _roofs(gpu, dtypes)
    xs = [r.op.intensity for r in points]
    ys = [tflops for _, _, tflops in measured]
    lo, hi = min(xs) / 3, max(xs) * 3
    tops = [rf.peak for rf in roofs if rf.peak] + [t for t in (rf.at(hi) for rf in roofs) if t]
    ylo, yhi = min(ys) / 3, max(ys + tops) * 2.5

    n = len(points)
    per_block = math.ceil(n / min(3, max(1, math.ceil(n / _ROWS_PER_BLOCK))))
    table_h = min(0.42, (per_block + 1) * _ROW_IN / FIG_SIZE_IN[1])
    plot_bottom = table_h + 0.09  # room for the x label between plot and table
    fig = plt.figure(figsize=FIG_SIZE_IN, dpi=DPI)
    ax = fig.add_axes((0.075, plot_bottom, 0.9, 0.93 - plot_bottom))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(ylo, yhi)

    # Roofs: x sampled densely on the log axis so the ridge corner is sharp.
    grid = [lo * (hi / lo) ** (i / 400) for i in range(401)]
    roof_handles = []
    for i, dt in enumerate(dtypes):
        colour = _ROOF_COLOURS[i % len(_ROOF_COLOURS)]
        for rf in (r for r in roofs if r.dtype == dt):
            if rf.bw:
                curve = cast("list[float]", [rf.at(x) for x in grid])  # a known bandwidth and x > 0: never None
                line, = ax.plot(grid, curve, color=colour, lw=1.4 if not rf.measured else 1.2,
                                ls="--" if rf.measured else "-", label=rf.label, zorder=2)
            elif rf.peak:
                line = ax.axhline(rf.peak, color=colour, lw=1.2, ls="--" if rf.measured else "-",
                                  label=rf.label, zorder=2)
            else:  # never: _roofs keeps a roof only when its bandwidth or its peak is known
                continue
            roof_handles.append(line)

    kinds = list(dict.fromkeys(r.op.kind for r in points))
    kind_handles = []
    for kind in kinds:
        colour, marker = _KIND_STYLE.get(kind, _OTHER_STYLE)
        sel = [(x, y) for x, y, r in zip(xs, ys, points, strict=True) if r.op.kind == kind]
        ax.scatter([p[0] for p in sel], [p[1] for p in sel], c=colour, marker=marker, s=30, alpha=0.85,
                   edgecolors="black", linewidths=0.5, zorder=4)
        kind_handles.append(Line2D([], [], color=colour, marker=marker, ls="", markeredgecolor="black",
                                   markeredgewidth=0.5, label=f"{kind} ({len(sel)})"))

    ax.set_xlabel("arithmetic intensity (FLOP / byte at the floor)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"Roofline on {gpu.name}: {n} kernels measured (each output checked against torch)",
                 fontsize=11)
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    if roof_handles:
        first = ax.legend(handles=roof_handles, loc="lower right", fontsize=8, title="ceilings",
                          title_fontsize=8, framealpha=0.9)
        ax.add_artist(first)
    ax.legend(handles=kind_handles, loc="upper left", fontsize=8, title="op kind", title_fontsize=8,
              framealpha=0.9)
    _place_labels(ax, list(zip(xs, ys, strict=True)), [str(i + 1) for i in range(n)], DPI)

    spec = _spec_only(gpu)
    has_measured = any(rf.measured for rf in roofs)
    one_dtype = len({r.op.dtype for r in points}) == 1
    head = ["#", "op", "shape", "kernel", "µs", "TFLOP/s", "% spec roof"] + (["% meas. roof"] if has_measured else [])
    table_rows = []
    for i, (r, us, tflops) in enumerate(measured):
        cells = [str(i + 1), r.op.kind if one_dtype else f"{r.op.kind} {r.op.dtype}",
                 "x".join(map(str, r.op.shape)), r.config.kernel, f"{us:.1f}", f"{tflops:.1f}",
                 _pct(r.op, us, spec)]
        if has_measured:
            cells.append(_pct(r.op, us, gpu))
        table_rows.append(cells)
    colours = [_KIND_STYLE.get(r.op.kind, _OTHER_STYLE)[0] for r in points]
    _table(fig, table_rows, head, colours, top=table_h + 0.015)
    if one_dtype:
        fig.text(0.03, table_h + 0.022, f"all ops {points[0].op.dtype}; % roof = floor time at the ceilings "
                 "/ measured time", fontsize=7, color="0.3", va="bottom")

    out = Path(path)
    try:
        fig.savefig(out, dpi=DPI)
    finally:
        plt.close(fig)
    log.info("wrote roofline of %d measured rows (of %d) to %s", n, len(results), out)
    return out
