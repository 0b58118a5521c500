"""What the kernel probes share: time a launcher, check it first, build a GEMM case, time the zero-shot pick.

A probe (``limit_variants_probe.py``, ``streamk_probe.py``, ``tma_occupancy_probe.py``,
``tma_cluster_probe.py``) times hand-built launchers of variant kernels beside the shipped pick. Each
launcher's output is compared with a float64 reference before it is timed, so a variant that is wrong,
or that this Triton cannot compile, is recorded as such and never gets a time. Runs on a CUDA GPU.

:func:`probe_main` is the command line and report loop of ``gemv_probe.py``, ``norm_coop_probe.py``,
``streamk_probe.py``, ``tma_occupancy_probe.py`` and ``tma_cluster_probe.py``; the copy bandwidth and
environment it records come from ``benchmarks/hw_limit.py``, as in that harness's own reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import triton.testing

from benchmarks.hw_limit import copy_gbs, environment


def bench_us(fn: Callable[[], Any], rep_ms: int = 100) -> float:
    """``do_bench`` median of ``fn`` in microseconds (25 ms warm-up)."""
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")) * 1e3


def checked(run: Callable[[], None], out: Any, ref: Any, tol: float = 1e-2) -> dict[str, Any]:
    """Run once into a NaN-poisoned ``out``, compare with ``ref`` (relative Frobenius error) and time
    ``run`` only if it matched: ``{"us", "rel_err"}``, else ``{"error"}``."""
    import torch

    try:
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
    except Exception as exc:  # a variant this triton cannot compile is data, not a crash
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    err = float((out.double() - ref).norm() / ref.norm())
    if not err < tol:  # NaN (an element never written) fails too
        return {"error": f"wrong output: relative error {err:.3g}", "rel_err": err}
    return {"us": bench_us(run), "rel_err": err}


def gemm_case(m: int, n: int, k: int) -> tuple[Any, Any, Any, Any]:
    """(A [m, k], W [n, k], float64 A @ W^T, bf16 output buffer) on the GPU, seeded: the same inputs
    in every probe and run. W is scaled by k^-1/2 so outputs stay O(1)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn((m, k), generator=gen).to("cuda", torch.bfloat16)
    w = (torch.randn((n, k), generator=gen) * k ** -0.5).to("cuda", torch.bfloat16)
    return a, w, a.double() @ w.double().t(), torch.empty((m, n), device="cuda", dtype=torch.bfloat16)


def timed_pick(gpu: Any, op: Any, rep_ms: int = 100) -> dict[str, Any]:
    """The zero-shot top-1 config of ``op`` (the cost model alone), checked and timed by the runner."""
    from autoopt.backend import runner
    from autoopt.search.ranking import rank

    pick = rank(gpu, op, top=1, measured=False).best.config
    res = runner.evaluate(op, pick, gpu=gpu, warmup_ms=25, rep_ms=rep_ms)
    return {"config": pick.to_dict(), "label": res.label, "us": res.us}


#: a probe's variant: (A, W, out, tile) -> a no-argument launcher, or None where it does not apply;
#: tile = (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
Variant = Callable[[Any, Any, Any, tuple[int, ...]], Callable[[], None] | None]


def tile_rows(gpu: Any, shapes: Iterable[tuple[int, int, int]], tiles: Iterable[tuple[int, ...]],
              variants: dict[str, Variant]) -> Iterator[list[dict[str, Any]]]:
    """One row per bf16 GEMM shape, yielded as it is done: torch.matmul, the zero-shot pick, and each
    variant of each tile, checked then timed, in one process on the same tensors."""
    from autoopt.kernels.ops import OpSpec

    tiles = list(tiles)
    for m, n, k in shapes:
        a, w, ref, out = gemm_case(m, n, k)
        row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "torch_us": bench_us(lambda a=a, w=w: a @ w.t()),
                               "pick": timed_pick(gpu, OpSpec(kind="gemm", shape=(m, n, k), dtype="bf16")),
                               "tiles": {}}
        for tile in tiles:
            cell = {}
            for name, make in variants.items():
                run = make(a, w, out, tile)
                if run is not None:
                    cell[name] = checked(run, out, ref)
            row["tiles"]["{}x{}x{}_w{}_s{}".format(*tile)] = cell
        best = {name: min((c[name]["us"] for c in row["tiles"].values() if c.get(name, {}).get("us")),
                          default=float("nan")) for name in variants}
        print(f"{row['shape']:16s} torch {row['torch_us']:7.1f} pick {row['pick']['us'] or float('nan'):7.1f} "
              + " ".join(f"best {name} {us:7.1f}" for name, us in best.items()), file=sys.stderr, flush=True)
        yield [row]


def probe_main(name: str, doc: str, key: str, steps: Callable[[Any, float], Iterable[list[dict[str, Any]]]]) -> int:
    """Run a probe script: parse ``--out``, detect the GPU, measure the copy bandwidth, then extend the
    report's ``key`` list with each batch of rows ``steps(gpu, copy_gbs)`` yields, saving after each."""
    from autoopt.hardware.detection import detect

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gpu = detect().gpu
    if gpu is None:
        print(f"{name}: no GPU detected", file=sys.stderr)
        return 2
    copy = copy_gbs()
    report: dict[str, Any] = {"env": environment(), "gpu": gpu.name, "copy_gbs": round(copy, 1), key: []}
    for rows in steps(gpu, copy):
        report[key] += rows
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0
