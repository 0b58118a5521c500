"""Time recommend(): cold (first call in a fresh process after import) and warm (repeat calls).

Targets: llama-3-70b on h100-sxm-8x, cold <= 100 ms, warm <= 10 ms. The cold figure
is dominated by rank() building its first rankings (see the "rank share" line).
Writes JSON (``--out``, default benchmarks/recommend_speed.json)::

    PYTHONPATH=. python benchmarks/recommend_speed.py
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import autoopt.recommendation as R
t1 = time.perf_counter()
import autoopt.ranking as rank_mod
orig = rank_mod.rank
spent = [0.0]
def timed(*a, **k):
    s = time.perf_counter()
    try:
        return orig(*a, **k)
    finally:
        spent[0] += time.perf_counter() - s
rank_mod.rank = timed
t2 = time.perf_counter()
rec = R.recommend(sys.argv[1], sys.argv[2])
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "cold_s": t3 - t2, "cold_rank_s": spent[0],
                  "split": rec.split.kind if rec.split else None, "format": rec.quant.format.name}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100-sxm-8x")
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--cold-runs", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    env_path = {"PYTHONPATH": str(root)}
    import os

    cold = []
    for _ in range(args.cold_runs):
        out = subprocess.run([sys.executable, "-c", _CHILD, args.profile, args.model], capture_output=True,
                             text=True, env={**os.environ, **env_path}, check=True)
        cold.append(json.loads(out.stdout.strip().splitlines()[-1]))
    sys.path.insert(0, str(root))
    from autoopt.recommendation import recommend

    recommend(args.profile, args.model)
    warm = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        recommend(args.profile, args.model)
        warm.append(time.perf_counter() - t)
    result = {
        "profile": args.profile, "model": args.model, "python": platform.python_version(),
        "machine": platform.machine(), "cold_runs": cold,
        "cold_ms_median": statistics.median(c["cold_s"] for c in cold) * 1e3,
        "cold_rank_share": statistics.median(c["cold_rank_s"] / c["cold_s"] for c in cold),
        "warm_ms_median": statistics.median(warm) * 1e3, "warm_ms_min": min(warm) * 1e3,
        "targets_ms": {"cold": 100, "warm": 10},
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"cold {result['cold_ms_median']:.1f} ms (rank() share {result['cold_rank_share']:.0%}), "
          f"warm {result['warm_ms_median']:.2f} ms median / {result['warm_ms_min']:.2f} ms min -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
