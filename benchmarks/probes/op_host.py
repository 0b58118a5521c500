"""Host time of one call of autoopt's ops at prefill shapes (issue 27: the fp8 1 x 2048 prefill under
torch.compile spent 138 us of self CPU time a ``autoopt::quant_linear`` call, 364 us a ``autoopt::swiglu`` and
103 us a ``autoopt::rms_norm``; ``h100/fp8_prefill_host_l8_profile.json``).

Per op on one GPU, the median host time to issue one call with the GPU idle before it (synchronised before,
not after: the call's own host cost, launches included) through three doors: the implementation called
directly (eager), the registered custom op (``torch.ops.autoopt.*``, the dispatcher), and the custom op
inside a compiled function (``torch.compile`` of a one-op function, Dynamo's guards included); and the GPU
time of one call (synchronised, median).

    PYTHONPATH=. python benchmarks/probes/op_host.py --out $OUT/op_host.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def host_us(fn: Callable[[], Any], reps: int = 30) -> float:
    """Median host time to issue one call with the GPU idle before it, in us."""
    from benchmarks.e2e_prefill_profile import _enqueue_ms

    return round(_enqueue_ms(fn, reps) * 1e3, 1)


def gpu_us(fn: Callable[[], Any], reps: int = 30) -> float:
    """Median wall time of one call, synchronised, in us."""
    from autoopt.nn.e2e import _median_ms

    return round(_median_ms(fn, "cuda", reps) * 1e3, 1)


def doors(impl: Callable[[], Any], op: Callable[[], Any], compiled: Callable[[], Any]) -> dict[str, Any]:
    for f in (impl, op, compiled, compiled, compiled):
        f()
    return {"host_us_impl": host_us(impl), "host_us_custom_op": host_us(op), "host_us_compiled": host_us(compiled),
            "wall_us_impl": gpu_us(impl)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    from autoopt.backend.quant import quantize
    from autoopt.nn import ops
    from benchmarks.quant_e2e import environment

    torch.manual_seed(0)
    m = args.m
    dev = "cuda"
    report: dict[str, Any] = {"env": environment(), "m": m, "ops": {}}
    x = torch.randn(m, 4096, device=dev, dtype=torch.bfloat16)
    gu = torch.randn(m, 2 * 14336, device=dev, dtype=torch.bfloat16)
    nw = torch.randn(4096, device=dev, dtype=torch.bfloat16)

    def compile_one(f: Callable[..., Any], *a: Any) -> Callable[[], Any]:
        cf = torch.compile(f, dynamic=False)
        return lambda: cf(*a)

    with torch.inference_mode():
        report["ops"]["swiglu"] = doors(lambda: ops._swiglu_impl(gu), lambda: torch.ops.autoopt.swiglu(gu),
                                        compile_one(ops.swiglu, gu))
        report["ops"]["rms_norm"] = doors(lambda: ops._rms_norm_impl(x, nw, 1e-5),
                                          lambda: torch.ops.autoopt.rms_norm(x, nw, 1e-5),
                                          compile_one(ops.rms_norm, x, nw, 1e-5))
        for fmt, n in (("fp8", 14336 * 2), ("fp8", 4096), ("int4", 4096)):
            w = torch.randn(n, 4096, device=dev, dtype=torch.bfloat16) / 64
            qw = quantize(w, fmt)
            spec = qw.fmt.spec
            t = (x, qw.qweight, qw.scales, qw.offsets, None, spec, 4096)
            report["ops"][f"quant_linear {spec} N={n}"] = doors(
                lambda t=t: ops._quant_linear_impl(*t), lambda t=t: torch.ops.autoopt.quant_linear(*t),
                compile_one(lambda a, q, s, fs=spec: ops.quant_linear(a, q, s, weight=fs, k=4096),
                            x, qw.qweight, qw.scales))
            print(fmt, n, report["ops"][f"quant_linear {spec} N={n}"], flush=True)
        report["ops"]["F.linear bf16 N=4096"] = doors(
            lambda: torch.nn.functional.linear(x, nw.new_ones(4096, 4096)), lambda: torch.mm(x, x.new_ones(4096, 4096)),
            compile_one(torch.nn.functional.linear, x, nw.new_ones(4096, 4096)))
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["ops"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
