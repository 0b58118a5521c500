"""Memory counters the memory check reads between steps: torch's CUDA caching allocator, or live CPU tensors.

Both have the same methods (:class:`MemoryCounter`), so the memory check runs one code path on a GPU and,
to test it, on the CPU. torch is imported inside the methods.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["CudaMemory", "LiveTensorMemory", "MemoryCounter"]


class MemoryCounter(Protocol):
    """What the memory check reads: bytes allocated now, the peak since the last reset, and the workspace."""

    def __enter__(self) -> MemoryCounter: ...
    def __exit__(self, *exc: object) -> None: ...
    def sync(self) -> None: ...
    def start(self) -> None: ...
    def allocated(self) -> int: ...
    def peak(self) -> int: ...
    def reserved_peak(self) -> int: ...
    def reset_peak(self) -> None: ...
    def free_workspaces(self) -> int | None: ...


class CudaMemory:
    """torch's caching-allocator counters for one CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> CudaMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def start(self) -> None:
        """Empty the allocator (cuBLAS workspaces included) and reset the peaks."""
        import torch

        self.free_workspaces()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        import torch

        return torch.cuda.memory_allocated(self.device)

    def peak(self) -> int:
        import torch

        return torch.cuda.max_memory_allocated(self.device)

    def reserved_peak(self) -> int:
        import torch

        return torch.cuda.max_memory_reserved(self.device)

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    def free_workspaces(self) -> int | None:
        """Bytes freed by dropping torch's cuBLAS/cuBLASLt workspaces (None: this torch cannot)."""
        import torch

        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is None:
            return None
        self.sync()
        before = self.allocated()
        clear()
        self.sync()
        return before - self.allocated()


class LiveTensorMemory:
    """Live tensor-storage bytes on the CPU, counted at every aten op (a CPU counterpart of the allocator's
    ``memory_allocated``, for running the memory check's code path without a GPU).

    Temporaries inside one aten kernel are not seen; allocations are not rounded to blocks.
    """

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                tracker._seen(out)
                return out

        self._mode = _Mode()
        self._live: dict[int, tuple[Any, int]] = {}
        self._peak = 0
        self._reserved_peak = 0

    def __enter__(self) -> LiveTensorMemory:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def _prune(self) -> int:
        for ptr in [p for p, (ref, _) in self._live.items() if ref.expired()]:
            del self._live[ptr]
        return sum(n for _, n in self._live.values())

    def _seen(self, out: Any) -> None:
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._pytree import tree_leaves

        self._prune()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                ptr, nbytes = st.data_ptr(), st.nbytes()
                if nbytes and ptr not in self._live:
                    self._live[ptr] = (StorageWeakRef(st), nbytes)
        live = sum(n for _, n in self._live.values())
        self._peak = max(self._peak, live)
        self._reserved_peak = max(self._reserved_peak, live)

    def sync(self) -> None:
        return None

    def start(self) -> None:
        gc.collect()
        self._peak = self._prune()

    def allocated(self) -> int:
        return self._prune()

    def peak(self) -> int:
        return max(self._peak, self._prune())

    def reserved_peak(self) -> int:
        return self._reserved_peak

    def reset_peak(self) -> None:
        self._peak = self._prune()

    def free_workspaces(self) -> int | None:
        return None
