"""The worker side of the fleet: one process per device, evaluating the items its parent hands it.

:func:`worker_main` pins the process to its device (``CUDA_VISIBLE_DEVICES``, before torch loads),
imports the evaluator ("module:function") and answers each ``(id, op, config, profile)`` task with
``(device, id, ok, result-or-reason)`` on its own pipe until it receives ``None``. An exception in the evaluator is a
``failed`` answer, not a dead worker; a crash of the process itself is the parent's to handle.

Evaluators: :func:`evaluate_item` (the default), :func:`tune_item` (what the tuner's serial path
runs for a config) and :func:`bench_item` (what ``autoopt bench`` runs: the config, then torch on the
same inputs). The last two also return the GPU the worker detected here, whose device fingerprint
keys the results store's rows of that evaluation.
"""

from __future__ import annotations

import functools
import importlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoopt.hardware.profile import GPUProfile

__all__ = ["bench_item", "evaluate_item", "load_evaluator", "tune_item", "worker_gpu", "worker_main"]


def load_evaluator(spec: str) -> Callable[..., Mapping[str, Any]]:
    """The function ``spec`` ("package.module:function") names."""
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"{spec} is not callable")
    return fn


def worker_main(device: str, conn: Any, evaluator: str, threads: int = 0, spawned_at: float = 0.0) -> None:
    # this worker sees one GPU, as cuda:0, numbered as NVML (and so detection) numbers them; a CPU
    # stand-in sees none, so it predicts (or checks in the interpreter) even on a GPU host
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = device if device.isdigit() else ""
    if threads > 0:  # its share of the host's cores for torch's CPU threads (set before torch loads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    compiling = _compile_clock() if device.isdigit() else None
    fn = load_evaluator(evaluator)
    from autoopt.backend.runner import phase_seconds as phases  # no torch or Triton
    # the first answer says how long the worker took from its parent's spawn (``spawned_at``, the host's
    # wall clock) to starting its first item: interpreter start-up, imports, and waiting for work
    boot_s: float | None = None  # taken at the first item, sent with its answer, then 0
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the parent is gone
            return
        if task is None:
            return
        item_id, op, config, profile = task
        if boot_s is None:
            boot_s = round(time.time() - spawned_at, 3) if spawned_at > 0 else 0.0
        t0, c0, p0 = time.perf_counter(), compiling() if compiling else 0.0, phases()
        try:
            out = fn(op, config, device=device, profile=profile)
        except Exception as exc:  # the item failed, the worker lives on
            conn.send((device, item_id, False, f"{type(exc).__name__}: {exc}"))
            continue
        # the worker's own seconds for the item (compile, inputs, reference, timed runs): what the
        # fleet's scaling reports split into work and waiting (PoolStats.utilisation)
        spent: dict[str, Any] = {"eval_s": round(time.perf_counter() - t0, 4)}
        if compiling:
            spent["compile_s"] = round(compiling() - c0, 4)
        if boot_s:
            spent["boot_s"], boot_s = boot_s, 0.0
        p1 = phases()
        if p1 != p0:
            spent["phase_s"] = {k: round(v - p0.get(k, 0.0), 4) for k, v in p1.items() if v != p0.get(k, 0.0)}
        conn.send((device, item_id, True, {**out, **spent}))


def _compile_clock() -> Callable[[], float] | None:
    """Count the seconds this process spends in ``triton.compiler.compile`` (a compile, or a load from
    Triton's disk cache: JIT launchers look the function up there when they first bind a kernel), and
    return the running total's reader; None without Triton. Installed before any kernel is bound."""
    try:
        import triton.compiler as tc
    except ImportError:
        return None
    real = tc.compile
    total = [0.0]

    @functools.wraps(real)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - t0

    tc.compile = timed
    return lambda: total[0]


def evaluate_item(op: Mapping[str, Any], config: Mapping[str, Any], *, device: str,
                  profile: str | None = None) -> dict[str, Any]:
    """Validate, run, check and time one config on this worker's GPU (``autoopt.backend.runner.evaluate``);
    on a worker with no GPU, the cost model's time for ``profile`` labelled ``predicted``."""
    from autoopt.backend.runner import evaluate
    from autoopt.hardware.library import load_profile
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import predict_config

    spec, cfg = OpSpec.from_dict(op), KernelConfig.from_dict(config)
    gpu = load_profile(profile).gpu if profile else None
    on_gpu = device.isdigit()
    predict = (lambda o, c: predict_config(gpu, o, c).us) if gpu is not None else None
    result = evaluate(spec, cfg, gpu=gpu, predict=predict, device="cuda:0" if on_gpu else None)
    return {**result.to_dict(), "worker_device": device}


@functools.lru_cache(maxsize=8)
def worker_gpu(device: str, profile: str | None = None) -> GPUProfile:
    """The GPU this worker evaluates for: the known ``profile`` a CPU stand-in predicts for, else the
    GPU detected here that ``CUDA_VISIBLE_DEVICES`` pins (NVML sees every GPU of the host)."""
    from autoopt.errors import BackendError
    from autoopt.hardware.detection import detect
    from autoopt.hardware.library import load_profile

    gpu = load_profile(profile).gpu if profile else _pinned(detect().gpus)
    if gpu is None:
        raise BackendError(f"fleet worker {device}: no GPU detected here and no --profile to predict for")
    return gpu


def _pinned(gpus: Sequence[GPUProfile]) -> GPUProfile | None:
    pin = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return next((g for g in gpus if pin and pin in (str(g.index), g.uuid)), gpus[0] if gpus else None)


def _identified(out: Mapping[str, Any], gpu: GPUProfile, device: str) -> dict[str, Any]:
    return {**out, "worker_device": device, "fingerprint": gpu.device_fingerprint, "gpu": gpu.to_dict()}


def tune_item(op: Mapping[str, Any], config: Mapping[str, Any], *, device: str,
              profile: str | None = None) -> dict[str, Any]:
    """One tuning trial's evaluation, exactly as the serial tuner runs it (``runner_evaluate``)."""
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec
    from autoopt.tuning.tuner import runner_evaluate

    gpu = worker_gpu(device, profile)
    result = runner_evaluate(gpu)(OpSpec.from_dict(op), KernelConfig.from_dict(config))
    return _identified(result.to_dict(), gpu, device)


def bench_item(op: Mapping[str, Any], config: Mapping[str, Any], *, device: str,
               profile: str | None = None) -> dict[str, Any]:
    """One ``autoopt bench`` row, exactly as the serial bench makes it: the config, then torch beside it."""
    from autoopt.backend import bench
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import predict_config, validate_config

    gpu = worker_gpu(device, profile)
    row = bench.run_bench([(OpSpec.from_dict(op), KernelConfig.from_dict(config))], gpu, progress=False,
                          validate=lambda o, c: validate_config(gpu, o, c),
                          predict=lambda o, c: predict_config(gpu, o, c).us)[0]
    return _identified(row.to_dict(), gpu, device)
