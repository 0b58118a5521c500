"""Same-run A/B of the int4 decode GEMV (M = 1, FMA path): an earlier ``quant_gemv.py`` (``--old``, a copy
of the file at a named commit) against the tree's, on Llama-3-8B's four linears, each output checked
against the dequantized-weight reference before it is timed; ``--ncu`` launches the tree's kernel once per
config (after a compiling warm-up) for Nsight Compute to profile, and times nothing.

    mkdir -p .ab && git show cbb9ec0:autoopt/backend/kernels/quant_gemv.py > .ab/quant_gemv_cbb9ec0.py
    PYTHONPATH=. python benchmarks/probes/int4_gemv_ab.py --old .ab/quant_gemv_cbb9ec0.py --out $OUT/ab.json

(``.ab/`` is not ignored, so the copy travels with the tree to the device; it is never committed.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
CONFIGS = [dict(BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st)
           for bn, bk, sk, w, st in [(16, 512, 1, 4, 3), (16, 512, 1, 8, 4), (32, 256, 1, 4, 3), (16, 1024, 1, 4, 3),
                                     (32, 512, 1, 4, 3), (32, 512, 2, 4, 3), (64, 512, 1, 8, 3), (16, 512, 2, 2, 3),
                                     (64, 1024, 2, 8, 3), (32, 1024, 4, 4, 3)]]


#: a kernel module is tens of kB; anything past this is not one
MAX_MODULE_BYTES = 1 << 20


def old_module_problem(path: str) -> str | None:
    """Why ``path`` is not a kernel module to import (None: it is a regular ``.py`` file of a sane size)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"--old {path}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode) or not path.endswith(".py"):
        return f"--old {path}: not a regular .py file (a copy of quant_gemv.py at a named commit)"
    if st.st_size > MAX_MODULE_BYTES:
        return f"--old {path}: {st.st_size} bytes; a kernel module is at most {MAX_MODULE_BYTES}"
    return None


def load(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--formats", default="int4,int4-asym")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--configs", type=int, default=len(CONFIGS), help="the first N of CONFIGS")
    args = ap.parse_args()
    problem = None if args.ncu else old_module_problem(args.old)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    import torch
    import triton.testing

    from autoopt.backend.accuracy import rel_error
    from autoopt.backend.kernels import quant_gemv as new
    from autoopt.backend.quant import quantize, reference_matmul

    impls = {"new": new} if args.ncu else {"old": load(args.old, "quant_gemv_old"), "new": new}
    bufs = [torch.empty(1 << 28, device="cuda"), torch.empty(1 << 28, device="cuda")]
    copy_gbs = 2 * bufs[0].numel() * 4 / (triton.testing.do_bench(lambda: bufs[1].copy_(bufs[0]),
                                                                   return_mode="median") * 1e-3) / 1e9
    bufs.clear()
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w = (torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5).bfloat16()
        x = torch.randn((1, k), device="cuda", generator=gen).bfloat16()
        for spec in args.formats.split(","):
            q = quantize(w, spec)
            ref = reference_matmul(x, q, gemm=False).float()
            copies = [q] + [type(q)(fmt=q.fmt, qweight=q.qweight.clone(), scales=q.scales.clone(),
                                    offsets=None if q.offsets is None else q.offsets.clone(), n=n, k=k)
                            for _ in range(max(0, min(12, int(150e6 // q.nbytes)) - 1))]
            for cfg in CONFIGS[:args.configs]:
                for label, mod in impls.items():
                    row = {"linear": name, "format": spec, "kernel": label, "config": cfg}
                    try:
                        outs = [torch.empty((1, n), device="cuda", dtype=torch.bfloat16) for _ in copies]
                        fns = [mod.quant_gemv_prepare(x, qq, o, cfg) for qq, o in zip(copies, outs, strict=True)]
                        outs[0].fill_(float("nan"))
                        fns[0]()
                        torch.cuda.synchronize()
                        err = rel_error(outs[0].float(), ref)
                        row["rel_err"] = float(f"{err:.3g}")
                        if not err < 8e-3:
                            row["check"] = "failed"
                        elif args.ncu:
                            fns[1 % len(fns)]()
                            torch.cuda.synchronize()
                        else:
                            state = [0]

                            def run(fns=fns, state=state) -> None:
                                fns[state[0] % len(fns)]()
                                state[0] += 1
                            us = triton.testing.do_bench(run, warmup=25, rep=40, return_mode="median") * 1e3
                            row["us"] = round(us, 2)
                            row["pct_floor"] = round(100 * q.nbytes / (copy_gbs * 1e9) / (us * 1e-6), 1)
                    except Exception as exc:  # a failing config is recorded, the rest go on
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    rows.append(row)
                    print(row, flush=True)
            del copies
        Path(args.out).write_text(json.dumps({"copy_gbs": copy_gbs, "old": args.old, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
