"""Where a compiled ``generate()`` token's host time goes (issue 27: a token through transformers' own
``generate()`` takes 1.4-2.1 ms more than the same format's compiled step replayed from a CUDA graph, for every
format; that gap, not the kernels, stands between the measured speed-ups and the targets).

Per variant, on a Llama-3-8B architecture with random weights, batch 1, a static cache, greedy, through
``generate()``'s compiled decode step: transformers at bf16; and ``optimize(weights=F)`` for each of ``--formats``,
first with its decode graphs (:mod:`autoopt.nn.decode_graphs`, the default), then with them uninstalled
(transformers' own compiled call, ``reduce-overhead``), with the number of greedy tokens the two generations
agree on before their first difference:

- ``measured_generate_ms_per_token``: as ``quant_e2e.py`` measures it (a ``--new-tokens`` run less a 1-token run);
- ``steps``: the same generation with the compiled call ``generate()`` gets (``get_compiled_call``) wrapped to
  stamp the host clock around it: per decode step, the host time inside the compiled call (Dynamo's guards, the
  CUDA-graph tree's replay; or the decode graph's signature, copies and replay), the time from its return to the
  next call (the rest of transformers' loop: logits processors, argmax, stopping criteria, the next step's inputs
  and masks), and the whole step;
- ``measured_graphed_compiled_step_ms``: the same model's decode step compiled and replayed from one CUDA graph,
  back to back (the GPU time under a token); a token's generate() time less it is the per-token host time
  ``recommend()`` prices (``GENERATE_HOST_US``);
- ``syncs``: the host-side calls that wait for the GPU in one generation (``torch.profiler``, CPU activity: a
  ``cudaStreamSynchronize``, ``cudaMemcpy``, ``aten::item`` or ``aten::_local_scalar_dense``), with the
  torch ops of most self CPU time;
- ``cprofile``: the Python functions of most own and cumulative time in one generation (``cProfile``).

    PYTHONPATH=. python benchmarks/probes/generate_host.py --out $OUT/generate_host.json
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROMPT = 128


def stamped_steps(gen: Any, model: Any, n: int) -> dict[str, Any]:
    """One ``n``-token generation with the compiled call (what ``get_compiled_call`` hands ``generate()``)
    timed on the host clock; per-step medians in ms."""
    stamps: list[tuple[float, float]] = []
    had = "get_compiled_call" in model.__dict__
    getter = model.get_compiled_call

    def timed_getter(config: Any = None) -> Any:
        inner = getter(config)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            stamps.append((t0, time.perf_counter()))
            return out
        return timed

    model.__dict__["get_compiled_call"] = timed_getter
    try:
        gen(n)
    finally:
        if had:
            model.__dict__["get_compiled_call"] = getter
        else:
            del model.__dict__["get_compiled_call"]
    if len(stamps) < 2:
        return {"calls": len(stamps)}
    call = [(b - a) * 1e3 for a, b in stamps]
    between = [(stamps[i + 1][0] - stamps[i][1]) * 1e3 for i in range(len(stamps) - 1)]
    step = [(stamps[i + 1][0] - stamps[i][0]) * 1e3 for i in range(len(stamps) - 1)]
    return {"calls": len(stamps), "median_ms_in_compiled_call": round(statistics.median(call), 4),
            "median_ms_between_calls": round(statistics.median(between), 4),
            "median_ms_step": round(statistics.median(step), 4),
            "first_calls_ms": [round(c, 3) for c in call[:3]]}


def syncs(gen: Any, n: int, top: int = 25) -> dict[str, Any]:
    """The waiting calls and the ops of most self CPU time in one ``n``-token generation."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        gen(n)
        torch.cuda.synchronize()
    rows = [{"op": e.key[:120], "self_cpu_us": round(float(e.self_cpu_time_total), 1), "calls": e.count}
            for e in prof.key_averages()]
    rows.sort(key=lambda r: -r["self_cpu_us"])
    waits = [r for r in rows if any(w in r["op"] for w in ("Synchronize", "Memcpy", "aten::item",
                                                          "_local_scalar_dense", "EventSynchronize"))]
    return {"tokens": n, "waiting_calls": waits, "top_self_cpu": rows[:top],
            "total_self_cpu_us": round(sum(r["self_cpu_us"] for r in rows), 1)}


def profiled(gen: Any, n: int) -> dict[str, str]:
    import torch

    prof = cProfile.Profile()
    prof.enable()
    gen(n)
    torch.cuda.synchronize()
    prof.disable()
    out = {}
    for key, order, count in (("tottime", "tottime", 40), ("cumulative", "cumulative", 70)):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(order).print_stats(count)
        out[key] = s.getvalue()
    return out


def per_token_ms(gen: Any, n: int) -> list[float]:
    import torch

    def timed(k: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        gen(k)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    short = statistics.median(timed(1) for _ in range(3))
    return [round((timed(n) - short) / (n - 1), 4) for _ in range(3)]


def measured(gen: Any, model: Any, n: int, profiles: bool) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    gen(n)
    gen(n)
    torch.cuda.synchronize()
    row: dict[str, Any] = {"warm_s": round(time.perf_counter() - t0, 1),
                           "measured_generate_ms_per_token": per_token_ms(gen, n),
                           "steps": stamped_steps(gen, model, n)}
    if profiles:
        row["syncs"] = syncs(gen, min(32, n))
        row["cprofile"] = profiled(gen, n)
    return row


def graphed_step_ms(model: Any) -> float:
    """The same model's decode step compiled by Inductor and replayed from one CUDA graph, back to back: the GPU
    time a token's generate() step cannot go under (``autoopt.nn.e2e._graphed_decode_ms``)."""
    from autoopt.nn.e2e import _graphed_decode_ms

    return round(_graphed_decode_ms(model, 1, PROMPT, 64, compiled=True), 4)


def variant(fmt: str | None, layers: int | None, n: int, compare: bool, masks: bool = False) -> dict[str, Any]:
    """transformers bf16 (``fmt`` None), or optimize(weights=fmt) (``"bf16"``: 16-bit weights) measured with its
    decode graphs, then (``compare``) with them uninstalled (transformers' own compiled call), and the two
    generations' tokens compared; last, the graphed compiled step."""
    import torch

    from autoopt.nn.e2e import _Generation, build_model

    model = build_model("llama-3-8b", dtype="bf16", device="cuda", layers=layers)
    row: dict[str, Any] = {"format": f"autoopt {fmt}" if fmt else "transformers bf16"}
    gen = _Generation(model, 1, PROMPT, n, "cuda", True)
    if fmt is None:
        row.update(measured(gen, model, n, True))
    else:
        from autoopt.nn import decode_graphs
        from autoopt.nn.optimize import optimize

        optimize(model, weights=None if fmt == "bf16" else fmt)
        row["with_decode_graphs"] = measured(gen, model, n, True)
        runners = decode_graphs.installed(model)
        row["with_decode_graphs"]["graphs"] = sum(len(r.graphs) for r in runners)
        row["with_decode_graphs"]["refused"] = {k: v for r in runners for k, v in r.refused.items()}
        if masks:  # the same runner with transformers' host-built 4D masks: another signature, captured anew
            own = model.__dict__.pop("create_masks_for_generate", None)
            row["with_transformers_masks"] = measured(gen, model, n, False)
            if own is not None:
                model.__dict__["create_masks_for_generate"] = own
        if compare:
            ours = gen(n)[:, PROMPT:].cpu()
            decode_graphs.uninstall(model)
            row["transformers_compiled_call"] = measured(gen, model, n, False)
            theirs = gen(n)[:, PROMPT:].cpu()
            row["tokens_equal_to_transformers_compiled_call"] = int((ours == theirs).int().cumprod(1).sum())
            row["tokens"] = n
    del gen
    row["measured_graphed_compiled_step_ms"] = graphed_step_ms(model)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return row


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    """The row without its profiles, for the log."""
    return {k: (_brief(v) if isinstance(v, dict) else v) for k, v in row.items() if k not in ("cprofile", "syncs")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int4", help="optimize() formats after transformers bf16 (comma list; "
                    "bf16: optimize() with 16-bit weights)")
    ap.add_argument("--masks", action="store_true", help="also time each optimize()d model with transformers' own "
                    "host-built 4D masks instead of the padding mask built inside the step")
    ap.add_argument("--compare", action="store_true", help="also time each optimize()d model through transformers' "
                    "own compiled call, and compare the two generations' tokens")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from benchmarks.quant_e2e import environment

    report: dict[str, Any] = {"env": environment(), "layers": args.layers, "new_tokens": args.new_tokens,
                              "variants": []}
    for fmt in [None, *[f for f in args.formats.split(",") if f]]:
        try:
            report["variants"].append(variant(fmt, args.layers, args.new_tokens, args.compare, args.masks))
        except Exception as exc:  # a failing variant is data; the next one runs
            report["variants"].append({"format": fmt, "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
        Path(args.out).write_text(json.dumps(report, indent=1))
        last = report["variants"][-1]
        print(json.dumps(_brief(last), indent=1)[:5000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
