"""Time a fixed, template-independent grid of GEMM configs on Llama-3-8B shapes (run on a GPU).

    PYTHONPATH=. python benchmarks/gemm_grid.py out.json [--rep-ms 20] [--workers 12]

For M in {16, 256, 4096} x (N, K) in the four Llama-3-8B projections, every
plain ``gemm`` config of the grid below (pruned only by the shared-memory
formula ``stages*(BM*BK + BN*BK)*2 <= 232448`` B, the H100/H200 opt-in limit
per block) goes through ``runner.evaluate`` (poisoned output, float64
reference, then ``do_bench`` median), next to ``torch.matmul`` (cuBLAS).
M=16 also gets SPLIT_K 2 and 4 for BLOCK_M <= 32. Persistent TMA GEMM configs
are timed on the M=4096 shapes under the separate key ``gemm_tma``.

Speed: kernels are compiled up front by a pool of spawned processes (Triton's
on-disk cache is shared, so the timing process only loads them); shapes are
runtime arguments, so one compile serves every shape with the same K-tiling
specialisation. JSON is rewritten every ~15 s, so a timeout still leaves data.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMEM_LIMIT = 232448  # bytes: H100/H200 max dynamic shared memory per block (227 KB opt-in)
SHAPES_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
MS = [16, 256, 4096]


def grid_configs() -> list[dict[str, int]]:
    """The plain-GEMM grid, SPLIT_K 1 (at least 150 configs survive the SMEM prune)."""
    out = []
    for bm, bn, bk, stages, warps in itertools.product((16, 32, 64, 128, 256), (32, 64, 128, 256),
                                                       (32, 64, 128), (3, 4, 5), (4, 8)):
        if stages * (bm * bk + bn * bk) * 2 <= SMEM_LIMIT:
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SPLIT_K=1,
                            num_warps=warps, num_stages=stages))
    return out


def splitk_configs() -> list[dict[str, int]]:
    """Split-K variants for the decode-sized M=16: BLOCK_M <= 32 only (larger tiles are mostly padding)."""
    return [dict(c, SPLIT_K=s) for c in grid_configs() if c["BLOCK_M"] <= 32 for s in (2, 4)]


def tma_configs() -> list[dict[str, int]]:
    """Persistent TMA GEMM grid; SMEM holds the pipeline plus the BM x BN bf16 epilogue tile."""
    out = []
    for bm, bn, bk, stages, warps in itertools.product((64, 128, 256), (64, 128, 256), (64, 128),
                                                       (3, 4), (4, 8)):
        if stages * (bm * bk + bn * bk) * 2 + bm * bn * 2 <= SMEM_LIMIT:
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages))
    return out


def _precompile(kernel: str, configs: list[dict[str, int]]) -> int:
    """Worker: launch each config once on small problems with the real K values, filling Triton's cache."""
    import torch

    from autoopt.backend import registry
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec

    done = 0
    for params in configs:
        for k in sorted({k for _, k in SHAPES_NK}):
            # M and N only matter through divisibility by 16 (all real ones are), K through K-tiling.
            op = OpSpec(kind="gemm", shape=(256, 256, k), dtype="bf16")
            cfg = KernelConfig(kernel=kernel, params=params)
            try:
                inputs = registry.make_inputs(op, "cuda", 0)
                out = registry.alloc_out(op, "cuda")
                registry.prepare(inputs, cfg, out, op)()
                torch.cuda.synchronize()
            except Exception:  # recorded properly by evaluate() in the timing pass
                pass
        done += 1
    return done


def precompile(kernel: str, configs: list[dict[str, int]], workers: int) -> None:
    chunks = [configs[i::workers] for i in range(workers)]
    t0 = time.time()
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        n = sum(pool.map(_precompile, [kernel] * len(chunks), chunks))
    print(f"precompiled {n} {kernel} configs in {time.time() - t0:.0f} s with {workers} processes",
          file=sys.stderr, flush=True)


def _driver() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("--rep-ms", type=int, default=20)
    ap.add_argument("--warmup-ms", type=int, default=5)
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--limit", type=int, default=0, help="only the first N configs of each list (smoke test)")
    args = ap.parse_args(argv)

    import torch
    import triton
    import triton.testing

    from autoopt.backend import registry, runner
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec

    if not torch.cuda.is_available():
        print("gemm_grid needs a CUDA GPU", file=sys.stderr)
        return 2
    plain, split, tma = grid_configs(), splitk_configs(), tma_configs()
    if args.limit:
        plain, split, tma = plain[:args.limit], split[:args.limit], tma[:args.limit]
    has_tma = torch.cuda.get_device_capability() >= (9, 0)
    props = torch.cuda.get_device_properties(0)
    data: dict = {"meta": {"device": torch.cuda.get_device_name(0), "driver": _driver(),
                           "torch": torch.__version__, "triton": triton.__version__,
                           "python": platform.python_version(),
                           "cc": list(torch.cuda.get_device_capability()), "sms": props.multi_processor_count,
                           "rep_ms": args.rep_ms, "warmup_ms": args.warmup_ms, "timer": "do_bench median",
                           "n_plain": len(plain), "n_splitk": len(split), "n_tma": len(tma),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "complete": False},
                  "gemm": {}, "gemm_tma": {}}
    t_start = last_write = time.time()

    def write(force: bool = False) -> None:
        nonlocal last_write
        if force or time.time() - last_write > 15:
            data["meta"]["elapsed_s"] = round(time.time() - t_start, 1)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(args.out)
            last_write = time.time()

    if not args.no_precompile:
        precompile("gemm", plain + split, args.workers)
        if has_tma:
            precompile("gemm_tma", tma, args.workers)
        data["meta"]["precompile_s"] = round(time.time() - t_start, 1)
    write(True)

    def sweep(kernel: str, key: str, op: OpSpec, configs: list[dict[str, int]]) -> None:
        entry = data[key].setdefault("x".join(map(str, op.shape)), {"configs": []})
        for params in configs:
            res = runner.evaluate(op, KernelConfig(kernel=kernel, params=params),
                                  warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
            entry["configs"].append({"config": params, "label": res.label,
                                     "us": None if res.us is None else round(res.us, 3),
                                     "rel_err": res.rel_err, "reason": res.reason})
            write()
        inputs, _ = runner._inputs_and_reference(op, "cuda", 0)
        base = registry.torch_baseline(inputs, op)
        entry["torch_us"] = round(float(triton.testing.do_bench(base, warmup=args.warmup_ms, rep=args.rep_ms,
                                                                return_mode="median")) * 1e3, 3)
        ok = [c["us"] for c in entry["configs"] if c["us"] is not None and c["label"] == "measured"]
        best = min(ok) if ok else None
        print(f"{key} {op.label()}: {len(ok)}/{len(entry['configs'])} measured, best "
              f"{best} us, torch {entry['torch_us']} us  [{time.time() - t_start:.0f} s]",
              file=sys.stderr, flush=True)
        write(True)

    for m in MS:
        for n, k in SHAPES_NK:
            op = OpSpec(kind="gemm", shape=(m, n, k), dtype="bf16")
            sweep("gemm", "gemm", op, plain + (split if m == 16 else []))
            if m == 4096 and has_tma:
                sweep("gemm_tma", "gemm_tma", op, tma)
    data["meta"]["complete"] = True
    data["meta"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write(True)
    print(f"wrote {args.out} in {time.time() - t_start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
