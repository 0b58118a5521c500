"""optimize() on MoE models against transformers' own experts implementations, same run (GPU).

One question: after ``autoopt.optimize(model)`` runs a MoE model's experts through the fused-MoE kernel,
how do decode (batch 1) and prefill (1 x 2048) compare with transformers' eager experts and its
``grouped_mm`` / ``batched_mm`` experts, each under ``torch.compile``? Models: Qwen3-30B-A3B and
Mixtral-8x7B architectures from the catalog's published configs, random bf16 weights, fewer decoder
layers than published (``--layers``: the same per-layer shapes; memory allows the whole model on one GPU
only for the smaller one).

- ``measured_decode_step_ms``: one decode step (compiled forward over a static cache, 128 tokens of
  context, greedy argmax) captured in one CUDA graph and replayed (``autoopt.nn.e2e._graphed_decode_ms``);
- ``measured_prefill_ms``: median compiled forward over 1 x 2048 tokens, timed only after the compiled forward's
  logits matched the same model's eager ones on a seeded 1 x 2048 prompt (``compiled_vs_eager``);
- ``logits_vs_eager``: last-position logits of 4 prompts against the eager-experts model's.

``autoopt`` is ``optimize(model, ops=OPS)`` (the MoE blocks included: they are off by default);
``autoopt-int4`` / ``autoopt-fp8`` add ``weights=``, which quantizes the experts too (each its own format,
compared with the bf16 transformers variants and labelled so).

    PYTHONPATH=. python benchmarks/moe_e2e.py --out $OUT/moe_e2e.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = {"qwen3-30b-a3b": 8, "mixtral-8x7b": 4}
VARIANTS = ("eager", "grouped_mm", "autoopt", "batched_mm", "autoopt-int4", "autoopt-fp8")
#: optimize()'s weights= per autoopt variant
WEIGHTS = {"autoopt": None, "autoopt-int4": "int4", "autoopt-fp8": "fp8"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--budget-s", type=float, default=520.0)
    ap.add_argument("--trace-prefill", action="store_true",
                    help="also record each variant's 1 x 2048 prefill by kernel (GPU time) and its host enqueue time")
    return ap.parse_args(argv)


def build(name: str, variant: str) -> Any:
    from autoopt.nn.e2e import build_model

    model = build_model(name, dtype="bf16", device="cuda", layers=MODELS[name])
    if variant in ("eager", "grouped_mm", "batched_mm"):
        model.set_experts_implementation(variant)
    else:
        model.set_experts_implementation("eager")  # optimize() replaces the experts module whatever it runs
    return model


def trace_prefill(forward: Any, vocab: int) -> dict[str, Any]:
    """Where a compiled 1 x 2048 prefill's time goes: its top kernels by GPU time, and the host's time to
    enqueue it (above the kernels' total, the prefill is bound by the host)."""
    import torch

    from benchmarks.e2e_prefill_profile import _enqueue_ms, _top_kernels

    ids = torch.randint(0, vocab, (1, 2048), device="cuda")

    def step() -> Any:
        with torch.inference_mode():
            return forward(input_ids=ids, use_cache=False, logits_to_keep=1).logits
    return {"label": "measured (torch.profiler, one prefill after the timed ones)",
            "enqueue_ms": round(_enqueue_ms(step), 3), "top_kernels": _top_kernels(step, 15)}


def run_variant(name: str, variant: str, prompts: Any, ref: Any, trace: bool = False) -> tuple[dict[str, Any], Any]:
    import torch

    from autoopt.nn.e2e import _graphed_decode_ms, checked_prefill_ms

    row: dict[str, Any] = {"variant": variant}
    model = build(name, variant)
    if variant in WEIGHTS:
        from autoopt.nn.match import OPS
        from autoopt.nn.optimize import optimize

        t0 = time.time()
        report = optimize(model, ops=OPS, weights=WEIGHTS[variant])
        row["optimize_s"] = round(time.time() - t0, 2)
        row["optimize_counts"] = report.counts()
        row["moe_rows"] = [{"path": r.path, "weight": r.weight, "error": r.error, "tolerance": r.tolerance,
                            "reason": r.reason, "kernels": r.kernels} for r in report.rows if r.kind == "moe"][:2]
        row["weight_bytes"] = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    with torch.inference_mode():
        logits = model(prompts, use_cache=False, logits_to_keep=1).logits[:, -1].float()
    if ref is not None:
        row["logits_vs_eager"] = {"rel_err": round(float((logits - ref).norm() / ref.norm()), 5),
                                  "top1_agreement": float((logits.argmax(-1) == ref.argmax(-1)).float().mean())}
    try:
        forward = torch.compile(model.forward, fullgraph=False, dynamic=False)
        ms, row["compiled_vs_eager"] = checked_prefill_ms(model, forward, 1, 2048, "cuda", 5)
        row["measured_prefill_ms"] = round(ms, 3)
        if trace:
            row["prefill_trace"] = trace_prefill(forward, model.config.vocab_size)
        torch._dynamo.reset()
        row["measured_decode_step_ms"] = round(_graphed_decode_ms(model, 1, 128, 32, compiled=True), 4)
    except Exception as exc:  # a variant that does not compile keeps its logits (eager's are the reference)
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    del model
    return row, logits


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("moe_e2e: no CUDA device", file=sys.stderr)
        return 2
    from benchmarks.quant_e2e import environment, isolated

    t0 = time.time()
    out = Path(args.out)
    report: dict[str, Any] = {"env": environment(), "layers": MODELS, "models": {}}
    for name in [m for m in args.models.split(",") if m]:
        ref = None
        prompts = torch.randint(0, 32000, (4, 64), generator=torch.Generator().manual_seed(1)).cuda()
        rows = report["models"].setdefault(name, {})
        for variant in [v for v in args.variants.split(",") if v]:
            if time.time() - t0 > args.budget_s:
                rows[variant] = {"skipped": "time budget"}
                continue
            t1 = time.time()
            got, failed = isolated(partial(run_variant, name, variant, prompts, ref, args.trace_prefill))
            row = failed or got[0]
            if got is not None and variant == "eager":
                ref = got[1]
            row["wall_s"] = round(time.time() - t1, 1)
            rows[variant] = row
            report["elapsed_s"] = round(time.time() - t0, 1)
            out.write_text(json.dumps(report, indent=1, default=str) + "\n")
            print(name, variant, {k: row.get(k) for k in ("measured_decode_step_ms", "measured_prefill_ms",
                                                            "logits_vs_eager", "error")}, file=sys.stderr, flush=True)
        best = [r for v, r in rows.items() if v not in WEIGHTS and "measured_decode_step_ms" in r]
        for variant in WEIGHTS:
            mine = rows.get(variant, {})
            if best and "measured_decode_step_ms" in mine:
                key_name = "speedup_vs_best_transformers" + ("" if variant == "autoopt" else f"_bf16_{variant}")
                rows[key_name] = {key: round(min(r[key] for r in best) / mine[key], 3)
                                  for key in ("measured_decode_step_ms", "measured_prefill_ms")}
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
