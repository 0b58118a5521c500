"""How long ranking one op takes: cold (first rank() of the op) and warm (cached), pruned and exhaustive.

    PYTHONPATH=. python benchmarks/rank_speed.py [--profile h100-sxm] [--suite llm] [--processes 5]

Three numbers per op of the suite (target: cold median < 1 ms, the exact exhaustive top-k):

- ``first_ms``: the op's first rank() in a fresh process after one rank() of the suite's first
  op (imports, plugin discovery, the per-GPU tables that op needs); includes building any
  per-(GPU, dtype) table the op is the first to need. Median over ``--processes`` processes.
- ``cold_ms``: rank() after forgetting the op's ranking but not the per-GPU tables: what every
  new op shape costs. Median (and ``cold_ms_min``, the least noisy on a shared VM) over ``--repeat`` runs.
- ``warm_us``: rank() of an op already ranked (a cache lookup). Median over ``--repeat`` runs.
- ``exhaustive_ms``: ``rank(..., exhaustive=True)``, every config validated and predicted (one run).

Writes ``benchmarks/results/rank_speed.json`` (``--out``) with the machine and Python version.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.host_timing import child_json, cpu_name  # noqa: E402

_CHILD = r"""
import json, sys, time
from autoopt.library import load_profile
from autoopt.ranking import rank
from autoopt.suite import suite
gpu = load_profile(sys.argv[1]).gpu
ops = suite(sys.argv[2])
rank(gpu, ops[0][1])  # imports, plugin discovery and that op's per-GPU tables are not ranking
out = []
for label, op in ops[1:]:
    t = time.perf_counter()
    rank(gpu, op)
    out.append((time.perf_counter() - t) * 1e3)
print(json.dumps(out))
"""


def first_ranks(profile: str, suite_name: str, processes: int) -> list[list[float]]:
    """Per op (the first excepted), its first rank() time in each of ``processes`` fresh processes."""
    runs = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(processes):
        runs.append(child_json(_CHILD, [profile, suite_name], env))
    return [list(col) for col in zip(*runs, strict=True)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100-sxm")
    ap.add_argument("--suite", default="llm")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rank_speed.json"))
    args = ap.parse_args()

    from autoopt.hardware.library import load_profile
    from autoopt.kernels.suite import suite
    from autoopt.search.ranking import _CACHE, rank

    gpu = load_profile(args.profile).gpu
    ops = suite(args.suite)
    firsts = [[], *first_ranks(args.profile, args.suite, args.processes)]  # the first op warms up
    for _, op in ops:  # per-GPU tables of every op warm
        rank(gpu, op)
    rows = []
    print(f"{'op':<24} {'configs':>7} {'first ms':>9} {'cold ms':>8} {'warm us':>8} {'exhaustive ms':>13}")
    for (label, op), first in zip(ops, firsts, strict=True):
        cold, warm = [], []
        for _ in range(args.repeat):
            _CACHE.clear()
            t = time.perf_counter()
            r = rank(gpu, op)
            cold.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            rank(gpu, op)
            warm.append((time.perf_counter() - t) * 1e6)
        _CACHE.clear()
        t = time.perf_counter()
        full = rank(gpu, op, exhaustive=True)
        exhaustive = (time.perf_counter() - t) * 1e3
        same = [c.config.key() for c in r.candidates] == [c.config.key() for c in full.candidates]
        rows.append({"op": label, "shape": list(op.shape), "kind": op.kind, "dtype": op.dtype,
                     "configs": r.considered, "first_ms": _median(first), "cold_ms": statistics.median(cold),
                     "cold_ms_min": min(cold),
                     "warm_us": statistics.median(warm), "exhaustive_ms": exhaustive, "same_top5": same})
        print(f"{label[:24]:<24} {r.considered:>7} {_fmt(rows[-1]['first_ms']):>9} {rows[-1]['cold_ms']:>8.3f} "
              f"{rows[-1]['warm_us']:>8.1f} {exhaustive:>13.1f}{'' if same else '  TOP-5 DIFFERS'}")
        _CACHE.clear()
    summary = {
        "cold_ms_median": statistics.median(r["cold_ms"] for r in rows),
        "cold_ms_max": max(r["cold_ms"] for r in rows),
        "cold_ms_min_median": statistics.median(r["cold_ms_min"] for r in rows),
        "first_ms_median": statistics.median(r["first_ms"] for r in rows[1:]),
        "first_ms_max": max(r["first_ms"] for r in rows[1:]),
        "warm_us_median": statistics.median(r["warm_us"] for r in rows),
        "exhaustive_ms_median": statistics.median(r["exhaustive_ms"] for r in rows),
        "all_top5_same": all(r["same_top5"] for r in rows),
    }
    result = {"profile": args.profile, "suite": args.suite, "device": cpu_name(), "cores": os.cpu_count(),
              "python": platform.python_version(), "repeat": args.repeat, "processes": args.processes,
              "targets": {"cold_ms_median": 1.0}, "summary": summary, "ops": rows,
              "note": "first_ms of the suite's first op is not measured: it warms the process (see docstring)"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"cold median {summary['cold_ms_median']:.3f} ms (max {summary['cold_ms_max']:.3f}); first-in-process "
          f"median {summary['first_ms_median']:.3f} ms (max {summary['first_ms_max']:.3f}); warm median "
          f"{summary['warm_us_median']:.1f} us; exhaustive median {summary['exhaustive_ms_median']:.1f} ms; "
          f"top-5 identical: {summary['all_top5_same']} ({args.profile}, {len(rows)} ops) -> {args.out}")
    return 0


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
