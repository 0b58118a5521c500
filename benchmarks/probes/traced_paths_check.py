"""Do the compiled prefill's traced paths compute what eager optimize() computes, one path at a time?

Issue 27: with the RMSNorm and SwiGLU ``triton_op``s and the traced fp8 GEMM all on, an 8-layer fp8 model's
compiled last-position logits differed from the custom ops' by 0.103 (int4: 0.016;
``h100/prefill_triton_ops_l8.json``), where the same kernels should agree to rounding. Per format, a
Llama-3-8B architecture of ``--layers`` layers with random weights: eager ``optimize()`` logits over 1 x 2048
tokens are the reference; then the forward compiled (static shapes) with each of
``fp8_prefill_host.TRACED_PATHS`` alone, none, and all; per variant the relative error of the last position's
logits against eager.

    PYTHONPATH=. python benchmarks/probes/traced_paths_check.py --out $OUT/traced_paths_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.fp8_prefill_host import TRACED_PATHS


def logits(model: Any, ids: Any, compiled: bool) -> Any:
    import torch

    torch._dynamo.reset()
    forward = torch.compile(model.forward, dynamic=False) if compiled else model.forward
    with torch.inference_mode():
        return forward(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1].float()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--formats", default="fp8,int4")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    from autoopt.nn import ops
    from autoopt.nn.e2e import build_model
    from autoopt.nn.optimize import optimize
    from benchmarks.quant_e2e import environment

    report: dict[str, Any] = {"env": environment(), "layers": args.layers, "tokens": 2048, "formats": {}}
    saved = {name: getattr(ops, name) for name in TRACED_PATHS}
    for fmt in args.formats.split(","):
        model = build_model("llama-3-8b", dtype="bf16", device="cuda", layers=args.layers)
        ids = torch.randint(0, model.config.vocab_size, (1, 2048), device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(0))
        bf16 = logits(model, ids, False)
        optimize(model, weights=fmt)
        ref = logits(model, ids, False)
        rows: dict[str, Any] = {"eager_vs_bf16": round(float((ref - bf16).norm() / bf16.norm()), 6)}
        for on in [(), *((p,) for p in TRACED_PATHS), TRACED_PATHS]:
            for name in TRACED_PATHS:
                setattr(ops, name, saved[name] if name in on else (lambda *a: None))
            try:
                got = logits(model, ids, True)
            finally:
                for name, fn in saved.items():
                    setattr(ops, name, fn)
            key = "+".join(on) if on else "none"
            rows[key] = round(float((got - ref).norm() / ref.norm()), 6)
            print(fmt, key, rows[key], flush=True)
        report["formats"][fmt] = rows
        del model
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
