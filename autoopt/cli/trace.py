"""``autoopt trace summary|compare``: profiler traces as GPU time by op class, and two runs side by side with
their fusion differences (see :mod:`autoopt.trace`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from autoopt.cli._common import FORMATS, UsageError, emit

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers


def register(sub: Subparsers) -> None:
    """Add ``trace``."""
    sp = sub.add_parser("trace", help="profiler traces: GPU time by op class (summary), two runs side by side "
                        "with fusion differences (compare)")
    sp.add_argument("action", choices=("summary", "compare"), metavar="summary|compare")
    sp.add_argument("traces", nargs="+", metavar="TRACE", help="Chrome/Perfetto trace JSON (.json or .json.gz)")
    sp.add_argument("--plot", help="compare: write a stacked bar chart per class (PNG)")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    """``autoopt trace summary T`` / ``autoopt trace compare A B``: GPU time by op class, and the differences."""
    return _summary(args) if args.action == "summary" else _compare(args)


def _summary(args: argparse.Namespace) -> int:
    """``trace summary T``: per step, each class's GPU time, launches and share."""
    from autoopt.report import format_table
    from autoopt.trace import summary_of

    if len(args.traces) != 1:
        raise UsageError(f"trace summary takes one trace file, got {len(args.traces)}")
    s = summary_of(args.traces[0])
    rows = [(c, f"{us / s.steps:.1f}", f"{n / s.steps:.1f}", f"{100 * us / s.total_us:.1f}")
            for c, (us, n) in s.by_class.items()]
    emit(s.to_dict(), args.format, format_table(("class", "us/step", "launches/step", "% of GPU time"), rows,
                                                title=f"{args.traces[0]}: {s.steps} step(s), "
                                                      f"{s.total_us / s.steps:.1f} us/step (measured)"))
    return 0


def _compare(args: argparse.Namespace) -> int:
    """``trace compare A B``: classes and kernels side by side, then the fusion differences (--plot: a chart)."""
    from autoopt.trace import compare, summary_of

    if len(args.traces) != 2:
        raise UsageError(f"trace compare takes two trace files (A B), got {len(args.traces)}")
    a, b = summary_of(args.traces[0]), summary_of(args.traces[1])
    data = compare(a, b)
    text = _side_by_side_text(data) + "\n" + _fusions_text(data)
    if args.plot:
        from autoopt.report import plot_trace_classes

        plot_trace_classes(data, args.plot)
    emit(data, args.format, text)
    return 0


def _side_by_side_text(data: dict[str, Any]) -> str:
    """The classes of A and B per step, then the kernels by their difference."""
    from autoopt.report import format_table

    side_by_side = [(r["class"], r["a_us"], r["b_us"], r["ratio_b_over_a"] or "-", r["a_launches"],
                     r["b_launches"]) for r in data["classes"]]
    text = format_table(("class", "A us/step", "B us/step", "B/A", "A launches", "B launches"), side_by_side,
                        title=f"A {data['a_per_step_us']} us/step vs B {data['b_per_step_us']} us/step (measured)")
    return text + "\n" + format_table(("kernel", "class", "A us", "B us", "delta"),
                                      [(k["kernel"][:70], k["class"], k["a_us"], k["b_us"], k["delta_us"])
                                       for k in data["kernels_by_delta"]], title="kernels by delta per step")


def _fusions_text(data: dict[str, Any]) -> str:
    """Fusion differences: one line per fused-kernel signature, then the classes only one side runs."""
    from autoopt.report import format_table

    align = data["fusion_alignment"]
    how = (f"aligned on {align['anchors_per_step']} GEMM/attention/communication launches, {align['basis']}"
           if align["mode"] == "aligned segments" else f"class-level estimate: {align['reason']}")
    fused = [f for f in data["fusions"] if f["kind"] != "class only on one side"]
    ops_text = [" ".join(dict.fromkeys(f["ops"])) for f in fused]  # each op once, in the kernel name's order
    text = (format_table(
        ("side", "fused ops", "its launches", "replaces (launches/step)", "launches saved/step", "us saved/step"),
        [(f["side"].upper(), o if len(o) <= 60 else o[:57] + "...", f["launches_per_step"],
          ", ".join(f"{n:.4g} {c}" for c, n in f["replaced"].items()) or "-", f["launches_saved_per_step"],
          f["us_saved_per_step"]) for f, o in zip(fused, ops_text, strict=True)],
        title=f"fusion differences per step ({how})") if fused else f"fusion differences per step ({how}): none")
    if align["mode"] == "aligned segments":
        text += "\nA - B per step: " + ", ".join(f"{k} {v:g} us" for k, v in align["a_minus_b_us"].items())
    only = [f"  {f['side'].upper()} {f['class']} ({f['us_per_step']:g} us, {f['launches_per_step']:g} launches)"
            + _around(f.get("around") or {}) for f in data["fusions"] if f["kind"] == "class only on one side"]
    if only:
        text += "\nclasses on one side only:\n" + "\n".join(only)
    return text


def _around(around: dict[str, list[list[Any]]]) -> str:
    """`` after X, before Y``: the most frequent kernels launched around a one-sided class."""
    parts = [f"{where} {around[key][0][0][:40]}" for key, where in (("before", "after"), ("after", "before"))
             if around.get(key)]
    return (": " + ", ".join(parts)) if parts else ""
