"""The worker side of the fleet: one process per device, evaluating the items its parent hands it.

:func:`worker_main` pins the process to its device (``CUDA_VISIBLE_DEVICES``, before torch loads),
imports the evaluator ("module:function") and answers each ``(id, op, config, profile)`` task with
``(device, id, ok, result-or-reason)`` on its own pipe until it receives ``None``. An exception in the evaluator is a
``failed`` answer, not a dead worker; a crash of the process itself is the parent's to handle.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["evaluate_item", "load_evaluator", "worker_main"]


def load_evaluator(spec: str) -> Callable[..., Mapping[str, Any]]:
    """The function ``spec`` ("package.module:function") names."""
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"{spec} is not callable")
    return fn


def worker_main(device: str, conn: Any, evaluator: str) -> None:
    if device.isdigit():
        os.environ["CUDA_VISIBLE_DEVICES"] = device  # this worker sees one GPU, as cuda:0
    fn = load_evaluator(evaluator)
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the parent is gone
            return
        if task is None:
            return
        item_id, op, config, profile = task
        try:
            out = fn(op, config, device=device, profile=profile)
        except Exception as exc:  # the item failed, the worker lives on
            conn.send((device, item_id, False, f"{type(exc).__name__}: {exc}"))
            continue
        conn.send((device, item_id, True, dict(out)))


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
