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
after ``pip install``. The ``pyc`` children also run over folders holding a results store, as on a
machine someone tuned. Each store holds a measured row for every op of this plan (the shipped
picks, at their predicted time plus 5 %) and rows of other devices (``--store-rows`` in all):

- ``cold_pyc_store``: the steady state. The first process wrote the store's winners snapshot
  (:mod:`autoopt.results.winners`), and the children answer from it without SQLite.
- ``cold_pyc_store_first``: the first start-up after a tuning run. Its snapshot is deleted before
  each child, so each child opens the store with SQLite and writes the snapshot again.
- ``cold_pyc_store_differs``: a store whose winners differ from the shipped picks for
  ``--differ`` ops (a measured second candidate). Those ops fall back to rank(), which places the
  measured winner first.

The first version of this script used the machine's own cache folder, so its numbers depended on
whether a store happened to exist there.
Writes ``benchmarks/results/recommend_speed.json`` (``--out``)::

    PYTHONPATH=. python benchmarks/recommend_speed.py
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
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
                  "ranked": len(getattr(ranking, "_CACHE", ())) if ranking else 0,
                  "measured": sum(1 for o in rec.ops if o.measured_us is not None),
                  "sqlite": "sqlite3" in sys.modules}))
"""


def cold_runs(profile: str, model: str, runs: int, env: dict[str, str], runtime: str = "",
              before: Callable[[], None] | None = None) -> list[dict]:
    out = []
    for _ in range(runs):
        if before is not None:
            before()
        out.append(child_json(_CHILD, [profile, model, runtime], env))
    return out


def tuned_store(folder: Path, profile: str, model: str, runtime: str | None, *, differ: int, rows: int) -> None:
    """A results store in ``folder`` as a tuning run leaves it: a measured row for every op this plan
    ranks (its shipped pick, or for the first ``differ`` GEMMs rank()'s second candidate), then rows of
    other devices up to ``rows`` in all."""
    from autoopt.backend.registry import KERNELS
    from autoopt.hardware.library import load_profile
    from autoopt.planning import recommendation
    from autoopt.results import keys
    from autoopt.results.store import ResultStore
    from autoopt.search.ranking import rank

    hw = load_profile(profile)
    recommendation._RECORD = asked = []
    try:
        recommendation.recommend(hw, model, runtime=runtime)
    finally:
        recommendation._RECORD = None
    made, changed = [], 0
    for gpu, op in {(id(gpu), op): (gpu, op) for gpu, op in asked}.values():
        cands = rank(gpu, op, top=2).candidates
        pick = cands[0]
        if changed < differ and op.kind == "gemm" and len(cands) > 1:
            pick, changed = cands[1], changed + 1
        made.append(keys.make_result(gpu, op, pick.config, label="measured", us=pick.predicted_us * 1.05,
                                     kernel_module=KERNELS[pick.config.kernel].module))
    others = [type(r.env)(device=f"other-{i}", gpu="other", driver="1", torch=r.env.torch, triton=r.env.triton)
              for i, r in enumerate(made)]
    filler = [replace(r, env=others[i % len(others)], us=(r.us or 1.0) * (1 + i / rows))
              for i, r in zip(range(max(0, rows - len(made))), itertools.cycle(made))]
    with ResultStore(folder / "results.sqlite3") as store:
        store.put_many(made + filler)


def drop_snapshots(folder: Path) -> None:
    shutil.rmtree(folder / "winners", ignore_errors=True)


def summary(runs: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in runs)
            for key in ("autoopt_ms", "imports_ms", "load_ms", "recommend_ms", "rank_ms", "total_ms")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100-sxm-8x")
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--cold-runs", type=int, default=15, help="fresh processes per condition")
    ap.add_argument("--store-rows", type=int, default=20000, help="rows in each tuned store")
    ap.add_argument("--differ", type=int, default=4, help="GEMMs whose stored winner is not the shipped pick")
    ap.add_argument("--runtime", default="vllm", help="plan for this runtime's rules (vllm, ...; \"\" for none)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "recommend_speed.json"))
    args = ap.parse_args()
    runtime = args.runtime or None
    os.environ["AUTOOPT_CACHE_DIR"] = "off"  # this process builds the stores: it must not touch the user's cache
    with tempfile.TemporaryDirectory() as fresh, tempfile.TemporaryDirectory() as tuned, \
            tempfile.TemporaryDirectory() as differs, tempfile.TemporaryDirectory() as cache:
        tuned_store(Path(tuned), args.profile, args.model, runtime, differ=0, rows=args.store_rows)
        tuned_store(Path(differs), args.profile, args.model, runtime, differ=args.differ, rows=args.store_rows)
        base = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_CACHE_DIR": fresh}
        pyc_env = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
        pyc_env["PYTHONPYCACHEPREFIX"] = cache
        cold_runs(args.profile, args.model, 1, pyc_env, args.runtime)  # priming: writes the bytecode cache
        pyc = cold_runs(args.profile, args.model, args.cold_runs, pyc_env, args.runtime)
        stores = {}
        for name, folder in (("store_first", tuned), ("store", tuned), ("store_differs", differs)):
            env = {**pyc_env, "AUTOOPT_CACHE_DIR": folder}
            first = name == "store_first"
            if not first:  # the steady state: one start-up has written the snapshot
                cold_runs(args.profile, args.model, 1, env, args.runtime)
            stores[name] = cold_runs(args.profile, args.model, args.cold_runs, env, args.runtime,
                                     before=(lambda f=Path(folder): drop_snapshots(f)) if first else None)
        as_is = cold_runs(args.profile, args.model, args.cold_runs, base, args.runtime)

    from autoopt.hardware.library import load_profile
    from autoopt.planning.recommendation import recommend

    hw = load_profile(args.profile)
    recommend(hw, args.model, runtime=runtime)
    warm = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        recommend(hw, args.model, runtime=runtime)
        warm.append((time.perf_counter() - t) * 1e3)
    result = {
        "profile": args.profile, "model": args.model, "runtime": runtime, "device": cpu_name(), "cores": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.machine(),
        "store_rows": args.store_rows, "store_differs_ops": args.differ,
        "cold_pyc": summary(pyc), "cold_as_is": summary(as_is),
        **{f"cold_pyc_{name}": summary(runs) for name, runs in stores.items()},
        "cold_min_total_ms": {"pyc": min(r["total_ms"] for r in pyc), "as_is": min(r["total_ms"] for r in as_is),
                              **{f"pyc_{name}": min(r["total_ms"] for r in runs) for name, runs in stores.items()}},
        "cold_runs": {"pyc": pyc, "as_is": as_is, **{f"pyc_{name}": runs for name, runs in stores.items()}},
        "warm_ms_median": statistics.median(warm), "warm_ms_min": min(warm),
        "targets_ms": {"cold_total": 100, "warm": 10},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name in ("cold_pyc", "cold_as_is", "cold_pyc_store", "cold_pyc_store_first", "cold_pyc_store_differs"):
        s = result[name]
        print(f"{name}: total {s['total_ms']:.1f} ms = import autoopt {s['autoopt_ms']:.1f} + imports "
              f"{s['imports_ms']:.1f} + load_profile {s['load_ms']:.1f} + recommend {s['recommend_ms']:.1f} "
              f"(per-op answers {s['rank_ms']:.1f})")
    print(f"warm {result['warm_ms_median']:.2f} ms median / {result['warm_ms_min']:.2f} ms min -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
