"""Fit the cuBLAS roofline of ``autoopt.kernels.vendor`` on the committed torch timings, and score it.

Every ``benchmarks/results/{h100,h200}/hw_limit*.json`` row of a 16-bit GEMM/GEMV carries
``torch_us``: ``F.linear`` (cuBLAS) on the same inputs, timed in the same run as autoopt's kernel.
Per GPU this takes the median torch time of each distinct shape and fits the three constants of
``t = max(FLOPs / (e_compute * peak), bytes / (e_memory * bandwidth)) + fixed_us`` on a grid,
minimising the mean |ln(predicted / measured)|. It reports the in-sample and leave-one-shape-out
errors and what the decision ``autoopt.nn`` makes with it would have cost: per shape, the model
picks cuBLAS when its prediction is below the cost model's prediction for autoopt's top-1 config,
and the truth is the faster of the two measured medians. Nothing runs on a GPU.

The W8A8 ``fp8`` path (autoopt's activation quantization, then ``torch._scaled_mm`` with row-wise scales) is
fitted apart (:func:`fit_fp8`) on the ``act_quant + torch._scaled_mm`` rows of ``quant_kernels*.json`` (M > 16,
where the vendor path is offered), with one more constant: cuBLASLt's FP8 kernel runs 128 x 128 output tiles
(``nvjet_sm90_qqtst_128x128`` in ``h200/quant_trace_*_b32_layers8.json``), so at M = 32 a GEMM with N = 4096 has
32 tiles for 132 SMs and reads its weight at a fraction of the bandwidth: the memory term is divided by
``min(1, tiles / SMs) ** occupancy_exp``.

    PYTHONPATH=. python benchmarks/fit_vendor_matmul.py --out benchmarks/results/vendor_matmul_fit.json
    PYTHONPATH=. python benchmarks/fit_vendor_matmul.py --fp8-only --out benchmarks/results/vendor_matmul_fit.json
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
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.quant_cost import act_quant_us
from autoopt.kernels.vendor import FITS, FP8_FITS, FP8_TILE, vendor_roofline_us
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


#: the W8A8 timings per GPU: graph-replayed where a run has them (the H200's), else the event-timed runs (the
#: H100's: their fixed cost holds a standalone launch, as rank()'s prices do)
FP8_FILES = {"h100": ("quant_kernels_qperf.json", "quant_kernels_batched.json", "quant_kernels_int4_m32.json"),
             "h200": ("quant_kernels_m32_graph.json",)}
#: the GPUs whose FP8 rows are graph-replayed: each call's launch is an in-graph one there, so the shipped
#: fixed cost adds a standalone launch's extra (rank()'s prices, which the dispatch compares it with, hold one)
FP8_GRAPH_TIMED = ("h200",)
_OCC_GRID = np.arange(0.0, 1.001, 0.05)
_EC_GRID = np.arange(0.30, 1.0, 0.02)


def fp8_timings(gpu_dir: str) -> dict[tuple[int, int, int], float]:
    """Shape -> the median measured us of activation quantization + ``torch._scaled_mm`` (M > 16)."""
    out: dict[tuple[int, int, int], list[float]] = {}
    for name in FP8_FILES[gpu_dir]:
        for r in json.loads((RESULTS / gpu_dir / name).read_text()).get("rows", []):
            if r.get("impl") == "act_quant + torch._scaled_mm" and r.get("measured_us") and r["m"] > 16:
                out.setdefault((r["m"], r["n"], r["k"]), []).append(float(r["measured_us"]))
    return {s: statistics.median(v) for s, v in sorted(out.items())}


def fit_fp8(gpu_dir: str, e_compute: float | None = None) -> dict[str, Any]:
    """(e_compute, e_memory, fixed_us, occupancy_exp) of the scaled_mm GEMM (the act_quant price taken off), by
    grid search on the mean |ln(predicted / measured)|; with no compute-bound shape measured (the H200's rows are
    all M = 32) ``e_compute`` is given: the other GPU's."""
    gpu = load_profile(PROFILES[gpu_dir]).gpu
    assert gpu is not None and gpu.sm_count
    data = fp8_timings(gpu_dir)
    ops = [OpSpec(kind="gemm", shape=s, dtype="bf16", weight="fp8") for s in data]
    peak, bw = peak_flops(gpu, "fp8"), (gpu.mem_bandwidth_gbs or 0.0) * 1e9
    assert peak and bw
    c, b, occ, t = [], [], [], []
    for op, us in zip(ops, data.values(), strict=True):
        m, n, k = op.shape
        fmt = op.weight_format
        assert fmt is not None
        c.append(op.flops / peak)
        b.append((m * k + fmt.weight_bytes(n, k) + 4 * m + m * n * DTYPE_BYTES["bf16"]) / bw)
        occ.append(min(1.0, math.ceil(m / FP8_TILE) * math.ceil(n / FP8_TILE) / gpu.sm_count))
        t.append(us - act_quant_us(gpu, op))
    ca, ba, oa, ta = (np.array(v) for v in (c, b, occ, t))
    compute_bound = any(s[0] >= 1024 for s in data)
    ec_grid = _EC_GRID if compute_bound or e_compute is None else np.array([e_compute])
    pred = (np.maximum(ca[None, None, None, :] / ec_grid[None, :, None, None],
                       ba[None, None, None, :] / (E_GRID[None, None, :, None]
                                                  * oa[None, None, None, :] ** _OCC_GRID[:, None, None, None]))
            * 1e6)
    best: tuple[float, ...] | None = None
    for t0 in T_GRID:
        err = np.abs(np.log((pred + t0) / ta[None, None, None, :])).mean(axis=-1)
        i, j, k = np.unravel_index(np.argmin(err), err.shape)
        if best is None or err[i, j, k] < best[0]:
            best = (float(err[i, j, k]), float(_OCC_GRID[i]), float(ec_grid[j]), float(E_GRID[k]), float(t0))
    assert best is not None
    mean_err, a, e_c, e_m, t0 = best
    rows = [{"shape": list(s), "measured_us": round(us, 2), "gemm_measured_us": round(tt, 2),
             "gemm_predicted_us": round(vendor_roofline_us(cc, bb / o ** a, e_c, e_m, t0), 2), "tile_occupancy":
             round(o, 3)} for (s, us), cc, bb, o, tt in zip(data.items(), c, b, occ, t, strict=True)]
    from autoopt.kernels.constants import GRAPH_LAUNCH_US, constants

    graphed = gpu_dir in FP8_GRAPH_TIMED
    as_ranked = t0 + (constants().launch_us - GRAPH_LAUNCH_US if graphed else 0.0)
    return {"gpu": gpu.name, "e_compute": round(e_c, 2), "e_memory": round(e_m, 2), "fixed_us": round(t0, 2),
            "timing": "CUDA-graph replay" if graphed else "CUDA events, one call", "fixed_us_as_ranked":
            round(as_ranked, 2), "occupancy_exp": round(a, 2), "shapes": len(rows),
            "mean_abs_log_err": round(mean_err, 4),
            "median_abs_log_err": round(statistics.median(
                abs(math.log(r["gemm_predicted_us"] / r["gemm_measured_us"])) for r in rows), 4),
            "sources": [f"{gpu_dir}/{n}" for n in FP8_FILES[gpu_dir]], "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the fits and the per-shape table here (JSON)")
    ap.add_argument("--fp8-only", action="store_true", help="fit the W8A8 path only; --out keeps its 16-bit fits "
                    "(they move with rank()'s predictions, and the shipped constants are theirs)")
    args = ap.parse_args()
    fits = (json.loads(args.out.read_text())["fits"] if args.fp8_only and args.out and args.out.is_file()
            else {} if args.fp8_only else {g: fit_gpu(g) for g in PROFILES})
    for g, f in fits.items():
        shipped = FITS.get(f["gpu"])
        print(f"{g}: e_compute={f['e_compute']:.2f} e_memory={f['e_memory']:.2f} fixed_us={f['fixed_us']:.2f} "
              f"over {f['shapes']} shapes; |ln err| median {f['median_abs_log_err']:.3f}, held out "
              f"{f['held_out_median_abs_log_err']:.3f} (mean {f['held_out_mean_abs_log_err']:.3f}); "
              f"decisions right {f['decisions_right']}/{f['decisions']}, chosen/best geomean "
              f"{f['geomean_chosen_over_best']:.3f} (worst {f['worst_chosen_over_best']:.3f}) against "
              f"{f['geomean_always_autoopt_over_best']:.3f} always autoopt; shipped: "
              f"{None if shipped is None else (shipped.e_compute, shipped.e_memory, shipped.fixed_us)}")
    fp8 = {"h100": fit_fp8("h100")}
    fp8["h200"] = fit_fp8("h200", e_compute=fp8["h100"]["e_compute"])  # no compute-bound H200 row: the H100's
    for g, f in fp8.items():
        print(f"{g} fp8 (act_quant + _scaled_mm): e_compute={f['e_compute']:.2f} e_memory={f['e_memory']:.2f} "
              f"fixed_us={f['fixed_us']:.2f} occupancy_exp={f['occupancy_exp']:.2f} over {f['shapes']} shapes; "
              f"|ln err| median {f['median_abs_log_err']:.3f}; shipped: {FP8_FITS.get(f['gpu'])}")
    if args.out:
        args.out.write_text(json.dumps({"model": "t = max(FLOPs/(e_compute*peak), bytes/(e_memory*bw)) + fixed_us",
                                        "fits": fits, "fp8_model": "act_quant_us + max(FLOPs/(e_compute*fp8 peak), "
                                        "bytes/(e_memory*bw*min(1, tiles/SMs)**occupancy_exp)) + fixed_us",
                                        "fp8_fits": fp8}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
