"""Does the compiled 1 x 2048 prefill of an optimize()d model compute what its eager forward does?

The e2e harnesses (``quant_e2e.py --compiled-prefill``, ``moe_e2e.py``) now time a compiled prefill only after this
check (``autoopt.nn.e2e.compiled_vs_eager``); this probe runs the check alone on one model and weight format, without
timing, for the rows measured before the check existed: no cache (``use_cache=False``) and into a fresh cache.

    PYTHONPATH=. python benchmarks/probes/compiled_check.py --weights int4 --out $OUT/compiled_check_int4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--weights", default="int4", help="optimize(weights=...); 'none': transformers' own model")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from autoopt.nn.e2e import build_model, compiled_vs_eager
    from benchmarks.quant_e2e import environment

    model = build_model(args.model, dtype="bf16", device="cuda", layers=args.layers)
    if args.weights != "none":
        from autoopt.nn.optimize import optimize

        optimize(model, weights=args.weights)
    forward = torch.compile(model.forward, dynamic=False)
    report: dict[str, Any] = {"env": environment(), "model": args.model, "weights": args.weights,
                              "layers": args.layers, "prompt": "1 x 2048, seeded"}
    for label, use_cache in (("no_cache", False), ("cache", True)):
        report[label] = compiled_vs_eager(model, forward, model.config.vocab_size, 1, 2048, "cuda",
                                          use_cache=use_cache)
        print(label, report[label], flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
