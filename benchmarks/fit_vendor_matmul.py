"""Fit the cuBLAS roofline of ``autoopt.kernels.vendor`` on the committed torch timings, and score it.

Every ``benchmarks/results/{h100,h200}/hw_limit*.json`` row of a 16-bit GEMM/GEMV carries
``torch_us``: ``F.linear`` (cuBLAS) on the same inputs, timed in the same run as autoopt's kernel.
Per GPU this takes the median torch time of each distinct shape and fits the three constants of
``t = max(FLOPs / (e_compute * peak), bytes / (e_memory * bandwidth)) + fixed_us`` on a grid,
minimising the mean |ln(predicted / measured)|. It reports the in-sample and leave-one-shape-out
errors and what the decision ``autoopt.nn`` makes with it would have cost: per shape, the model
picks cuBLAS when its prediction is below the cost model's prediction for autoopt's top-1 config,
and the truth is the faster of the two measured medians. Nothing runs on a GPU.

    PYTHONPATH=. python benchmarks/fit_vendor_matmul.py --out benchmarks/results/vendor_matmul_fit.json
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

import numpy as np

from autoopt.hardware.library import load_profile
from autoopt.kernels.cost import peak_flops
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.vendor import FITS, vendor_roofline_us
from autoopt.search.ranking import rank

RESULTS = Path(__file__).resolve().parent / "results"
PROFILES = {"h100": "h100-sxm", "h200": "h200"}
E_GRID = np.arange(0.50, 1.001, 0.01)
T_GRID = np.arange(0.0, 15.01, 0.25)


def timings(gpu_dir: str) -> dict[tuple[int, int, int], dict[str, list[float]]]:
    """Shape -> the torch and autoopt times (us) of every committed 16-bit matmul row of that GPU."""
    out: dict[tuple[int, int, int], dict[str, list[float]]] = {}
    for path in sorted((RESULTS / gpu_dir).glob("hw_limit*.json")):
        for rows in json.loads(path.read_text()).get("sections", {}).values():
            for r in rows if isinstance(rows, list) else ():
                op = r.get("op", {}) if isinstance(r, dict) else {}
                if op.get("kind") not in ("gemm", "gemv") or op.get("dtype") not in ("bf16", "fp16"):
                    continue
                if not r.get("torch_us") or op.get("layout", "nk") != "nk":
                    continue
                d = out.setdefault(tuple(op["shape"]), {"torch": [], "ours": []})
                d["torch"].append(float(r["torch_us"]))
                if r.get("us"):
                    d["ours"].append(float(r["us"]))
    return out


def _grid_errors(c: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """|ln(pred / t)| for every (e_compute, e_memory, fixed_us) on the grid: shape [E, E, T, shapes]."""
    pred = np.maximum(c[None, None, None, :] / E_GRID[:, None, None, None],
                      b[None, None, None, :] / E_GRID[None, :, None, None]) * 1e6 + T_GRID[None, None, :, None]
    return np.abs(np.log(pred / t[None, None, None, :]))


def _best(err: np.ndarray) -> tuple[float, float, float]:
    i, j, k = np.unravel_index(np.argmin(err.mean(axis=-1)), err.shape[:3])
    return float(E_GRID[i]), float(E_GRID[j]), float(T_GRID[k])


def fit_gpu(gpu_dir: str) -> dict[str, Any]:
    gpu = load_profile(PROFILES[gpu_dir]).gpu
    assert gpu is not None
    data = timings(gpu_dir)
    shapes = sorted(data)
    ops = [OpSpec(kind="gemv" if s[0] <= 16 else "gemm", shape=s, dtype="bf16") for s in shapes]
    peak = peak_flops(gpu, "bf16")
    bw = (gpu.mem_bandwidth_gbs or 0.0) * 1e9
    assert peak and bw
    c = np.array([op.flops / peak for op in ops])
    b = np.array([op.min_bytes / bw for op in ops])
    t = np.array([statistics.median(data[s]["torch"]) for s in shapes])
    err = _grid_errors(c, b, t)
    e_c, e_m, t0 = _best(err)
    held_out = []
    for i in range(len(shapes)):  # leave one shape out: fit on the rest, predict it
        keep = [j for j in range(len(shapes)) if j != i]
        ec_i, em_i, t0_i = _best(err[..., keep])
        held_out.append(abs(math.log(vendor_roofline_us(c[i], b[i], ec_i, em_i, t0_i) / t[i])))
    rows = []
    for i, (s, op) in enumerate(zip(shapes, ops, strict=True)):
        vendor = vendor_roofline_us(c[i], b[i], e_c, e_m, t0)
        pick = rank(gpu, op, top=1).best
        ours_meas = statistics.median(data[s]["ours"]) if data[s]["ours"] else None
        row = {"shape": list(s), "torch_us": round(float(t[i]), 2), "vendor_predicted_us": round(vendor, 2),
               "autoopt_predicted_us": round(pick.predicted_us, 2), "autoopt_measured_us":
               None if ours_meas is None else round(ours_meas, 2)}
        if ours_meas is not None:
            chosen = "torch" if vendor < pick.predicted_us else "autoopt"
            best = min(float(t[i]), ours_meas)
            row.update(chosen=chosen, faster="torch" if t[i] <= ours_meas else "autoopt",
                       chosen_over_best=round((float(t[i]) if chosen == "torch" else ours_meas) / best, 4),
                       always_autoopt_over_best=round(ours_meas / best, 4))
        rows.append(row)
    scored = [r for r in rows if "chosen" in r]
    fitted = {"gpu": gpu.name, "e_compute": round(e_c, 2), "e_memory": round(e_m, 2), "fixed_us": round(t0, 2),
              "shapes": len(shapes),
              "median_abs_log_err": round(statistics.median(err[tuple(
                  np.unravel_index(np.argmin(err.mean(axis=-1)), err.shape[:3]))].tolist()), 4),
              "held_out_median_abs_log_err": round(statistics.median(held_out), 4),
              "held_out_mean_abs_log_err": round(statistics.fmean(held_out), 4),
              "decisions": len(scored), "decisions_right": sum(r["chosen"] == r["faster"] for r in scored),
              "geomean_chosen_over_best": round(math.exp(statistics.fmean(
                  math.log(r["chosen_over_best"]) for r in scored)), 4),
              "worst_chosen_over_best": max(r["chosen_over_best"] for r in scored),
              "geomean_always_autoopt_over_best": round(math.exp(statistics.fmean(
                  math.log(r["always_autoopt_over_best"]) for r in scored)), 4),
              "rows": rows}
    return fitted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the fits and the per-shape table here (JSON)")
    args = ap.parse_args()
    fits = {g: fit_gpu(g) for g in PROFILES}
    for g, f in fits.items():
        shipped = FITS.get(f["gpu"])
        print(f"{g}: e_compute={f['e_compute']:.2f} e_memory={f['e_memory']:.2f} fixed_us={f['fixed_us']:.2f} "
              f"over {f['shapes']} shapes; |ln err| median {f['median_abs_log_err']:.3f}, held out "
              f"{f['held_out_median_abs_log_err']:.3f} (mean {f['held_out_mean_abs_log_err']:.3f}); "
              f"decisions right {f['decisions_right']}/{f['decisions']}, chosen/best geomean "
              f"{f['geomean_chosen_over_best']:.3f} (worst {f['worst_chosen_over_best']:.3f}) against "
              f"{f['geomean_always_autoopt_over_best']:.3f} always autoopt; shipped: "
              f"{None if shipped is None else (shipped.e_compute, shipped.e_memory, shipped.fixed_us)}")
    if args.out:
        args.out.write_text(json.dumps({"model": "t = max(FLOPs/(e_compute*peak), bytes/(e_memory*bw)) + fixed_us",
                                        "fits": fits}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
