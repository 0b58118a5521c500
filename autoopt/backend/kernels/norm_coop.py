"""RMSNorm with each row split over ``SPLIT_N`` programs of one launch: one read, one write.

For a few very wide rows (64 x 262144, 256 x 131072) one program per row leaves most SMs idle, and
the two-launch ``rmsnorm_split`` (norm.py) reads every row twice and pays a second launch: 53 % of
copy bandwidth on the H100 at 64 x 262144. Here the ``SPLIT_N`` programs of a row meet in the
middle of one launch instead:

1. each program loads its ``BLOCK_N``-wide chunk of the row into registers and stores the chunk's
   sum of squares (fp32) in its own slot of a ``[rows, SPLIT_N]`` partials buffer;
2. it counts itself in at the row's arrival counter (an atomic with release order, after a CTA
   barrier, so the partial is visible before the count is), then spins on the counter (acquire)
   until all ``SPLIT_N`` programs of the row have arrived;
3. it sums the row's partials in a fixed order (deterministic, unlike atomics on a float), and
   normalises and stores its chunk from the registers: the row is read from DRAM once.

The last program to leave a row resets the row's two counters (arrival, departure), so the
counter buffer is all zeros again when the kernel ends: it is allocated once per device and
reused by every launch on that device, in stream order, CUDA-graph replays included.

**Co-residency.** A program spins until its row's siblings arrive, so the siblings must be able
to run while it waits. Programs are numbered row-major (``pid = row * SPLIT_N + s``) and the GPU
starts blocks in launch order (what GPUs do, though CUDA does not promise it), so at any moment only
the row being started last can have programs waiting for siblings not yet started: every row before
it is complete or has all its programs on the chip. The template allows ``SPLIT_N`` only up to half
the programs the chip holds at once (``templates/norm.py``), so the waiting programs of that one row
never fill it.

**Triton's interpreter** runs a grid's programs one after another, where a spinning program would
wait forever; there (``PHASE`` 1 then 2) the same kernel runs as two launches, partials then
normalise, so CI proves the arithmetic on the CPU and the GPU tests prove the synchronisation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import interpreter_active

__all__ = ["counters", "rmsnorm_coop_prepare"]


# The @triton.jit kernel carries no annotations on purpose: Triton reads a parameter's annotation
# as its type or specialisation, so it is exempt from mypy's no-untyped-def by a `type: ignore`.
@triton.jit
def _rmsnorm_coop(x_ptr, w_ptr, o_ptr, part_ptr, cnt_ptr, N, stride_x, stride_o, eps,  # type: ignore[no-untyped-def]
                  BLOCK_N: tl.constexpr, SPLIT_N: tl.constexpr, SPLIT_P2: tl.constexpr, PHASE: tl.constexpr):
    pid = tl.program_id(0)
    row = (pid // SPLIT_N).to(tl.int64)
    s = pid % SPLIT_N
    cols = s * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=cmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if PHASE != 2:
        tl.store(part_ptr + row * SPLIT_N + s, tl.sum(x * x, axis=0))
    if PHASE == 0:
        tl.debug_barrier()  # every thread's part of the store is done before the count goes up
        tl.atomic_add(cnt_ptr + row * 2, 1, sem="release", scope="gpu")
        # Spin with a scalar atomic. Spinning on a volatile load instead (with the weight loaded before the
        # wait) ran 1.1-1.7x slower at 8-16 warps (H100, h100/norm_coop_probe_volatile_spin.json).
        arrived = tl.atomic_add(cnt_ptr + row * 2, 0, sem="acquire", scope="gpu")
        while arrived < SPLIT_N:
            arrived = tl.atomic_add(cnt_ptr + row * 2, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()  # the acquire above orders the partials' loads below for every thread
    if PHASE != 1:
        slots = tl.arange(0, SPLIT_P2)
        parts = tl.load(part_ptr + row * SPLIT_N + slots, mask=slots < SPLIT_N, other=0.0, cache_modifier=".cg")
        rstd = tl.rsqrt(tl.sum(parts, axis=0) / N + eps)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(o_ptr + row * stride_o + cols, (x * rstd * w).to(o_ptr.dtype.element_ty), mask=cmask)
    if PHASE == 0:
        left = tl.atomic_add(cnt_ptr + row * 2 + 1, 1, sem="relaxed", scope="gpu")
        if left == SPLIT_N - 1:  # the row's last program out: every sibling is past its spin
            tl.atomic_xchg(cnt_ptr + row * 2, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(cnt_ptr + row * 2 + 1, 0, sem="relaxed", scope="gpu")


_lock = threading.Lock()
_counters: dict[Any, Any] = {}


def counters(device: Any, rows: int) -> Any:
    """The device's zeroed ``int32`` counter buffer, at least ``2 * rows`` long (grown, never shrunk).

    Every launch leaves it all zeros (see the module docstring), so one buffer serves every launch on
    the device. Grow it before a CUDA-graph capture by running each shape once eagerly (the usual
    warm-up): a buffer replaced later would leave a captured graph pointing at the old one.
    """
    import torch

    with _lock:
        buf = _counters.get(device)
        if buf is None or buf.numel() < 2 * rows:
            buf = torch.zeros(max(2 * rows, 256), dtype=torch.int32, device=device)
            _counters[device] = buf
        return buf


def rmsnorm_coop_prepare(x: Any, weight: Any, out: Any, params: dict[str, int], eps: float) -> Callable[[], None]:
    """Bind a ``rmsnorm_coop`` config (``BLOCK_N``, ``SPLIT_N``, ``num_warps``) to ``[rows, N]`` tensors."""
    import torch

    rows, n = x.shape
    block_n, split = params["BLOCK_N"], params["SPLIT_N"]
    if block_n * split < n or block_n * (split - 1) >= n:
        raise ValueError(f"rmsnorm_coop: SPLIT_N={split} chunks of BLOCK_N={block_n} must cover N={n} with "
                         f"none empty (BLOCK_N * SPLIT_N >= N > BLOCK_N * (SPLIT_N - 1))")
    partials = torch.empty((rows, split), device=x.device, dtype=torch.float32)
    cnt = counters(x.device, rows)
    grid = (rows * split,)
    meta = dict(BLOCK_N=block_n, SPLIT_N=split, SPLIT_P2=triton.next_power_of_2(split),
                num_warps=params.get("num_warps", 4))
    args = (x, weight, out, partials, cnt, n, x.stride(0), out.stride(0), eps)
    if interpreter_active():
        def run_phases() -> None:
            _rmsnorm_coop[grid](*args, PHASE=1, **meta)
            _rmsnorm_coop[grid](*args, PHASE=2, **meta)
        return run_phases

    def run() -> None:
        _rmsnorm_coop[grid](*args, PHASE=0, **meta)
    return run
