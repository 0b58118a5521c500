"""Capture real profiler traces of a Llama-3-8B-architecture model for `autoopt trace` (GPU).

One question: where do eager transformers and torch.compile spend GPU time on this GPU, prefill and
decode, and which fusions does Inductor make? Builds the model from its published config with random
bf16 weights (autoopt.nn.e2e.build_model), profiles `--steps` prefill steps (batch 1 and 8) and
decode steps (batch 1 and 8, static KV cache) under eager and under torch.compile, and writes for each
case a gzipped Chrome trace, a trimmed copy (GPU events of one step, for test fixtures) and the
`trace compare` of eager against compile:

    PYTHONPATH=. python benchmarks/capture_traces.py --out $OUT/traces
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def trim(src: Path, dst: Path) -> None:
    """GPU events and profiler step markers only (no CPU ops): a small test fixture with every step."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    keep = [e for e in doc["traceEvents"]
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
            or str(e.get("name", "")).startswith("ProfilerStep#")]
    with gzip.open(dst, "wt") as f:
        json.dump({"schemaVersion": doc.get("schemaVersion", 1), "traceEvents": keep}, f)


def _stepper(model: Any, fwd: Callable[..., Any], phase: str, ids: Any, cache: Any) -> Callable[[], None]:
    """One prefill forward, or one decode step over the static cache (filled with ``ids`` first)."""
    import torch

    if phase == "prefill":
        return lambda: fwd(input_ids=ids, use_cache=False, logits_to_keep=1)
    model(ids, past_key_values=cache, use_cache=True)
    tok, pos = ids[:, -1:], torch.tensor([ids.shape[1]], device=ids.device)

    def step() -> None:
        fwd(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True)
        pos.add_(1)
    return step


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    from transformers import StaticCache

    from autoopt.errors import AutooptError
    from autoopt.nn.e2e import build_model
    from autoopt.trace import compare, summary_of

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.model)
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    results = {}
    for variant in ("eager", "compile"):
        fwd = torch.compile(model.forward, dynamic=False) if variant == "compile" else model.forward
        for phase, batch in (("prefill", 1), ("prefill", 8), ("decode", 1), ("decode", 8)):
            seq = 2048 if batch == 1 else 512
            ids = torch.randint(0, model.config.vocab_size, (batch, seq if phase == "prefill" else 128), device="cuda")
            cache = StaticCache(config=model.config, max_cache_len=128 + 64)
            with torch.inference_mode():
                step = _stepper(model, fwd, phase, ids, cache)
                for _ in range(3):  # warm-up (and compile)
                    step()
                torch.cuda.synchronize()
                name = f"{gpu}_{args.model}_{variant}_{phase}_b{batch}"
                path = out / f"{name}.json.gz"
                # the schedule's cycle ends inside the loop: export there (after the block, the
                # profiler holds only the empty tail of the last step)
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                             schedule=schedule(wait=0, warmup=1, active=args.steps, repeat=1),
                             on_trace_ready=lambda p, path=path: p.export_chrome_trace(str(path))) as prof:
                    for _ in range(args.steps + 1):
                        step()
                        torch.cuda.synchronize()
                        prof.step()
                trim(path, out / f"{name}.trimmed.json.gz")
                results[name] = summary_of(path).to_dict()
                print(name, round(results[name]["per_step_us"], 1), "us/step", file=sys.stderr)
    for phase, batch in (("prefill", 1), ("prefill", 8), ("decode", 1), ("decode", 8)):
        a = out / f"{gpu}_{args.model}_eager_{phase}_b{batch}.json.gz"
        b = out / f"{gpu}_{args.model}_compile_{phase}_b{batch}.json.gz"
        try:
            results[f"compare_{phase}_b{batch}"] = compare(summary_of(a), summary_of(b))
        except AutooptError as exc:  # recorded, not fatal: the traces themselves are the result
            results[f"compare_{phase}_b{batch}"] = {"error": str(exc)}
    (out / f"{gpu}_summary.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
