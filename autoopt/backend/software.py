"""The software a measurement ran on, recorded beside it: one reader for every harness that times a model.

:func:`versions` is what the validation checks, the regret harness and the benchmark scripts write into
their results (the per-evaluation record of the runner, :func:`autoopt.backend.runner.Result`, stays the
cheaper python/torch/triton set: it is taken once per config).
"""

from __future__ import annotations

import importlib
import platform
from typing import Any

__all__ = ["versions"]


def versions() -> dict[str, Any]:
    """Python, torch, CUDA, triton, transformers and driver versions (what a timing depends on)."""
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda}
    for name in ("triton", "transformers"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception as exc:
            out[name] = f"unavailable: {type(exc).__name__}"
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        out["driver"] = v.decode() if isinstance(v, bytes) else v
    except Exception as exc:
        out["driver"] = f"unavailable from NVML: {type(exc).__name__}"
    return out
