"""Probe (issue 27): the decode GEMV with the weight as the MMA's A operand ("swap AB"), against rank()'s picks.

Today's quantized GEMV (``quant_gemv.py``) runs M = 1 on FMAs and M = 2..16 as ``tl.dot(x, w^T)`` with X padded to
16 rows: the decoded weight tile is the dot's B operand, so it goes through shared memory, and at M = 8 half the
MMA is padding. Here the weight tile ``[BLOCK_N, BLOCK_K]`` is A and the tokens are the dot's N (``TOK``, 16):
``C^T = W X^T``; on sm_90 a wgmma takes A from registers, so a tile decoded in registers need not be stored to
shared memory first, and the MMA's M is the weight rows (64 / 128). Per format:

- ``int4`` (g128, symmetric): codes to bf16 ``q - 8`` by ``int4_unpack16``'s PTX, one group a K-tile, scaled per tile;
- ``fp8`` / ``int8`` converted: codes to bf16 exactly (``e4m3_exact``), per-channel scale in the epilogue;
- ``fp8`` native: X quantized per token to e4m3 first (``act_quant``, its launch timed with the GEMV), both
  operands e4m3 (fp8 wgmma), row x column scales in the epilogue.

Each config is checked against the float64 reference of the dequantized weight (relative error <= 1e-2; native
fp8 against the per-token-quantized X it multiplies) before it is timed; times are replayed from a CUDA graph
over copies of the inputs rotated past the L2 (``quant_kernels.bench_us``), same process, same GPU, as rank()'s
top 3 picks of today's kernel and torch's bf16 ``F.linear``. Writes JSON (rewritten after every case):

    PYTHONPATH=. python benchmarks/probes/gemv_swap_probe.py --out $OUT/gemv_swap_probe.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton
import triton.language as tl

from autoopt.backend.kernels import interpreter_active
from autoopt.backend.kernels.gemm import splitk_reduce_prepare
from autoopt.backend.kernels.quant_gemv import e4m3_exact, int4_unpack16

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
FMT = {"fp8": 0, "int8": 2, "int4": 3}
TOL = 1e-2


@triton.jit
def _swap_gemv_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, c_ptr, M, N, stride_xm, stride_wn, stride_sn, stride_cs,
                      tiles_per_split,
                      FMT: tl.constexpr, G: tl.constexpr, NATIVE: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, TOK: tl.constexpr, STAGES: tl.constexpr, DOT_F16: tl.constexpr,
                      ASM: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_t = tl.arange(0, TOK)
    t_ok = offs_t < M
    TILE_B: tl.constexpr = BLOCK_K // 2 if FMT == 3 else BLOCK_K
    w_rows = w_ptr + offs_wn[:, None] * stride_wn
    x_rows = x_ptr + offs_t[:, None] * stride_xm
    acc = tl.zeros((BLOCK_N, TOK), dtype=tl.float32)
    tile0 = pid_k * tiles_per_split
    for kt in tl.range(0, tiles_per_split, num_stages=STAGES):
        byte0 = (tile0 + kt) * TILE_B
        pb = byte0 + tl.arange(0, TILE_B)
        b = tl.load(w_rows + pb[None, :], eviction_policy="evict_first")
        if FMT == 3:  # one group a tile: bytes hold k (low nibble) and k + G/2 (high) of the group
            HB: tl.constexpr = G // 2
            grp = byte0 // HB
            k_lo = grp * G + pb % HB
            x_lo = tl.load(x_rows + k_lo[None, :], mask=t_ok[:, None], other=0.0)
            x_hi = tl.load(x_rows + (k_lo + HB)[None, :], mask=t_ok[:, None], other=0.0)
            if DOT_F16:
                x_lo = x_lo.to(tl.float16)
                x_hi = x_hi.to(tl.float16)
            w_lo, w_hi = int4_unpack16(b, DOT_F16, ASM)
            p = tl.dot(w_lo, tl.trans(x_lo))
            p = tl.dot(w_hi, tl.trans(x_hi), p)
            s = tl.load(s_ptr + offs_wn * stride_sn + grp).to(tl.float32)
            acc += s[:, None] * p
        elif NATIVE:  # e4m3 x e4m3 (X pre-quantized per token, stored as uint8)
            x = tl.load(x_rows + pb[None, :], mask=t_ok[:, None], other=0)
            acc = tl.dot(b.to(tl.float8e4nv, bitcast=True), tl.trans(x.to(tl.float8e4nv, bitcast=True)), acc)
        else:
            x = tl.load(x_rows + pb[None, :], mask=t_ok[:, None], other=0.0)
            w = e4m3_exact(b, FMT == 2)
            if DOT_F16:
                x = x.to(tl.float16)
                w = w.to(tl.float16)
            else:
                w = w.to(tl.bfloat16)
            acc = tl.dot(w, tl.trans(x), acc)
    if FMT != 3:
        acc = acc * tl.load(s_ptr + offs_wn).to(tl.float32)[:, None]
        if NATIVE:
            acc = acc * tl.load(xs_ptr + offs_t, mask=t_ok, other=0.0)[None, :]
    c_ptrs = c_ptr + pid_k * stride_cs + offs_t[None, :] * N + offs_n[:, None]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=t_ok[None, :] & (offs_n[:, None] < N))


def swap_prepare(x: Any, q: Any, out: Any, cfg: dict[str, int], *, native: bool = False) -> Any:
    """A launcher of one swap-AB config on ``x`` [M, K] bf16, the packed weight ``q``, ``out`` [M, N]."""
    import torch

    from autoopt.backend.kernels.act_quant import act_quant_prepare

    m, k = x.shape
    n, f = q.n, q.fmt
    bn, bk, split = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    row = k // 2 if f.name == "int4" else k
    tile = bk // 2 if f.name == "int4" else bk
    tiles = row // tile
    assert row % tile == 0 and tiles % split == 0 and n % bn == 0, (n, k, cfg)
    w = q.qweight.view(torch.uint8) if f.name == "fp8" and native else q.qweight
    if f.name == "fp8" and not native:
        w = w.view(torch.int8)
    s = q.scales
    x_in, xs, quant = x, s, None
    if native:
        x_in = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
        xs = torch.empty((m,), device=x.device, dtype=torch.float32)
        quant = act_quant_prepare(x, x_in, xs)
        x_in = x_in.view(torch.uint8)
    dot_f16 = interpreter_active()
    meta = dict(FMT=FMT[f.name], G=f.group_size or 0, NATIVE=native, BLOCK_N=bn, BLOCK_K=bk, TOK=cfg["TOK"],
                STAGES=cfg["num_stages"], DOT_F16=dot_f16, ASM=not interpreter_active(),
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    grid = (n // bn, split)
    stride_sn = s.stride(0)
    ws = out if split == 1 else torch.empty((split, m, n), device=x.device, dtype=torch.float32)
    reduce = None if split == 1 else splitk_reduce_prepare(ws, out, split)

    def run() -> None:
        if quant is not None:
            quant()
        _swap_gemv_kernel[grid](x_in, xs, w, s, ws, m, n, x_in.stride(0), w.stride(0), stride_sn,
                                0 if split == 1 else ws.stride(0), tiles // split, **meta)
        if reduce is not None:
            reduce()
    return run


def configs(fmt: str, n: int, k: int, m: int) -> list[dict[str, int]]:
    """The probe's grid: weight rows a program, K a tile, warps, stages, split-K (only splits that leave every
    program whole tiles and at most ~4 waves of programs)."""
    out = []
    bks = (64, 128) if fmt == "int4" else (128, 256)
    for bn, bk, warps, stages, split in itertools.product((64, 128), bks, (4, 8), (3, 5), (1, 2, 4, 8)):
        if bn == 64 and warps == 8:
            continue
        row, tile = (k // 2, bk // 2) if fmt == "int4" else (k, bk)
        tiles = row // tile
        programs = n // bn * split
        if tiles % split or tiles // split < 2 or programs > 4 * 132 * 2 or (split > 1 and n // bn >= 264):
            continue
        out.append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages, "SPLIT_K": split,
                    "TOK": 8 if m <= 8 else 16})
    return out


def checked_us(make: Any, ref: Any, out: Any, args: argparse.Namespace, copies: list[Any]) -> dict[str, Any]:
    """Run once on a NaN-poisoned output, check against ``ref``, then time over rotated copies (graph-replayed)."""
    import torch

    from benchmarks.quant_kernels import bench_us, rel_err

    out.fill_(float("nan"))
    make(*copies[0], out)()
    torch.cuda.synchronize()
    err = rel_err(out, ref)
    if not err <= TOL:
        return {"check": f"failed: error {err:.3g} > {TOL}", "measured_rel_err": float(f"{err:.4g}")}
    fns = [make(*c, torch.empty_like(out)) for c in copies]
    return {"check": "passed", "measured_rel_err": float(f"{err:.4g}"),
            "measured_us": round(bench_us(fns, args.rep_ms, graph=True), 3)}


def run_case(name: str, m: int, fmt: str, gpu: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from autoopt.backend import registry
    from autoopt.backend.kernels.quant_gemv_swap import quant_gemv_swap_prepare
    from autoopt.backend.quant import (
        dequantize,
        dequantize_activations,
        quantize,
        quantize_activations,
        reference_matmul,
    )
    from autoopt.backend.runner import rotation_copies
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import rank

    n, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    w = (torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5).to(torch.bfloat16)
    x = torch.randn((m, k), device="cuda", generator=gen).to(torch.bfloat16)
    spec = "int4-g128" if fmt == "int4" else fmt
    op = OpSpec(kind="gemv" if m <= 16 else "gemm", shape=(m, n, k), dtype="bf16", weight=spec)
    q = quantize(w, op.weight_format)
    ref = reference_matmul(x, q, gemm=False).float()
    floor_us = q.nbytes / (args.copy_gbs * 1e3)
    ncopy = rotation_copies(q.nbytes + x.numel() * 2, gpu.l2_bytes)
    copies = [(x, q)] + [(x.clone(), type(q)(fmt=q.fmt, qweight=q.qweight.clone(), scales=q.scales.clone(),
                                              offsets=None, n=n, k=k)) for _ in range(ncopy - 1)]
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    case: dict[str, Any] = {"linear": name, "m": m, "n": n, "k": k, "format": spec, "weight_bytes": q.nbytes,
                            "floor_us_at_copy_bw": round(floor_us, 3), "rows": []}

    def add(row: dict[str, Any]) -> None:
        if "measured_us" in row:
            row["measured_pct_of_weight_read_floor"] = round(100 * floor_us / row["measured_us"], 1)
        case["rows"].append(row)

    ranked = rank(gpu, op, top=3, measured=False)
    for i, cand in enumerate(ranked.candidates[:3]):
        def make(xx: Any, qq: Any, o: Any, cand: Any = cand) -> Any:
            return registry.prepare({"a": xx, **qq.tensors()}, cand.config, o, op)
        add({"impl": f"{cand.config.kernel} rank() pick", "rank": i + 1, "config": dict(cand.config.params),
             "predicted_us": round(cand.predicted_us, 3), **checked_us(make, ref, out, args, copies)})
    for cfg in configs(fmt, n, k, m):
        if args.kernel == "tree":  # the package's kernel (quant_gemv_swap: token halves of 8, BLOCK_M 8 or 16)
            params = {**{key: v for key, v in cfg.items() if key != "TOK"}, "BLOCK_M": 8 if m <= 8 else 16 if m <= 16
                      else 32}
            add({"impl": "quant_gemv_swap", "config": params,
                 **checked_us(lambda xx, qq, o, p=params: quant_gemv_swap_prepare(xx, qq, o, p), ref, out, args,
                              copies)})
            continue
        add({"impl": "swap-AB", "config": cfg,
             **checked_us(lambda xx, qq, o, cfg=cfg: swap_prepare(xx, qq, o, cfg), ref, out, args, copies)})
    if fmt == "fp8" and args.native and torch.cuda.get_device_capability() >= (8, 9):
        ref_q = (dequantize_activations(*quantize_activations(x, q.fmt)).double() @ dequantize(q).double().t()).float()
        for cfg in configs(fmt, n, k, m):
            cfg = {**cfg, "TOK": 16}
            add({"impl": "swap-AB native e4m3 (+ act_quant)", "config": cfg,
                 **checked_us(lambda xx, qq, o, cfg=cfg: swap_prepare(xx, qq, o, cfg, native=True), ref_q, out,
                              args, copies)})
    wb = [w] + [w.clone() for _ in range(ncopy - 1)]
    xb = [x] + [x.clone() for _ in range(ncopy - 1)]
    from benchmarks.quant_kernels import bench_us
    bf16_us = bench_us([lambda i=i: F.linear(xb[i], wb[i]) for i in range(ncopy)], args.rep_ms, graph=True)
    case["torch_bf16_linear_us"] = round(bf16_us, 3)
    timed = [r for r in case["rows"] if "measured_us" in r]
    best = {impl: min((r for r in timed if r["impl"] == impl), key=lambda r: r["measured_us"], default=None)
            for impl in sorted({r["impl"] for r in timed})}
    case["best"] = {impl: (r["measured_us"], r["config"]) for impl, r in best.items() if r}
    return case


def main(argv: list[str] | None = None) -> int:
    import torch

    from autoopt.hardware.detection import detect
    from benchmarks.hw_limit import copy_gbs
    from benchmarks.quant_kernels import environment

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--formats", default="int4,fp8,int8")
    ap.add_argument("--m", default="1,8,16")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rep-ms", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--kernel", choices=("probe", "tree"), default="probe",
                    help="swap rows on this file's kernel (one dot of TOK tokens; the first run) or the package's "
                         "quant_gemv_swap (token halves of 8)")
    ap.add_argument("--no-native", dest="native", action="store_false", help="skip the native e4m3 rows")
    args = ap.parse_args(argv)
    t0 = time.time()
    gpu = detect().gpu
    args.copy_gbs = copy_gbs()
    doc: dict[str, Any] = {"env": environment(), "gpu": torch.cuda.get_device_name(),
                           "timing": "CUDA graph replay over rotated copies, median, per call",
                           "measured_copy_gbs": round(args.copy_gbs, 1), "cases": []}
    for m in (int(v) for v in args.m.split(",")):
        for fmt in args.formats.split(","):
            for name in args.shapes.split(","):
                if time.time() - t0 > args.budget_s:
                    doc["stopped"] = f"budget {args.budget_s} s reached before {fmt} m={m} {name}"
                    break
                case = run_case(name, m, fmt, gpu, args)
                doc["cases"].append(case)
                print(f"{fmt} m={m} {name}: floor {case['floor_us_at_copy_bw']} us, bf16 {case['torch_bf16_linear_us']}"
                      f" us, best {json.dumps(case['best'])}", flush=True)
                doc["elapsed_s"] = round(time.time() - t0, 1)
                Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
