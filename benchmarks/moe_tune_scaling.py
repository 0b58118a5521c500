"""How fast ``autoopt export moe-configs --tune`` sweeps one (E, N, format) on one GPU and on all of them (issue 28).

Runs the CLI twice in fresh processes, as a user would (``--no-store``, so neither run reads the other's
measurements): once on one GPU, once with ``--gpus all``; records each wall time, the speed-up and whether
the two runs wrote the same files, M keys and labels.

    PYTHONPATH=. python benchmarks/moe_tune_scaling.py --out moe_tune_scaling.json [--model mixtral-8x7b --tp 8]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _sweep(model: str, tp: int, folder: Path, gpus: str | None, extra_env: dict[str, str] | None = None
           ) -> tuple[float, dict[str, Any], str]:
    """(wall seconds, {file name: its JSON}, the CLI's stderr tail) of one tuned export."""
    cmd = [sys.executable, "-m", "autoopt", "export", "moe-configs", "--model", model, "--tp", str(tp), "--tune",
           "--no-store", "--out", str(folder)] + (["--gpus", gpus] if gpus else [])
    # each sweep compiles into its own empty Triton cache: a later sweep must not find the kernels an earlier
    # one compiled (the first runs of this script shared ~/.triton/cache, so only the first sweep compiled)
    env = {**os.environ, "TRITON_CACHE_DIR": str(folder.with_name(folder.name + "_triton_cache")), **(extra_env or {})}
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} exited {run.returncode}: {run.stderr.strip()[-600:]}")
    files = {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    return wall, files, run.stderr.strip()[-1200:]


def _fleet_line(log: str) -> str | None:
    """The CLI's ``autoopt: fleet: ...`` line (evaluations, each worker's busy and compiling seconds)."""
    return next((line for line in log.splitlines() if line.startswith("autoopt: fleet:")), None)


def _labels(files: dict[str, Any]) -> dict[str, list[str]]:
    return {name: sorted(k for k in body if k != "triton_version") for name, body in files.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--no-ahead", action="store_true", help="also sweep --gpus all with AUTOOPT_PRECOMPILE=0 (no "
                    "compile-ahead: each GPU worker compiles its own trials' kernels)")
    ap.add_argument("--pool", type=int, default=0, help="also sweep --gpus all with AUTOOPT_PRECOMPILE_WORKERS=N "
                    "(the compile-ahead pool's size)")
    ap.add_argument("--fleet-of-one", action="store_true", help="also sweep with --gpus 0 (the fleet's path, one GPU)")
    args = ap.parse_args(argv)
    import torch

    from autoopt.backend.software import versions

    env = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "gpus": torch.cuda.device_count(), **versions()}
    with tempfile.TemporaryDirectory() as tmp:
        one_s, one, one_log = _sweep(args.model, args.tp, Path(tmp) / "one", None)
        all_s, every, all_log = _sweep(args.model, args.tp, Path(tmp) / "all", "all")
        fleet_one = _sweep(args.model, args.tp, Path(tmp) / "fleet_one", "0") if args.fleet_of_one else None
        no_ahead = (_sweep(args.model, args.tp, Path(tmp) / "no_ahead", "all", {"AUTOOPT_PRECOMPILE": "0"})
                    if args.no_ahead else None)
        pool = (_sweep(args.model, args.tp, Path(tmp) / "pool", "all", {"AUTOOPT_PRECOMPILE_WORKERS": str(args.pool)})
                if args.pool else None)
    same = sum(one[f][m] == every[f][m] for f in one if f in every for m in one[f] if m in every[f])
    result = {"env": env, "model": args.model, "tp": args.tp, "timing": "graph replay (do_bench_cudagraph)",
              "triton_cache": "empty for each sweep",
              "one_gpu_s": round(one_s, 1), "all_gpus_s": round(all_s, 1), "speedup": round(one_s / all_s, 2),
              "same_files": sorted(one) == sorted(every), "same_m_keys": _labels(one) == _labels(every),
              "same_configs": same, "one": one, "all": every, "one_log_tail": one_log, "all_log_tail": all_log,
              "all_fleet_line": _fleet_line(all_log)}
    if no_ahead is not None:  # each GPU worker compiling its own trials' kernels (AUTOOPT_PRECOMPILE=0)
        result.update(no_ahead_gpus_s=round(no_ahead[0], 1), no_ahead_speedup=round(one_s / no_ahead[0], 2),
                      no_ahead_fleet_line=_fleet_line(no_ahead[2]), no_ahead_log_tail=no_ahead[2])
    if pool is not None:  # the compile-ahead pool at another size
        result.update(pool_workers=args.pool, pool_gpus_s=round(pool[0], 1), pool_speedup=round(one_s / pool[0], 2),
                      pool_fleet_line=_fleet_line(pool[2]), pool_log_tail=pool[2])
    if fleet_one is not None:  # the fleet's machinery on one GPU: its per-trial cost beside the in-process tuner's
        result.update(fleet_one_s=round(fleet_one[0], 1), fleet_one_fleet_line=_fleet_line(fleet_one[2]),
                      fleet_one_log_tail=fleet_one[2])
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result.get(k) for k in ("one_gpu_s", "all_gpus_s", "speedup", "same_files", "same_m_keys",
                                                 "same_configs", "all_fleet_line", "no_ahead_gpus_s",
                                                 "no_ahead_speedup", "pool_workers", "pool_gpus_s", "pool_speedup",
                                                 "pool_fleet_line", "fleet_one_s",
                                                 "fleet_one_fleet_line")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
