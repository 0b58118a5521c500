"""Fit the fused-MoE template's measured factors from vLLM-kernel grid timings, and validate them (CPU).

The template's hand model (``templates/moe.py``) ranks the 144-config grid of
``results/h100/moe_runtime_configs.json`` with a pick that runs 0.94x the grid's best at the geomean; its
errors are systematic per config class (one warpgroup of 4 warps on a 128-row or 256-wide tile, narrow
N tiles at many rows per expert). This fits one factor per (routing regime, BLOCK_SIZE_M, BLOCK_SIZE_N,
num_warps) on Hopper: the mean log of measured / predicted over every timed config of that class, shrunk
toward 1 by ``n / (n + SHRINK)``, and checks it leave-one-model-case-out (fit on 7 cases, pick on the 8th).
Writes ``templates/moe_factors.py`` (``--write``) and prints the validation::

    PYTHONPATH=. python benchmarks/fit_moe_factors.py [--write]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SRC = Path(__file__).resolve().parent / "results" / "h100" / "moe_runtime_configs.json"
OUT = Path(__file__).resolve().parents[1] / "templates" / "moe_factors.py"
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
SHRINK = 3.0


def points() -> list[tuple[str, Any, list[tuple[dict[str, int], float, float]]]]:
    """(case, op, [(config params, measured us, hand-model us)]) per measured (case, M)."""
    from autoopt.hardware.library import load_profile
    from autoopt.kernels.ops import OpSpec
    from autoopt.templates import moe

    gpu = load_profile("h100-sxm").gpu
    assert gpu is not None
    template = moe.FusedMoeTemplate()
    out = []
    for r in json.loads(SRC.read_text())["rows"]:
        if "grid" not in r:
            continue
        op = OpSpec(kind="fused_moe", shape=(r["M"], r["E"], r["topk"], r["N"], r["K"]), dtype="bf16",
                    weight="fp8" if r["dtype"] == "fp8_w8a8" else None)
        by_params = {tuple(c.params[k] if k in c.params else getattr(c, k) for k in KEYS): c
                     for c in template.space(gpu, op)}
        rows = []
        for text, us in r["grid"].items():
            params = dict(zip(KEYS, map(int, text.split("/")), strict=True))
            cfg = by_params.get(tuple(params.values()))
            if not isinstance(us, (int, float)) or cfg is None or template.validate(gpu, op, cfg):
                continue
            rows.append((params, float(us), moe.moe_cost(gpu, op, cfg, hand=True).us))
        out.append((r["case"], op, rows))
    return out


def cell(op: Any, params: dict[str, int]) -> tuple[int, int, int, int]:
    from autoopt.templates.moe import regime

    return regime(op), params["BLOCK_SIZE_M"], params["BLOCK_SIZE_N"], params["num_warps"]


def fit(pts: list[Any]) -> dict[tuple[int, int, int, int], float]:
    acc: dict[tuple[int, int, int, int], list[float]] = defaultdict(list)
    for _, op, rows in pts:
        for params, us, pred in rows:
            acc[cell(op, params)].append(math.log(us / pred))
    return {k: round(sum(v) / len(v) * len(v) / (len(v) + SHRINK), 4) for k, v in sorted(acc.items())}


def pick(pts: list[Any], factors: dict[Any, float]) -> list[float]:
    """Per point: the grid's best time over the time of the config the (corrected) model ranks first."""
    out = []
    for _, op, rows in pts:
        best = min(us for _, us, _ in rows)
        chosen = min(rows, key=lambda r: r[2] * math.exp(factors.get(cell(op, r[0]), 0.0)))
        out.append(best / chosen[1])
    return out


def geomean(x: list[float]) -> float:
    return math.exp(sum(map(math.log, x)) / len(x))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    pts = points()
    cases = sorted({c for c, _, _ in pts})
    loco: list[float] = []
    for hold in cases:
        loco += pick([p for p in pts if p[0] == hold], fit([p for p in pts if p[0] != hold]))
    hand = pick(pts, {})
    factors = fit(pts)
    summary = {"points": len(pts), "configs_timed": sum(len(r) for _, _, r in pts), "cells": len(factors),
               "hand_model_pick_geomean": round(geomean(hand), 4), "hand_model_pick_min": round(min(hand), 4),
               "leave_one_case_out_pick_geomean": round(geomean(loco), 4),
               "leave_one_case_out_min": round(min(loco), 4),
               "in_sample_pick_geomean": round(geomean(pick(pts, factors)), 4)}
    print(json.dumps(summary, indent=1))
    if args.write:
        lines = [f"    {k!r}: {v!r}," for k, v in factors.items()]
        OUT.write_text(
            '"""Measured factors of the fused-MoE template on Hopper (sm_90): generated, do not edit.\n\n'
            "``benchmarks/fit_moe_factors.py`` over ``benchmarks/results/h100/moe_runtime_configs.json`` (vLLM's\n"
            "fused_moe_kernel, 8 model cases x 6 M x 144 configs, H100 SXM, Triton 3.6): per (routing regime,\n"
            "BLOCK_SIZE_M, BLOCK_SIZE_N, num_warps), ln(measured / hand-model us), shrunk toward 0 by n/(n+3).\n"
            "Validation:\n" + "".join(f"- {k}: {v}\n" for k, v in summary.items()) +
            '"""\n\n'
            "FACTORS: dict[tuple[int, int, int, int], float] = {\n" + "\n".join(lines) + "\n}\n")
        print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
