"""An inference runtime's start-up, using autoopt to decide how to run a model.

1. Know the machine: detect it, or load a known profile (``--profile h100-sxm``).
2. Ask ``recommend()`` for the weight format, memory plan, device split, per-op
   kernel configs and per-layer plan, and print ``explain()``.
3. When a CUDA GPU and triton are present (and no ``--profile`` stands in for the
   hardware), launch the backend kernels with the recommended configs to check and
   time them; otherwise stop at the predictions.

    PYTHONPATH=. python examples/runtime_startup.py --profile h100-sxm --model llama-3-8b
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoopt.errors import AutooptError
from autoopt.planning.recommendation import recommend

log = logging.getLogger("runtime_startup")


def machine(profile: str | None):
    """The hardware profile: a named/saved one, else detection."""
    import autoopt

    return autoopt.load_profile(profile) if profile else autoopt.detect()


def gpu_present() -> bool:
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def launch(rec, gpu) -> list[dict]:
    """Run each distinct op of the plan that has a ranked config through the backend runner."""
    from autoopt.backend.runner import evaluate
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec

    results = []
    for o in rec.ops:
        if o.source != "rank":
            continue
        op = OpSpec(kind=o.kind, shape=o.shape, dtype=o.dtype)
        cfg = KernelConfig(kernel=o.kernel, params=o.config, path=o.path, template=o.template)
        res = evaluate(op, cfg, gpu=gpu)
        results.append({"phase": o.phase, "op": o.name, "predicted_us": round(o.predicted_us, 3),
                        "measured_us": None if res.us is None else round(res.us, 3), "label": res.label,
                        "reason": res.reason})
        print(f"  [{o.phase}] {o.name:<15} predicted {o.predicted_us:9.2f} us, {res.label}"
              + (f" {res.us:9.2f} us" if res.us is not None else f" ({res.reason})"))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="autoopt at an inference runtime's start-up")
    ap.add_argument("--profile", help="known profile name or saved profile file (default: detect this machine)")
    ap.add_argument("--model", default="llama-3-8b", help="catalog name or path to a config.json")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--preference", default="balanced", choices=("speed", "balanced", "quality"))
    ap.add_argument("--weight-dtype", default=None)
    ap.add_argument("--json", help="also write the recommendation as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        hw = machine(args.profile)
        rec = recommend(hw, args.model, batch=args.batch, prompt_len=args.prompt_len, gen_len=args.gen_len,
                        preference=args.preference, weight_dtype=args.weight_dtype,
                        include_cpu=hw.gpu is None)  # a CPU-only host runs the model on its CPU
    except AutooptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(rec.explain())
    out = rec.to_dict()
    if args.profile is None and hw.gpu is not None and gpu_present():
        print("\nLaunching the recommended kernels on this GPU (measured, not predicted):")
        out["launched"] = launch(rec, hw.gpu)
    else:
        print("\nPredictions only: " + ("a named profile stands in for the hardware" if args.profile
                                        else "no CUDA GPU with torch and triton here"))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if rec.fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
