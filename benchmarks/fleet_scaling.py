"""Issue 15's scaling run: one fixed sweep of (op, config) evaluations on one GPU, then on every GPU.

The sweep is the LLM suite's ops (``autoopt tune --suite llm``) with the ``--top`` best-predicted
configs of each, ranked for this host's GPU: a fixed list, so both runs evaluate exactly the same
items and each config's label and time can be compared run against run. Each run starts a fresh
pool (``autoopt.fleet.jobs.open_fleet``, the path of ``autoopt tune --gpus``: spawned workers, one per
GPU, evaluating with the tuner's own ``tune_item``) and a fresh, empty Triton cache, so compile time
counts in both. Wall time is measured from before the pool starts to the last outcome.

    PYTHONPATH=. python benchmarks/fleet_scaling.py --runs 0 all --out fleet_scaling.json

``--cli bench`` times the same fixed sweep as a user runs it, ``autoopt bench --suite llm --top K
--format json`` with each ``--gpus`` value (each row also times torch on the op's inputs).
``--cli tune`` times ``autoopt tune --suite llm --trials N --no-store --format jsonl`` (the adaptive
search: the configs tried can differ slightly between runs, so only the common ones are compared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.fleet import jobs
from autoopt.fleet.devices import local_devices
from autoopt.kernels.suite import suite
from autoopt.search.ranking import rank

#: two timings of one config on one GPU model differ by up to this much run to run (CUDA-event
#: medians of short kernels on H200s, measured in benchmarks/results/h200/*: a few per cent)
NOISE = 0.10


def sweep(top: int) -> list[jobs.Item]:
    """The fixed list: each suite op's ``top`` best-predicted configs for this host's first GPU."""
    device = local_devices("all")[0]
    items: list[jobs.Item] = []
    for _, op in suite("llm"):
        for cand in rank(device.gpu, op, top=top, measured=False).candidates:
            items.append(jobs._item(len(items), op, cand.config, device))
    return items


def run_once(items: list[jobs.Item], gpus: str) -> dict[str, Any]:
    """One fresh pool on ``gpus`` evaluating every item; wall time and each item's outcome."""
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton-{gpus.replace(',', '_')}-")
    t0 = time.perf_counter()
    landed: dict[int, float] = {}
    with jobs.open_fleet(mode="tune", gpus=gpus) as fleet:
        started = time.perf_counter() - t0
        outcomes = jobs.run_items(fleet.pool, items,
                                  lambda o: landed.setdefault(o.item, time.perf_counter() - t0))
        wall = time.perf_counter() - t0
        devices = [d.to_dict() for d in fleet.devices]
    rows = []
    for item in items:
        o = outcomes[item.id]
        r = dict(o.result or {})
        rows.append({"item": item.id, "op": item.op.get("shape"), "kind": item.op.get("kind"),
                     "config": dict(item.config), "status": o.status, "device": o.device,
                     "label": r.get("label", "failed"), "us": r.get("us"), "reason": o.reason or r.get("reason"),
                     "eval_s": r.get("eval_s"), "landed_s": round(landed[item.id], 3)})
    return {"gpus": gpus, "devices": devices, "pool_start_s": round(started, 3), "wall_s": round(wall, 3),
            "evals_per_s": round(len(items) / wall, 4), "per_device": busy(rows), "rows": rows}


def busy(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per device: items, seconds spent evaluating (the workers' own clocks), the first and last
    result: a gap between work and the last result is time the device waited."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        d = out.setdefault(row["device"], {"items": 0, "eval_s": 0.0, "first_s": 1e9, "last_s": 0.0})
        d["items"] += 1
        d["eval_s"] = round(d["eval_s"] + (row["eval_s"] or 0.0), 3)
        d["first_s"], d["last_s"] = min(d["first_s"], row["landed_s"]), max(d["last_s"], row["landed_s"])
    return out


def compare(one: dict[str, Any], many: dict[str, Any]) -> dict[str, Any]:
    """Labels must match config for config; measured times agree within noise."""
    label_diff = [a["item"] for a, b in zip(one["rows"], many["rows"], strict=True) if a["label"] != b["label"]]
    ratios = [b["us"] / a["us"] for a, b in zip(one["rows"], many["rows"], strict=True)
              if a["label"] == b["label"] == "measured" and a["us"] and b["us"]]
    dev = sorted(abs(r - 1) for r in ratios)
    speedup = one["wall_s"] / many["wall_s"]
    n = len(many["devices"])
    return {"configs": len(one["rows"]), "label_mismatches": label_diff, "timed_pairs": len(ratios),
            "time_ratio_median": round(statistics.median(ratios), 4) if ratios else None,
            "abs_dev_median": round(dev[len(dev) // 2], 4) if dev else None,
            "abs_dev_p90": round(dev[int(0.9 * (len(dev) - 1))], 4) if dev else None,
            "within_noise": sum(d <= NOISE for d in dev), "noise_bound": NOISE,
            "speedup": round(speedup, 3), "gpus": n, "scaling_efficiency": round(speedup / n, 3)}


def cli_run(command: str, gpus: str, n: int) -> dict[str, Any]:
    """``autoopt bench|tune --suite llm --gpus GPUS``, timed from the command's start to its exit."""
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton-cli-")}
    tail = (["--top", str(n), "--format", "json"] if command == "bench"
            else ["--trials", str(n), "--no-store", "--format", "jsonl"])
    cmd = [sys.executable, "-m", "autoopt", command, "--suite", "llm", "--gpus", gpus, *tail]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if command == "bench":
        rows = json.loads(proc.stdout)["rows"] if proc.returncode == 0 else []
        trials_out = [{"op": json.dumps(r["op"], sort_keys=True), "config": r["config"], "label": r["label"],
                       "measured_us": r["us"] if r["label"] == "measured" else None, "worker": r["worker"]}
                      for r in rows]
    else:
        trials_out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {"gpus": gpus, "command": " ".join(cmd[1:]), "rc": proc.returncode, "wall_s": round(wall, 3),
            "evaluations": len(trials_out), "evals_per_s": round(len(trials_out) / wall, 4),
            "stderr_tail": proc.stderr[-2000:], "trials": trials_out}


def compare_cli(one: dict[str, Any], many: dict[str, Any]) -> dict[str, Any]:
    def key(t: dict[str, Any]) -> tuple[str, str]:
        return t["op"], json.dumps(t.get("config"), sort_keys=True)

    a, b = {key(t): t for t in one["trials"]}, {key(t): t for t in many["trials"]}
    common = sorted(set(a) & set(b))
    same_label = sum(a[k].get("label") == b[k].get("label") for k in common)
    ratios = [b[k]["measured_us"] / a[k]["measured_us"] for k in common
              if a[k].get("measured_us") and b[k].get("measured_us")]
    return {"common_configs": len(common), "same_label": same_label,
            "time_ratio_median": round(statistics.median(ratios), 4) if ratios else None,
            "speedup": round(one["wall_s"] / many["wall_s"], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", nargs="+", default=["0", "all"], help="--gpus values, the first the baseline")
    ap.add_argument("--top", type=int, default=6, help="configs per suite op (20 ops)")
    ap.add_argument("--cli", choices=("bench", "tune"), help="time `autoopt bench|tune --gpus` instead")
    ap.add_argument("--trials", type=int, default=6, help="with --cli tune: --trials per op")
    args = ap.parse_args()
    from autoopt.backend.software import versions

    report: dict[str, Any] = {"versions": versions(), "host_cpus": os.cpu_count()}
    if args.cli:
        runs = [cli_run(args.cli, g, args.top if args.cli == "bench" else args.trials) for g in args.runs]
        report["cli"] = runs
        report["cli_comparison"] = [compare_cli(runs[0], r) for r in runs[1:]]
    else:
        items = sweep(args.top)
        runs = [run_once(items, g) for g in args.runs]
        report["sweep"] = {"ops": len(suite("llm")), "top": args.top, "configs": len(items)}
        report["runs"] = runs
        report["comparison"] = [compare(runs[0], r) for r in runs[1:]]
    Path(args.out).write_text(json.dumps(report, indent=1))
    for r in runs:
        print(f"--gpus {r['gpus']}: {r['wall_s']:.1f} s, {r['evals_per_s']:.3f} evals/s", file=sys.stderr)
    print(json.dumps(report.get("comparison") or report.get("cli_comparison"), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
