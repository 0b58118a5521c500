"""Probe: two kernel changes the compiled code suggests, timed before either goes into the kernels.

Compiled for sm_90 (Triton 3.9, on a CPU machine), the shipped kernels show two limits:

- ``gemm_tma`` with a 256 x 128 (or 128 x 256) x 64 tile holds 3 operand stages (144 KB) plus a
  64 KB shared-memory buffer for the TMA store of the bf16 C tile: 213 KB, so a 4th stage
  (262 KB) does not fit the 227 KB opt-in. Storing C in two 128 x 64 halves through one 32 KB
  buffer (the tutorial's ``EPILOGUE_SUBTILE``) makes 4 stages fit: 229,408 B.
- The decode GEMV's W loads are plain ``ld.global.v4``: Triton's pipeliner stages only loads
  that feed a ``tl.dot``, so ``num_stages`` does nothing there and each K-iteration waits for
  its own loads. The variant here prefetches the next K-tile into registers before the FMAs of
  this one (a masked load past the last, so no extra bytes); it also tries programs of 4 and 8
  rows (the template's smallest is 16), so the hardware block scheduler balances the tail.

``gemm`` section: the 8 prefill shapes and the broad suite's shapes with M >= 1000, each timed
as the shipped zero-shot pick (``runner.evaluate``), torch.matmul, and the split-epilogue
kernel at 3 and 4 stages for both large tiles. ``gemv`` section: M = 1, K = 4096 at
N = 14336 / 28672 / 128256, a device-to-device copy of the same bytes, the shipped pick and the
variants. Every output is checked against torch (GEMM) or float64 (GEMV) before it is timed.

    PYTHONPATH=. python benchmarks/limit_variants_probe.py --out $OUT/limit_variants.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.backend.kernels.gemm_tma import _tile_of
from benchmarks.hw_limit import copy_gbs, environment, prefill_ops

GEMV_K = 4096
GEMV_NS = (14336, 28672, 128256)
TILES = ((256, 128, 64), (128, 256, 64))


@triton.jit
def _tma_subtile(a_desc, b_desc, c_desc, M, N, K,  # type: ignore[no-untyped-def]
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 NUM_SMS: tl.constexpr):
    """The shipped persistent TMA kernel (SPLIT_K = 1), C stored in two BLOCK_N / 2 halves."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(start_pid, num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        acc = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc0, acc1 = tl.split(acc)
        c_desc.store([off_m, off_n], acc0.to(c_desc.dtype))
        c_desc.store([off_m, off_n + BLOCK_N // 2], acc1.to(c_desc.dtype))


@triton.jit
def _gemv_prefetch(x_ptr, w_ptr, c_ptr, N, K, stride_wn,  # type: ignore[no-untyped-def]
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """M = 1 GEMV; the next K-tile of W is loaded before this one's FMAs (K % BLOCK_K == 0)."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None] * stride_wn + cols[None, :]
    k_tiles = K // BLOCK_K
    w_next = tl.load(w_ptrs, eviction_policy="evict_first")
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kt in range(k_tiles):
        w = w_next
        more = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.int32) + kt + 1 < k_tiles  # a splat: stays one predicate
        w_next = tl.load(w_ptrs + (kt + 1) * BLOCK_K, mask=more, other=0.0, eviction_policy="evict_first")
        x = tl.load(x_ptr + kt * BLOCK_K + cols)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(c_ptr + offs_n, tl.sum(acc, axis=1).to(c_ptr.dtype.element_ty), mask=offs_n < N)


def bench(fn: Any, rep: int = 100) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")) * 1e3


def subtile_launcher(a: Any, w: Any, out: Any, bm: int, bn: int, bk: int, warps: int, stages: int) -> Any:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    a_d = TensorDescriptor.from_tensor(a, [bm, bk])
    b_d = TensorDescriptor.from_tensor(w, [bn, bk])
    c_d = TensorDescriptor.from_tensor(out, [bm, bn // 2])
    m, n, k = a.shape[0], w.shape[0], a.shape[1]
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

    def run() -> None:
        _tma_subtile[grid](a_d, b_d, c_d, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, NUM_SMS=sms,
                           num_warps=warps, num_stages=stages)
    return run


def checked(run: Any, out: Any, ref: Any, tol: float) -> dict[str, Any]:
    """Run once, compare with ``ref`` (relative Frobenius error), time only if it matched."""
    import torch

    try:
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
    except Exception as exc:  # a variant this triton cannot compile is data, not a crash
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    err = float((out.double() - ref).norm() / ref.norm())
    if not err < tol:
        return {"error": f"wrong output: relative error {err:.3g}", "rel_err": err}
    return {"us": bench(run), "rel_err": err}


def gemm_ops() -> list[tuple[str, Any]]:
    from autoopt.kernels.suite import suite

    broad = [(label, op) for label, op in suite("broad") if op.shape[0] >= 1000]
    return prefill_ops() + broad


def gemm_rows(gpu: Any) -> list[dict[str, Any]]:
    import torch

    from autoopt.backend import runner
    from autoopt.search.ranking import rank

    rows = []
    for label, op in gemm_ops():
        m, n, k = op.shape
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn((m, k), generator=gen).to("cuda", torch.bfloat16)
        w = (torch.randn((n, k), generator=gen) * k ** -0.5).to("cuda", torch.bfloat16)
        ref = a.double() @ w.double().t()
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        pick = rank(gpu, op, top=1, measured=False).best.config
        res = runner.evaluate(op, pick, gpu=gpu, warmup_ms=25, rep_ms=100)
        row: dict[str, Any] = {"label": label, "shape": f"{m}x{n}x{k}", "torch_us": bench(lambda a=a, w=w: a @ w.t()),
                               "pick": {"config": pick.to_dict(), "label": res.label, "us": res.us}}
        for bm, bn, bk in TILES:
            for stages in (3, 4):
                key = f"sub_{bm}x{bn}x{bk}_s{stages}"
                row[key] = checked(subtile_launcher(a, w, out, bm, bn, bk, 8, stages), out, ref, 1e-2)
        rows.append(row)
        best = min((v["us"] for key, v in row.items() if key.startswith("sub_") and v.get("us")), default=None)
        print(f"{label:36s} torch {row['torch_us']:8.2f} pick {res.us or float('nan'):8.2f} "
              f"best subtile {best or float('nan'):8.2f}", file=sys.stderr, flush=True)
    return rows


def gemv_rows(gpu: Any, copy: float) -> list[dict[str, Any]]:
    import torch

    from autoopt.backend import runner
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import rank

    rows = []
    for n in GEMV_NS:
        op = OpSpec(kind="gemv", shape=(1, n, GEMV_K), dtype="bf16")
        nbytes = op.min_bytes
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn((1, GEMV_K), generator=gen).to("cuda", torch.bfloat16)
        w = (torch.randn((n, GEMV_K), generator=gen) * GEMV_K ** -0.5).to("cuda", torch.bfloat16)
        ref = x.double() @ w.double().t()
        out = torch.empty((1, n), device="cuda", dtype=torch.bfloat16)
        src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        entry: dict[str, Any] = {"n": n, "bytes": nbytes, "copy_us": bench(lambda d=dst, s=src: d.copy_(s), 200),
                                 "torch_us": bench(lambda x=x, w=w: x @ w.t(), 200), "variants": {}}
        del src, dst
        pick = rank(gpu, op, top=1, measured=False).best.config
        res = runner.evaluate(op, pick, gpu=gpu, warmup_ms=25, rep_ms=200)
        entry["variants"]["pick"] = {"config": pick.to_dict(), "us": res.us, "label": res.label}
        for bn in (4, 8, 16):
            for bk in (256, 512, 1024):
                for warps in (2, 4, 8):
                    if bn * bk // (32 * warps) < 8 or bn * bk // (32 * warps) > 128:
                        continue  # fewer than one 16-byte vector, or more than 128 fp32 accumulators, per thread
                    cfg = KernelConfig(kernel="gemv", template="gemv", path="standard", params={
                        "BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "num_warps": warps,
                        "num_stages": 3})
                    r = runner.evaluate(op, cfg, gpu=gpu, warmup_ms=25, rep_ms=200)
                    entry["variants"][f"gemv_bn{bn}_bk{bk}_w{warps}"] = {"us": r.us, "label": r.label,
                                                                        "reason": r.reason or None}

                    def pre(bn: int = bn, bk: int = bk, warps: int = warps, n: int = n, x: Any = x, w: Any = w,
                            out: Any = out) -> None:
                        _gemv_prefetch[(triton.cdiv(n, bn),)](x, w, out, n, GEMV_K, w.stride(0), BLOCK_N=bn,
                                                              BLOCK_K=bk, num_warps=warps)
                    entry["variants"][f"prefetch_bn{bn}_bk{bk}_w{warps}"] = checked(pre, out, ref, 1.5e-2)
        for v in entry["variants"].values():
            if v.get("us"):
                v["pct_of_copy"] = round(100 * nbytes / (v["us"] * 1e-6) / 1e9 / copy, 1)
        best = sorted(((v["us"], k) for k, v in entry["variants"].items() if v.get("us")))[:4]
        print(f"gemv N={n}: copy {entry['copy_us']:.1f} pick {res.us:.1f} best {best}", file=sys.stderr, flush=True)
        rows.append(entry)
    return rows


def main() -> int:
    from autoopt.hardware.detection import detect

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="gemv,gemm")
    args = ap.parse_args()
    gpu = detect().gpu
    if gpu is None:
        print("limit_variants_probe: no GPU detected", file=sys.stderr)
        return 2
    t0 = time.time()
    copy = copy_gbs()
    report: dict[str, Any] = {"env": environment(), "gpu": gpu.name, "copy_gbs": round(copy, 1)}
    out = Path(args.out)
    for section in args.sections.split(","):
        report[section] = gemv_rows(gpu, copy) if section == "gemv" else gemm_rows(gpu)
        report["elapsed_s"] = round(time.time() - t0, 1)
        out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
