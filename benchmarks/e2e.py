"""End to end on a real transformers architecture: eager vs torch.compile vs autoopt.optimize (and both).

One question: how fast does a Llama-3-8B / Qwen2.5-7B-shaped model (random bf16 weights, built from
the published config) prefill and decode on this GPU under each variant, how close are the
optimized logits to eager's, and how far is recommend()'s prediction? One JSON result file.

    PYTHONPATH=. python benchmarks/e2e.py --model llama-3-8b --variants eager,optimize --out e2e.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.backend.runner import _versions
from autoopt.hardware.detection import detect
from autoopt.nn.e2e import PARTS, VARIANTS, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"subset of {','.join(PARTS)}")
    ap.add_argument("--prefill", default="1x2048,8x512", help="BxS shapes, comma-separated")
    ap.add_argument("--decode-batches", default="1,16")
    ap.add_argument("--vendor", choices=("on", "off"), default="on",
                    help="off: autoopt's GEMM kernels even where cuBLAS is predicted faster (A/B of the choice)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        prefill = [tuple(int(v) for v in shape.split("x", 1)) for shape in args.prefill.split(",") if shape]
        decode_batches = [int(b) for b in args.decode_batches.split(",")]
    except ValueError:
        print(f"e2e: --prefill takes BxS shapes like 1x2048,8x512 (or \"\") and --decode-batches whole numbers "
              f"like 1,16; got {args.prefill!r} and {args.decode_batches!r}", file=sys.stderr)
        return 2
    parts = args.parts.split(",")
    if any(len(shape) != 2 for shape in prefill) or not set(parts) <= set(PARTS):
        print(f"e2e: --prefill shapes are BxS, --parts a subset of {','.join(PARTS)}; got {args.prefill!r} "
              f"and {args.parts!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from autoopt.nn import dispatch

    dispatch.set_vendor(args.vendor == "on")
    profile = detect()
    if profile.gpu is None:
        print("e2e: no CUDA GPU detected", file=sys.stderr)
        return 2
    import transformers

    meta = {"gpu": profile.gpu.name, "driver": profile.gpu.driver_version, "vendor_matmul": args.vendor,
            "versions": {**_versions(), "transformers": transformers.__version__}}
    out = Path(args.out)

    def save(result: dict) -> None:
        out.write_text(json.dumps({**result, **meta}, indent=1) + "\n")

    result = run(args.model, variants=args.variants.split(","), prompts=args.prompts, reps=args.reps,
                 new_tokens=args.new_tokens, profile=profile, on_variant=save, parts=parts,
                 prefill=prefill, decode_batches=decode_batches)
    save(result)
    for variant, row in result["variants"].items():
        peak_gib = row.get("memory_peak_bytes", 0) / 2**30
        top1 = row.get("agreement_vs_eager", {}).get("top1_agreement")
        print(f"{variant:18s} prefill {row['prefill_ms']}  decode ms/token {row['decode_ms_per_token']}  "
              f"graphed ms/step {row.get('graphed_decode_ms_per_step')}  top1 {top1}  "
              f"tokens {row.get('decode_token_agreement_vs_eager')}  peak {peak_gib:.1f} GiB")
        print(f"{'':18s} kernel us/token (batch 1): {row.get('kernel_us_per_token_batch1')}")
    print("predicted", result.get("predicted"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
