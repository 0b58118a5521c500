"""Replay the committed fused-MoE grids against the cost model: how good is its order of the measured configs?

Each (case, M) point of ``benchmarks/results/h*/moe_runtime_configs*.json`` timed a 144-config grid in vLLM's
own kernel. For each point this ranks the grid's valid configs by the fused-MoE template's prediction
(``autoopt.templates.moe.moe_cost`` on the profile of the GPU the file was measured on) and reports the
measured time of the config ranked first over the grid's best (1: the model's first choice among them was the
fastest), per point and as a geomean, with that config's predicted over measured time (the model's absolute
scale). It scores the model's order of configs that were measured, which a zero-shot pick from the whole space
(most of it unmeasured) cannot. A config's time is the least of its timings in that run (:func:`timings`).
Nothing runs on a GPU.

It also scores today's zero-shot pick (rank()'s first from the whole space) where the run happened to time
that config (in its grid, its named sets or its final round): over the run's fastest timed config.

    PYTHONPATH=. python benchmarks/replay_moe.py [FILE ...]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.hardware.library import load_profile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

RESULTS = Path(__file__).resolve().parent / "results" / "h100"
FILES = (RESULTS / "moe_runtime_configs.json", RESULTS / "moe_runtime_configs_factors.json")
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
#: the runtimes' dtype names (and block shape) -> autoopt's weight format
FORMATS = {("bf16", None): None, ("fp8_w8a8", None): "fp8", ("fp8_w8a8", (128, 128)): "fp8_block",
           ("int8_w8a16", None): "int8", ("int4_w4a16", None): "int4"}


def point_score(row: dict[str, Any], gpu: Any) -> tuple[float, str, float] | None:
    """(grid best over the measured time of the model's first config, that config's key, its predicted time
    over its measured time), or None."""
    from autoopt.templates.gemm import matmul_path
    from autoopt.templates.moe import FusedMoeTemplate, moe_cost

    op = _op(row)
    grid = timings(row)
    template, predicted = FusedMoeTemplate(), {}
    for key in grid:
        params = dict(zip(KEYS, map(int, key.split("/")), strict=True))
        config = KernelConfig(kernel="fused_moe", params=params,
                              path=matmul_path(gpu, params["BLOCK_SIZE_M"], params["num_warps"]))
        if not template.validate(gpu, op, config):
            predicted[key] = moe_cost(gpu, op, config).us
    if not predicted:
        return None
    first = min(predicted, key=lambda k: predicted[k])
    return min(grid.values()) / grid[first], first, predicted[first] / grid[first]


def timings(row: dict[str, Any]) -> dict[str, float]:
    """Each grid config's measured us: the least of its timings in the row's process, the grid's and those of
    the config sets timed beside it (default, zero-shot, tuned, shipped, the search's best) when one of them
    is the same config. A ~60 us kernel timed once can spike 3x (Qwen3-235B TP8 M=1: 16/64/128/1/4/4 took
    385.7 us in the grid and 125.7 us as vLLM's default in the same run); the least of repeated timings is
    the kernel's own time."""
    out = {k: float(v) for k, v in row.get("grid", {}).items() if isinstance(v, (int, float))}
    for key, us in _named_times(row):
        if key in out:
            out[key] = min(out[key], us)
    return out


def measured(row: dict[str, Any]) -> dict[str, float]:
    """Every config the row's process timed (the grid, the named sets, the final round), its least time."""
    out = timings(row)
    final = row.get("final_round", {}).get("us", {}) if isinstance(row.get("final_round"), dict) else {}
    repeats = [(key, float(us)) for key, times in final.items() if isinstance(times, list) for us in times
               if isinstance(us, (int, float))]
    for key, us in [*_named_times(row), *repeats]:
        out[key] = min(out.get(key, math.inf), us)
    return out


def _named_times(row: dict[str, Any]) -> list[tuple[str, float]]:
    """(config key, measured us) of each named config set the row timed whose check passed: the least of its
    two timings (``measured_us_first``, then ``measured_us`` in the round that times the sets together; on the
    H200 run of 2026-11-28 the second round of Mixtral TP8 M=1 took 120-129 us where the first took 70-74)."""
    out = []
    for entry in row.values():
        if isinstance(entry, dict) and isinstance(entry.get("config"), dict) and \
                isinstance(entry.get("measured_us"), (int, float)) and entry.get("check", "passed") == "passed":
            key = "/".join(str(entry["config"].get(k)) for k in KEYS)
            first = entry.get("measured_us_first")
            out.append((key, min(float(entry["measured_us"]), float(first) if isinstance(first, (int, float))
                                 else math.inf)))
    return out


def _op(row: dict[str, Any]) -> OpSpec:
    return OpSpec(kind="fused_moe", shape=(row["M"], row["E"], row["topk"], row["N"], row["K"]), dtype="bf16",
                  weight=FORMATS[_format_key(row)])


def zero_shot_score(row: dict[str, Any], gpu: Any) -> tuple[float, str] | None:
    """(the row's fastest measured time over the measured time of rank()'s first config from the whole space,
    that config's key), or None when the run did not time that config (a pick outside what it measured)."""
    from autoopt.search.ranking import rank

    times = measured(row)
    params = rank(gpu, _op(row), top=1).candidates[0].config.params
    key = "/".join(str(params[k]) for k in KEYS)
    return (min(times.values()) / times[key], key) if key in times else None


#: the largest grid file read (the committed ones are under 1 MiB)
MAX_GRID_BYTES = 16 << 20


def load_run(path: Path) -> tuple[list[dict[str, Any]], Any]:
    """The (case, M) rows of a ``moe_runtime_configs.py`` result and the known profile of the GPU it was measured
    on, the file read once and checked first (a regular JSON file of sane size, rows holding the case's shape and
    a grid). ValueError (one line, naming the file) otherwise."""
    from benchmarks.rescore_regret import checked_json

    data = checked_json(path, MAX_GRID_BYTES, "a moe_runtime_configs.py result")
    rows = data.get("rows") if isinstance(data, dict) else None
    need = ("case", "M", "E", "topk", "N", "K", "dtype")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and all(k in r for k in need) for r in rows):
        raise ValueError(f"{path}: not a moe_runtime_configs.py result (expected 'rows' with {', '.join(need)})")
    for r in rows:
        if _format_key(r) not in FORMATS:
            raise ValueError(f"{path}: {r['case']} M={r['M']} has dtype {r['dtype']!r} (block shape "
                             f"{r.get('block_shape')}); expected one of {sorted({d for d, _ in FORMATS})}")
    return rows, _gpu_named(data.get("device_name"), path)


def _gpu_named(name: Any, path: Path) -> Any:
    """The known profile of the GPU a result names (``device_name``, vLLM's spelling: spaces as underscores);
    ``h100-sxm`` for a file that names none (the first runs). ValueError if no profile describes it."""
    from autoopt.hardware.library import match_gpu

    if not isinstance(name, str) or not name:
        return load_profile("h100-sxm").gpu
    known = match_gpu(name=name.replace("_", " "))
    if known is None:
        raise ValueError(f"{path}: measured on {name!r}, which no profile in profiles/ describes")
    return load_profile(known.name).gpu


def _format_key(row: dict[str, Any]) -> tuple[Any, tuple[int, ...] | None]:
    return row["dtype"], tuple(row.get("block_shape") or ()) or None


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, default=list(FILES))
    args = ap.parse_args(argv)
    for path in args.files:
        try:
            rows, gpu = load_run(path)
        except ValueError as exc:
            print(f"replay_moe: {exc}", file=sys.stderr)
            return 2
        scores, ratios = [], []
        for row in rows:
            got = point_score(row, gpu)
            if got is None:
                continue
            scores.append(got[0])
            ratios.append(got[2])
            print(f"{row['case']:24s} M={row['M']:<5d} {got[0]:.3f} {got[1]} predicted/measured {got[2]:.2f}")
        if scores:
            print(f"{path.name}: {len(scores)} points, geomean {_geomean(scores):.4f}, min {min(scores):.3f}; "
                  f"the first config's predicted/measured geomean {_geomean(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f})")
        zero = [z for z in (zero_shot_score(row, gpu) for row in rows) if z is not None]
        if not scores and not zero:
            print(f"replay_moe: {path}: no (case, M) point with a timed grid or a timed zero-shot config",
                  file=sys.stderr)
            return 2
        if zero:
            got = [z[0] for z in zero]
            print(f"{path.name}: zero-shot (rank()'s first from the whole space), {len(got)} of {len(rows)} points "
                  f"timed in the run: geomean {_geomean(got):.4f}, min {min(got):.3f} of the run's fastest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
