"""Micro-benchmarks that measure what a GPU really delivers (torch needed).

- copy bandwidth: ``dst.copy_(src)`` of a 1 GiB tensor, counting bytes read plus
  bytes written (2 GiB per copy), as in the profile's bandwidth unit;
- bf16 matmul rate: 8192 x 8192 x 8192 on random data (2*n^3 flops per product).

Each is the median of many timed runs after warm-up: ``triton.testing.do_bench``
when Triton is installed, else CUDA events. Reference (shared/hardware-captures
README, H100 SXM, do_bench median): copy 3.00 TB/s, bf16 8192^3 676 TFLOP/s;
the datasheet peaks are 3.35 TB/s and 989.4 TFLOP/s.
"""

from __future__ import annotations

import importlib.util
import statistics
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import BackendError

__all__ = ["measure_gpu"]

log = get_logger(__name__)

_COPY_BYTES = 1 << 30
_MATMUL_N = 8192
_MIN_REPS = 10


def _time_ms(fn: Any, torch: Any, *, reps: int) -> tuple[float, str]:
    """Median milliseconds of ``fn`` on the current device, and how it was timed."""
    if importlib.util.find_spec("triton") is not None:
        try:
            from triton.testing import do_bench

            # warmup/rep are milliseconds of running; rep=200 gives >= 60 runs of a 3 ms kernel.
            ms = do_bench(fn, warmup=50, rep=200, return_mode="median")
            return float(ms), "triton.testing.do_bench median"
        except Exception as exc:  # fall back to events (old triton without return_mode, say)
            log.debug("do_bench failed, using CUDA events: %s", exc)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), f"CUDA events median of {reps}"


def measure_gpu(index: int, *, copy_bytes: int = _COPY_BYTES, matmul_n: int = _MATMUL_N,
                reps: int = 20) -> dict[str, Any]:
    """Measure torch device ``index``: ``{"copy_gbs", "bf16_tflops", "method", ...}``.

    ``index`` is torch's device index (it follows ``CUDA_VISIBLE_DEVICES``).
    Raises :class:`BackendError` when torch or a CUDA device is missing.
    """
    if importlib.util.find_spec("torch") is None:
        raise BackendError("measure_gpu needs torch (pip install 'autoopt[gpu]')")
    import torch

    if not torch.cuda.is_available():
        raise BackendError(f"measure_gpu needs a CUDA GPU; torch {torch.__version__} sees none")
    if not 0 <= index < torch.cuda.device_count():
        raise BackendError(f"torch device {index} does not exist (torch sees {torch.cuda.device_count()} "
                           f"devices; indices follow CUDA_VISIBLE_DEVICES)")
    reps = max(reps, _MIN_REPS)
    device = torch.device("cuda", index)
    with torch.cuda.device(device):
        src = torch.empty(copy_bytes // 4, dtype=torch.float32, device=device).uniform_()
        dst = torch.empty_like(src)
        # F821 below: ruff reads the lambdas after the `del`s; they run (inside _time_ms) before them
        copy_ms, method = _time_ms(lambda: dst.copy_(src), torch, reps=reps)  # noqa: F821
        moved = 2 * src.numel() * src.element_size()  # read + write
        del src, dst
        torch.cuda.empty_cache()
        a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
        b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
        mm_ms, _ = _time_ms(lambda: torch.matmul(a, b), torch, reps=reps)  # noqa: F821
        del a, b
        torch.cuda.empty_cache()
        name = torch.cuda.get_device_name(device)
    return {
        "copy_gbs": round(moved / (copy_ms * 1e-3) / 1e9, 1),
        "bf16_tflops": round(2 * matmul_n ** 3 / (mm_ms * 1e-3) / 1e12, 1),
        "copy_ms": copy_ms,
        "matmul_ms": mm_ms,
        "copy_bytes": copy_bytes,
        "matmul_n": matmul_n,
        "method": method,
        "device": name,
        "torch_index": index,
    }
