"""Why an uncompiled decode step's time moves from run to run: the regret harness times the same 8-layer
Llama-3-8B option at 8.9 ms in one run and 17.3 ms in another (``regret_1gpu_layers8*.json``), which no host
constant can predict within 15 %. This probe times blocks of eager decode steps in one process under four
conditions, interleaved: as the harness does, with Python's garbage collector off, pinned to one core, and
both; per block the step's median, its enqueue part (the forward's return, before the sync) and the host's
CPU clock.

    PYTHONPATH=. python benchmarks/probes/eager_host_noise.py --out r/eager_host_noise.json [--tiny]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CONDITIONS = ("harness", "gc_off", "pinned", "pinned_gc_off")


@contextmanager
def _condition(name: str) -> Iterator[None]:
    """Garbage collection off and/or the process on one core for the block's duration."""
    before = os.sched_getaffinity(0)
    if "pinned" in name:
        os.sched_setaffinity(0, {min(before)})
    if "gc_off" in name:
        gc.disable()
    try:
        yield
    finally:
        gc.enable()
        os.sched_setaffinity(0, before)


def _cpu_mhz() -> float | None:
    """Mean current clock of the host's cores (``/proc/cpuinfo``), or None where it does not say."""
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except OSError:
        return None
    return round(statistics.mean(mhz), 1) if mhz else None


def _block(step: Any, sync: Any, steps: int) -> dict[str, Any]:
    """``steps`` synchronised steps: median total and enqueue time (ms), and the block's CPU over wall time."""
    totals, enqueues = [], []
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        enqueues.append((t1 - t0) * 1e3)
        totals.append((t2 - t0) * 1e3)
    return {"measured_step_ms": round(statistics.median(totals), 3),
            "measured_enqueue_ms": round(statistics.median(enqueues), 3),
            "min_step_ms": round(min(totals), 3), "max_step_ms": round(max(totals), 3),
            "cpu_over_wall": round((time.process_time() - c0) / (time.perf_counter() - w0), 3),
            "cpu_mhz": _cpu_mhz(), "loadavg_1m": os.getloadavg()[0]}


def run(fmt: str, *, tiny: bool, layers: int, batch: int, steps: int, rounds: int) -> dict[str, Any]:
    import torch

    from autoopt.nn.e2e import _sync, build_model, eager_decode_step
    from autoopt.nn.optimize import optimize

    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = build_model("llama-3-8b", dtype="bf16", device=device, tiny=tiny, layers=layers)
    optimize(net, weights=None if fmt == "bf16" else fmt)
    step = eager_decode_step(net, batch, 16, steps * len(CONDITIONS) * rounds + 1)  # the blocks and a warm-up

    def sync() -> None:
        _sync(device)
    step()
    sync()  # warm-up, as the harness
    blocks: dict[str, list[dict[str, Any]]] = {c: [] for c in CONDITIONS}
    for _ in range(rounds):
        for c in CONDITIONS:
            with _condition(c):
                blocks[c].append(_block(step, sync, steps))
    del net
    summary = {c: {"median_of_blocks_ms": round(statistics.median(b["measured_step_ms"] for b in bs), 3),
                   "blocks_ms": [b["measured_step_ms"] for b in bs]} for c, bs in blocks.items()}
    return {"format": fmt, "batch": batch, "layers": layers, "summary": summary, "blocks": blocks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--formats", default="bf16,int4")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20, help="steps a block (the harness: 20)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--builds", type=int, default=2, help="models built a format (each optimised afresh)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (checks the probe on the CPU)")
    args = ap.parse_args()
    import torch

    from benchmarks.quant_e2e import environment

    env = environment() if torch.cuda.is_available() else {"device": "cpu", "torch": torch.__version__}
    result: dict[str, Any] = {"env": env, "cpu_count": os.cpu_count(), "variants": []}
    for build in range(args.builds):
        for fmt in args.formats.split(","):
            result["variants"].append({"build": build, **run(fmt, tiny=args.tiny, layers=args.layers,
                                                              batch=args.batch, steps=args.steps, rounds=args.rounds)})
            print(fmt, build, json.dumps(result["variants"][-1]["summary"]), flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
