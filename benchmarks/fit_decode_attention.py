"""Fit the decode-attention price's constants (``autoopt/kernels/attention.py``) to a probe's measured grid.

Reads ``benchmarks/probes/decode_attention_probe.py``'s JSON (each config of the kernel timed replayed from a CUDA
graph), fits FIXED_US, BLOCK_US, KEY_US, KV_EFFICIENCY and PROGRAM_KEY_US by least squares on ln(predicted /
measured) (Nelder-Mead from the shipped values: the price is piecewise, with a max), and prints the constants, the
ratio range over every config, and what the choice would measure on each shape:

    python benchmarks/fit_decode_attention.py benchmarks/results/h200/decode_attention_probe_loops.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NAMES = ("FIXED_US", "BLOCK_US", "KEY_US", "KV_EFFICIENCY", "PROGRAM_KEY_US")


def price(c: Sequence[float], row: dict[str, Any], *, heads: int, kv_heads: int, head_dim: int, gbs: float) -> float:
    """``decode_attention_us``'s formula with the constants ``c`` (kept in step with autoopt/kernels/attention.py)."""
    fixed, block_us, key_us, eff, program_key_us = c
    keys, bn, splits = row["keys"], row["BLOCK_N"], row["splits"]
    chunk = math.ceil(math.ceil(keys / splits) / bn) * bn
    serial = math.ceil(min(chunk, keys) / bn)
    programs = row["batch"] * kv_heads * splits
    kv_bytes = 2.0 * row["batch"] * kv_heads * keys * head_dim * 2
    return fixed + max(serial * (block_us + key_us * bn), kv_bytes / (gbs * 1e3 * eff)) + programs * bn * program_key_us


def nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], steps: int = 4000) -> list[float]:
    """Minimise ``f`` over positive parameters (searched in log space) by Nelder-Mead."""
    n = len(x0)
    simplex = [[math.log(v) for v in x0]]
    for i in range(n):
        p = list(simplex[0])
        p[i] += 0.3
        simplex.append(p)
    g = lambda p: f([math.exp(v) for v in p])  # noqa: E731
    values = [g(p) for p in simplex]
    for _ in range(steps):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflect = [c + (c - w) for c, w in zip(centre, worst, strict=True)]
        fr = g(reflect)
        if fr < values[0]:
            expand = [c + 2 * (c - w) for c, w in zip(centre, worst, strict=True)]
            fe = g(expand)
            simplex[-1], values[-1] = (expand, fe) if fe < fr else (reflect, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflect, fr
        else:
            contract = [c + 0.5 * (w - c) for c, w in zip(centre, worst, strict=True)]
            fc = g(contract)
            if fc < values[-1]:
                simplex[-1], values[-1] = contract, fc
            else:  # shrink toward the best
                simplex = [simplex[0]] + [[b + 0.5 * (v - b) for b, v in zip(simplex[0], p, strict=True)]
                                          for p in simplex[1:]]
                values = [values[0]] + [g(p) for p in simplex[1:]]
    return [math.exp(v) for v in simplex[min(range(n + 1), key=values.__getitem__)]]


#: the largest probe file read (the committed ones are under 100 KiB)
MAX_PROBE_BYTES = 16 << 20


def load_probe(path: Path) -> dict[str, Any]:
    """A ``decode_attention_probe.py`` result, checked first (a regular JSON file of sane size with the heads and
    timed rows of the kernel's configs); ValueError, one line naming the file, otherwise."""
    from benchmarks.rescore_regret import checked_json

    data = checked_json(path, MAX_PROBE_BYTES, "a decode_attention_probe.py result")
    need = ("batch", "keys", "BLOCK_N", "splits", "us")
    rows = data.get("rows") if isinstance(data, dict) else None
    ok = isinstance(rows, list) and all(isinstance(data.get(k), int) for k in ("heads", "kv_heads", "head_dim"))
    timed = [r for r in rows or () if isinstance(r, dict) and r.get("impl") == "decode_attention" and "us" in r]
    if not ok or not timed or not all(all(k in r for k in need) for r in timed):
        raise ValueError(f"{path}: not a decode_attention_probe.py result (expected heads, kv_heads, head_dim and "
                         f"rows of impl 'decode_attention' with {', '.join(need)})")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", help="a decode_attention_probe.py JSON")
    ap.add_argument("--profile", default="h200", help="the profile whose bandwidth the price uses (default h200)")
    args = ap.parse_args(argv)
    import autoopt
    from autoopt.kernels import attention

    try:
        data = load_probe(Path(args.probe))
    except ValueError as exc:
        print(f"fit_decode_attention: {exc}", file=sys.stderr)
        return 2
    shape = {"heads": data["heads"], "kv_heads": data["kv_heads"], "head_dim": data["head_dim"],
             "gbs": autoopt.load_profile(args.profile).gpus[0].bandwidth_gbs}
    # rows of the shipped loop only (an older probe timed a second loop under a "prepass" key)
    rows = [r for r in data["rows"] if r["impl"] == "decode_attention" and "us" in r and r.get("prepass", True)]
    loss = lambda c: sum(math.log(price(c, r, **shape) / r["us"]) ** 2 for r in rows)  # noqa: E731
    fit = nelder_mead(loss, [getattr(attention, n) for n in NAMES])
    ratios = sorted(price(fit, r, **shape) / r["us"] for r in rows)
    out: dict[str, Any] = {"configs": len(rows), **{n: float(f"{v:.3g}") for n, v in zip(NAMES, fit, strict=True)},
                           "ratio_min": round(ratios[0], 3), "ratio_median": round(ratios[len(ratios) // 2], 3),
                           "ratio_max": round(ratios[-1], 3), "shapes": []}
    for bk in sorted({(r["batch"], r["keys"]) for r in rows}):
        grid = [r for r in rows if (r["batch"], r["keys"]) == bk]
        # decode_attention_choice's order: BLOCK_N, then splits ascending; a later config only if strictly cheaper
        grid.sort(key=lambda r: (r["BLOCK_N"], r["splits"]))
        pick = grid[0]
        for r in grid[1:]:
            if price(fit, r, **shape) < price(fit, pick, **shape) - 1e-9:
                pick = r
        best = min(grid, key=lambda r: r["us"])
        out["shapes"].append({"batch": bk[0], "keys": bk[1], "pick": [pick["BLOCK_N"], pick["splits"]],
                              "pick_us": pick["us"], "predicted_us": round(price(fit, pick, **shape), 2),
                              "best": [best["BLOCK_N"], best["splits"]], "best_us": best["us"]})
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
