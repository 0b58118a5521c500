"""A GPU's identity for caches: every field of a :class:`GPUProfile` the templates and the cost model
read. Its own small module (no dataclasses) so that start-up lookups keyed by it (the shipped rank
cache) need not import the branch-and-bound machinery of :mod:`autoopt.kernels.pruning`."""

from __future__ import annotations

from typing import Any

from autoopt.hardware.profile import GPUProfile

__all__ = ["gpu_key"]

_GPU_KEY_FIELDS = ("name", "vendor", "arch", "cc_major", "cc_minor", "sm_count", "max_threads_per_sm",
                   "max_threads_per_block", "warp_size", "regs_per_sm", "regs_per_block",
                   "max_regs_per_thread", "smem_per_sm_bytes", "smem_per_block_bytes",
                   "smem_per_block_optin_bytes", "l2_bytes", "sm_clock_max_mhz", "mem_bandwidth_gbs",
                   "measured_bandwidth_gbs")
_KEY_CACHE: dict[int, tuple[GPUProfile, tuple[Any, ...]]] = {}


def gpu_key(gpu: GPUProfile) -> tuple[Any, ...]:
    """Everything about a GPU that templates and the cost model read (cached per profile object)."""
    hit = _KEY_CACHE.get(id(gpu))
    if hit is not None and hit[0] is gpu:
        return hit[1]
    key = (tuple(getattr(gpu, f) for f in _GPU_KEY_FIELDS), tuple(sorted(gpu.peak_tflops.items())),
           tuple(sorted(gpu.measured_tflops.items())))
    if len(_KEY_CACHE) > 256:
        _KEY_CACHE.clear()
    _KEY_CACHE[id(gpu)] = (gpu, key)
    return key
