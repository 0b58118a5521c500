"""What the whole-model probes share (``graph_launch.py``, ``replay_host.py``, ``step_variants.py``): the one-line
refusal on a machine without CUDA, and the optimize()d Llama-3-8B architecture (random weights) they time."""

from __future__ import annotations

import sys
from typing import Any

MODEL = "llama-3-8b"


def no_cuda(probe: str, what: str) -> bool:
    """True (after one line on stderr naming ``probe``) where no CUDA device is here: the probe exits 2."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"{probe}: no CUDA device; this probe times {what} on a GPU", file=sys.stderr)
    return True


def optimized_llama(fmt: str, layers: int | None, ops: tuple[str, ...] | None = None) -> tuple[Any, Any]:
    """Llama-3-8B's architecture (``layers`` decoder layers, default all) in bf16 on the GPU, optimize()d with
    ``weights=fmt`` (and ``ops``, default optimize()'s): (the model, optimize()'s report)."""
    from autoopt.nn.e2e import build_model
    from autoopt.nn.optimize import optimize

    model = build_model(MODEL, dtype="bf16", device="cuda", layers=layers)
    return model, optimize(model, weights=fmt, ops=ops)
