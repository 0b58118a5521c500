"""Where the host time of optimize()'s MoE prefill goes (issue 28: its compiled 1 x 2048 prefill took 30.7 ms
to enqueue on the H100 against 7.5 ms of kernels, `moe_e2e_prefill_trace.json`): the host-side torch ops with
the most self CPU time (``torch.profiler``; a ``cudaStreamSynchronize`` or ``cudaMemcpy`` there is a sync)
and the Python functions with the most own time (``cProfile``), one compiled prefill after three warm ones.

    PYTHONPATH=. python benchmarks/probes/moe_prefill_host.py --model qwen3-30b-a3b --out $OUT/moe_prefill_host.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--variant", default="autoopt")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    from benchmarks.e2e_prefill_profile import _enqueue_ms, _top_cpu
    from benchmarks.moe_e2e import WEIGHTS, build

    model = build(args.model, args.variant)
    if args.variant in WEIGHTS:
        from autoopt.nn.match import OPS
        from autoopt.nn.optimize import optimize

        optimize(model, ops=OPS, weights=WEIGHTS[args.variant])
    forward = torch.compile(model.forward, fullgraph=False, dynamic=False)
    ids = torch.randint(0, model.config.vocab_size, (1, 2048), device="cuda")

    def step() -> Any:
        with torch.inference_mode():
            return forward(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    out: dict[str, Any] = {"model": args.model, "variant": args.variant, "enqueue_ms": _enqueue_ms(step),
                           "top_cpu_ops": _top_cpu(step, 30)}
    prof = cProfile.Profile()
    prof.enable()
    step()
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
    out["cprofile_tottime"] = s.getvalue()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
    out["cprofile_cumulative"] = s.getvalue()
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k in ("enqueue_ms", "top_cpu_ops")}, indent=1)[:6000])
    print(out["cprofile_tottime"][:5000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
