"""Host (Python) cost of the autoopt.nn ops: dispatch, prepare, custom-op call, against torch's own op.

    PYTHONPATH=. python benchmarks/nn_overhead.py [--out benchmarks/results/nn_overhead.json]

On a CUDA GPU (tiny shapes, so the GPU finishes each kernel before the host issues the next and the
loop measures the host): per call, in microseconds, median of ``--repeat`` loops of ``--calls`` calls,

- ``dispatch_warm_us`` / ``dispatch_cold_ms``: :func:`autoopt.nn.dispatch.choose` cached / for a new shape;
- ``prepare_us[kernel]``: :func:`autoopt.backend.registry.prepare` alone (binds a config, no launch);
- ``launch_us[kernel]``: calling a prepared launcher (Triton's launch path alone);
- ``public_us[op]``: the public function (``autoopt.nn.linear`` ...): validation, dispatch, allocation,
  prepare, launch, through the custom op; ``torch_us[op]``: the torch op it replaces;
- ``quant_public_us[format]``: ``autoopt.nn.ops.quant_linear`` (what a quantized linear runs) per weight format.

Without CUDA (Triton interpreter) only dispatch and prepare are measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def per_call_us(fn: Any, calls: int, repeat: int, sync: Any) -> float:
    for _ in range(20):
        fn()
    sync()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def host_us(fn: Any, calls: int = 100, repeat: int = 5) -> float:
    """Host time per call to issue ``fn`` (no waiting on the GPU: ``calls`` launches stay below the
    launch queue's depth, so a long kernel does not block the host), median of ``repeat``."""
    import torch

    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(runs)


def _prefill_host(ann: Any, dispatch: Any, prepare: Any, dt: Any, dev: Any) -> dict[str, Any]:
    """Host cost per call at a Llama-3-8B prefill's shapes (1 x 2048 tokens), where the kernels are the
    TMA GEMM and the row kernels: the public op, its dispatch, prepare (binding) and launch alone."""
    import torch

    m = 2048
    x = torch.randn(m, 4096, device=dev, dtype=dt)
    w = torch.randn(4096, 4096, device=dev, dtype=dt) / 64
    nw = torch.randn(4096, device=dev, dtype=dt)
    gu = torch.randn(m, 2 * 14336, device=dev, dtype=dt)
    out: dict[str, Any] = {}
    with torch.inference_mode():
        choice = dispatch.choose("linear", "gemm", (m, 4096, 4096), dt, dev)
        out["linear_kernel"] = choice.describe()
        y = torch.empty(m, 4096, device=dev, dtype=dt)
        out["linear_public_us"] = host_us(lambda: ann.linear(x, w))
        out["linear_custom_op_us"] = host_us(lambda: torch.ops.autoopt.linear(x, w, None))
        out["linear_dispatch_us"] = host_us(lambda: dispatch.choose("linear", "gemm", (m, 4096, 4096), dt, dev))
        out["linear_prepare_us"] = host_us(lambda: prepare({"a": x, "w": w}, choice.config, y))
        run = prepare({"a": x, "w": w}, choice.config, y)
        out["linear_launch_us"] = host_us(run)
        out["torch_linear_us"] = host_us(lambda: torch.nn.functional.linear(x, w))
        out["rms_norm_public_us"] = host_us(lambda: ann.rms_norm(x, nw, 1e-5))
        out["swiglu_public_us"] = host_us(lambda: ann.swiglu(gu))
        out["empty_us"] = host_us(lambda: torch.empty(m, 4096, device=dev, dtype=dt))
    return out


def _quant_host(dt: Any, dev: Any, calls: int, repeat: int, sync: Any) -> dict[str, Any]:
    """Per call, in us: ``autoopt.nn.ops.quant_linear`` (the op every quantized linear runs) at a decode shape
    (1 x 256 x 256: the host's cost, the kernel is ~5 us) per format, beside torch's F.linear on the 16-bit
    weight: what a quantized model's ops add on the host that a CUDA graph must hide."""
    import torch

    from autoopt.backend.quant import quantize
    from autoopt.kernels.quant import parse_weight
    from autoopt.nn.ops import quant_linear

    x = torch.randn(1, 256, device=dev, dtype=dt)
    w = torch.randn(256, 256, device=dev, dtype=dt) / 16
    out: dict[str, Any] = {"torch_linear_bf16": per_call_us(lambda: torch.nn.functional.linear(x, w), calls,
                                                            repeat, sync)}
    with torch.inference_mode():
        for spec in ("fp8", "int8", "int4", "int4-asym"):
            qw = quantize(w, parse_weight(spec))

            def call(qw: Any = qw, spec: str = spec) -> Any:
                return quant_linear(x, qw.qweight, qw.scales, qw.offsets, weight=qw.fmt.spec, k=256)
            call()  # rank + compile
            out[spec] = per_call_us(call, calls, repeat, sync)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import os

    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch.nn.functional as F

    import autoopt.nn as ann
    from autoopt.backend.registry import prepare
    from autoopt.nn import dispatch

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dt = torch.bfloat16 if cuda else torch.float16
    if cuda:
        torch.set_float32_matmul_precision("high")
    else:
        dispatch.set_profile("h100-sxm")
    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu (interpreter)",
                           "torch": torch.__version__, "python": platform.python_version(), "dtype": str(dt)}
    import triton
    res["triton"] = triton.__version__

    t0 = time.perf_counter()
    dispatch.choose("linear", "gemv", (1, 256, 256), dt, dev)
    res["dispatch_first_ms"] = (time.perf_counter() - t0) * 1e3  # detection + plugins + the first rank
    cold = []
    for n in range(512, 512 + 64 * 15, 64):
        t0 = time.perf_counter()
        dispatch.choose("linear", "gemm", (100, n, 4096), dt, dev)
        cold.append((time.perf_counter() - t0) * 1e3)
    res["dispatch_cold_ms"] = statistics.median(cold)
    res["dispatch_warm_us"] = per_call_us(lambda: dispatch.choose("linear", "gemv", (1, 256, 256), dt, dev),
                                          args.calls, args.repeat, lambda: None)

    x1, w = torch.randn(1, 256, device=dev, dtype=dt), torch.randn(256, 256, device=dev, dtype=dt) / 16
    xr, nw = torch.randn(4, 256, device=dev, dtype=dt), torch.randn(256, device=dev, dtype=dt)
    gu = torch.randn(4, 512, device=dev, dtype=dt)
    g, u = gu[:, :256].contiguous(), gu[:, 256:].contiguous()
    cases = {
        "linear": (lambda: ann.linear(x1, w), lambda: F.linear(x1, w), "linear", "gemv", (1, 256, 256),
                   {"a": x1, "w": w}, (1, 256), {}),
        "rms_norm": (lambda: ann.rms_norm(xr, nw, 1e-6), lambda: F.rms_norm(xr, (256,), nw, 1e-6), "rms_norm",
                     "rmsnorm", (4, 256), {"x": xr, "weight": nw}, (4, 256), {"eps": 1e-6}),
        "silu_mul": (lambda: ann.silu_mul(g, u), lambda: F.silu(g) * u, "silu_mul", "silu_mul", (4, 256),
                     {"x": g, "y": u}, (4, 256), {}),
        "swiglu": (lambda: ann.swiglu(gu), lambda: F.silu(gu[:, :256]) * gu[:, 256:], "swiglu", "silu_mul",
                   (4, 256), None, None, {}),
        "add": (lambda: ann.add(g, u), lambda: g + u, "add", "add", (4, 256), {"x": g, "y": u}, (4, 256), {}),
    }
    res["prepare_us"], res["launch_us"], res["public_us"], res["torch_us"], res["kernel"] = {}, {}, {}, {}, {}
    with torch.inference_mode():
        for name, (ours, theirs, op, kind, shape, inputs, out_shape, kw) in cases.items():
            choice = dispatch.choose(op, kind, shape, dt, dev)
            res["kernel"][name] = choice.describe()
            ours()  # rank + compile
            if inputs is not None and choice.config is not None:
                out = torch.empty(out_shape, device=dev, dtype=dt)
                cfg = choice.config
                bind = lambda i=inputs, c=cfg, o=out, k=kw: prepare(i, c, o, **k)  # noqa: E731
                res["prepare_us"][name] = per_call_us(bind, args.calls, args.repeat, lambda: None)
                if cuda:
                    launcher = prepare(inputs, cfg, out, **kw)
                    res["launch_us"][name] = per_call_us(launcher, args.calls, args.repeat, sync)
            if cuda:
                res["public_us"][name] = per_call_us(ours, args.calls, args.repeat, sync)
                res["torch_us"][name] = per_call_us(theirs, args.calls, args.repeat, sync)
    if cuda:
        res["prefill_host_us"] = _prefill_host(ann, dispatch, prepare, dt, dev)
        res["quant_public_us"] = _quant_host(dt, dev, args.calls, args.repeat, sync)
    res["fallbacks"] = {f"{o}: {r}": n for (o, r), n in dispatch.fallback_counts().items()}
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
