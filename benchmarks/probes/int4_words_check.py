"""The int4 decode GEMV's word path against its dequantized reference on a GPU, on shapes the Llama grid lacks.

N not a multiple of BLOCK_N (wrapped rows), K a multiple of the group but not of BLOCK_K (the split's tiles
uneven: the per-byte path takes those), split-K 1-4, 2-8 warps; each row: config, whether the word path
ran, the relative error and the bound. Prints JSON; exit 1 when any row fails::

    PYTHONPATH=. python benchmarks/probes/int4_words_check.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = [(1000, 4096), (4096, 4096 + 256), (6144, 14336), (136, 1152)]
CONFIGS = [dict(BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=s)
           for bn, bk, sk, w, s in [(16, 512, 1, 2, 4), (32, 256, 1, 2, 3), (16, 512, 2, 4, 3), (64, 256, 4, 8, 3),
                                    (16, 128, 1, 2, 3), (32, 1024, 3, 4, 3)]]


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("int4_words_check: no CUDA device; the word path runs on a GPU only", file=sys.stderr)
        return 2
    from autoopt.backend import registry
    from autoopt.backend.kernels import quant_gemv
    from autoopt.backend.quant import quantize
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec

    rows, bad = [], 0
    for n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        op = OpSpec(kind="gemv", shape=(1, n, k), dtype="bf16", weight="int4")
        q = quantize(w, op.weight_format)
        inputs = {"a": x, **q.tensors()}
        ref = registry.reference(inputs, op).float()
        tol = registry.tolerance(op)
        for params in CONFIGS:
            cfg = KernelConfig(kernel="quant_gemv", template="quant-gemv", params=params)
            out = registry.alloc_out(op, "cuda").fill_(float("nan"))
            seen = []
            real = quant_gemv._words_fit
            quant_gemv._words_fit = lambda *a, _r=real, _s=seen: _s.append(_r(*a)) or _s[-1]  # type: ignore[assignment]
            try:
                registry.prepare(inputs, cfg, out, op)()
            finally:
                quant_gemv._words_fit = real  # type: ignore[assignment]
            torch.cuda.synchronize()
            err = float((out.float() - ref).norm() / ref.norm())
            ok = bool(torch.isfinite(out).all()) and err <= tol
            bad += not ok
            rows.append({"n": n, "k": k, "config": params, "words": bool(seen and seen[-1]),
                         "measured_rel_err": round(err, 6), "bound": tol, "check": "passed" if ok else "failed"})
    print(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows, "failed": bad}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
