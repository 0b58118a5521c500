"""Do autoopt's ``triton_op``s compile under ``torch.compile(fullgraph=True)`` on this GPU, and match eager?

The fused MoE (``autoopt::fused_moe_kernel``) and SwiGLU (``autoopt::swiglu_kernel``) triton_ops and the RMSNorm
custom op, each on random inputs: prints ``OK <op> <relative error>`` or ``FAILED <op>`` with the end of the
error, one line each (inductor compiles in-process, so its errors are whole). Then the host time to enqueue two
compiled RMSNorms (custom ops: the cost an RMSNorm ``triton_op`` would remove).

    PYTHONPATH=. python benchmarks/probes/triton_op_check.py
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _check(name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    import torch

    ref = fn(*args)
    try:
        out = torch.compile(fn, fullgraph=True)(*args)
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        print(f"OK {name} {err:.3g}", flush=True)
    except Exception as exc:  # the finding: what inductor said
        print(f"FAILED {name} {type(exc).__name__}: {str(exc)[-3000:]}", flush=True)


def main() -> int:
    import torch

    from autoopt.nn import _moe, ops

    torch.manual_seed(0)
    dev = "cuda"
    m, e, k, n, topk = 64, 8, 512, 256, 2
    h = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w13 = torch.randn(e, 2 * n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
    w2 = torch.randn(e, k, n, device=dev, dtype=torch.bfloat16) * n ** -0.5
    wts, ids = torch.softmax(torch.randn(m, e, device=dev), -1).topk(topk, -1)
    with torch.inference_mode():
        _check("fused_moe", lambda *a: _moe.fused_moe(*a), (h, w13, w2, wts, ids))
        x = torch.randn(2048, 4096, device=dev, dtype=torch.bfloat16)
        w = torch.rand(4096, device=dev, dtype=torch.bfloat16) + 0.5
        _check("rms_norm", lambda a, b: ops.rms_norm(a, b, 1e-6), (x, w))
        for rows in (1, 2048):
            gu = torch.randn(rows, 2 * 14336, device=dev, dtype=torch.bfloat16)
            _check(f"swiglu rows={rows}", ops.swiglu, (gu,))
        f = torch.compile(lambda a, b: ops.rms_norm(ops.rms_norm(a, b, 1e-6), b, 1e-6), fullgraph=True)
        f(x, w)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            f(x, w)
        host = (time.perf_counter() - t0) / 100 * 1e6
        torch.cuda.synchronize()
        print(f"compiled 2 x rms_norm host enqueue {host:.1f} us a call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
