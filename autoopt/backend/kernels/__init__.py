"""The Triton kernel sources (one module per kernel family; a module's hash keys its stored timings).

:func:`interpreter_active` lives here, beside the kernels, because a kernel that cannot run as one
launch under Triton's CPU interpreter (its programs run one after another) launches differently
there; the runner and the torch-facing dispatch ask the same question.
"""

from __future__ import annotations

import os

__all__ = ["interpreter_active"]


def interpreter_active() -> bool:
    """Whether Triton's CPU interpreter is on (``TRITON_INTERPRET``; it must be set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")
