"""Which change to optimize()'s compiled decode step buys the most (issue 27: int4 through ``generate()`` at 2.10x
bf16 + compile on an H200, target 2.2x): A/B of candidate changes, in one process, on the full Llama-3-8B
architecture with random weights, batch 1, a static cache.

Variants (``--variants``, comma separated; each builds, optimizes and compiles its own model):

- ``base``: optimize() as shipped;
- ``autoopt_norm``: a decode step's RMSNorm stays autoopt's Triton kernel under torch.compile, as before
  ``INDUCTOR_NORM_MAX_ROWS`` (Inductor then cannot fuse the residual add into it: two kernels where Inductor's own
  norm is one);
- ``decode_layer``: ``optimize(ops=[..., "decode_layer"])``, each decoder layer's one-token step as five fused
  kernels (its norms, SwiGLU and residual adds inside the quantized GEMVs: ``autoopt.nn.decode_layer``); timed
  only after one eager decode step's logits matched the unfused step's (``autoopt.nn.e2e.decode_layer_vs_unfused``)
  (``h200/step_variants_decode_layer_loads.json`` compared it with a fused norm summing the squares from the main
  loop's loads, there named ``decode_layer``, today's ``decode_layer`` there ``decode_layer_prepass``: slower, removed);
- ``run80``: the cost model's ``dram_run_bytes`` at 80 (was 50) while optimize() picks its configs: the
  longer contiguous weight runs the H200 graph grid measured faster for the int4 decode GEMV
  (``h200/quant_kernels_fmagrid_graph.json``: BLOCK_K 512 against 256 at equal tile bytes, ~1.2x).

The committed ``h200/step_variants.json`` ran before the norm change, when ``base`` kept autoopt's norm and a
variant ``norm_inductor`` (today's ``base``) left it to Inductor, and ``both`` added ``run80`` to that.

Per variant: the compiled decode step replayed from one CUDA graph (``_graphed_decode_ms``, the GPU time under a
token) and ``generate()``'s ms/token (three runs, as ``quant_e2e.py`` measures it). transformers at bf16 +
compile's ``generate()`` is timed first and last, the denominator of the speed-up and a check of the host's drift.
Numbers are labelled measured; nothing is predicted here.

    PYTHONPATH=. python benchmarks/probes/step_variants.py --formats int4 --out $OUT/step_variants.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.model_kit import MODEL, no_cuda, optimized_llama

PROMPT = 128
VARIANTS = ("base", "autoopt_norm", "run80", "decode_layer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write (rewritten after every variant)")
    ap.add_argument("--formats", default="int4", help="weight formats, comma separated (default %(default)s)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="default %(default)s")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the published 32)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no variant after this (default %(default)s)")
    args = ap.parse_args(argv)
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        print(f"step_variants: unknown variant(s) {', '.join(bad)}; expected some of {', '.join(VARIANTS)}",
              file=sys.stderr)
        raise SystemExit(2)
    return args


@contextlib.contextmanager
def applied(variant: str) -> Iterator[None]:
    """The variant's change, process-wide, undone on exit."""
    from autoopt.kernels import constants as consts
    from autoopt.nn import dispatch, ops

    left, saved = ops._left_to_inductor, consts.constants()
    dispatch.clear_cache()  # choices are cached per key, not per constants
    if variant == "autoopt_norm":
        ops._left_to_inductor = lambda rows: False  # type: ignore[assignment]
    if variant == "run80":
        consts.set_constants(replace(saved, dram_run_bytes=80.0))
    try:
        yield
    finally:
        ops._left_to_inductor = left  # type: ignore[assignment]
        consts.set_constants(saved)
        dispatch.clear_cache()


def run_variant(fmt: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    from autoopt.nn.e2e import _graphed_decode_ms
    from autoopt.nn.match import DEFAULT_OPS
    from benchmarks.quant_e2e import generate_ms_per_token

    row: dict[str, Any] = {"format": fmt, "variant": variant, "label": "measured"}
    with applied(variant):
        fused = variant.startswith("decode_layer")
        ops = (*DEFAULT_OPS, "decode_layer") if fused else None
        model, report = optimized_llama(fmt, args.layers, ops)
        row["optimize_counts"] = report.counts()
        if fused:  # new kernels in the step: timed only once they match the unfused step
            from autoopt.nn.e2e import decode_layer_vs_unfused

            row["check_vs_unfused"] = check = decode_layer_vs_unfused(model)
            if not check["ok"]:
                row["error"] = f"fused decode step's logits differ from the unfused step's: {check}; not timed"
                return row
        row["measured_graphed_compiled_step_ms"] = round(
            _graphed_decode_ms(model, 1, PROMPT, 64, compiled=True), 4)
        row.update(generate_ms_per_token(model, args.new_tokens, compiled=True))
    del model
    return row


def bf16_generate(args: argparse.Namespace) -> dict[str, Any]:
    from autoopt.nn.e2e import build_model
    from benchmarks.quant_e2e import generate_ms_per_token

    model = build_model(MODEL, dtype="bf16", device="cuda", layers=args.layers)
    row = {"impl": "transformers bf16 + compile", "label": "measured",
           **generate_ms_per_token(model, args.new_tokens, compiled=True)}
    del model
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if no_cuda("step_variants", "a model"):
        return 2
    from benchmarks.quant_e2e import environment, isolated

    t0 = time.time()
    out = Path(args.out)
    report: dict[str, Any] = {"env": environment(), "model": "llama-3-8b", "layers": args.layers,
                              "prompt": PROMPT, "new_tokens": args.new_tokens, "rows": []}

    def record(row: dict[str, Any]) -> None:
        report["rows"].append(row)
        report["elapsed_s"] = round(time.time() - t0, 1)
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k not in ("traceback", "optimize_counts")}),
              file=sys.stderr, flush=True)

    got, failed = isolated(partial(bf16_generate, args))
    record(failed or got)
    for fmt in [f for f in args.formats.split(",") if f]:
        for variant in args.variants.split(","):
            if time.time() - t0 > args.budget_s:
                record({"format": fmt, "variant": variant, "skipped": f"budget {args.budget_s:.0f} s spent"})
                continue
            t1 = time.time()
            got, failed = isolated(partial(run_variant, fmt, variant, args))
            row = failed or got
            row.update(format=fmt, variant=variant, wall_s=round(time.time() - t1, 1))
            record(row)
    got, failed = isolated(partial(bf16_generate, args))
    record(failed or got)
    return 0


if __name__ == "__main__":
    sys.exit(main())
