"""Single-pass vs looped norms on a real GPU: is the template's choice the faster one?

For RMSNorm, LayerNorm and softmax over rows of N = 4096 ... 262144 (rows chosen so
each case moves ~256 MB), time the best single-pass and the best looped config the
ranking offers when forced to each approach, and record which the unforced ranking
picks. A forced approach with no valid config is recorded as infeasible.

    PYTHONPATH=. python benchmarks/norm_choice.py --out norm.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.backend import runner
from autoopt.errors import AutooptError
from autoopt.hardware.detection import detect
from autoopt.kernels.ops import OpSpec
from autoopt.search.ranking import rank, validate_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="rmsnorm,layernorm,softmax")
    args = ap.parse_args()
    gpu = detect().gpu
    if gpu is None:
        print("norm_choice: no GPU detected", file=sys.stderr)
        return 2
    rows = []
    for kind in args.kinds.split(","):
        for n in (4096, 16384, 32768, 65536, 131072, 262144):
            op = OpSpec(kind=kind, shape=(max(1, (128 << 20) // (2 * n)), n), dtype="bf16")
            entry: dict = {"kind": kind, "shape": list(op.shape)}
            try:
                entry["chosen"] = rank(gpu, op, top=1).candidates[0].config.kernel
            except AutooptError as exc:
                entry["chosen"] = f"none: {exc}"
            for force in ("single", "looped"):
                try:
                    cand = rank(gpu, op, top=1, force=force).candidates[0]
                except AutooptError as exc:
                    entry[force] = {"label": "infeasible", "reason": str(exc)}
                    continue
                res = runner.evaluate(op, cand.config, gpu=gpu, validate=lambda o, c: validate_config(gpu, o, c),
                                      warmup_ms=10, rep_ms=50)
                entry[force] = {"config": cand.config.to_dict(), "predicted_us": round(cand.predicted_us, 3),
                                "label": res.label, "measured_us": res.us, "gbs": res.gbs, "reason": res.reason}
            times = {f: entry[f].get("measured_us") for f in ("single", "looped")
                     if isinstance(entry.get(f), dict) and entry[f].get("label") == "measured"}
            entry["faster"] = min(times, key=times.get) if times else None
            entry["choice_right"] = entry["faster"] is None or entry["chosen"].endswith(entry["faster"])
            rows.append(entry)
            print(f"{kind:9s} N={n:7d} chosen {entry['chosen']:18s} "
                  + "  ".join(f"{f}: {entry[f].get('measured_us') or entry[f]['label']}" for f in ("single", "looped")),
                  flush=True)
    Path(args.out).write_text(json.dumps({"gpu": gpu.name, "versions": runner._versions(), "rows": rows},
                                         indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
