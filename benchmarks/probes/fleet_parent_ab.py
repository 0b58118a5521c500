"""Does the fleet's parent finding its GPUs without torch shorten a tuned MoE export on all GPUs? (issue 28: no)

Runs ``autoopt export moe-configs --tune --no-store`` in fresh processes, as ``moe_tune_scaling.py`` does:
once on one GPU (the baseline), then with ``--gpus all`` alternating two parents: ``torch`` (as shipped:
the parent's detection captures torch) and ``nvml`` (NVML and the profile library only, which give a known
GPU the same profile). Each sweep compiles into its own empty Triton cache. Records each wall time and the
CLI's ``autoopt: fleet:`` line (per worker: evaluations, busy seconds, boot, phases). On four H200s
(h200/fleet_parent_ab.json) the ``nvml`` parent took 45.1 / 44.8 s against 31.1 s: its lanes then import
torch when they make the compile-ahead pool, after the workers are spawned, and the workers waited 6.7-7.3 s
for their first item (0.9 s) and spent 7.8-9.6 s setting up inputs (2.8-3.0 s). Not shipped.

    PYTHONPATH=. python benchmarks/probes/fleet_parent_ab.py --out fleet_parent_ab.json [--order nvml,torch,nvml]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: the parent's program for each variant: the CLI, with the ``nvml`` one's device detection skipping torch
PARENT = {
    "torch": "from autoopt.cli import main; raise SystemExit(main(sys.argv[1:]))",
    "nvml": ("from autoopt.fleet import devices; from autoopt.hardware.detection import detect; "
             "devices._detected_devices = lambda: {g.index: devices.Device(name=str(g.index), gpu=g) "
             "for g in detect(use_torch=False).gpus}; from autoopt.cli import main; "
             "raise SystemExit(main(sys.argv[1:]))"),
}


def sweep(variant: str, gpus: str | None, folder: Path) -> dict[str, object]:
    args = ["export", "moe-configs", "--model", "mixtral-8x7b", "--tp", "8", "--tune", "--no-store",
            "--out", str(folder / "o")] + (["--gpus", gpus] if gpus else [])
    env = {**os.environ, "TRITON_CACHE_DIR": str(folder / "triton_cache")}
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", "import sys; " + PARENT[variant], *args], capture_output=True,
                         text=True, timeout=900, env=env)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"{variant} {gpus}: exit {run.returncode}: {run.stderr.strip()[-600:]}")
    line = next((x for x in run.stderr.splitlines() if x.startswith("autoopt: fleet:")), None)
    return {"variant": variant, "gpus": gpus or "one (no --gpus)", "wall_s": round(wall, 1), "fleet_line": line}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--order", default="nvml,torch,nvml")
    a = ap.parse_args()
    from autoopt.backend.runner import _versions

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (variant, gpus) in enumerate([("torch", None)] + [(v, "all") for v in a.order.split(",")]):
            rows.append(sweep(variant, gpus, Path(tmp) / str(i)))
            print(json.dumps(rows[-1]), flush=True)
    one = rows[0]["wall_s"]
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    out = {"model": "mixtral-8x7b", "tp": 8, "gpus": smi, "versions": _versions(), "rows": rows,
           "speedup_by_variant": {v: [round(one / r["wall_s"], 2) for r in rows[1:] if r["variant"] == v]
                                  for v in dict.fromkeys(a.order.split(","))}}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out["speedup_by_variant"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
