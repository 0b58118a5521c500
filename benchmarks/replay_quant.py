"""Replay the committed quantized-kernel timings against the cost model: median |ln(predicted / measured)|.

Reads the ``autoopt quant_*`` rows of ``benchmarks/results/h100/quant_kernels.json`` (or ``--results``),
predicts each timed config with the template that owns it (``quant-gemv``, ``quant-gemm``,
``quant-dequant-cublas``) on the profile the file names (``profile_match``; else the H100's, or
``--profile``), and prints per (kernel, format) and overall the median and worst |ln(predicted / measured)|
and the median ratio; then, per linear, M and format, the measured time of the config the model ranks first
among those timed against the fastest timed (``picks``: each, and their sums). Rows whose kernel changed
since the run (the int4 decode GEMV: its and/or became one LOP3) are reported apart unless
``--keep-changed``. Nothing runs on a GPU. Committed runs: ``quant_kernels.json`` (the first),
``quant_kernels_qperf.json`` (after the dequantize + cuBLAS path and the refit); the H200's graph-replayed
int4 GEMV grid (``h200/quant_kernels_fmagrid_graph.json``, the word path the model prices)::

    PYTHONPATH=. python benchmarks/replay_quant.py
    PYTHONPATH=. python benchmarks/replay_quant.py --keep-changed \
        --results benchmarks/results/h200/quant_kernels_fmagrid_graph.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.errors import AutooptError
from autoopt.hardware.library import load_profile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

RESULTS = Path(__file__).resolve().parent / "results" / "h100" / "quant_kernels.json"
#: (kind, format name) pairs whose kernel changed after the committed run
CHANGED = {("gemv", "int4")}


def replay(rows: list[dict[str, Any]], skip: set[tuple[str, str]], profile: str = "h100-sxm") -> dict[str, Any]:
    from autoopt.templates.quant import QuantDequantCublasTemplate, QuantGemmTemplate, QuantGemvTemplate

    gpu = load_profile(profile).gpu
    owners = {"quant_gemv": QuantGemvTemplate(), "quant_gemm": QuantGemmTemplate(),
              "quant_dequant_cublas": QuantDequantCublasTemplate()}
    groups: dict[str, list[float]] = {}
    changed: list[float] = []
    timed: dict[str, list[tuple[float, float]]] = {}  # (linear, M, format) -> [(predicted, measured)]
    for r in rows:
        kernel = r.get("impl", "").removeprefix("autoopt ")
        if kernel not in owners or not r.get("measured_us"):
            continue
        kind = "gemv" if r["m"] <= 16 else "gemm"
        op = OpSpec(kind=kind, shape=(r["m"], r["n"], r["k"]), dtype="bf16", weight=r["format"])
        t = owners[kernel]
        cfg = KernelConfig(kernel=kernel, template=t.name, path=r.get("path", "standard"), params=r["config"])
        predicted = t.predict(gpu, op, cfg).us
        err = math.log(predicted / r["measured_us"])
        fmt = op.weight_format
        assert fmt is not None
        if (kind, fmt.name) in skip:
            changed.append(err)
            continue
        groups.setdefault(f"{kernel} {fmt.spec}", []).append(err)
        timed.setdefault(f"{r['linear']} M={r['m']} {fmt.spec}", []).append((predicted, r["measured_us"]))
    out = _errors(groups, changed)
    if timed:
        out["picks"] = _picks(timed)
    return out


def _picks(timed: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """Per linear: the measured time of the config predicted fastest against the fastest measured."""
    each = {key: {"picked_us": min(pairs)[1], "best_us": min(m for _, m in pairs)} for key, pairs in timed.items()}
    picked, best = sum(v["picked_us"] for v in each.values()), sum(v["best_us"] for v in each.values())
    return {"sum_picked_over_best": round(picked / best, 3), **{k: {n: round(x, 2) for n, x in v.items()}
                                                                 for k, v in each.items()}}


def _errors(groups: dict[str, list[float]], changed: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    every = [e for errs in groups.values() for e in errs]
    for key, errs in [*sorted(groups.items()), ("all unchanged", every), ("changed since the run", changed)]:
        if errs:
            out[key] = {"rows": len(errs), "median_abs_log": round(statistics.median(map(abs, errs)), 3),
                        "worst_abs_log": round(max(map(abs, errs)), 3),
                        "median_pred_over_measured": round(math.exp(statistics.median(errs)), 3)}
    return out


#: the largest result file read (the committed ones are under 1 MiB)
MAX_RESULTS_BYTES = 64 << 20
#: what a timed autoopt row must hold to be replayed
ROW_KEYS = ("linear", "m", "n", "k", "format", "config")


def load_results(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of a ``quant_kernels.py`` result and the profile it names (``profile_match``), the file checked
    first (a regular JSON file of sane size whose timed autoopt rows hold :data:`ROW_KEYS`). ValueError (one
    line, naming the file) otherwise."""
    from benchmarks.rescore_regret import checked_json

    data = checked_json(path, MAX_RESULTS_BYTES, "a quant_kernels.py result")
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: not a quant_kernels.py result (expected a 'rows' list)")
    for r in rows:
        if str(r.get("impl", "")).startswith("autoopt quant_") and r.get("measured_us"):
            missing = [k for k in ROW_KEYS if k not in r]
            if missing:
                raise ValueError(f"{path}: a timed {r['impl']} row lacks {', '.join(missing)}")
    named = data.get("profile_match")
    return rows, named if isinstance(named, str) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--keep-changed", action="store_true", help="score the changed kernels' rows with the rest")
    ap.add_argument("--profile", default=None, help="the profile to predict on (default: the file's profile_match, "
                    "else h100-sxm)")
    args = ap.parse_args(argv)
    try:
        rows, named = load_results(Path(args.results))
        profile = args.profile or named or "h100-sxm"
        out = replay(rows, set() if args.keep_changed else CHANGED, profile)
    except (ValueError, AutooptError) as exc:
        print(f"replay_quant: {exc}", file=sys.stderr)
        return 2
    picks = out.pop("picks", {})
    for key, v in out.items():
        print(f"{key:36s} {v}")
    for key, v in picks.items():
        print(f"picks {key:30s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
