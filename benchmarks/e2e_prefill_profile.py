"""Where a prefill's GPU time goes, by kernel: transformers + torch.compile against autoopt.optimize +
torch.compile on one real architecture (random bf16 weights), same process.

Diagnostic for the end-to-end prefill gap (issue 11): prints and writes the top kernels of each
variant's prefill with their total GPU time, each variant's wall time per prefill, the host time
to enqueue one prefill, and the host-side ops with the most self CPU time.

    PYTHONPATH=. python benchmarks/e2e_prefill_profile.py --model llama-3-8b --batch 1 --seq 2048 \
        --out prefill_profile.json

``--weights int4`` (or fp8, int8) quantizes in ``optimize()`` and profiles that model's prefill uncompiled as well
as compiled (issue 27: int4's compiled prefill measured slower than its eager one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.backend.runner import _versions
from autoopt.nn.e2e import _median_ms, _prefill_forward, build_model


def _top_kernels(fn, top: int) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        us = float(getattr(evt, "device_time_total", 0.0) or 0.0)
        if us > 0 and getattr(evt, "device_type", None) == torch.autograd.DeviceType.CUDA:
            rows.append({"kernel": evt.key[:120], "us": round(us, 1), "calls": evt.count})
    rows.sort(key=lambda r: -r["us"])
    return [{"total_us": round(sum(r["us"] for r in rows), 1)}, *rows[:top]]


def _enqueue_ms(fn, reps: int = 10) -> float:
    """Median host time to issue one forward without waiting for the GPU: when it exceeds the GPU's
    kernel time, the forward is bound by the host (Python and launch overhead), not the kernels."""
    import statistics
    import time

    import torch

    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def _top_cpu(fn, top: int) -> list[dict]:
    """The host-side ops with the most self CPU time in one forward (``torch.profiler``, CPU activity)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = [{"op": e.key[:120], "self_cpu_us": round(float(e.self_cpu_time_total), 1), "calls": e.count}
            for e in prof.key_averages()]
    rows.sort(key=lambda r: -r["self_cpu_us"])
    return [{"total_self_cpu_us": round(sum(r["self_cpu_us"] for r in rows), 1)}, *rows[:top]]


def main() -> int:
    import torch

    import autoopt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--weights", default="bf16", help="optimize()'s weight format (default %(default)s)")
    ap.add_argument("--use-cache", action="store_true", help="prefill into a fresh DynamicCache (a plain model(ids) "
                    "call) instead of use_cache=False")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    model = build_model(args.model)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), device="cuda")
    result: dict = {"model": args.model, "batch": args.batch, "seq": args.seq, "device": torch.cuda.get_device_name(),
                    "weights": args.weights, "use_cache": args.use_cache, "versions": _versions()}
    variants = ["compile", *([] if args.weights == "bf16" else ["optimize"]), "optimize+compile"]
    for variant in variants:
        if variant == variants[1]:  # the first optimize() variant: the model is optimized once, in place
            autoopt.optimize(model, weights=args.weights)
        fwd = _prefill_forward(model, compiled=variant.endswith("compile"))
        with torch.no_grad():
            step = lambda f=fwd: f(input_ids=ids, use_cache=args.use_cache)  # noqa: E731
            for _ in range(3):
                step()
            ms = _median_ms(step, "cuda", 10)
            kernels = _top_kernels(step, args.top)
            enqueue = _enqueue_ms(step)
            cpu = _top_cpu(step, args.top)
        result[variant] = {"prefill_ms": round(ms, 3), "enqueue_ms": round(enqueue, 3), "kernels": kernels,
                           "cpu": cpu}
        print(f"{variant}: {ms:.2f} ms wall, {kernels[0]['total_us'] / 1e3:.2f} ms GPU kernels, "
              f"{enqueue:.2f} ms to enqueue")
        for r in kernels[1:]:
            print(f"   {r['us']:10.1f} us  x{r['calls']:<4d} {r['kernel']}")
        for r in cpu[1:]:
            print(f"   cpu {r['self_cpu_us']:10.1f} us  x{r['calls']:<4d} {r['op']}")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
