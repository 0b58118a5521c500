"""Does dequantizing an int4 weight in row chunks that stay in L2 cut the prefill's dequantize + cuBLAS overhead?

Issue 27: int4's compiled 1 x 2048 prefill runs at 0.885-0.915x bf16 + compile, bound by its GEMMs: dequantize +
cuBLAS takes 1.43 ms a Llama-3-8B layer against bf16's 1.25 (``h100/quant_kernels_int4dot_prefill.json``), the
difference being the dequantization's pass over the weight (0.5 bytes a weight read, 2 written to a scratch in
DRAM) before a compute-bound GEMM that reads the scratch back. Dequantized a chunk of rows at a time into a
scratch small enough for L2, each chunk's GEMM reading it from there, the scratch need never reach DRAM.

Per linear at M = ``--m`` (Llama-3-8B's four, int4 g128, the dequantization config optimize() would choose): the
median time (CUDA events, L2 flushed by the timing loop's rotation of weights) of the whole-matrix path as it ships
(``quant_dequant_cublas_prepare``), of the same path in chunks of ``--chunks`` rows (one scratch of that many rows,
reused; each chunk's GEMM written into its columns of the output), and of bf16 ``F.linear``; each chunked output
compared with the whole-matrix one (bitwise: the same dequantized values, the same GEMM shape family).

    PYTHONPATH=. python benchmarks/probes/dequant_chunk_probe.py --out $OUT/dequant_chunk_probe.json

Measured on the H200 (``benchmarks/results/h200/dequant_chunk_probe.json``, 2026-11-29): no chunking beat the whole
matrix by more than 2 % (qkv in 4096-row chunks 198.6 against 203.2 us), 1024-row chunks ran 1.1-1.7x slower (the
smaller GEMMs): not pursued.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: Llama-3-8B's linears at TP 1: (name, N, K)
LINEARS = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
#: weight copies the timing loop rotates through, so a timed call finds no earlier call's bytes in L2
COPIES = 8


def rows(qw: Any, n0: int, n1: int) -> Any:
    """The weight's rows ``[n0, n1)`` as a QuantizedWeight (views, no copy)."""
    from autoopt.backend.quant import QuantizedWeight

    return QuantizedWeight(fmt=qw.fmt, qweight=qw.qweight[n0:n1], scales=qw.scales[n0:n1],
                           offsets=None if qw.offsets is None else qw.offsets[n0:n1], n=n1 - n0, k=qw.k)


def chunked(a: Any, qw: Any, out: Any, params: dict[str, int], chunk: int) -> Any:
    """A launcher: for each chunk of ``chunk`` rows, dequantize into one reused scratch, then
    ``out[:, chunk] = a @ scratch^T`` (cuBLAS writes the column slice in place: leading dimension N)."""
    import torch

    from autoopt.backend.kernels.quant_dequant import dequant_prepare

    scratch = torch.empty((chunk, qw.k), device=a.device, dtype=a.dtype)
    steps = []
    for n0 in range(0, qw.n, chunk):
        n1 = min(n0 + chunk, qw.n)
        s = scratch[:n1 - n0]
        steps.append((dequant_prepare(rows(qw, n0, n1), s, params), s.t(), out[:, n0:n1]))

    def run() -> None:
        for dequant, wt, o in steps:
            dequant()
            torch.mm(a, wt, out=o)
    return run


def timed_us(runs: list[Any], reps: int) -> float:
    """Median us a call, cycling through ``runs`` (one per weight copy)."""
    import statistics

    import torch

    for r in runs:
        r()
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runs[i % len(runs)]()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return round(statistics.median(times), 2)


def linear_row(name: str, n: int, k: int, m: int, chunks: list[int], reps: int) -> dict[str, Any]:
    import torch

    from autoopt.backend.kernels.quant_dequant import quant_dequant_cublas_prepare
    from autoopt.backend.quant import quantize
    from autoopt.nn.dispatch import choose, matmul_kind

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k ** 0.5 for _ in range(COPIES)]
    qws = [quantize(w, "int4") for w in ws]
    choice = choose("quant_linear", matmul_kind(m), (m, n, k), torch.bfloat16, torch.device("cuda"),
                    weight=qws[0].fmt.spec)
    row: dict[str, Any] = {"linear": name, "m": m, "n": n, "k": k, "chosen": None if choice.config is None else {
        "kernel": choice.config.kernel, **choice.config.params}}
    if choice.config is None or choice.config.kernel != "quant_dequant_cublas":
        row["skipped"] = f"optimize() does not choose dequantize + cuBLAS here ({choice.fallback or 'another kernel'})"
        return row
    params = dict(choice.config.params)
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
    whole = [quant_dequant_cublas_prepare(a, q, o, params) for q, o in zip(qws, outs, strict=True)]
    row["measured_us_whole"] = timed_us(whole, reps)
    reference = outs[0].clone()
    row["measured_us_bf16_linear"] = timed_us([lambda w=w: torch.nn.functional.linear(a, w) for w in ws], reps)
    for chunk in chunks:
        if chunk >= n:
            continue
        got = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        us = timed_us([chunked(a, q, o, params, chunk) for q, o in zip(qws, got, strict=True)], reps)
        row[f"measured_us_chunk_{chunk}"] = us
        row[f"equal_to_whole_chunk_{chunk}"] = bool(torch.equal(got[0], reference))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--chunks", default="1024,2048,4096,8192")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from benchmarks.quant_e2e import environment

    chunks = [int(c) for c in args.chunks.split(",")]
    report: dict[str, Any] = {"env": environment(), "m": args.m, "rows": []}
    for name, n, k in LINEARS:
        row = linear_row(name, n, k, args.m, chunks, args.reps)
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
