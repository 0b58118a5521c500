"""Where a quantized decode step's time goes: GPU time per kernel class, eager and compiled (GPU).

One question: the graphed decode step of Llama-3-8B after ``optimize(weights=fmt)`` runs at about half
of its format's weight-read floor (``quant_e2e.json``). Which kernels take the rest? For bf16 (the
model as transformers builds it), autoopt fp8 and autoopt int4, on a model built fresh per variant:

- ``eager``: ``--steps`` decode steps over a static cache (``--batch`` rows, default 1, 128 tokens of context) under
  torch.profiler, reduced by ``autoopt.trace`` to GPU time and launches per kernel class per step;
- ``compiled``: the same with the forward under ``torch.compile`` (fullgraph, Inductor's kernels);
- ``measured_graphed_ms``: the step captured in one CUDA graph and replayed (eager, then compiled).

Per variant also the decode GEMV's time per linear of a layer (``quant_gemv_us_by_linear``: its launches in
order, four a layer). Every number is measured; the weight-read floor is the format's linear weights + the bf16
LM head over the measured copy bandwidth, as in ``quant_e2e.py``. Format ``autoopt-bf16`` is ``optimize()`` with no
weight format (what the regret harness's "bf16" option runs); ``FMT+OP`` adds an opt-in op to optimize()'s
default ones (``int4+decode_layer``)::

    PYTHONPATH=. python benchmarks/quant_trace.py --out $OUT/quant_trace.json
    PYTHONPATH=. python benchmarks/quant_trace.py --batch 32 --layers 8 --formats autoopt-bf16,fp8 --out b32.json
    PYTHONPATH=. python benchmarks/quant_trace.py --model qwen2.5-7b --batch 32 --layers 8 --no-compile ...
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "llama-3-8b"
PROMPT = 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--model", default=MODEL, help="catalog model built with random weights (default %(default)s)")
    ap.add_argument("--formats", default="bf16,fp8,int4", help="comma list; bf16 is the model unquantized")
    ap.add_argument("--steps", type=int, default=5, help="profiled decode steps per variant (default %(default)s)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's 32)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded together (default %(default)s)")
    ap.add_argument("--no-int4-words", action="store_true",
                    help="symmetric int4's decode GEMV on its per-byte PTX, not the word path (an A/B in one run)")
    args = ap.parse_args(argv)
    if not 1 <= args.batch <= 256:
        ap.error(f"--batch {args.batch}: expected 1 to 256")
    return args


def _stepper(model: Any, forward: Any, batch: int = 1) -> Any:
    """A decode step of ``batch`` rows over a static cache filled with a 128-token prompt."""
    import torch
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=PROMPT + 64)
    ids = torch.randint(0, model.config.vocab_size, (batch, PROMPT), device="cuda")
    model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    tok, pos = ids[:, -1:].clone(), torch.tensor([PROMPT], device="cuda")

    def step() -> None:
        logits = forward(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        tok.copy_(logits[:, -1:].argmax(-1))
        pos.add_(1)
    return step


def profile_steps(model: Any, compiled: bool, steps: int, batch: int = 1) -> dict[str, Any]:
    """GPU time and launches per kernel class per decode step, from a real profiler trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from autoopt.trace import summary_of

    forward = torch.compile(model.forward, fullgraph=True, dynamic=False) if compiled else model.forward
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        step = _stepper(model, forward, batch)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        path = Path(tmp) / "trace.json.gz"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
            for _ in range(steps + 1):
                step()
                torch.cuda.synchronize()
                prof.step()
        summary = summary_of(path)
    s = summary.to_dict()
    per_step = {c: {"us": round(v["us"] / summary.steps, 2), "launches": v["launches"] / summary.steps}
                for c, v in sorted(s["by_class"].items(), key=lambda kv: -kv[1]["us"])}
    return {"label": "measured (profiler trace, kernels' GPU time, no gaps)", "steps": summary.steps,
            "gpu_kernel_us_per_step": round(summary.total_us / summary.steps, 1),
            "quant_gemv_us_by_linear": gemv_by_linear(summary.step),
            "launches_per_step": summary.kernels / summary.steps, "by_class_per_step": per_step,
            "top_kernels": [{**t, "us_per_step": round(t["us"] / summary.steps, 2)} for t in s["top"][:20]]}


#: a decoder layer's quantized GEMVs in launch order (the LM head is bf16: not this kernel)
LINEARS = ("qkv", "o", "gate_up", "down")


def gemv_by_linear(step: Any) -> dict[str, float] | None:
    """One profiler step's decode-GEMV time per linear of a layer (us, summed over the layers): the kernel's
    launches taken in order, four a layer (qkv, o, gate_up, down); None where the count is not a multiple of
    four (another model's layout) or the trace kept no step."""
    if step is None:
        return None
    durs = [d for i, d in zip(step.seq, step.dur, strict=True) if "_quant_gemv_kernel" in step.names[i]]
    if not durs or len(durs) % len(LINEARS):
        return None
    return {name: round(sum(durs[j::len(LINEARS)]), 2) for j, name in enumerate(LINEARS)}


def weight_floor_ms(model: Any, copy_gbs: float) -> float:
    """Bytes of every linear's stored weight (packed + scales) and the LM head, over the copy bandwidth."""
    seen: set[int] = set()
    total = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if "embed_tokens" in name or id(t) in seen or t.dim() < 2 or not t.is_cuda:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total / (copy_gbs * 1e9) * 1e3


def run_variant(fmt: str, args: argparse.Namespace, copy_gbs: float) -> dict[str, Any]:
    from autoopt.nn.e2e import _graphed_decode_ms, build_model

    row: dict[str, Any] = {"format": fmt, "batch": args.batch,
                           "impl": "transformers" if fmt == "bf16" else "autoopt optimize()"}
    model = build_model(args.model, dtype="bf16", device="cuda", layers=args.layers)
    if fmt != "bf16":
        from autoopt.nn.match import DEFAULT_OPS
        from autoopt.nn.optimize import optimize

        weights, _, extra = fmt.partition("+")  # "int4+decode_layer": optimize()'s ops and that one
        ops = (*DEFAULT_OPS, extra) if extra else None
        report = optimize(model, ops=ops) if weights == "autoopt-bf16" else optimize(model, weights=weights, ops=ops)
        row["optimize_counts"] = report.counts()
    row["weight_read_floor_ms"] = round(weight_floor_ms(model, copy_gbs), 4)
    row["eager"] = profile_steps(model, False, args.steps, args.batch)
    row["measured_graphed_ms"] = {"eager": round(_graphed_decode_ms(model, args.batch, PROMPT, 64), 4)}
    if not args.no_compile:
        row["compiled"] = profile_steps(model, True, args.steps, args.batch)
        row["measured_graphed_ms"]["compiled"] = round(_graphed_decode_ms(model, args.batch, PROMPT, 64,
                                                                          compiled=True), 4)
    del model
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_int4_words:
        from autoopt.backend.kernels import quant_gemv

        quant_gemv._words_fit = lambda *a: False  # type: ignore[assignment]
    import torch

    if not torch.cuda.is_available():
        print("quant_trace: no CUDA device; this harness profiles a model on a GPU", file=sys.stderr)
        return 2
    from benchmarks.hw_limit import copy_gbs
    from benchmarks.quant_e2e import environment, isolated

    t0 = time.time()
    out = Path(args.out)
    report: dict[str, Any] = {"env": environment(), "model": args.model, "layers": args.layers, "prompt": PROMPT,
                              "batch": args.batch, "int4_words": not args.no_int4_words,
                              "measured_copy_gbs": round(copy_gbs(), 1), "variants": {}}
    for fmt in [f for f in args.formats.split(",") if f]:
        t1 = time.time()
        got, failed = isolated(partial(run_variant, fmt, args, report["measured_copy_gbs"]))
        row = failed or got
        row["wall_s"] = round(time.time() - t1, 1)
        report["variants"][fmt] = row
        report["elapsed_s"] = round(time.time() - t0, 1)
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(fmt, json.dumps({k: row.get(k) for k in ("weight_read_floor_ms", "measured_graphed_ms")}),
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
