"""How close to the copy rate does the prefill's dequantization pass run, per tile, kernel text and format?

Issue 27: the compiled int4 1 x 2048 prefill of Llama-3-8B spends 8.5 ms of its ~60 in ``_dequant_kernel`` on the
H200 (``h200/prefill_profile_int4_cache.json``: 128 calls, 66 us a call), ~48 % of the copy rate for the bytes it
moves (0.5 a weight read, 2 written). This probe times the kernel alone, per Llama-3-8B linear, over a grid of
``BLOCK_N`` x ``BLOCK_K`` x ``num_warps``: the kernel in this tree and, given ``--old FILE`` (an earlier text of
``autoopt/backend/kernels/quant_dequant.py``), that one beside it on the int4 formats, in one process on the same
weights.

Each launch is first checked: its bf16 output must equal ``dequantize(q)`` rounded to bf16, element for element;
a config that does not is recorded as wrong and never timed. Timing: a CUDA graph of 4 launches over each of
``COPIES`` weight copies (so a launch finds no earlier launch's bytes in L2), replayed ``--reps`` times; the median
replay over its launches. ``pct_of_copy``: bytes moved (packed weight + scales read, bf16 written) at the measured
copy rate (``benchmarks/hw_limit.copy_gbs``) over the time.

    PYTHONPATH=. python benchmarks/probes/dequant_probe.py --out $OUT/dequant_probe.json [--old FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: Llama-3-8B's linears at TP 1: (name, N, K)
LINEARS = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
#: weight copies the graph cycles through (the largest, gate_up's bf16 output, is 235 MB; L2 is 50 MB)
COPIES = 4
#: the tile grid: (BLOCK_N, BLOCK_K, num_warps) with 16 to 64 weights a thread (28 tiles)
GRID = [(bn, bk, w) for bn in (8, 16, 32, 64) for bk in (128, 256, 512, 1024) for w in (1, 2, 4, 8)
        if 16 <= bn * bk // (32 * w) <= 64]


#: the largest module text ``--old`` reads (the module is ~8 KB)
MAX_OLD_BYTES = 1 << 20


def old_problem(path: str) -> str | None:
    """Why ``--old`` cannot be an earlier text of the dequantization module (None: it can): a regular ``.py`` file
    of at most 1 MiB, UTF-8, defining ``dequant_prepare`` (never a device or pipe, whose read would not end)."""
    import stat

    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        return f"--old {path}: cannot read it ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return f"--old {path}: not a regular file; expected a .py text of autoopt/backend/kernels/quant_dequant.py"
    if p.suffix != ".py" or st.st_size > MAX_OLD_BYTES:
        return f"--old {path}: expected a .py file of at most {MAX_OLD_BYTES} bytes, got {st.st_size} bytes"
    try:
        text = p.read_bytes()[:MAX_OLD_BYTES + 1].decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"--old {path}: not UTF-8 text ({exc})"
    if "def dequant_prepare(" not in text:
        return f"--old {path}: defines no dequant_prepare(); expected a text of quant_dequant.py"
    return None


def formats_problem(formats: list[str]) -> str | None:
    """Why ``--formats`` names something this probe cannot time (None: it can): weight-only formats only."""
    from autoopt.errors import OpError
    from autoopt.kernels.quant import parse_weight

    for spec in formats:
        try:
            fmt = parse_weight(spec)
        except OpError as exc:
            return f"--formats: {exc}"
        if fmt.quantizes_activations:
            return f"--formats: {spec} quantizes activations; the dequantization pass serves weight-only formats"
    return None


def _module(path: str) -> Any:
    """An earlier text of the dequantization module, loaded under its own name."""
    spec = importlib.util.spec_from_file_location("quant_dequant_old", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _graph_us(runs: list[Any], reps: int) -> float:
    """Median microseconds a launch: ``runs`` captured 4 times over in one CUDA graph (the runner's
    ``captured``), replayed ``reps`` times between events (``replayed_us``). The 2026-11-29 run timed the same
    graph with this loop written out here."""
    import itertools

    from autoopt.backend.runner import captured, replayed_us

    cycle = itertools.cycle(runs)
    calls = 4 * len(runs)
    return replayed_us(captured(lambda: next(cycle)(), calls=calls), calls, reps)


def _weights(n: int, k: int, spec: str) -> list[Any]:
    import torch

    from autoopt.backend.quant import quantize

    g = torch.Generator(device="cuda").manual_seed(0)
    return [quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k ** 0.5, spec)
            for _ in range(COPIES)]


def _cell(mod: Any, qws: list[Any], ref: Any, tile: tuple[int, int, int], reps: int, moved: int,
          copy: float) -> dict[str, Any]:
    """One (kernel text, tile) on one linear: checked, then timed."""
    import torch

    bn, bk, w = tile
    params = {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w}
    cell: dict[str, Any] = {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w}
    outs = [torch.full((q.n, q.k), float("nan"), device="cuda", dtype=torch.bfloat16) for q in qws]
    try:
        runs = [mod.dequant_prepare(q, o, params) for q, o in zip(qws, outs, strict=True)]
        runs[0]()
        torch.cuda.synchronize()
    except Exception as exc:  # a tile this Triton cannot compile is data
        cell["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return cell
    if not torch.equal(outs[0], ref):
        cell["error"] = "wrong output: not equal to dequantize() rounded to bf16"
        return cell
    us = _graph_us(runs, reps)
    cell.update(measured_us=round(us, 2), measured_gbs=round(moved / us / 1e3, 1),
                pct_of_copy=round(100 * moved / us / 1e3 / copy, 1))
    return cell


def linear_rows(name: str, n: int, k: int, spec: str, kernels: dict[str, Any], reps: int,
                copy: float) -> dict[str, Any]:
    from autoopt.backend.quant import dequantize

    qws = _weights(n, k, spec)
    ref = dequantize(qws[0]).bfloat16()
    q = qws[0]
    moved = (q.qweight.numel() * q.qweight.element_size() + q.scales.numel() * q.scales.element_size()
             + (0 if q.offsets is None else q.offsets.numel() * q.offsets.element_size()) + 2 * n * k)
    row: dict[str, Any] = {"linear": name, "n": n, "k": k, "format": spec, "bytes_moved": moved,
                           "copy_floor_us": round(moved / copy / 1e3, 2)}
    for label, mod in kernels.items():
        if label == "old" and not spec.startswith("int4"):
            continue  # the earlier text differs in its int4 branch only
        cells = [_cell(mod, qws, ref, tile, reps, moved, copy) for tile in GRID]
        timed = [c for c in cells if "measured_us" in c]
        row[label] = {"cells": cells, "best": min(timed, key=lambda c: c["measured_us"]) if timed else None}
        shipped = next((c for c in cells if (c["BLOCK_N"], c["BLOCK_K"], c["num_warps"]) == (16, 256, 2)), None)
        row[label]["shipped_tile"] = shipped
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int4,int8")
    ap.add_argument("--old", help="an earlier text of autoopt/backend/kernels/quant_dequant.py, timed beside")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    problem = formats_problem(formats) or (old_problem(args.old) if args.old else None)
    if problem:
        print(f"dequant_probe: {problem}", file=sys.stderr)
        return 2
    from benchmarks.probes.model_kit import no_cuda

    if no_cuda("dequant_probe", "the dequantization pass"):
        return 2
    from autoopt.backend.kernels import quant_dequant
    from benchmarks.hw_limit import copy_gbs, environment

    kernels = {"tree": quant_dequant}
    if args.old:
        kernels["old"] = _module(args.old)
    copy = copy_gbs()
    report: dict[str, Any] = {"what": __doc__.splitlines()[0], "env": environment(), "measured_copy_gbs": copy,
                              "grid": GRID, "rows": []}
    for spec in formats:
        for name, n, k in LINEARS:
            row = linear_rows(name, n, k, spec, kernels, args.reps, copy)
            report["rows"].append(row)
            print(json.dumps({"linear": name, "format": spec, "copy_floor_us": row["copy_floor_us"],
                              **{lab: row[lab]["best"] for lab in kernels if lab in row},
                              **{f"{lab}_shipped": row[lab]["shipped_tile"] for lab in kernels if lab in row}}),
                  flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
