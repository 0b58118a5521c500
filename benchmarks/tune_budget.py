"""Budgeted tuning vs the exhaustive grid, on the GPU: does <= 8 trials reach >= 0.99x the grid's best?

For the 12 Llama-3-8B projection shapes (qkv, o, gate_up, down at M = 16, 256, 4096) this runs
``autoopt.tuning.tuner.tune`` with a budget of 8 trials through the real backend runner, timing the
wall clock per new shape (compilation included), then re-times in the same process the best
configs of the committed exhaustive grid (``--grid``: the fastest 3 of each kernel section per
shape), so tuned and grid-best are same-run numbers. Writes one JSON (device, driver, versions).

    PYTHONPATH=. python benchmarks/tune_budget.py --grid benchmarks/results/h200_gemm_grid.json --out tune.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.backend import runner
from autoopt.hardware.detection import detect
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.suite import LLAMA3_8B_PROJECTIONS
from autoopt.search.ranking import validate_config
from autoopt.tuning.tuner import REP_MS, WARMUP_MS, tune


def grid_top(grid: dict, key: str, per_section: int = 3) -> list[KernelConfig]:
    out = []
    for section in ("gemm", "gemm_tma"):
        rows = [r for r in grid.get(section, {}).get(key, {}).get("configs", []) if r.get("label") == "measured"]
        for r in sorted(rows, key=lambda r: r["us"])[:per_section]:
            out.append(KernelConfig(kernel=section, params=r["config"],
                                    path="tma_wgmma" if section == "gemm_tma" else "standard"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials", type=int, default=8)
    args = ap.parse_args()
    grid = json.loads(Path(args.grid).read_text())
    gpu = detect().gpu
    if gpu is None:
        print("tune_budget: no GPU detected", file=sys.stderr)
        return 2
    report: dict = {"gpu": gpu.name, "grid": args.grid, "grid_meta": grid.get("meta"), "shapes": {},
                    "do_bench_ms": {"warmup": WARMUP_MS, "rep": REP_MS}}
    for m in (16, 256, 4096):
        for name, (n, k) in LLAMA3_8B_PROJECTIONS.items():
            op = OpSpec(kind="gemm", shape=(m, n, k), dtype="bf16")
            key = f"{m}x{n}x{k}"
            t0 = time.perf_counter()
            res = tune(gpu, op, budget_trials=args.trials)
            wall = time.perf_counter() - t0
            grid_rows = []
            for cfg in grid_top(grid, key):
                cfg = _with_path(gpu, op, cfg)
                r = runner.evaluate(op, cfg, gpu=gpu, validate=lambda o, c: validate_config(gpu, o, c),
                                    warmup_ms=25, rep_ms=100)
                grid_rows.append({"kernel": cfg.kernel, "config": dict(cfg.params), "label": r.label, "us": r.us,
                                  "reason": r.reason})
            best = res.best
            retimed = None
            if best is not None:  # same windows as the grid re-timing, so the ratio compares like with like
                r = runner.evaluate(op, best.config, gpu=gpu, warmup_ms=25, rep_ms=100)
                retimed = r.us if r.label == "measured" else None
            grid_best = min((g["us"] for g in grid_rows if g["label"] == "measured" and g["us"]), default=None)
            ratio = grid_best / retimed if grid_best and retimed else None
            report["shapes"][key] = {"projection": name, "tune": res.to_dict(), "wall_s": round(wall, 3),
                                     "tuned_us_retimed": retimed, "grid_best_us_same_run": grid_best,
                                     "tuned_vs_grid_best": None if ratio is None else round(ratio, 4),
                                     "grid_rows": grid_rows}
            print(f"{key:18s} trials {len(res.trials)} ({res.stopped}) wall {wall:5.2f}s tuned {retimed} "
                  f"grid-best {grid_best} ratio {ratio and round(ratio, 3)} gain-vs-zero-shot {res.gain}",
                  flush=True)
    ratios = [s["tuned_vs_grid_best"] for s in report["shapes"].values() if s["tuned_vs_grid_best"]]
    walls = [s["wall_s"] for s in report["shapes"].values()]
    report["summary"] = {
        "geomean_tuned_vs_grid_best": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4) if ratios else None,
        "min_tuned_vs_grid_best": min(ratios) if ratios else None,
        "max_trials": max(len(s["tune"]["trials"]) for s in report["shapes"].values()),
        "wall_s_first_shape": walls[0], "wall_s_max_after_first": max(walls[1:]),
        "wall_s_median": sorted(walls)[len(walls) // 2], "versions": runner._versions(),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"], indent=1))
    return 0


def _with_path(gpu: object, op: OpSpec, cfg: KernelConfig) -> KernelConfig:
    """The grid stored kernels without template/path: take them from the ranking's space."""
    from autoopt.search.ranking import rank

    for cand in rank(gpu, op, top=100_000, exhaustive=True).candidates:  # type: ignore[arg-type]
        if cand.config.kernel == cfg.kernel and dict(cand.config.params) == dict(cfg.params):
            return cand.config
    return cfg


if __name__ == "__main__":
    sys.exit(main())
