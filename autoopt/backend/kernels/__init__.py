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


class _Traceable:
    """A Triton kernel launched as ``kernel[grid](...)``: directly on plain tensors outside tracing, through
    ``torch.library.wrap_triton`` while ``torch.compile`` traces it (see :func:`traceable`)."""

    __slots__ = ("kernel", "wrapped")

    def __init__(self, kernel: Any) -> None:
        from torch.library import wrap_triton

        self.kernel = kernel
        self.wrapped = wrap_triton(kernel)

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            if _tracing(args):
                return self.wrapped[grid](*args, **kwargs)
            return self.kernel[grid](*args, **kwargs)
        return launch


def _tracing(args: tuple[Any, ...]) -> bool:
    """Whether a launch is being traced: torch.compile's Dynamo, a dispatch mode (AOTAutograd's fake and
    functional tensors), or a tensor subclass among the arguments."""
    import torch

    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return True
    return any(isinstance(a, torch.Tensor) and type(a) not in (torch.Tensor, torch.nn.Parameter) for a in args)


@functools.cache
def traceable(kernel: Any) -> Any:
    """``kernel`` launched the same way (``[grid](...)``), and inside a ``triton_op`` traced by ``torch.compile``
    as the kernel it is (``torch.library.wrap_triton``), which inductor then launches from its compiled graph
    with its own launcher instead of calling back into Python (a custom op's body costs a MoE layer ~0.8 ms of
    host time a call: ``benchmarks/results/h100/moe_prefill_host_*.json``). Outside tracing it launches the
    kernel itself: ``wrap_triton``'s eager call goes through its higher-order op, which took 444 us of host
    time a SwiGLU call at 2048 x 14336 on an H100 machine, for a kernel of 54 us (``op_host.json``,
    ``fp8_prefill_host_l8_kernels.json`` in ``benchmarks/results/h100/``)."""
    return _Traceable(kernel)


def interpreter_active() -> bool:
    """Whether Triton's CPU interpreter is on (``TRITON_INTERPRET``; it must be set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")
