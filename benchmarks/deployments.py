"""autoopt's plans against published deployments (tests/data/deployments.yaml).

One question: for each real deployment someone published (model, GPUs, runtime, settings, measured
tokens/s or memory), is autoopt's plan for that runtime runnable, is it predicted at least as fast as
the published setting, and how far is the prediction from what the source measured? Writes
benchmarks/results/deployments.json and prints a table (CPU only: predictions, no GPU):

    PYTHONPATH=. python benchmarks/deployments.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoopt.validation.deployments import evaluate  # noqa: E402


def main() -> int:
    rows = yaml.safe_load((ROOT / "tests/data/deployments.yaml").read_text())["deployments"]
    done, skipped = [], []
    for row in rows:
        if not row.get("catalog") or not row["gpus"].get("profile"):
            skipped.append({"id": row["id"], "why": "model or GPU not in autoopt's catalog/profiles"})
            continue
        done.append(evaluate(row))
    ratios = {k: [d["measured"][k]["ratio"] for d in done if k in d.get("measured", {})]
              for k in ("tokens_per_s", "memory_gb")}
    summary = {k: {"n": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
               for k, v in ratios.items() if v}
    out = {"rows": done, "skipped": skipped, "predicted_over_measured": summary,
           "label": "predicted (autoopt's cost model) vs measured (as published by each source)"}
    (ROOT / "benchmarks/results/deployments.json").write_text(json.dumps(out, indent=1) + "\n")
    for d in done:
        a, p = d["autoopt"], d["published"]
        meas = d.get("measured", {}).get("tokens_per_s", {})
        print(f"{d['id'][:44]:44s} autoopt {a['format']:>8s} tp{a['tp']} pp{a['pp']}  published "
              f"{p.get('format', '-'):>8s}  published/autoopt time {d.get('autoopt_vs_published')}  "
              f"tokens/s pred/meas {meas.get('ratio', '-')}")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
