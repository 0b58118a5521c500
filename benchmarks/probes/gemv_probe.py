"""Where the decode GEMV's time goes beyond streaming W, on a GPU (issue 13: >= 90 % of copy at >= 200 MB).

For M = 1, K = 4096 and N from 4096 to 128256 (W from 34 MB to 1.05 GB), one process times:

- ``read``: a read-only Triton kernel over the same bytes (each program sums a contiguous slice):
  what streaming W alone costs at this size, with this launch and tail;
- ``copy``: a device-to-device copy of the same bytes;
- the zero-shot top-1 config, two fixed configs of the GEMV and GEMM kernels, and
- ``persistent``: a prototype GEMV with one program per SM slot walking its row tiles in one
  software-pipelined loop (``tl.range(..., flatten=True)``), so no program starts or drains
  mid-stream.

A linear fit of time against bytes per variant gives its fixed cost (intercept) and its
streaming rate (slope). Every GEMV output is checked against float64 first. One JSON file:

    PYTHONPATH=. python benchmarks/probes/gemv_probe.py --out $OUT/gemv_probe.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoopt.backend import runner
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.search.ranking import rank
from benchmarks.probes.probe_kit import probe_main

K = 4096
NS = (4096, 6144, 14336, 28672, 57344, 128256)
FIXED = {
    "gemv_bn16_bk512_w8": KernelConfig(kernel="gemv", template="gemv", path="standard", params={
        "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 8, "num_stages": 3}),
    "gemm_bm16_bn128_bk128_w2": KernelConfig(kernel="gemm", template="gemm", path="standard", params={
        "BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 2,
        "num_stages": 5}),
}


@triton.jit
def _read(w_ptr, o_ptr, per_prog, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    base = w_ptr + pid.to(tl.int64) * per_prog
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in tl.range(0, per_prog, BLOCK, num_stages=4):
        acc += tl.load(base + off + tl.arange(0, BLOCK), eviction_policy="evict_first").to(tl.float32)
    tl.store(o_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _gemv_persistent(x_ptr, w_ptr, c_ptr, N, K, stride_wn,  # type: ignore[no-untyped-def]
                     PROGS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    k_tiles = K // BLOCK_K
    for tile in tl.range(pid, n_tiles, PROGS, flatten=True, num_stages=STAGES):
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for kt in range(k_tiles):
            cols = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :], eviction_policy="evict_first")
            x = tl.load(x_ptr + cols)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        tl.store(c_ptr + offs_n, tl.sum(acc, axis=1).to(c_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _gemv_balanced(x_ptr, w_ptr, c_ptr, N, K, stride_wn,  # type: ignore[no-untyped-def]
                   PROGS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """Like _gemv_persistent, but program p owns the contiguous rows [p N / PROGS, (p + 1) N / PROGS):
    every SM streams the same number of rows (to one row), not the same number of whole tiles."""
    pid = tl.program_id(0)
    r0 = (pid * N) // PROGS
    r1 = ((pid + 1) * N) // PROGS
    k_tiles = K // BLOCK_K
    for t in tl.range(0, tl.cdiv(r1 - r0, BLOCK_N), flatten=True, num_stages=STAGES):
        offs_n = r0 + t * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < r1
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for kt in range(k_tiles):
            cols = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + cols[None, :], mask=nmask[:, None], other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(x_ptr + cols)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        tl.store(c_ptr + offs_n, tl.sum(acc, axis=1).to(c_ptr.dtype.element_ty), mask=nmask)


def bench(fn: Any) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")) * 1e3


def read_us(nbytes: int, sms: int) -> float:
    import torch

    block = 4096
    progs = sms * 4
    per = -(-(nbytes // 2) // (progs * block)) * block
    w = torch.randn(progs * per, device="cuda", dtype=torch.bfloat16)
    o = torch.empty(progs, device="cuda", dtype=torch.float32)
    return bench(lambda: _read[(progs,)](w, o, per, BLOCK=block, num_warps=8))


def persistent_rows(n: int, sms: int) -> list[dict[str, Any]]:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn((1, K), generator=gen).to("cuda", torch.bfloat16)
    w = (torch.randn((n, K), generator=gen) * K ** -0.5).to("cuda", torch.bfloat16)
    ref = x.double() @ w.double().t()
    rows = []
    for kernel, bn, bk, warps, per_sm, stages in (
            (_gemv_persistent, 16, 512, 8, 2, 3), (_gemv_persistent, 8, 512, 4, 4, 3),
            (_gemv_balanced, 16, 512, 8, 2, 3), (_gemv_balanced, 8, 512, 4, 4, 3), (_gemv_balanced, 16, 256, 4, 4, 3),
            (_gemv_balanced, 8, 512, 8, 2, 3), (_gemv_balanced, 16, 512, 8, 1, 4), (_gemv_balanced, 4, 1024, 4, 4, 3)):
        progs = sms * per_sm
        out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)

        def fn(out: Any = out, bn: int = bn, bk: int = bk, warps: int = warps, progs: int = progs,
               stages: int = stages, kernel: Any = kernel) -> None:
            kernel[(progs,)](x, w, out, n, K, w.stride(0), PROGS=progs, BLOCK_N=bn, BLOCK_K=bk,
                             STAGES=stages, num_warps=warps)
        name = "persistent" if kernel is _gemv_persistent else "balanced"
        label = f"{name}_bn{bn}_bk{bk}_w{warps}_x{per_sm}_s{stages}"
        try:
            fn()
            err = float((out.double() - ref).norm() / ref.norm())
        except Exception as exc:  # a prototype: a config that fails to compile is data
            rows.append({"variant": label, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            continue
        row: dict[str, Any] = {"variant": label, "rel_err": err}
        if err < 1.5e-2 and torch.isfinite(out).all():
            row["us"] = bench(fn)
        rows.append(row)
    return rows


def size_rows(gpu: Any, copy: float, n: int) -> list[dict[str, Any]]:
    """Every variant at one N: the read-only and copy references, the GEMV configs, the prototypes."""
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    op = OpSpec(kind="gemv", shape=(1, n, K), dtype="bf16")
    nbytes = op.min_bytes
    entry: dict[str, Any] = {"n": n, "bytes": nbytes, "rows": []}
    entry["rows"].append({"variant": "read", "us": read_us(nbytes, sms)})
    src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    entry["rows"].append({"variant": "copy", "us": bench(lambda src=src, dst=dst: dst.copy_(src))})
    del src, dst
    configs = {"top1": rank(gpu, op, top=1, measured=False).best.config, **FIXED}
    for name, config in configs.items():
        res = runner.evaluate(op, config, gpu=gpu, warmup_ms=25, rep_ms=200)
        entry["rows"].append({"variant": name, "config": config.to_dict(), "label": res.label, "us": res.us,
                              "rel_err": res.rel_err, "torch_us": None})
    entry["rows"] += persistent_rows(n, sms)
    for row in entry["rows"]:
        if row.get("us"):
            row["pct_of_copy"] = round(100 * nbytes / (row["us"] * 1e-6) / 1e9 / copy, 1)
        print(f"N={n:6d} {row['variant']:36s} {row.get('us') or float('nan'):9.2f} us "
              f"{row.get('pct_of_copy', '')} {row.get('error', '')}", file=sys.stderr, flush=True)
    return [entry]


def main() -> int:
    return probe_main("gemv_probe", __doc__ or "", "sizes", lambda gpu, copy: (size_rows(gpu, copy, n) for n in NS))


if __name__ == "__main__":
    sys.exit(main())
