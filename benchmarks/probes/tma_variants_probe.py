"""Probe: does warp specialization or a split epilogue speed up the persistent TMA GEMM on this GPU?

Issue 13 asks for the prefill GEMMs at >= 1.00x torch.matmul; the TMA kernel sits at 0.92-0.96.
Triton's tutorial 09-persistent-matmul adds two things our ``gemm_tma`` kernel lacks: a
warp-specialized tile loop (``tl.range(..., warp_specialize=True)``, producer and consumer warps;
enabled for Hopper upstream in mid-2025) and ``EPILOGUE_SUBTILE`` (the accumulator stored in two
halves). This script times four variants of the same kernel with the current zero-shot pick's
tile config on the 8 prefill shapes, beside torch.matmul in the same run, after checking each
output against torch. A variant that fails to compile is reported, not timed.

    PYTHONPATH=. python benchmarks/probes/tma_variants_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoopt.backend import runner
from autoopt.backend.kernels.gemm_tma import _tile_of
from autoopt.hardware.detection import detect
from autoopt.kernels.ops import OpSpec
from autoopt.kernels.suite import LLAMA3_8B_PROJECTIONS
from autoopt.search.ranking import rank


@triton.jit
def _kernel(a_desc, b_desc, c_desc, M, N, K,  # type: ignore[no-untyped-def]
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
            NUM_SMS: tl.constexpr, WS: tl.constexpr, SUBTILE: tl.constexpr):
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=not WS, warp_specialize=WS):
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if SUBTILE:
            acc = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2))
            acc = tl.permute(acc, (0, 2, 1))
            acc0, acc1 = tl.split(acc)
            c_desc.store([off_m, off_n], acc0.to(c_desc.dtype))
            c_desc.store([off_m, off_n + BLOCK_N // 2], acc1.to(c_desc.dtype))
        else:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


def _launcher(a, w, out, p, ws, subtile):  # type: ignore[no-untyped-def]
    bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    a_d = TensorDescriptor.from_tensor(a, [bm, bk])
    b_d = TensorDescriptor.from_tensor(w, [bn, bk])
    c_d = TensorDescriptor.from_tensor(out, [bm, bn // 2] if subtile else [bm, bn])
    m, n, k = a.shape[0], w.shape[0], a.shape[1]
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

    def run() -> None:
        _kernel[grid](a_d, b_d, c_d, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=p.get("GROUP_M", 8),
                      NUM_SMS=sms, WS=ws, SUBTILE=subtile, num_warps=p["num_warps"], num_stages=p["num_stages"])
    return run


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", default="256,4096")
    args = ap.parse_args()
    gpu = detect().gpu
    report: dict = {"gpu": gpu.name if gpu else None, "versions": runner._versions(), "shapes": []}
    torch.manual_seed(0)
    for m in (int(x) for x in args.m.split(",")):
        for name, (n, k) in LLAMA3_8B_PROJECTIONS.items():
            op = OpSpec(kind="gemm", shape=(m, n, k), dtype="bf16")
            pick = next(c for c in rank(gpu, op, top=50, measured=False).candidates
                        if c.config.kernel == "gemm_tma" and c.config.params.get("SPLIT_K", 1) == 1
                        and not c.config.params.get("STREAM_K", 0))
            p = dict(pick.config.params)
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            ref = a @ w.T
            row = {"shape": f"{m}x{n}x{k}", "name": name, "config": p,
                   "torch_us": _time(lambda a=a, w=w: a @ w.T)}
            for ws in (False, True):
                for sub in (False, True):
                    key = f"ws{int(ws)}_sub{int(sub)}"
                    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                    try:
                        run = _launcher(a, w, out, p, ws, sub)
                        run()
                        torch.cuda.synchronize()
                        err = float(((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item())
                        if err > 2e-2:
                            row[key] = {"error": f"wrong: max rel err {err:.3g}"}
                            continue
                        us = _time(run)
                        row[key] = {"us": us, "vs_torch": row["torch_us"] / us, "rel_err": err}
                    except Exception as exc:  # a variant this triton cannot compile: say so
                        row[key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            report["shapes"].append(row)
            print(json.dumps({k: (v if not isinstance(v, dict) else {kk: (round(vv, 3) if isinstance(vv, float) else vv)
                                                                     for kk, vv in v.items()})
                              for k, v in row.items() if k != "config"}), flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    report["elapsed_s"] = round(time.process_time(), 1)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
