"""Quantized weights end to end (issue 27), in one process: transformers at bf16, autoopt.optimize(weights=F) and
torchao's same formats on a Llama-3-8B-architecture model with random bf16 weights.

The model is built from the catalog's published config (``autoopt.nn.e2e.build_model``: nothing is downloaded;
``--layers N`` keeps the first N decoder layers' shape with fewer of them). Each variant is built fresh, the
previous one freed (16 GB at bf16 plus a quantized copy would not both fit a 40 GB card, and peaks must not
mix):

- ``bf16``: transformers as it comes;
- ``autoopt F`` for F in ``--formats`` (default fp8, int4): ``autoopt.optimize(model, weights=F)`` (its report's
  per-linear errors, backend and memory go into the row);
- ``torchao F`` for the same formats where ``import torchao`` works: ``quantize_`` with
  ``Float8DynamicActivationFloat8WeightConfig()`` (fp8) or
  ``Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")`` (int4), on every linear but
  ``lm_head`` (autoopt keeps the LM head 16-bit too, as ``autoopt.planning.quant`` counts it).

Per variant, in this order (the cheap numbers first, so a variant that fails late keeps them):

- ``measured_weight_bytes``: ``torch.cuda.memory_allocated()`` once the model is built and quantized (nothing
  else is allocated then), ``measured_peak_build_bytes`` the peak while building and quantizing;
- ``measured_logits_vs_bf16``: last-position logits of 8 random 64-token prompts against the bf16 variant's
  (relative Frobenius error, top-1 agreement);
- ``measured_graphed_decode_ms``: one decode step (forward over a static cache + argmax, batch 1, 128 tokens of
  context) captured in one CUDA graph and replayed (``autoopt.nn.e2e._graphed_decode_ms``, eager forward), and
  ``measured_pct_of_weight_read_floor``: the time to read every weight a decode step reads (the weight bytes
  less the embedding table, of which a step reads one row) at the measured copy bandwidth, over that step;
- ``measured_prefill_1x2048_ms``: one eager forward over 1 x 2048 tokens (median of 3); with
  ``--compiled-prefill`` also ``measured_prefill_1x2048_compiled_ms``, the forward through ``torch.compile``
  (static shapes, Inductor's default mode; median of 5 after its warm-up), and
  ``measured_prefill_1x2048_compiled_cache_ms``, the same forward into a fresh DynamicCache (``model(ids)``); each
  timed only after its logits matched the same model's eager ones (``compiled_vs_eager[_cache]``);
- ``measured_generate_ms_per_token``: three ``model.generate()`` runs of ``--new-tokens`` tokens, batch 1, greedy,
  with a static KV cache (transformers' ``StaticCache``, what ``cache_implementation="static"`` builds; built
  once so every length shares one compiled step) and transformers' own ``torch.compile`` of the decode step;
  each run's time less a 1-token generation's (prefill and set-up cancel), per token;
- ``measured_peak_run_bytes``: the peak over all of the above.

Beside them ``predicted_decode_step_ms`` (and ``_graphed``): ``recommend()``'s decode step for the same model
(the same layer count), batch 1, 128 + new tokens of context, in the variant's format, runtime ``autoopt``
(a compiled step); ``predicted_graphed_decode_ms``: the step ``measured_graphed_decode_ms`` times (eager in one
graph), as the regret harness prices it (2026-11-28 H200 run, ``h200/quant_e2e_attention.json``, re-priced
offline: int4 3.72 against 3.48 ms measured, fp8 4.58 against 4.26; transformers' bf16 5.44 against 7.54).
Every number's key says ``measured_`` or ``predicted_``. A failing variant records its error and the harness
goes on; the JSON (device, driver, torch, triton, transformers, torchao versions, the copy bandwidth) is
rewritten after every variant. ``--budget-s`` (default 345) skips a variant that would end after it (taken to last
as long as the longest variant so far), so a full 32-layer run stays under 6 minutes on an H100: all five
variants took 364 s there (``benchmarks/results/h100/quant_e2e_run1.json``; each compiled ``generate()`` costs
26-125 s of compiling), so the default skips the last (torchao int4: ``quant_e2e.json``, 259 s); ``--budget-s 420``
runs it, ``--layers 8`` runs every variant well inside 6 minutes::

    PYTHONPATH=. python benchmarks/quant_e2e.py --out $OUT/quant_e2e.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "llama-3-8b"
FORMATS = ("fp8", "int4")
#: recommend()'s name of each format (autoopt.planning.quant)
PLAN_NAMES = {"bf16": "bf16", "fp8": "fp8", "fp8-wo": "fp8-weight-only", "int8": "int8", "int4": "int4"}
PROMPT = 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write (rewritten after every variant)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the published 32)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="weight formats, comma separated (default "
                                                                  "%(default)s)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens per generate() run (default %(default)s)")
    ap.add_argument("--graph-steps", type=int, default=64, help="CUDA-graph replays timed (default %(default)s)")
    ap.add_argument("--no-torchao", action="store_true", help="skip torchao even when it imports")
    ap.add_argument("--compiled-prefill", action="store_true",
                    help="also time the 1 x 2048 prefill through torch.compile (static shapes; the issue's comparison "
                    "is against transformers + compile)")
    ap.add_argument("--no-compile", action="store_true", help="generate() eager (no torch.compile): a quick run")
    ap.add_argument("--budget-s", type=float, default=345.0,
                    help="skip a variant that would end after this many seconds, taking it to last as long as the "
                         "longest so far (default %(default)s)")
    return ap.parse_args(argv)


# -- variants ----------------------------------------------------------------------------------------------------

def variants(formats: list[str], torchao: bool) -> list[tuple[str, str, str | None]]:
    """(label, implementation, format) in the order they run: the bf16 reference first."""
    out: list[tuple[str, str, str | None]] = [("transformers bf16", "transformers", None)]
    out += [(f"autoopt {f}", "autoopt", f) for f in formats]
    out += [(f"torchao {f}", "torchao", f) for f in formats if torchao and f in ("fp8", "int4")]
    return out


def quantize(model: Any, impl: str, fmt: str | None, row: dict[str, Any]) -> None:
    """Quantize ``model`` in place as ``impl`` does ``fmt``; what it said goes into ``row``."""
    if fmt is None:
        return
    t0 = time.perf_counter()
    if impl == "autoopt":
        from autoopt.nn.optimize import optimize

        report = optimize(model, weights=fmt)
        errors = sorted(report.errors().values())
        row["optimize"] = {"weights": report.weights, "backend": report.backend, "counts": report.counts(),
                           "notes": report.notes, "memory_bytes": report.memory_bytes,
                           "measured_linear_rel_err_vs_bf16": {"n": len(errors), "max": errors[-1] if errors else None,
                                                               "median": statistics.median(errors) if errors else None}}
    else:
        from torch import nn
        from torchao.quantization import (
            Float8DynamicActivationFloat8WeightConfig,
            Int4WeightOnlyConfig,
            quantize_,
        )

        config = (Float8DynamicActivationFloat8WeightConfig() if fmt == "fp8"
                  else Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d"))
        quantize_(model, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn != "lm_head")
        row["torchao_config"] = repr(config)[:300]
    row["measured_quantize_s"] = round(time.perf_counter() - t0, 2)


def logits_of(model: Any, prompts: Any) -> Any:
    import torch

    with torch.inference_mode():
        return model(prompts, use_cache=False, logits_to_keep=1).logits[:, -1].float().cpu()


def agreement(ref: Any, got: Any) -> dict[str, float]:
    return {"rel_err": round(float((got - ref).norm() / ref.norm()), 5),
            "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean())}


def generate_ms_per_token(model: Any, new_tokens: int, compiled: bool) -> dict[str, Any]:
    """Three generate() runs' ms/token (each less a 1-token generation's time), with the compile warm-up timed."""
    from autoopt.nn.e2e import _Generation, _median_ms

    gen = _Generation(model, 1, PROMPT, new_tokens, "cuda", compiled)
    t0 = time.perf_counter()
    gen(new_tokens)
    _sync()
    warm_s = time.perf_counter() - t0
    short = _median_ms(lambda: gen(1), "cuda", 3)
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        gen(new_tokens)
        _sync()
        runs.append(((time.perf_counter() - t0) * 1e3 - short) / (new_tokens - 1))
    return {"measured_generate_ms_per_token": [round(r, 4) for r in runs],
            "measured_generate_ms_per_token_median": round(statistics.median(runs), 4),
            "measured_generate_1_token_ms": round(short, 3), "measured_first_generate_s": round(warm_s, 1),
            "compiled": compiled}


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def step(row: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """Run one measurement; a failure is recorded under ``errors`` and the variant goes on."""
    try:
        return fn()
    except Exception as exc:  # data, not a crash: the next measurement and variant still run
        row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        row.setdefault("tracebacks", {})[name] = traceback.format_exc()[-1500:]
        return None


def isolated(fn: Callable[[], Any]) -> tuple[Any, dict[str, Any] | None]:
    """Run one variant (its model built inside ``fn``): ``(result, None)``, or ``(None, the failure as a row)``
    so the next variant still runs; the GPU is cleared after it either way (gc, dynamo's cache, CUDA's)."""
    import torch

    try:
        return fn(), None
    except Exception as exc:  # data, not a crash
        return None, {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}",
                      "traceback": traceback.format_exc()[-2000:]}
    finally:
        gc.collect()
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def measure(model: Any, row: dict[str, Any], args: argparse.Namespace, reference: Any, prompts: Any,
            copy_gbs: float) -> Any:
    """Everything the module docstring lists, into ``row``; returns the variant's logits."""
    import torch

    from autoopt.nn.e2e import _graphed_decode_ms, _prefill_ms, checked_prefill_ms

    gc.collect()
    row["measured_weight_bytes"] = int(torch.cuda.memory_allocated())
    row["measured_peak_build_bytes"] = int(torch.cuda.max_memory_allocated())
    embed = model.get_input_embeddings().weight
    read = row["measured_weight_bytes"] - embed.numel() * embed.element_size()
    got = step(row, "logits", lambda: logits_of(model, prompts))
    if got is not None and reference is not None:
        row["measured_logits_vs_bf16"] = agreement(reference, got)
    graphed = step(row, "graphed", lambda: _graphed_decode_ms(model, 1, PROMPT, args.graph_steps))
    if graphed:
        floor_ms = read / (copy_gbs * 1e9) * 1e3
        row["measured_graphed_decode_ms"] = round(graphed, 4)
        row["weight_read_floor_ms"] = round(floor_ms, 4)
        row["measured_pct_of_weight_read_floor"] = round(100 * floor_ms / graphed, 1)
    prefill = step(row, "prefill", lambda: _prefill_ms(model.forward, model.config.vocab_size, 1, 2048, "cuda", 3))
    if prefill:
        row["measured_prefill_1x2048_ms"] = round(prefill, 3)
    if args.compiled_prefill:
        # static shapes, Inductor's default mode: as transformers + compile runs a prompt of this length
        forward = torch.compile(model.forward, dynamic=False)
        # the same into a fresh cache (model(ids)): optimize()'s causal_mask leaves SDPA causal there
        for use_cache, tail in ((False, ""), (True, "_cache")):
            got_ms = step(row, f"prefill_compiled{tail}",
                          partial(checked_prefill_ms, model, forward, 1, 2048, "cuda", 5, use_cache=use_cache))
            if got_ms:
                row[f"measured_prefill_1x2048_compiled{tail}_ms"] = round(got_ms[0], 3)
                row[f"compiled_vs_eager{tail}"] = got_ms[1]
    timing = step(row, "generate", lambda: generate_ms_per_token(model, args.new_tokens, not args.no_compile))
    if timing:
        row.update(timing)
    row["measured_peak_run_bytes"] = int(torch.cuda.max_memory_allocated())
    return got


def predicted(model: Any, profile: Any, fmt: str | None, new_tokens: int, impl: str,
              graph_steps: int) -> dict[str, Any]:
    """recommend()'s decode step for this model (its layer count) in ``fmt``, plain and CUDA-graphed (a compiled
    step), and ``predicted_graphed_decode_ms``: the step ``measured_graphed_decode_ms`` times, an eager forward
    in one graph (:func:`predicted_eager_graphed_ms`)."""
    from autoopt.planning.recommendation import recommend

    out: dict[str, Any] = {}
    for key, graphs in (("predicted_decode_step_ms", False), ("predicted_decode_step_ms_graphed", True)):
        rec = recommend(profile, model, batch=1, prompt_len=PROMPT, gen_len=new_tokens, phase="decode",
                        weight_dtype=PLAN_NAMES.get(fmt or "bf16", fmt), max_devices=1, runtime="autoopt",
                        cuda_graphs=graphs)
        out[key] = round(rec.predicted["decode_step_us"] / 1e3, 4)
    if impl in ("autoopt", "transformers"):  # torchao's kernels are not what recommend() prices
        out["predicted_graphed_decode_ms"] = round(predicted_eager_graphed_ms(model, profile, fmt, impl,
                                                                              graph_steps), 4)
    return out


def predicted_eager_graphed_ms(model: Any, profile: Any, fmt: str | None, impl: str, steps: int) -> float:
    """The graphed step as this harness captures it (eager forward, batch 1, a cache of PROMPT + ``steps`` +
    slack keys): an optimize()d model's is the regret harness's price of that option (recommend()'s compiled
    step plus what runs uncompiled, :func:`autoopt.regret.run.predicted_ms`); transformers' own is
    ``runtime="transformers"``'s GPU time plus its uncompiled modules (``UNCOMPILED_TRANSFORMERS_LAYER_US``)."""
    from autoopt.planning.catalog import parse_model
    from autoopt.planning.recommendation import UNCOMPILED_TRANSFORMERS_LAYER_US, recommend
    from autoopt.regret.options import Option
    from autoopt.regret.run import predicted_ms

    spec = parse_model(model)
    if impl == "autoopt":
        option = Option(weights=PLAN_NAMES.get(fmt or "bf16", fmt or "bf16"), cuda_graphs=True, batch=1)
        return predicted_ms(profile, spec, option, steps=steps)
    rec = recommend(profile, spec, batch=1, prompt_len=PROMPT, gen_len=steps, phase="decode", max_devices=1,
                    runtime="transformers", cuda_graphs=True)
    gpu = float(rec.predicted.get("decode_gpu_us", rec.predicted["decode_step_us"]))
    return (gpu + spec.num_layers * UNCOMPILED_TRANSFORMERS_LAYER_US) / 1e3


def run_variant(row: dict[str, Any], impl: str, fmt: str | None, args: argparse.Namespace, profile: Any,
                reference: Any, prompts: Any, copy_gbs: float) -> Any:
    """One variant on a model built fresh (freed when this returns); its logits."""
    import torch

    from autoopt.nn.e2e import build_model

    torch.cuda.reset_peak_memory_stats()
    model = build_model(MODEL, dtype="bf16", device="cuda", layers=args.layers)
    row.update(step(row, "predicted", lambda: predicted(model, profile, fmt, args.new_tokens, impl,
                                                        args.graph_steps)) or {})
    quantize(model, impl, fmt, row)
    return measure(model, row, args, reference, prompts, copy_gbs)


def environment() -> dict[str, Any]:
    from benchmarks.quant_kernels import environment as base

    env = base()
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except Exception as exc:
        env["transformers"] = f"not importable: {type(exc).__name__}"
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("quant_e2e: no CUDA device; this harness measures a model on a GPU", file=sys.stderr)
        return 2
    from autoopt.hardware.detection import detect
    from benchmarks.hw_limit import copy_gbs

    t_start = time.time()
    profile = detect()
    formats = [f for f in args.formats.split(",") if f]
    report: dict[str, Any] = {"env": environment(), "gpu": profile.gpu.name if profile.gpu else None,
                              "profile_match": profile.gpu.profile if profile.gpu else None, "argv": sys.argv[1:],
                              "model": MODEL, "layers": args.layers, "new_tokens": args.new_tokens,
                              "variants": {}}
    report["measured_copy_gbs"] = round(copy_gbs(), 1)
    torch.cuda.empty_cache()
    torchao = report["env"].get("torchao") is not None and not args.no_torchao
    out = Path(args.out)
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompts = None
    reference = None
    for label, impl, fmt in variants(formats, torchao):
        row: dict[str, Any] = {"impl": impl, "format": fmt}
        report["variants"][label] = row
        longest = max((v.get("wall_s", 0.0) for v in report["variants"].values()), default=0.0)
        if time.time() - t_start + longest > args.budget_s:
            row["skipped"] = (f"time budget: it would end after {args.budget_s:.0f} s (--budget-s; --layers N runs "
                              "every variant sooner)")
            continue
        t0 = time.time()
        if prompts is None:
            prompts = torch.randint(0, 128256, (8, 64), generator=gen).to("cuda")
        # a variant that cannot be built or quantized is recorded, and the next one runs
        got, failed = isolated(partial(run_variant, row, impl, fmt, args, profile, reference, prompts,
                                       report["measured_copy_gbs"]))
        if failed:
            row.update(failed)
        elif fmt is None:
            reference = got
        row["wall_s"] = round(time.time() - t0, 1)
        report["elapsed_s"] = round(time.time() - t_start, 1)
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(f"{label}: {json.dumps({k: v for k, v in row.items() if k.startswith(('measured_', 'predicted_'))})}",
              file=sys.stderr, flush=True)
    report["elapsed_s"] = round(time.time() - t_start, 1)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
