"""Which device a check runs on: refusing a machine with no CUDA GPU, naming devices in results.

torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

from autoopt.errors import BackendError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["device_name", "require_cuda", "resolve_device"]


def require_cuda() -> int:
    """The number of CUDA devices torch sees; :class:`BackendError` (one line) when torch or a GPU is missing."""
    try:
        import torch
    except ImportError as exc:
        raise BackendError(f"needs torch ({exc}); nothing measured") from None
    if not torch.cuda.is_available():
        raise BackendError(f"torch {torch.__version__} sees no CUDA device; nothing measured")
    torch.cuda.init()
    return int(torch.cuda.device_count())


def resolve_device(device: Any) -> torch.device:
    """A device with its index filled in (``cuda`` -> ``cuda:N``), so dict keys and comparisons agree."""
    import torch

    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def device_name(d: torch.device) -> str:
    """The GPU's name, or the CPU's processor for a CPU run."""
    import torch

    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    return f"cpu ({platform.processor() or platform.machine()})"
