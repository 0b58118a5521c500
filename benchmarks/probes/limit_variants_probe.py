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
as the shipped zero-shot pick (``runner.evaluate``), torch.matmul, and the split-epilogue kernel
(``tma_variants_probe.py``'s, not warp-specialized) at 3 and 4 stages for both large tiles, in the
rows of ``probe_kit.tile_rows``. The committed H100 run (``h100/limit_variants_probe.json``) predates
that layout: its cells sit at the row's top level as ``sub_{tile}_s{stages}``. ``gemv`` section:
M = 1, K = 4096 at N = 14336 / 28672 / 128256, a device-to-device copy of the same bytes, the shipped
pick and the variants. Every output is checked against float64 before it is timed.

    PYTHONPATH=. python benchmarks/probes/limit_variants_probe.py --out $OUT/limit_variants.json
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.hw_limit import copy_gbs, environment, prefill_ops
from benchmarks.probes.probe_kit import bench_us, checked, tile_rows, timed_pick

GEMV_K = 4096
GEMV_NS = (14336, 28672, 128256)
#: the two large tiles on 8 warps, at the 3 stages the full epilogue buffer allows and the 4 the split one does
TILES = tuple((bm, bn, 64, 8, stages) for bm, bn in ((256, 128), (128, 256)) for stages in (3, 4))


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


def subtile(a: Any, w: Any, out: Any, tile: tuple[int, ...]) -> Any:
    """tma_variants_probe's split-epilogue kernel (C stored in two BLOCK_N / 2 halves), not warp-specialized."""
    from benchmarks.probes.tma_variants_probe import _launcher

    bm, bn, bk, warps, stages = tile
    return _launcher(a, w, out, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps,
                                 "num_stages": stages}, False, True)


def gemm_shapes() -> list[tuple[int, int, int]]:
    """The 8 prefill shapes and the broad suite's shapes with M >= 1000."""
    from autoopt.kernels.suite import suite

    ops = prefill_ops() + [(label, op) for label, op in suite("broad") if op.shape[0] >= 1000]
    return [op.shape for _, op in ops]


def gemv_rows(gpu: Any, copy: float) -> list[dict[str, Any]]:
    import torch

    from autoopt.backend import runner
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec

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
        entry: dict[str, Any] = {"n": n, "bytes": nbytes, "copy_us": bench_us(lambda d=dst, s=src: d.copy_(s), 200),
                                 "torch_us": bench_us(lambda x=x, w=w: x @ w.t(), 200), "variants": {}}
        del src, dst
        entry["variants"]["pick"] = pick = timed_pick(gpu, op, rep_ms=200)
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
        print(f"gemv N={n}: copy {entry['copy_us']:.1f} pick {pick['us']:.1f} best {best}", file=sys.stderr, flush=True)
        rows.append(entry)
    return rows


def main() -> int:
    from autoopt.hardware.detection import detect

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="gemv,gemm")
    args = ap.parse_args()
    sections = args.sections.split(",")
    if not set(sections) <= {"gemv", "gemm"}:
        ap.error(f"--sections {args.sections!r}: each must be gemv or gemm")
    gpu = detect().gpu
    if gpu is None:
        print("limit_variants_probe: no GPU detected", file=sys.stderr)
        return 2
    t0 = time.time()
    copy = copy_gbs()
    report: dict[str, Any] = {"env": environment(), "gpu": gpu.name, "copy_gbs": round(copy, 1)}
    out = Path(args.out)
    for section in sections:
        report[section] = gemv_rows(gpu, copy) if section == "gemv" else [
            row for rows in tile_rows(gpu, gemm_shapes(), TILES, {"subtile": subtile}) for row in rows]
        report["elapsed_s"] = round(time.time() - t0, 1)
        out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
