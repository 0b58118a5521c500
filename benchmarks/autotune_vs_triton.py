"""Does ``@autoopt.autotune`` tune Triton's tutorial matmul faster than ``triton.autotune``, and as well?

    PYTHONPATH=. python benchmarks/autotune_vs_triton.py --out $OUT/autotune.json

Targets (issue 10): tuning time per new shape <= 1/5 of triton.autotune's, the chosen kernel
>= 0.98x as fast as triton.autotune's choice (geomean over shapes), and a second process
does zero timings.

The kernel and its 16 configs are the tutorial's (``benchmarks/tutorial_matmul.py``), fp16, at
M=N=K in (512, 1024, 2048, 4096) and the Llama-3 shapes 256x6144x4096, 16x28672x4096 and
4096x4096x14336 (4096^3 is also a Llama shape; it is run once). Each side runs in its own fresh
process with its own empty ``TRITON_CACHE_DIR``, so neither reuses the other's compiled kernels
or tuning results:

1. ``triton``: ``triton.autotune`` (its default timer, 25/100 ms windows);
2. ``autoopt``: ``autoopt.autotune`` with its defaults (top 4, 5/20 ms windows), persisting to an
   empty ``AUTOOPT_CACHE_DIR``;
3. ``autoopt_again``: a second autoopt process with the first one's stores (Triton's compiled
   kernels and autoopt's winners): it should time nothing;
4. ``joint``: one more process times both sides' chosen configs, interleaved, with
   ``do_bench(warmup=25, rep=100)`` median over 5 rounds: the speed ratio (``triton_us / autoopt_us``,
   >= 1: autoopt's choice is at least as fast; 1 where both chose the same config, the measured
   ratio kept beside it as ``speed_ratio_measured``).

Per shape and side: ``tune_s`` (wall clock of the first call, compile and timing included, CUDA
synchronized), the number of ``do_bench`` calls it made (``timings``), the chosen config, its
median time measured afterwards in the same process (``us``), and its max error against
``torch.matmul``. Writes one JSON file with the device, driver, torch and triton versions.
Exits with status 2 and a message when there is no CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES: tuple[tuple[int, int, int], ...] = (
    (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
    (256, 6144, 4096), (16, 28672, 4096), (4096, 4096, 14336),
)
TARGET_TIME_RATIO, TARGET_SPEED_RATIO = 0.2, 0.98
#: timing windows of the after-tuning measurement (Triton's do_bench defaults).
MEASURE_WARMUP_MS, MEASURE_REP_MS = 25, 100


def _geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


# -- children ----------------------------------------------------------------------------------------

def _launch(config: dict[str, Any], a: Any, b: Any, c: Any) -> None:
    """The raw tutorial kernel with one config: what both sides' choices are measured as."""
    import triton

    from benchmarks import tutorial_matmul as tm

    m, k = a.shape
    n = b.shape[1]
    meta = {**config["kwargs"], **{key: config[key] for key in ("num_warps", "num_stages") if key in config}}
    grid = (triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)
    tm.matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                           c.stride(1), ACTIVATION="", **meta)


def _median_ms(bench: Any, fn: Any) -> float:
    """do_bench's median (ms) of ``fn``, after one call outside the timing (compiles if needed)."""
    import torch

    fn()
    torch.cuda.synchronize()
    out = bench(fn, warmup=MEASURE_WARMUP_MS, rep=MEASURE_REP_MS, quantiles=[0.5])
    return float(out[0] if isinstance(out, (list, tuple)) else out)


def _config_dict(config: Any) -> dict[str, Any]:
    return {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages}


def child_side(side: str, shapes: list[tuple[int, int, int]], autoopt_args: dict[str, Any]) -> dict[str, Any]:
    """Tune every shape with one side's decorator (``triton``, else autoopt's) in this (fresh) process."""
    import inspect

    import torch
    import triton
    import triton.testing

    from benchmarks import tutorial_matmul as tm

    real_do_bench = triton.testing.do_bench
    calls = [0]

    def counting_do_bench(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real_do_bench(*args, **kwargs)

    if side == "triton":
        if "do_bench" in inspect.signature(triton.autotune).parameters:
            # Triton's default timer is do_bench with its default windows: the same call, counted
            kernel = tm.autotuned(triton.autotune,
                                  do_bench=lambda fn, quantiles: counting_do_bench(fn, quantiles=quantiles))
        else:
            triton.testing.do_bench = counting_do_bench
            kernel = tm.autotuned(triton.autotune)
    else:
        import autoopt

        triton.testing.do_bench = counting_do_bench  # autoopt's default timer looks it up per call
        kernel = tm.autotuned(autoopt.autotune, **autoopt_args)
    rows = []
    for m, n, k in shapes:
        gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
        a = torch.randn((m, k), device="cuda", dtype=torch.float16, generator=gen)
        b = torch.randn((k, n), device="cuda", dtype=torch.float16, generator=gen)
        before = calls[0]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        c = tm.matmul(kernel, a, b)
        torch.cuda.synchronize()
        tune_s = time.perf_counter() - t0
        timings = calls[0] - before
        config = _config_dict(kernel.best_config)
        ref = torch.matmul(a, b)
        err = float((c.float() - ref.float()).abs().max())
        out = torch.empty((m, n), device="cuda", dtype=torch.float16)
        us = _median_ms(real_do_bench, lambda a=a, b=b, out=out, config=config: _launch(config, a, b, out)) * 1e3
        row: dict[str, Any] = {"shape": [m, n, k], "tune_s": round(tune_s, 4), "timings": timings, "config": config,
                               "us": round(us, 3), "max_abs_err": err}
        lt = getattr(kernel, "last_tuning", None)
        if side != "triton" and lt is not None:
            row["autoopt"] = {"model": lt.model, "op": lt.op, "from_store": lt.from_store, "top_k": lt.top_k,
                              "phases_s": {p: round(v, 4) for p, v in lt.phases.items()},
                              "timed": [t.to_dict() for t in lt.timed], "skipped": [s.to_dict() for s in lt.skipped],
                              "rank_of_chosen": next((i for i, r in enumerate(lt.ranked) if r.index == lt.chosen_index),
                                                     None)}
        elif side == "triton":
            row["bench_s"] = round(float(getattr(kernel, "bench_time", float("nan"))), 4)
        rows.append(row)
        print(f"{side} {m}x{n}x{k}: tune {tune_s:.2f} s, {timings} timings, {us:.1f} us", file=sys.stderr, flush=True)
    return {"side": side, "rows": rows}


def child_joint(pairs: list[dict[str, Any]], rounds: int = 5) -> dict[str, Any]:
    """Time both sides' chosen configs per shape in one process, interleaved, ``rounds`` times."""
    import torch
    import triton.testing

    rows = []
    for pair in pairs:
        m, n, k = pair["shape"]
        a = torch.randn((m, k), device="cuda", dtype=torch.float16)
        b = torch.randn((k, n), device="cuda", dtype=torch.float16)
        c = torch.empty((m, n), device="cuda", dtype=torch.float16)
        times: dict[str, list[float]] = {"triton": [], "autoopt": []}
        for _ in range(rounds):
            for side in ("triton", "autoopt"):
                cfg = pair[side]
                fn = lambda cfg=cfg, a=a, b=b, c=c: _launch(cfg, a, b, c)  # noqa: E731
                times[side].append(_median_ms(triton.testing.do_bench, fn) * 1e3)
        med = {s: sorted(v)[len(v) // 2] for s, v in times.items()}
        same = pair["triton"] == pair["autoopt"]
        measured = med["triton"] / med["autoopt"]
        # one config is one kernel: its two timings differ by noise only (seen up to 2.4% on the H100)
        rows.append({"shape": [m, n, k], "triton_us": round(med["triton"], 3),
                     "autoopt_us": round(med["autoopt"], 3), "speed_ratio": 1.0 if same else round(measured, 4),
                     "speed_ratio_measured": round(measured, 4), "same_config": same,
                     "rounds_us": {s: [round(v, 3) for v in vs] for s, vs in times.items()}})
    return {"rows": rows}


# -- parent --------------------------------------------------------------------------------------------

def _run_child(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        done = subprocess.run([sys.executable, __file__, "--child", *args, "--result", result.name], env=env,
                              timeout=timeout, text=True, stderr=subprocess.PIPE)
        sys.stderr.write(done.stderr[-4000:])
        if done.returncode != 0:
            raise SystemExit(f"autotune_vs_triton: child {args[0]} failed (status {done.returncode}); see above")
        return json.loads(Path(result.name).read_text())


def _environment() -> dict[str, Any]:
    import torch
    import triton

    from autoopt.hardware.detection import detect

    gpu = detect().gpu
    return {"device": torch.cuda.get_device_name(0), "driver": gpu.driver_version if gpu else None,
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "host": platform.node(),
            "profile": gpu.profile if gpu else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "autotune_vs_triton.json")
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: the issue's 7 shapes)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process")
    ap.add_argument("--autoopt-args", default="{}",
                    help='JSON of extra autoopt.autotune arguments, e.g. \'{"top_k": 3}\' (default: none)')
    ap.add_argument("--child", choices=("triton", "autoopt", "autoopt_again", "joint"), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--pairs", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in opts.shapes.split(",") if s] or list(SHAPES)

    if opts.child:
        if opts.child == "joint":
            data = child_joint(json.loads(Path(opts.pairs).read_text()))
        else:
            data = child_side(opts.child, shapes, json.loads(opts.autoopt_args))
        Path(opts.result).write_text(json.dumps(data))
        return 0

    try:
        import torch
    except ImportError:
        print("autotune_vs_triton: needs torch with CUDA and triton; torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("autotune_vs_triton: needs a CUDA GPU (torch.cuda.is_available() is False, or TRITON_INTERPRET "
              "is set); nothing was measured", file=sys.stderr)
        return 2

    env0 = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    shape_arg = ["--shapes", ",".join("x".join(map(str, s)) for s in shapes), "--autoopt-args", opts.autoopt_args]
    with tempfile.TemporaryDirectory(prefix="autotune-vs-triton-") as tmp:
        t_env = {**env0, "TRITON_CACHE_DIR": f"{tmp}/triton-side"}
        a_env = {**env0, "TRITON_CACHE_DIR": f"{tmp}/autoopt-side", "AUTOOPT_CACHE_DIR": f"{tmp}/autoopt-store"}
        sides = {"triton": _run_child(["triton", *shape_arg], t_env, opts.timeout),
                 "autoopt": _run_child(["autoopt", *shape_arg], a_env, opts.timeout),
                 "autoopt_again": _run_child(["autoopt_again", *shape_arg], a_env, opts.timeout)}
        pairs = [{"shape": t["shape"], "triton": t["config"], "autoopt": o["config"]}
                 for t, o in zip(sides["triton"]["rows"], sides["autoopt"]["rows"], strict=True)]
        pairs_file = Path(tmp) / "pairs.json"
        pairs_file.write_text(json.dumps(pairs))
        joint = _run_child(["joint", "--pairs", str(pairs_file)], {**env0, "TRITON_CACHE_DIR": f"{tmp}/joint"},
                           opts.timeout)

    per_shape = []
    for t, o, again, j in zip(sides["triton"]["rows"], sides["autoopt"]["rows"], sides["autoopt_again"]["rows"],
                              joint["rows"], strict=True):
        per_shape.append({"shape": t["shape"], "tune_s_triton": t["tune_s"], "tune_s_autoopt": o["tune_s"],
                          "time_ratio": round(o["tune_s"] / t["tune_s"], 4) if t["tune_s"] else None,
                          "timings_triton": t["timings"], "timings_autoopt": o["timings"],
                          "timings_second_process": again["timings"], "tune_s_second_process": again["tune_s"],
                          "speed_ratio": j["speed_ratio"], "same_config": j["same_config"]})
    time_ratio = _geomean([p["time_ratio"] for p in per_shape])
    speed_ratio = _geomean([p["speed_ratio"] for p in per_shape])
    second = sum(p["timings_second_process"] for p in per_shape)
    summary = {
        "time_ratio_geomean": None if time_ratio is None else round(time_ratio, 4),
        "time_ratio_max": max(p["time_ratio"] for p in per_shape if p["time_ratio"] is not None),
        "speed_ratio_geomean": None if speed_ratio is None else round(speed_ratio, 4),
        "speed_ratio_min": min(p["speed_ratio"] for p in per_shape),
        "second_process_timings": second,
        "tune_s_total": {"triton": round(sum(p["tune_s_triton"] for p in per_shape), 3),
                         "autoopt": round(sum(p["tune_s_autoopt"] for p in per_shape), 3)},
        "targets": {"time_ratio_geomean_max": TARGET_TIME_RATIO, "speed_ratio_geomean_min": TARGET_SPEED_RATIO,
                    "second_process_timings": 0},
        "met": {"time": time_ratio is not None and time_ratio <= TARGET_TIME_RATIO,
                "speed": speed_ratio is not None and speed_ratio >= TARGET_SPEED_RATIO, "second_process": second == 0},
    }
    result = {"question": "autoopt.autotune vs triton.autotune on Triton's tutorial matmul (16 configs, fp16): "
                          "tuning time per new shape, speed of the chosen kernel, timings in a second process",
              "environment": _environment(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "shapes": [list(s) for s in shapes], "autoopt_args": json.loads(opts.autoopt_args),
              "summary": summary, "per_shape": per_shape,
              "sides": sides, "joint": joint}
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
