"""Kernels against the hardware's limit (issue 13), on a real GPU, same-run references.

Sections (``--sections``, default all), each timed with the backend runner (correctness checked
against a float64 reference first, ``do_bench`` median) beside its reference on the same tensors:

- ``copy``: device-to-device copy bandwidth of a 1 GiB bf16 buffer (read + write bytes / time),
  the denominator of every "% of copy" below;
- ``prefill``: Llama-3-8B's qkv/o/gate_up/down at M = 256 and 4096, zero-shot top-1 vs torch.matmul;
- ``broad``: the ``broad`` suite (28 GEMMs of 5 families, tensor-parallel shards, ragged M, lm_heads);
- ``decode``: M = 1 GEMV on Llama-3-8B's projections and lm_head, % of copy and vs torch;
- ``norm``: RMSNorm shapes from 4096 x 4096 to 64 x 262144, % of copy and vs torch;
- ``fp8``: the prefill shapes in fp8 e4m3 (bf16 out, unit per-tensor scales) vs ``torch._scaled_mm``;
- ``explore``: the ranking's top ``--explore-top`` configs of each prefill M = 256 and decode shape,
  measured, so the cost model's misjudgements show (zero-shot top-1 vs the best of its own top-k);
- ``splits``: for the skinny GEMMs (M = 256 and the 70B TP=8 shards), the best-ranked TMA config of
  each SPLIT_K value and of stream-K (labelled SPLIT_K=0), measured: what each decomposition buys where
  the output tiles underfill the SMs.

Zero-shot means the cost model's ranking alone (``rank(..., measured=False)``): no stored winner.
Writes JSON (device, driver, torch, triton versions) after every section, so a run cut short keeps
what it measured:

    PYTHONPATH=. python benchmarks/hw_limit.py --out $OUT/hw_limit.json
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.backend import bench, runner
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.suite import LLAMA3_8B_PROJECTIONS, suite
from autoopt.search.ranking import rank

SECTIONS = ("copy", "prefill", "broad", "decode", "norm", "fp8", "explore", "splits")
NORM_SHAPES = ((64, 262144), (256, 131072), (4096, 4096), (16384, 8192), (1024, 65536), (32, 65536))
LM_HEAD = (128256, 4096)


def prefill_ops(dtype: str = "bf16") -> list[tuple[str, OpSpec]]:
    return [(f"prefill {name} M={m}", OpSpec(kind="gemm", shape=(m, n, k), dtype=dtype))
            for m in (256, 4096) for name, (n, k) in LLAMA3_8B_PROJECTIONS.items()]


def decode_ops() -> list[tuple[str, OpSpec]]:
    shapes = {**LLAMA3_8B_PROJECTIONS, "lm_head": LM_HEAD}
    return [(f"decode {name} M=1", OpSpec(kind="gemv", shape=(1, n, k), dtype="bf16"))
            for name, (n, k) in shapes.items()]


def norm_ops() -> list[tuple[str, OpSpec]]:
    return [(f"rmsnorm {r}x{n}", OpSpec(kind="rmsnorm", shape=(r, n), dtype="bf16")) for r, n in NORM_SHAPES]


def copy_gbs() -> float:
    """Device-to-device copy bandwidth (GB/s, read + write) of a 1 GiB bf16 buffer."""
    import torch
    import triton.testing

    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def measure(gpu: Any, labelled: list[tuple[str, OpSpec]], copy: float | None, *, top: int = 1
            ) -> list[dict[str, Any]]:
    """Zero-shot top-``top`` configs of each op, measured beside torch; one row per config."""
    rows = []
    for label, op in labelled:
        ranking = rank(gpu, op, top=top, measured=False)
        cases = [(op, c.config) for c in ranking.candidates]
        predicted = [c.predicted_us for c in ranking.candidates]
        for i, (row, pred) in enumerate(zip(bench.run_bench(cases, gpu, progress=False), predicted, strict=True)):
            d = row.to_dict()
            d.update(label=label, rank=i + 1, predicted_us=round(pred, 3))
            if copy and row.result.us and row.result.label == "measured":
                d["pct_of_copy"] = round(100 * op.min_bytes / (row.result.us * 1e-6) / 1e9 / copy, 1)
            rows.append(d)
            print(f"{label:36s} #{i + 1} {row.config.kernel:14s} {row.result.label:9s} "
                  f"{row.result.us or float('nan'):9.2f} us  torch {row.torch_us or float('nan'):9.2f}  "
                  f"x{row.ratio or float('nan'):.3f}  {d.get('pct_of_copy', '')}", file=sys.stderr, flush=True)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Geomean and minimum of the top-1 ratios vs torch, and the minimum % of copy."""
    top1 = [r for r in rows if r["rank"] == 1 and r.get("ratio_vs_torch")]
    ratios = [r["ratio_vs_torch"] for r in top1]
    out: dict[str, Any] = {"n": len(top1)}
    if ratios:
        out["geomean_vs_torch"] = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
        worst = min(top1, key=lambda r: r["ratio_vs_torch"])
        out["min_vs_torch"] = {"ratio": worst["ratio_vs_torch"], "label": worst["label"]}
    pct = [r for r in top1 if r.get("pct_of_copy") is not None]
    if pct:
        worst = min(pct, key=lambda r: r["pct_of_copy"])
        out["min_pct_of_copy"] = {"pct": worst["pct_of_copy"], "label": worst["label"]}
    return out


def split_cases(gpu: Any, labelled: list[tuple[str, OpSpec]]) -> list[tuple[str, OpSpec, Any]]:
    """(label, op, config): the best-ranked gemm_tma config of each SPLIT_K value of each op."""
    out = []
    for label, op in labelled:
        seen: set[int] = set()
        for c in rank(gpu, op, top=400, measured=False).candidates:
            # stream-K as SPLIT_K=0 in the label and the seen set
            s = 0 if c.config.params.get("STREAM_K", 0) else c.config.params.get("SPLIT_K", 1)
            if c.config.kernel == "gemm_tma" and s not in seen:
                seen.add(s)
                out.append((f"{label} SPLIT_K={s}", op, c.config))
    return out


def measure_splits(gpu: Any, labelled: list[tuple[str, OpSpec]]) -> list[dict[str, Any]]:
    rows = []
    for label, op, config in split_cases(gpu, labelled):
        row = bench.run_bench([(op, config)], gpu, progress=False)[0]
        d = row.to_dict()
        d.update(label=label, rank=1)
        rows.append(d)
        print(f"{label:44s} {row.result.label:9s} {row.result.us or float('nan'):9.2f} us  "
              f"x{row.ratio or float('nan'):.3f} {dict(config.params)}", file=sys.stderr, flush=True)
    return rows


def explore_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per op: top-1's time over the best measured time of the ranking's top-k (the ranking's loss)."""
    out = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label and r.get("us")]
        if not mine:
            continue
        best = min(mine, key=lambda r: r["us"])
        first = next((r for r in mine if r["rank"] == 1), None)
        out[label] = {"best_rank": best["rank"], "best_us": best["us"], "best_config": best["config"],
                      "top1_over_best": round(first["us"] / best["us"], 3) if first else None}
    return out


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"device": torch.cuda.get_device_name(), **runner._versions()}
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        env["driver"] = None
    return env


def main() -> int:
    from autoopt.hardware.detection import detect

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--explore-top", type=int, default=6)
    args = ap.parse_args()
    sections = args.sections.split(",")
    prof = detect()
    gpu = prof.gpu
    if gpu is None:
        print("hw_limit: no GPU detected", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"env": environment(), "gpu": gpu.name, "profile_match": gpu.profile,
                              "sections": {}, "summary": {}}
    out = Path(args.out)
    t0 = time.time()
    copy = None
    plan = {"prefill": (prefill_ops(), 1), "broad": (suite("broad"), 1), "decode": (decode_ops(), 1),
            "norm": (norm_ops(), 1), "fp8": (prefill_ops("fp8"), 1)}
    for section in sections:
        t = time.time()
        if section == "copy":
            copy = copy_gbs()
            report["copy_gbs"] = round(copy, 1)
        elif section == "splits":
            skinny = [lo for lo in prefill_ops() if lo[1].shape[0] == 256]
            skinny += [lo for lo in suite("broad") if "tp8" in lo[0]]
            report["sections"]["splits"] = measure_splits(gpu, skinny)
        elif section == "explore":
            ops = [lo for lo in prefill_ops() if lo[1].shape[0] == 256] + decode_ops()
            rows = measure(gpu, ops, copy, top=args.explore_top)
            report["sections"]["explore"] = rows
            report["summary"]["explore"] = explore_summary(rows)
        else:
            ops, top = plan[section]
            rows = measure(gpu, ops, copy, top=top)
            report["sections"][section] = rows
            report["summary"][section] = summarize(rows)
        report.setdefault("section_s", {})[section] = round(time.time() - t, 1)
        report["elapsed_s"] = round(time.time() - t0, 1)
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"== {section} done in {time.time() - t:.0f} s: {report['summary'].get(section, report.get('copy_gbs'))}",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
