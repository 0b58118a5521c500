"""Rebuild the roofline chart from a saved ``autoopt bench --out`` JSON.

The ceilings come from ``--profile`` (a known profile name or a profile file, as
``autoopt.api.load_profile`` takes). Measured ceilings, when known, are drawn
dashed beside the datasheet ones; they are taken, later ones winning, from the
bench JSON if it carries ``measured_bandwidth_gbs`` / ``measured_tflops`` (top
level), from ``--measured-from`` (an ``autoopt profile`` output: its first GPU),
and from ``--measured-bandwidth-gbs`` / ``--measured-tflops DTYPE=TFLOPS``.

    PYTHONPATH=. python benchmarks/replot.py benchmarks/results/h200/bench_run3.json --profile h200 \
        --measured-from benchmarks/results/h200/autoopt_profile.json \
        --out benchmarks/results/h200/roofline_run3.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.api import load_profile
from autoopt.backend.plot import roofline_png
from autoopt.backend.runner import Result
from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile


def _measured_in(data: dict[str, Any]) -> dict[str, Any]:
    """measured_bandwidth_gbs / measured_tflops of a bench JSON or of an ``autoopt profile`` output."""
    gpus = (data.get("profile") or {}).get("gpus") if isinstance(data.get("profile"), dict) else data.get("gpus")
    src = gpus[0] if gpus else data
    return {k: src[k] for k in ("measured_bandwidth_gbs", "measured_tflops") if src.get(k)}


def _tflops_arg(text: str) -> tuple[str, float]:
    dtype, _, value = text.partition("=")
    try:
        return dtype.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--measured-tflops {text!r}: expected DTYPE=TFLOPS, "
                                         "e.g. bf16=693.5") from None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--profile", required=True, help="known profile name (e.g. h200) or profile file")
    ap.add_argument("--out", required=True, type=Path, help="PNG to write")
    ap.add_argument("--measured-from", type=Path, help="autoopt profile JSON whose GPU has measured ceilings")
    ap.add_argument("--measured-bandwidth-gbs", type=float)
    ap.add_argument("--measured-tflops", type=_tflops_arg, action="append", default=[], metavar="DTYPE=TFLOPS")
    args = ap.parse_args()
    try:
        bench = json.loads(args.bench_json.read_text())
        gpu: GPUProfile | None = load_profile(args.profile).gpu
        if gpu is None:
            print(f"replot: profile {args.profile!r} has no GPU", file=sys.stderr)
            return 2
        measured = _measured_in(bench)
        if args.measured_from:
            measured.update(_measured_in(json.loads(args.measured_from.read_text())))
        if args.measured_bandwidth_gbs:
            measured["measured_bandwidth_gbs"] = args.measured_bandwidth_gbs
        if args.measured_tflops:
            measured["measured_tflops"] = {**measured.get("measured_tflops", {}), **dict(args.measured_tflops)}
        if measured:
            gpu = gpu.with_(**measured)
        rows = [Result.from_dict(r) for r in bench["rows"]]
        out = roofline_png(rows, gpu, args.out)
    except (AutooptError, OSError, KeyError, json.JSONDecodeError) as exc:
        print(f"replot: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({sum(r.label == 'measured' and bool(r.us) for r in rows)} measured rows of {len(rows)}; "
          f"bandwidth {gpu.mem_bandwidth_gbs} spec / {gpu.measured_bandwidth_gbs} measured GB/s; "
          f"measured TFLOP/s {gpu.measured_tflops or '-'})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
