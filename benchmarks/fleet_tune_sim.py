"""The tuner's fleet path on CPU stand-ins whose costs mimic the runner's, to study its scheduling.

Each fake GPU (``AUTOOPT_FLEET_FAKE_GPUS``) answers a trial with the cost model's time after sleeping
what the 2 x H200 measured (benchmarks/results/h200x2/fleet_scaling_lpt.json): ``--eval-s`` for
any config, plus ``--setup-s`` when the op is not among the worker's last four (the runner caches four
ops' inputs and float64 references). The tuner's fleet path (``autoopt tune --suite llm --gpus``) then
runs on one stand-in and on two. No GPU: the numbers are a simulation, and are labelled as one.

    PYTHONPATH=. python benchmarks/fleet_tune_sim.py --trials 5 --out sim.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EVALUATOR = "benchmarks.fleet_tune_sim:simulated"
_RECENT: list[str] = []


def simulated(op: dict[str, Any], config: dict[str, Any], *, device: str, profile: str | None = None) -> Any:
    """A worker's trial: sleep like the runner would, answer with the cost model's time (label
    ``measured`` so the tuner treats it as a timing; this file's report says it was simulated)."""
    from autoopt.backend.runner import Result
    from autoopt.fleet.worker import worker_gpu
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import predict_config

    key = json.dumps(op, sort_keys=True)
    setup = key not in _RECENT
    if not setup:
        _RECENT.remove(key)
    _RECENT.append(key)
    del _RECENT[:-4]
    time.sleep(float(os.environ["SIM_EVAL_S"]) + (float(os.environ["SIM_SETUP_S"]) if setup else 0.0))
    gpu = worker_gpu(device, profile)
    spec, cfg = OpSpec.from_dict(op), KernelConfig.from_dict(config)
    res = Result(op=spec, config=cfg, label="measured", us=predict_config(gpu, spec, cfg).us, device=device)
    return {**res.to_dict(), "worker_device": device, "fingerprint": gpu.device_fingerprint, "gpu": gpu.to_dict()}


def run(gpus: str, trials: int) -> dict[str, Any]:
    from autoopt.fleet import jobs
    from autoopt.kernels.suite import suite

    t0 = time.perf_counter()
    with jobs.open_fleet(mode="tune", gpus=gpus, evaluator=EVALUATOR) as fleet:
        done = jobs.tune(fleet, suite("llm"), budget_trials=trials, use_store=False)
    wall = time.perf_counter() - t0
    return {"gpus": gpus, "wall_s": round(wall, 2), "trials": sum(len(d.result.trials) for d in done)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--eval-s", type=float, default=0.35, help="seconds per trial of a warm op")
    ap.add_argument("--setup-s", type=float, default=0.75, help="extra seconds for an op the worker lacks")
    args = ap.parse_args()
    os.environ.update({"AUTOOPT_FLEET_FAKE_GPUS": "h200,h200", "SIM_EVAL_S": str(args.eval_s),
                       "SIM_SETUP_S": str(args.setup_s)})
    runs = [run(g, args.trials) for g in ("0", "all")]
    report = {"simulated": True, "eval_s": args.eval_s, "setup_s": args.setup_s, "runs": runs,
              "speedup": round(runs[0]["wall_s"] / runs[1]["wall_s"], 3)}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
