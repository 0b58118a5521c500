"""Does the GPU wait for the host's graph launch between tokens? (issue 27: int4 through ``generate()`` loses
0.4-0.6 ms a token to the host beyond its graphed step on the lent H200s; ``generate_host.json`` on an H100 put
0.48 ms of it inside the compiled call, where autoopt's decode graph computes its signature, copies its inputs
and replays.)

For the optimize()d Llama-3-8B (random weights, ``--format``, batch 1) the compiled decode step is captured in one
CUDA graph (``capture_decode_step``) and timed four ways, all measured:

- ``back_to_back_ms``: replays queued without a sync (the GPU time of a step, as before);
- ``replay_host_us``: the host time of one ``replay()`` call (``cudaGraphLaunch``), the queue empty before it;
- ``synced_ms``: replay then ``synchronize()``, one step at a time (what a token of ``generate()`` pays at least);
- ``synced_minus_back_to_back_us``: their difference, the GPU's idle time a token from the launch alone;

and the same for a one-kernel graph, the floor of a launch and a sync. ``nodes``: kernels in the step's graph.

    PYTHONPATH=. python benchmarks/probes/graph_launch.py --out $OUT/graph_launch.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.model_kit import no_cuda, optimized_llama

PROMPT = 128


def timings(replay: Any, steps: int = 64) -> dict[str, float]:
    """The four figures of the module docstring for one captured graph's ``replay``."""
    import torch

    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        replay()
    end.record()
    torch.cuda.synchronize()
    back = start.elapsed_time(end) / steps
    host, synced = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e6)
        synced.append((t2 - t0) * 1e3)
    s = statistics.median(synced)
    return {"back_to_back_ms": round(back, 4), "replay_host_us": round(statistics.median(host), 1),
            "synced_ms": round(s, 4), "synced_minus_back_to_back_us": round((s - back) * 1e3, 1)}


def tiny_graph() -> Any:
    import torch

    x = torch.zeros(1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        x.add_(1)
    return graph


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--format", default="int4", choices=("bf16", "fp8", "int8", "int4"))
    ap.add_argument("--layers", type=int, default=None)
    args = ap.parse_args(argv)
    if no_cuda("graph_launch", "CUDA graphs"):
        return 2
    from autoopt.nn.e2e import capture_decode_step
    from benchmarks.quant_e2e import environment

    report: dict[str, Any] = {"env": environment(), "model": "llama-3-8b", "layers": args.layers,
                              "format": args.format, "label": "measured"}
    tiny = tiny_graph()
    report["one_kernel_graph"] = timings(tiny.replay, 256)
    model, _ = optimized_llama(args.format, args.layers)
    captured = capture_decode_step(model, 1, PROMPT, PROMPT + 400, compiled=True)
    graph = getattr(captured, "graph", None)
    if graph is not None and hasattr(graph, "raw_cuda_graph"):
        try:  # the node count, where this torch exposes the cudaGraph_t (cuda-python absent: left out)
            from cuda.bindings import runtime as cudart

            report["nodes"] = int(cudart.cudaGraphGetNodes(graph.raw_cuda_graph(), 0)[2])
        except Exception as exc:  # an optional figure
            report["nodes_error"] = f"{type(exc).__name__}: {exc}"[:200]
    report["decode_step_graph"] = timings(captured.replay, 64)
    report["one_kernel_graph_after"] = timings(tiny.replay, 256)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
