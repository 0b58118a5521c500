"""Compile the configs the tuner will try next in worker processes, so its trials find them cached.

Compiling a new Triton config takes 0.2-1 s on the lent H100/H200 hosts, against 50 ms to check
and time it (benchmarks/results/h200/tune_budget.json: trials of an already compiled config take
0.05 s, the others 0.2-1.0 s), so a tuning budget of about a second per shape is spent compiling.
Workers compile the proposals ahead of the tuner, in parallel, into Triton's on-disk cache; when
the tuner reaches a config, its own compile is a cache hit.

Workers never launch a kernel: they bind the config to *uninitialised* tensors of the op's shapes
(Triton specialises on dtype, alignment and sizes, never on values) and call Triton's JIT with
``warmup=True``, which compiles without launching, so the timings the tuner takes on the same GPU
are not disturbed. A worker that fails is reported and the tuner compiles for itself, as before:
the pool only ever saves time. The tuner never waits for a worker.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from autoopt._log import get_logger
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

log = get_logger(__name__)

__all__ = ["Precompiler", "default_precompiler"]

#: workers: half the host's cores (the tuner's process and the driver need the rest), at most 8 (or
#: ``AUTOOPT_PRECOMPILE_WORKERS``: a fleet's searches on a large host may want more; unmeasured beyond 8).
_MAX_WORKERS = 8


def _workers() -> int:
    """The pool's size: ``AUTOOPT_PRECOMPILE_WORKERS`` where set to a positive integer, else half the cores, at
    most :data:`_MAX_WORKERS`, at least one."""
    asked = os.environ.get("AUTOOPT_PRECOMPILE_WORKERS", "")
    if asked.isdigit() and int(asked) > 0:
        return int(asked)
    return max(1, min(_MAX_WORKERS, (os.cpu_count() or 2) // 2))


def _init_worker() -> None:
    """Make every Triton launch in this process compile only (``warmup=True``), then start CUDA."""
    import torch
    from triton.runtime.jit import JITFunction

    run = JITFunction.run

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = compile_only
    torch.cuda.init()


_inputs: dict[tuple[Any, ...], tuple[dict[str, Any], Any]] = {}


def _compile(op_dict: dict[str, Any], config_dict: dict[str, Any]) -> str | None:
    """In a worker: compile ``config`` for ``op``; None when done, else the reason it failed."""
    from autoopt.backend import registry

    op = OpSpec.from_dict(op_dict)
    config = KernelConfig.from_dict(config_dict)
    key = (op.kind, op.shape, op.dtype, op.layout, op.out_dtype, op.weight, op.moe_gemm)
    try:
        if key not in _inputs:
            _inputs.clear()
            _inputs[key] = (registry.make_inputs(op, "cuda", empty=True), registry.alloc_out(op, "cuda"))
        inputs, out = _inputs[key]
        registry.prepare(inputs, config, out, op)()
    except Exception as exc:  # the tuner will meet (and record) the same failure itself
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


class Precompiler:
    """A pool of compile-only worker processes (spawned: CUDA cannot be forked)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or _workers()
        self._pool: ProcessPoolExecutor | None = None
        self._submitted: dict[tuple[Any, ...], Future[str | None]] = {}
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_init_worker,
                                             mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def submit(self, op: OpSpec, configs: Sequence[KernelConfig]) -> int:
        """Queue ``configs`` of ``op`` not queued before; returns how many were queued."""
        queued = 0
        with self._lock:
            for config in configs:
                key = (op.kind, op.shape, op.dtype, op.layout, config.key())
                if key in self._submitted:
                    continue
                self._submitted[key] = self._executor().submit(_compile, op.to_dict(), config.to_dict())
                queued += 1
        return queued

    def failures(self) -> list[str]:
        """Reasons of finished compiles that failed (for diagnostics; the tuner records its own)."""
        with self._lock:
            done = [f for f in self._submitted.values() if f.done() and not f.cancelled()]
        return [r for r in (f.result() if f.exception() is None else str(f.exception()) for f in done) if r]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_default: Precompiler | None = None


def default_precompiler() -> Precompiler | None:
    """The process-wide pool when kernels compile for a CUDA GPU here (not under the interpreter), else None."""
    global _default
    if _default is None:
        try:
            import torch
        except ImportError:
            return None
        from autoopt.backend.runner import interpreter_active

        if interpreter_active() or not torch.cuda.is_available() or os.environ.get("AUTOOPT_PRECOMPILE") == "0":
            return None
        _default = Precompiler()
        atexit.register(_default.close)
    return _default
