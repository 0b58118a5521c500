"""NCCL all-reduce time against message size on this host's GPUs (issue 29: the NCCL model's data).

Run under torchrun, one process a GPU::

    torchrun --nproc_per_node 2 benchmarks/nccl_allreduce.py --out $OUT/nccl_allreduce_tp2.json
    torchrun --nproc_per_node 4 benchmarks/nccl_allreduce.py --out $OUT/nccl_allreduce_tp4.json

For each message size (bf16, 16 KiB to 256 MiB by factors of 2) every rank times ``--iters`` in-place
``all_reduce`` calls two ways: replayed from one CUDA graph (``measured_us``: what a graphed decode step
pays) and enqueued back to back from Python (``measured_enqueued_us``: an eager step, bound by the host's
enqueue for small messages). A size's time is the slowest rank's median (the collective ends when its
last rank does). Rank 0 writes the JSON: the measured
microseconds, the algorithm bandwidth (bytes / time) and NCCL's bus bandwidth (x 2(n-1)/n), beside
``autoopt.planning.split.allreduce_us``'s prediction for the link the detected profile reports
between GPU 0 and GPU 1, labelled ``predicted``. Device, driver, torch and NCCL versions are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: 16 KiB .. 256 MiB, factors of 2 (issue 29's range)
SIZES = [16 << 10 << i for i in range(15)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file rank 0 writes")
    ap.add_argument("--iters", type=int, default=30, help="timed all-reduces per size (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size (default %(default)s)")
    return ap.parse_args(argv)


def time_size(nbytes: int, iters: int, warmup: int, repeats: int = 3) -> float:
    """This rank's microseconds a bf16 all-reduce of ``nbytes``, in place: ``iters`` enqueued back to back
    between two CUDA events (as nccl-tests times them, so the host's enqueue overlaps the GPU's work),
    the median of ``repeats`` such windows. One all-reduce a window would time the host's enqueue:
    ~70 us for every size up to 4 MiB on the H100 host, against NCCL's ~10-20 us."""
    import torch
    import torch.distributed as dist

    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    for _ in range(warmup):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(times)


def time_size_graphed(nbytes: int, iters: int, repeats: int = 3) -> float:
    """This rank's microseconds a bf16 all-reduce of ``nbytes`` replayed from one CUDA graph of ``iters``
    of them (how a graphed tensor-parallel decode step runs its all-reduces: no host enqueue per call);
    the median of ``repeats`` replays."""
    import torch
    import torch.distributed as dist

    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (NCCL's communicator set up)
        for _ in range(3):
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            dist.all_reduce(x)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    del graph
    return statistics.median(times)


def predicted(nbytes: int, world: int) -> dict[str, Any]:
    """``allreduce_us`` for the detected profile's GPU 0 - GPU 1 link."""
    from autoopt.hardware.detection import detect
    from autoopt.planning.split import allreduce_us, devices_of, link_gbs

    profile = detect()
    devs = [d for d in devices_of(profile) if d.kind == "gpu"]
    bw, path = link_gbs(profile, devs[0], devs[1])
    return {"predicted_us": round(allreduce_us(nbytes, world, bw, path), 3), "link_gbs": bw, "path": path}


def environment() -> dict[str, Any]:
    """The device, NCCL's version and what every timing records (:func:`autoopt.backend.software.versions`)."""
    import torch

    from autoopt.backend.software import versions

    return {"device": torch.cuda.get_device_name(0), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            **versions()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    t0 = time.time()
    rows = []
    capture_error = None
    for nbytes in SIZES:
        try:
            graphed = time_size_graphed(nbytes, args.iters)
        except Exception as exc:  # a capture NCCL or torch refuses: recorded, the enqueued time still taken
            graphed, capture_error = float("nan"), f"{type(exc).__name__}: {exc}"[:300]
        mine = torch.tensor([graphed, time_size(nbytes, args.iters, args.warmup)], device="cuda")
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        us, eager_us = (float(v) for v in mine.tolist())
        algbw = nbytes / us / 1e3
        rows.append({"bytes": nbytes, "measured_us": round(us, 3), "measured_algbw_gbs": round(algbw, 2),
                     "measured_busbw_gbs": round(algbw * 2 * (world - 1) / world, 2),
                     "measured_enqueued_us": round(eager_us, 3)})
    if rank == 0:
        pred = {r["bytes"]: predicted(int(r["bytes"]), world) for r in rows}
        for r in rows:
            r.update(pred[r["bytes"]])
            r["predicted_over_measured"] = round(r["predicted_us"] / r["measured_us"], 3)
        report = {"env": environment(), "world": world, "dtype": "bf16", "iters": args.iters,
                  "capture_error": capture_error,
                  "rows": rows, "elapsed_s": round(time.time() - t0, 1)}
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
