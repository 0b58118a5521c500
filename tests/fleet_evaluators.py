"""Evaluators for the fleet's fault tests, imported by spawned worker processes (tests/ is on their path).

Each wraps the real default evaluator (predicted mode on a CPU worker) and misbehaves on cue: the
cue is a file in the folder ``AUTOOPT_TEST_FLEET_DIR`` names, so a test decides which item crashes
and whether only once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from autoopt.fleet.worker import evaluate_item


def _cue(kind: str, op: dict[str, Any]) -> Path | None:
    folder = os.environ.get("AUTOOPT_TEST_FLEET_DIR")
    if not folder:
        return None
    path = Path(folder) / f"{kind}-{op['shape'][0]}"
    return path if path.exists() else None


def crash_once(op: dict[str, Any], config: dict[str, Any], *, device: str, profile: str | None = None) -> Any:
    """SIGKILL this worker the first time it sees a cued item. The cue file is removed first, and only the
    worker whose removal succeeds dies: two workers on cued items at once both saw it exist, and the
    second's unlink raised FileNotFoundError, failing its item (a flaky CI run, 2026-11-27)."""
    cue = _cue("crash-once", op)
    if cue is not None:
        try:
            cue.unlink()
        except FileNotFoundError:  # another worker claimed it
            return evaluate_item(op, config, device=device, profile=profile)
        os.kill(os.getpid(), signal.SIGKILL)
    return evaluate_item(op, config, device=device, profile=profile)


def crash_always(op: dict[str, Any], config: dict[str, Any], *, device: str, profile: str | None = None) -> Any:
    """Segfault-like death (SIGSEGV) on every cued item."""
    if _cue("crash-always", op) is not None:
        os.kill(os.getpid(), signal.SIGSEGV)
    return evaluate_item(op, config, device=device, profile=profile)


def hang(op: dict[str, Any], config: dict[str, Any], *, device: str, profile: str | None = None) -> Any:
    """Never return on a cued item (a kernel that hangs the GPU looks like this from the parent)."""
    if _cue("hang", op) is not None:
        time.sleep(3600)
    return evaluate_item(op, config, device=device, profile=profile)


def raise_on(op: dict[str, Any], config: dict[str, Any], *, device: str, profile: str | None = None) -> Any:
    """An ordinary exception on a cued item: a failed item, not a dead worker."""
    if _cue("raise", op) is not None:
        raise RuntimeError("evaluation broke")
    return evaluate_item(op, config, device=device, profile=profile)


def echo(op: dict[str, Any], config: dict[str, Any], *, device: str, profile: str | None = None) -> Any:
    """No evaluation at all (nothing heavy imported): says which op it was handed, for order tests."""
    return {"m": op["shape"][0], "stages": config["config"].get("num_stages")}


def threads(op: dict[str, Any], config: dict[str, Any], *, device: str, profile: str | None = None) -> Any:
    """The worker's own OMP_NUM_THREADS (its share of the host's cores)."""
    import os

    return {"omp": os.environ.get("OMP_NUM_THREADS")}


def fake_measured(op: dict[str, Any], config: dict[str, Any], *, device: str, profile: str | None = None) -> Any:
    """A made-up measured time (the cost model's) instead of a run, so the tuner keeps rows in the store
    as it would on a GPU; the worker's GPU comes back with it, as from a real worker."""
    from autoopt.backend.runner import Result
    from autoopt.fleet.worker import worker_gpu
    from autoopt.kernels.config import KernelConfig
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import predict_config

    gpu = worker_gpu(device, profile)
    spec, cfg = OpSpec.from_dict(op), KernelConfig.from_dict(config)
    res = Result(op=spec, config=cfg, label="measured", us=predict_config(gpu, spec, cfg).us, rel_err=0.0)
    return {**res.to_dict(), "worker_device": device, "fingerprint": gpu.device_fingerprint, "gpu": gpu.to_dict()}
