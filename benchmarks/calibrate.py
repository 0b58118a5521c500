"""Calibrate the cost model's constants on real GEMM timings and report ranking quality.

Input: a grid file written by ``benchmarks/gemm_grid.py`` on a real GPU (every
config's output checked against torch before it was timed). The constants are
fitted on half of each shape's configs and scored on the other half as well as
on all of them, so the report shows whether the fit generalises:

- Spearman rho between predicted and measured time per shape (target median >= 0.9);
- grid top-1: measured time of the config the model ranks first among the grid's
  configs, over the best measured one (target geomean >= 0.97, none below 0.90).

Usage (the committed calibration)::

    python benchmarks/calibrate.py benchmarks/results/h200_gemm_grid.json --profile h200 \
        --out benchmarks/results/calibration_h200.json --max-fit 500 --names tc_efficiency,\
        dram_efficiency,dram_latency_us,launch_us,iter_overhead_us,overlap_exponent,\
        single_warpgroup_efficiency,pointer_wgmma_efficiency,narrow_wgmma_efficiency

The fitted values printed at the end are then written into ``CostConstants``'
defaults by hand (each with its prior in a comment), so a reader sees them. Those defaults are now
the fitted ones, so to reproduce ``calibration_h200.json`` start from its priors:
``--start benchmarks/results/calibration_h200.json`` (its ``constants_prior``).

The split, the fit and the scores are the package's (``autoopt.search.calibration``: ``spearman``,
``holdout_split``, ``score``, ``calibrate``); ``autoopt calibrate`` fits per device the same way.
``l2_bw_ratio`` is left out on purpose: free, it drifts to an unphysical 17x DRAM.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.api import load_profile
from autoopt.kernels import cost
from autoopt.search.calibration import calibrate, grid_samples, score, spearman

__all__ = ["main", "spearman"]


def _start(path: str | None) -> cost.CostConstants:
    """The constants the fit starts from: the defaults, or a file's (a calibration report's
    ``constants_prior``, or a plain object of constants); constants it lacks keep their defaults."""
    if not path:
        return cost.DEFAULT_CONSTANTS
    data = json.loads(Path(path).read_text())
    data = data.get("constants_prior", data.get("constants", data))
    return cost.CostConstants.from_dict({**cost.DEFAULT_CONSTANTS.to_dict(), **data})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("grid")
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--out", required=True)
    ap.add_argument("--near", type=float, default=1.5, help="fit on configs within this factor of the best")
    ap.add_argument("--names", help="comma-separated constants to fit (default: all)")
    ap.add_argument("--max-fit", type=int, default=1600, help="fit on at most this many samples")
    ap.add_argument("--start", metavar="FILE", help="start from these constants (JSON; default: the defaults)")
    args = ap.parse_args()
    grid = json.loads(Path(args.grid).read_text())
    gpu = load_profile(args.profile).gpu
    samples = grid_samples(grid, gpu)
    start = _start(args.start)
    names = args.names.split(",") if args.names else None
    # Held out: every second config of each shape in file order; fit on the rest within --near of
    # the shape's best (a uniform fit spends its accuracy on slow configs no ranking would ever pick).
    rep = calibrate(samples, start=start, names=names, holdout=0.5, stratify=False, near=args.near,
                    max_per_shape=None, max_train=args.max_fit)
    before = score(samples, start)
    after_all = score(samples, rep.constants)
    report = {
        "grid": args.grid, "grid_meta": grid["meta"], "profile": args.profile,
        "samples": len(samples), "fit_samples": rep.n_train, "near": args.near,
        "fitted_names": args.names or "all", "fit_seconds": round(rep.fit_seconds, 1),
        "constants_prior": start.to_dict(), "constants_fitted": rep.constants.to_dict(),
        "prior": before.to_dict(), "fitted_all": after_all.to_dict(), "fitted_heldout": rep.after.to_dict(),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for name, s in (("prior", before), ("fitted (all)", after_all), ("fitted (held-out)", rep.after)):
        print(f"{name:18s} median rho {s.median_spearman:.3f}  grid top-1 geomean {s.geomean_top1:.3f}"
              f"  min {s.min_top1:.3f}")
    changed = {k: round(v, 4) for k, v in rep.constants.to_dict().items() if v != start.to_dict()[k]}
    print("fitted constants:", json.dumps(changed))
    for v in after_all.per_shape:
        print(f"  {v.shape:16s} n={v.n:4d} rho={v.spearman:.3f} top1={v.top1_ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
