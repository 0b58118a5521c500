"""Score the cost model on a stream sweep (``benchmarks/stream_sweep.py`` output) without a GPU.

Per op: Spearman rho between predicted and measured over the timed configs, and the
measured time of the config the model ranks first among them over the best measured.

    PYTHONPATH=. python benchmarks/score_stream.py benchmarks/results/h200/stream_sweep_run2.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.api import load_profile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.search.calibration import spearman
from autoopt.search.ranking import predict_config, rank


def score(path: str, profile: str = "h200") -> dict:
    data = json.loads(Path(path).read_text())
    gpu = load_profile(profile).gpu
    out = {}
    for entry in data["ops"]:
        op = OpSpec.from_dict(entry["op"])
        # only configs the current search space still offers (caps may have dropped some)
        offered = {c.config.key() for c in rank(gpu, op, top=1_000_000).candidates}
        pairs = []
        for row in entry["rows"]:
            if row["label"] != "measured":
                continue
            cfg = KernelConfig.from_dict(row["config"])
            if cfg.key() not in offered:
                continue
            pairs.append((predict_config(gpu, op, cfg).us, row["measured_us"]))
        if not pairs:
            continue
        pred, meas = zip(*pairs, strict=True)
        pick = meas[min(range(len(pred)), key=pred.__getitem__)]
        out[op.label()] = {"n": len(pairs), "rho": round(spearman(list(pred), list(meas)), 3),
                           "top1": round(min(meas) / pick, 3), "picked_us": pick, "best_us": min(meas)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("--profile", default="h200")
    args = ap.parse_args()
    res = score(args.sweep, args.profile)
    for k, v in res.items():
        print(f"{k:34s} n={v['n']:3d} rho={v['rho']:6.3f} top1={v['top1']:.3f} "
              f"({v['picked_us']:.1f} vs {v['best_us']:.1f} us)")
    ratios = [v["top1"] for v in res.values()]
    print(f"geomean top1 {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
