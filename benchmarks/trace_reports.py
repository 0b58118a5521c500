"""Comparison reports of the real traces `benchmarks/capture_traces.py` wrote on the H100 and the H200.

For each phase and batch: eager against torch.compile on each GPU, and the H100 against the H200 for
each variant; plus each trace's coverage (share of GPU time classified, classes summing to the total).
Fusions are attributed by aligning each pair on its GEMM/attention launches (see autoopt.trace.analysis).
Writes ``benchmarks/results/traces/reports.json`` and one stacked-bar PNG:

    PYTHONPATH=. python benchmarks/trace_reports.py --h100 DIR --h200 DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.trace import compare, summary_of

CASES = [(p, b) for p in ("prefill", "decode") for b in (1, 8)]


def find(folder: Path, variant: str, phase: str, batch: int) -> Path:
    hits = [p for p in folder.glob(f"*_{variant}_{phase}_b{batch}.json.gz") if "trimmed" not in p.name]
    if len(hits) != 1:
        raise SystemExit(f"trace_reports: expected one {variant} {phase} b{batch} trace in {folder}, found {len(hits)}")
    return hits[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h100", required=True, type=Path)
    ap.add_argument("--h200", required=True, type=Path)
    ap.add_argument("--out", default="benchmarks/results/traces", type=Path)
    args = ap.parse_args()
    gpus = {"h100": args.h100, "h200": args.h200}
    summaries = {(g, v, p, b): summary_of(find(d, v, p, b)) for g, d in gpus.items()
                 for v in ("eager", "compile") for p, b in CASES}
    report: dict = {"coverage": {}, "eager_vs_compile": {}, "h100_vs_h200": {}}
    for (g, v, p, b), s in summaries.items():
        d = s.to_dict()
        class_sum = sum(us for us, _ in s.by_class.values())
        report["coverage"][f"{g} {v} {p} b{b}"] = {
            "per_step_us": round(d["per_step_us"], 1), "classified_share": round(1 - d["other_share"], 5),
            "class_sum_over_total": round(class_sum / s.total_us, 6), "layers_per_step": s.layers_per_step,
            "fused_kernels": len(s.fused)}
    for g in gpus:
        for p, b in CASES:
            report["eager_vs_compile"][f"{g} {p} b{b}"] = compare(summaries[(g, "eager", p, b)],
                                                                  summaries[(g, "compile", p, b)])
    for v in ("eager", "compile"):
        for p, b in CASES:
            report["h100_vs_h200"][f"{v} {p} b{b}"] = compare(summaries[("h100", v, p, b)],
                                                             summaries[("h200", v, p, b)])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reports.json").write_text(json.dumps(report, indent=1) + "\n")
    worst = min(c["classified_share"] for c in report["coverage"].values())
    print(f"16 traces: lowest classified share {worst:.4%}", file=sys.stderr)
    for case, cmp in report["eager_vs_compile"].items():
        saved = sum(f["us_saved_per_step"] for f in cmp["fusions"] if f["kind"].startswith("fused kernel"))
        print(f"{case}: fusions attributed by {cmp['fusion_alignment']['mode']}, {saved:.1f} us/step saved "
              f"(A - B: {cmp['fusion_alignment'].get('a_minus_b_us')})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
