"""The Triton kernel sources (one module per kernel family; a module's hash keys its stored timings).

:func:`interpreter_active` lives here, beside the kernels, because a kernel that cannot run as one
launch under Triton's CPU interpreter (its programs run one after another) launches differently
there; the runner and the torch-facing dispatch ask the same question. :func:`traceable` is how a
kernel that a ``torch.library.triton_op`` launches is launched, so that ``torch.compile`` sees it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["interpreter_active", "traceable"]


@functools.cache
def traceable(kernel: Any) -> Any:
    """``kernel`` wrapped by ``torch.library.wrap_triton``: launched the same way (``[grid](...)``), and inside a
    ``triton_op`` traced by ``torch.compile`` as the kernel it is, which inductor then launches from its
    compiled graph with its own launcher instead of calling back into Python (a custom op's body costs a
    MoE layer ~0.8 ms of host time a call: ``benchmarks/results/h100/moe_prefill_host_*.json``). Outside
    tracing the wrapper just launches the kernel."""
    from torch.library import wrap_triton

    return wrap_triton(kernel)


def interpreter_active() -> bool:
    """Whether Triton's CPU interpreter is on (``TRITON_INTERPRET``; it must be set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")
