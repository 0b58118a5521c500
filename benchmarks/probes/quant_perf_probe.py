"""Quick H100 probe of the quantized kernels (no ranking, no torchao): int4/int8 decode GEMV configs on
Llama-3-8B's five linears against the weight-read floor, and dequantize + cuBLAS against bf16 F.linear at
prefill. Every output is checked against the dequantized-weight reference before it is timed.

    PYTHONPATH=. python benchmarks/probes/quant_perf_probe.py --out $OUT/quant_perf_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
GEMV_CFGS = [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st)
             for bn, bk, sk, w, st in [(16, 512, 1, 8, 3), (32, 256, 1, 4, 3), (64, 256, 1, 4, 3),
                                       (128, 256, 1, 4, 3), (128, 256, 1, 8, 3), (256, 256, 1, 8, 3),
                                       (64, 256, 2, 4, 3), (128, 256, 2, 4, 3), (128, 256, 4, 4, 3),
                                       (128, 128, 1, 4, 3), (256, 128, 1, 4, 3), (128, 128, 2, 2, 3),
                                       (64, 128, 1, 2, 3), (128, 512, 1, 8, 3)]]
DEQUANT_CFGS = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w) for bn, bk, w in [(32, 256, 4), (16, 512, 4), (64, 256, 8),
                                                                              (8, 1024, 4), (32, 128, 4), (16, 256, 2)]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--formats", default="int4,int8")
    ap.add_argument("--parts", default="decode,prefill")
    args = ap.parse_args()
    import torch
    import triton.testing

    from autoopt.backend.accuracy import rel_error as relative_error
    from autoopt.backend.kernels.quant_dequant import quant_dequant_cublas_prepare
    from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare
    from autoopt.backend.quant import quantize, reference_matmul

    bufs = [torch.empty(1 << 28, device="cuda"), torch.empty(1 << 28, device="cuda")]
    ms = triton.testing.do_bench(lambda: bufs[1].copy_(bufs[0]), return_mode="median")
    copy_gbs = 2 * bufs[0].numel() * 4 / (ms * 1e-3) / 1e9
    bufs.clear()
    rows = []

    def bench(fns):
        state = [0]

        def run():
            fns[state[0] % len(fns)]()
            state[0] += 1
        return triton.testing.do_bench(run, warmup=10, rep=40, return_mode="median") * 1e3

    gen = torch.Generator(device="cuda").manual_seed(0)
    for part in args.parts.split(","):
        for name, (n, k) in SHAPES.items():
            w = (torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5).bfloat16()
            m = 1 if part == "decode" else 2048
            x = torch.randn((m, k), device="cuda", generator=gen).bfloat16()
            if part == "prefill":
                ws = [w] + [w.clone() for _ in range(2)]
                us = bench([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in ws])
                rows.append({"part": part, "linear": name, "impl": "F.linear bf16", "us": round(us, 2)})
                print(rows[-1], flush=True)
            for spec in args.formats.split(","):
                q = quantize(w, spec)
                ref = reference_matmul(x, q, gemm=m > 16).float()
                copies = [q] + [type(q)(fmt=q.fmt, qweight=q.qweight.clone(), scales=q.scales.clone(),
                                        offsets=None if q.offsets is None else q.offsets.clone(), n=n, k=k)
                                for _ in range(max(0, min(8, int(150e6 // q.nbytes)) - 1))]
                if part == "decode":
                    cfgs = [("quant_gemv", c) for c in GEMV_CFGS]
                else:
                    cfgs = [("dequant_cublas", c) for c in DEQUANT_CFGS]
                for kern, cfg in cfgs:
                    row = {"part": part, "linear": name, "format": spec, "impl": kern, "config": cfg}
                    try:
                        outs = [torch.empty((m, n), device="cuda", dtype=torch.bfloat16) for _ in copies]
                        if kern == "quant_gemv":
                            fns = [quant_gemv_prepare(x, qq, o, {"BLOCK_M": 1, **cfg})
                                   for qq, o in zip(copies, outs, strict=True)]
                        else:
                            fns = [quant_dequant_cublas_prepare(x, qq, o, cfg)
                                   for qq, o in zip(copies, outs, strict=True)]
                        outs[0].fill_(float("nan"))
                        fns[0]()
                        torch.cuda.synchronize()
                        err = relative_error(outs[0].float(), ref)
                        row["rel_err"] = float(f"{err:.3g}")
                        if not err < 8e-3:
                            row["check"] = "failed"
                        else:
                            us = bench(fns)
                            row["us"] = round(us, 2)
                            row["pct_floor"] = round(100 * q.nbytes / (copy_gbs * 1e9) / (us * 1e-6), 1)
                    except Exception as exc:
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    rows.append(row)
                    print(row, flush=True)
                del copies
            Path(args.out).write_text(json.dumps({"copy_gbs": copy_gbs, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
