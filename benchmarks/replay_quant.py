"""Replay the committed quantized-kernel timings against the cost model: median |ln(predicted / measured)|.

Reads the ``autoopt quant_*`` rows of ``benchmarks/results/h100/quant_kernels.json`` (or ``--results``),
predicts each timed config with the template that owns it (``quant-gemv``, ``quant-gemm``,
``quant-dequant-cublas``) on the H100 profile, and prints per (kernel, format) and overall the median
and worst |ln(predicted / measured)| and the median ratio. Rows whose kernel changed since the run (the
int4 decode GEMV: its and/or became one LOP3) are reported apart unless ``--keep-changed``. Nothing
runs on a GPU. Committed runs: ``quant_kernels.json`` (the first), ``quant_kernels_qperf.json`` (after
the dequantize + cuBLAS path and the refit).

    PYTHONPATH=. python benchmarks/replay_quant.py
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.hardware.library import load_profile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

RESULTS = Path(__file__).resolve().parent / "results" / "h100" / "quant_kernels.json"
#: (kind, format name) pairs whose kernel changed after the committed run
CHANGED = {("gemv", "int4")}


def replay(rows: list[dict[str, Any]], skip: set[tuple[str, str]]) -> dict[str, Any]:
    from autoopt.templates.quant import QuantDequantCublasTemplate, QuantGemmTemplate, QuantGemvTemplate

    gpu = load_profile("h100-sxm").gpu
    owners = {"quant_gemv": QuantGemvTemplate(), "quant_gemm": QuantGemmTemplate(),
              "quant_dequant_cublas": QuantDequantCublasTemplate()}
    groups: dict[str, list[float]] = {}
    changed: list[float] = []
    for r in rows:
        kernel = r.get("impl", "").removeprefix("autoopt ")
        if kernel not in owners or not r.get("measured_us"):
            continue
        kind = "gemv" if r["m"] <= 16 else "gemm"
        op = OpSpec(kind=kind, shape=(r["m"], r["n"], r["k"]), dtype="bf16", weight=r["format"])
        t = owners[kernel]
        cfg = KernelConfig(kernel=kernel, template=t.name, path=r.get("path", "standard"), params=r["config"])
        err = math.log(t.predict(gpu, op, cfg).us / r["measured_us"])
        fmt = op.weight_format
        assert fmt is not None
        if (kind, fmt.name) in skip:
            changed.append(err)
            continue
        groups.setdefault(f"{kernel} {fmt.spec}", []).append(err)
    out: dict[str, Any] = {}
    every = [e for errs in groups.values() for e in errs]
    for key, errs in [*sorted(groups.items()), ("all unchanged", every), ("changed since the run", changed)]:
        if errs:
            out[key] = {"rows": len(errs), "median_abs_log": round(statistics.median(map(abs, errs)), 3),
                        "worst_abs_log": round(max(map(abs, errs)), 3),
                        "median_pred_over_measured": round(math.exp(statistics.median(errs)), 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--keep-changed", action="store_true", help="score the changed kernels' rows with the rest")
    args = ap.parse_args(argv)
    rows = json.loads(Path(args.results).read_text())["rows"]
    for key, v in replay(rows, set() if args.keep_changed else CHANGED).items():
        print(f"{key:36s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
