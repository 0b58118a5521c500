"""The runner's timing of the int4 decode GEMV on a GPU: rank()'s top configs for Llama-3-8B's four decode
linears through ``runner.evaluate`` (replayed from a CUDA graph over rotated input copies, as ``autoopt tune``
times it), beside their predictions. Prints JSON::

    PYTHONPATH=. python benchmarks/probes/quant_gemv_runner.py --top 3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LINEARS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=3, help="rank()'s configs a linear (default %(default)s)")
    ap.add_argument("--weight", default="int4", help="weight format (default %(default)s)")
    args = ap.parse_args(argv)
    from autoopt.backend.runner import evaluate
    from autoopt.errors import AutooptError
    from autoopt.hardware.detection import detect
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import rank

    if not 1 <= args.top <= 100:
        print(f"quant_gemv_runner: --top {args.top}: give 1 to 100 configs a linear", file=sys.stderr)
        return 2
    try:
        ops = {name: OpSpec(kind="gemv", shape=(1, n, k), dtype="bf16", weight=args.weight)
               for name, (n, k) in LINEARS.items()}
    except AutooptError as exc:
        print(f"quant_gemv_runner: {exc}", file=sys.stderr)
        return 2

    gpu = detect().gpu
    if gpu is None:
        print("quant_gemv_runner: no GPU detected", file=sys.stderr)
        return 2
    rows = []
    for name, op in ops.items():
        for cand in rank(gpu, op, top=args.top, measured=False).candidates:
            res = evaluate(op, cand.config, gpu=gpu)
            rows.append({"linear": name, "config": dict(cand.config.params),
                         "predicted_us": round(cand.predicted_us, 3), "label": res.label, "measured_us": res.us,
                         "rel_err": res.rel_err, "reason": res.reason})
    print(json.dumps({"gpu": gpu.name, "timing": "runner.evaluate (graph replay over rotated copies)",
                      "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
