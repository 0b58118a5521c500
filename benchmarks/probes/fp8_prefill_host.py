"""Is fp8's compiled prefill bound by the host, and does tracing the vendor GEMM fix it (issue 27: a 1 x 2048 fp8
prefill through torch.compile took 47.8 ms on one H100 machine and 80.2 ms on another, against bf16's steady
55.6-56.5 ms; ``h100/quant_e2e_decode_graphs_run2.json``, ``_run3.json``)?

One process, Llama-3-8B architecture with random weights (``--layers``), ``optimize(weights="fp8")``, the forward
compiled with static shapes, over 1 x 2048 tokens; per variant the median wall time (synchronised), the host time
to issue one forward without waiting (``enqueue_ms``: over the wall time, the forward is bound by the host), and
the last-position logits against the first variant's:

- ``F traced``: ``optimize(weights=F)`` for each of ``--formats``; where cuBLASLt's fp8 GEMM is chosen the graph
  holds the activation quantization and ``torch._scaled_mm`` (``autoopt.nn.ops._quant_linear_traced``), where
  the dequantize + cuBLAS path is chosen (int4 at prefill) the dequantization kernel and the GEMM, and the
  SwiGLU kernel is a ``triton_op`` launch (:data:`TRACED_PATHS`);
- ``F custom_op``: the same model with those paths off, each op an ``autoopt::`` custom op;
- ``transformers bf16``: the model before optimize(), compiled the same way (the issue's comparison).

    PYTHONPATH=. python benchmarks/probes/fp8_prefill_host.py --out $OUT/fp8_prefill_host.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def timed(model: Any, ids: Any, profile: bool) -> tuple[dict[str, float], Any]:
    import torch

    from autoopt.nn.e2e import _median_ms
    from benchmarks.e2e_prefill_profile import _enqueue_ms

    torch._dynamo.reset()
    forward = torch.compile(model.forward, dynamic=False)

    def step() -> Any:
        with torch.inference_mode():
            return forward(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    wall = _median_ms(step, "cuda", 5)
    row: dict[str, Any] = {"measured_prefill_ms": round(wall, 3), "enqueue_ms": round(_enqueue_ms(step), 3)}
    if profile:
        row["host"] = host_profile(step)
    return row, step()[:, -1].float()


#: the trace-time choices that put a kernel into the compiled graph instead of a custom op's Python
TRACED_PATHS = ("_scaled_mm_chosen", "_dequant_mm_params", "_swiglu_triton_op_runs")


def host_profile(step: Any) -> dict[str, Any]:
    """Where one forward's time goes: torch.profiler's kernels of most GPU time and ops of most self CPU time,
    and cProfile's Python functions of most own and cumulative time."""
    import cProfile
    import io
    import pstats

    import torch

    from benchmarks.e2e_prefill_profile import _top_cpu, _top_kernels

    out: dict[str, Any] = {"top_self_cpu": _top_cpu(step, 25), "top_kernels": _top_kernels(step, 25)}
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    step()
    prof.disable()
    torch.cuda.synchronize()
    for order, count in (("tottime", 30), ("cumulative", 50)):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(order).print_stats(count)
        out[f"cprofile_{order}"] = s.getvalue()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--formats", default="fp8", help="optimize() formats, comma list")
    ap.add_argument("--profile", action="store_true", help="also profile one forward's host time per variant")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    from autoopt.nn import ops
    from autoopt.nn.e2e import build_model
    from autoopt.nn.optimize import optimize
    from benchmarks.quant_e2e import environment

    report: dict[str, Any] = {"env": environment(), "layers": args.layers, "tokens": 2048, "variants": {}}
    model = build_model("llama-3-8b", dtype="bf16", device="cuda", layers=args.layers)
    ids = torch.randint(0, model.config.vocab_size, (1, 2048), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    report["variants"]["transformers bf16"], _ = timed(model, ids, args.profile)
    for i, fmt in enumerate(args.formats.split(",")):
        if i:
            del model
            model = build_model("llama-3-8b", dtype="bf16", device="cuda", layers=args.layers)
        optimize(model, weights=fmt)
        row, ref = timed(model, ids, args.profile)
        report["variants"][f"{fmt} traced"] = row
        saved = {name: getattr(ops, name) for name in TRACED_PATHS}
        for name in TRACED_PATHS:
            setattr(ops, name, lambda *a: None)
        try:
            row, got = timed(model, ids, args.profile)
        finally:
            for name, fn in saved.items():
                setattr(ops, name, fn)
        row["logits_rel_err_vs_traced"] = round(float((got - ref).norm() / ref.norm()), 6)
        report["variants"][f"{fmt} custom_op"] = row
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
