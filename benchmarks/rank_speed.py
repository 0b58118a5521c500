"""How long ranking one op takes: cold (enumerate + validate + predict every config) and warm (cached).

    PYTHONPATH=. python benchmarks/rank_speed.py [--profile h100-sxm] [--suite llm] [--repeat 200]

The warm figure is what repeated planning pays per op (target < 1 ms); the cold
one is paid once per (GPU, op, template set, cost constants) in a process.
"""

from __future__ import annotations

import argparse
import statistics
import time

from autoopt.library import load_profile
from autoopt.ranking import clear_cache, rank
from autoopt.suite import suite


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100-sxm")
    ap.add_argument("--suite", default="llm")
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    gpu = load_profile(args.profile).gpu
    ops = suite(args.suite)
    clear_cache()
    rank(gpu, ops[0][1])  # import and plugin discovery are not ranking
    clear_cache()
    print(f"{'op':<28} {'configs':>8} {'cold ms':>9} {'warm us':>9}")
    colds, warms = [], []
    for label, op in ops:
        t = time.perf_counter()
        r = rank(gpu, op)
        cold = (time.perf_counter() - t) * 1e3
        samples = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            rank(gpu, op)
            samples.append((time.perf_counter() - t) * 1e6)
        warm = statistics.median(samples)
        colds.append(cold)
        warms.append(warm)
        print(f"{label[:28]:<28} {r.considered:>8} {cold:>9.1f} {warm:>9.1f}")
    print(f"median cold {statistics.median(colds):.1f} ms, max {max(colds):.1f} ms; "
          f"median warm {statistics.median(warms):.1f} us, max {max(warms):.1f} us "
          f"({args.profile}, {len(ops)} ops)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
