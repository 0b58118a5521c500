"""Time recommend(): cold (first call in a fresh process) and warm (repeat calls in one process).

Targets: ``recommend(load_profile("h100-sxm-8x"), "llama-3-70b", runtime="vllm")`` cold <= 100 ms
including ``import autoopt`` and loading the profile, warm <= 10 ms. Each cold run is a fresh
``python -c`` child that times:

- ``autoopt_ms``: ``import autoopt`` itself;
- ``imports_ms``: importing autoopt.library and autoopt.recommendation (and what they import);
- ``load_ms``: ``load_profile(name)`` (reads and checks that profile's YAML file; its parsed data comes
  from the shipped mirror while the text is unchanged, else PyYAML parses it);
- ``recommend_ms``: the first ``recommend()`` (model catalog, plugin discovery, every distinct op's
  best config), of which ``rank_ms`` inside ``recommendation._rank``: the shipped rank cache
  (``autoopt/search/shipped``) plus the measured-winner lookup per op, or rank() for ops it lacks;
- ``ranked``: how many ops rank() itself ranked (0 while the shipped cache is current);
- ``total_ms``: all four, the number the cold target names.

Children run twice over: with compiled bytecode cached (``pyc``, how an installed package runs:
a priming child writes it to a temporary PYTHONPYCACHEPREFIX) and as this environment runs them
(``as_is``: with PYTHONDONTWRITEBYTECODE set every import compiles its module from source).
Both use an empty cache folder (``AUTOOPT_CACHE_DIR``): a machine that has measured nothing, as
after ``pip install``. ``cold_pyc_store`` runs the ``pyc`` children over a folder holding a results
store, as on a machine someone tuned: its first lookup imports SQLite and opens the file (~6 ms on
the 2-core box). The first version of this script used the machine's own cache folder, so its
numbers depended on whether a store happened to exist there.
Writes ``benchmarks/results/recommend_speed.json`` (``--out``)::

    PYTHONPATH=. python benchmarks/recommend_speed.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.host_timing import child_json, cpu_name  # noqa: E402

_CHILD = r"""
import time
t_start = time.perf_counter()
import autoopt
t0 = time.perf_counter()
import json, sys
import autoopt.hardware.library, autoopt.planning.recommendation
t1 = time.perf_counter()
hw = autoopt.hardware.library.load_profile(sys.argv[1])
t2 = time.perf_counter()
rec_mod = autoopt.planning.recommendation
orig = rec_mod._rank
spent = [0.0]
def timed(*a, **k):
    s = time.perf_counter()
    try:
        return orig(*a, **k)
    finally:
        spent[0] += time.perf_counter() - s
rec_mod._rank = timed
t3 = time.perf_counter()
rec = rec_mod.recommend(hw, sys.argv[2], runtime=sys.argv[3] or None)
t4 = time.perf_counter()
ranking = sys.modules.get("autoopt.search.ranking")
print(json.dumps({"autoopt_ms": (t0 - t_start) * 1e3, "imports_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3,
                  "recommend_ms": (t4 - t3) * 1e3, "rank_ms": spent[0] * 1e3,
                  "total_ms": (t4 - t3 + t2 - t_start) * 1e3, "split": rec.split.kind if rec.split else None,
                  "format": rec.quant.format.name, "ops": len(rec.ops), "yaml": "yaml" in sys.modules,
                  "ranked": len(getattr(ranking, "_CACHE", ())) if ranking else 0}))
"""


def cold_runs(profile: str, model: str, runs: int, env: dict[str, str], runtime: str = "") -> list[dict]:
    return [child_json(_CHILD, [profile, model, runtime], env) for _ in range(runs)]


def summary(runs: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in runs)
            for key in ("autoopt_ms", "imports_ms", "load_ms", "recommend_ms", "rank_ms", "total_ms")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100-sxm-8x")
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--cold-runs", type=int, default=15, help="fresh processes per condition")
    ap.add_argument("--runtime", default="vllm", help="plan for this runtime's rules (vllm, ...; \"\" for none)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "recommend_speed.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as fresh, tempfile.TemporaryDirectory() as tuned, \
            tempfile.TemporaryDirectory() as cache:
        from autoopt.results.store import ResultStore

        ResultStore(Path(tuned) / "results.sqlite3").close()  # the store a tuned machine has
        base = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_CACHE_DIR": fresh}
        pyc_env = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
        pyc_env["PYTHONPYCACHEPREFIX"] = cache
        cold_runs(args.profile, args.model, 1, pyc_env, args.runtime)  # priming: writes the bytecode cache
        pyc = cold_runs(args.profile, args.model, args.cold_runs, pyc_env, args.runtime)
        pyc_store = cold_runs(args.profile, args.model, args.cold_runs, {**pyc_env, "AUTOOPT_CACHE_DIR": tuned},
                              args.runtime)
        as_is = cold_runs(args.profile, args.model, args.cold_runs, base, args.runtime)

    from autoopt.hardware.library import load_profile
    from autoopt.planning.recommendation import recommend

    hw = load_profile(args.profile)
    runtime = args.runtime or None
    recommend(hw, args.model, runtime=runtime)
    warm = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        recommend(hw, args.model, runtime=runtime)
        warm.append((time.perf_counter() - t) * 1e3)
    result = {
        "profile": args.profile, "model": args.model, "runtime": runtime, "device": cpu_name(), "cores": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.machine(),
        "cold_pyc": summary(pyc), "cold_as_is": summary(as_is), "cold_pyc_store": summary(pyc_store),
        "cold_min_total_ms": {"pyc": min(r["total_ms"] for r in pyc), "as_is": min(r["total_ms"] for r in as_is),
                              "pyc_store": min(r["total_ms"] for r in pyc_store)},
        "cold_runs": {"pyc": pyc, "as_is": as_is, "pyc_store": pyc_store},
        "warm_ms_median": statistics.median(warm), "warm_ms_min": min(warm),
        "targets_ms": {"cold_total": 100, "warm": 10},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name in ("cold_pyc", "cold_as_is", "cold_pyc_store"):
        s = result[name]
        print(f"{name}: total {s['total_ms']:.1f} ms = import autoopt {s['autoopt_ms']:.1f} + imports "
              f"{s['imports_ms']:.1f} + load_profile {s['load_ms']:.1f} + recommend {s['recommend_ms']:.1f} "
              f"(per-op answers {s['rank_ms']:.1f})")
    print(f"warm {result['warm_ms_median']:.2f} ms median / {result['warm_ms_min']:.2f} ms min -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
