"""Which execution path an op takes and which implementation serves each kernel class.

:func:`default_path`/:func:`default_impl` are the built-in answers, derived
from the GPU's feature flags (see :mod:`autoopt.hardware.features` for the sources);
:mod:`autoopt.plugins.choices` asks plugins first (pluggy ``firstresult`` hooks) and
falls back to these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import PATHS
from autoopt.kernels.ops import DTYPE_BYTES, GEMV_MAX_M, OpSpec

log = get_logger(__name__)

__all__ = ["KERNEL_CLASSES", "ImplChoice", "PathChoice", "default_impl", "default_path"]

#: kernel classes :func:`choose_impl` answers for.
KERNEL_CLASSES = ("gemm", "gemv", "attention", "rmsnorm", "layernorm", "softmax", "rope", "silu_mul", "swiglu",
                  "elementwise", "quantized_gemm")


@dataclass(frozen=True, slots=True, kw_only=True)
class PathChoice:
    """An execution path (one of :data:`autoopt.config.PATHS`) and why."""

    path: str
    reason: str
    source: str = "builtin"

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise AutooptError(f"unknown execution path {self.path!r}; expected one of {', '.join(PATHS)}")

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PathChoice:
        return cls(path=str(data["path"]), reason=str(data.get("reason", "")),
                   source=str(data.get("source", "builtin")))


@dataclass(frozen=True, slots=True, kw_only=True)
class ImplChoice:
    """The implementation to use for one kernel class and why."""

    kernel_class: str
    impl: str
    reason: str
    source: str = "builtin"

    def to_dict(self) -> dict[str, Any]:
        return {"kernel_class": self.kernel_class, "impl": self.impl, "reason": self.reason,
                "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImplChoice:
        return cls(kernel_class=str(data["kernel_class"]), impl=str(data["impl"]),
                   reason=str(data.get("reason", "")), source=str(data.get("source", "builtin")))


def default_path(gpu: GPUProfile, op: OpSpec) -> PathChoice:
    """Built-in path choice from feature flags (WGMMA only on sm_90a; tcgen05 only on sm_100a/103a)."""
    f = gpu.features
    if not op.is_matmul:
        return PathChoice(path="standard", reason=f"{op.kind} is a row/element stream: plain vector loads "
                                                  "reach DRAM bandwidth, TMA/MMA paths do not apply")
    m, _, k = op.shape
    if op.dtype == "fp4":
        if f.tcgen05:
            return PathChoice(path="fp4_cluster", reason="fp4 on tcgen05 (sm_100a/sm_103a): block-scaled "
                                                         "UMMA with 2-CTA clusters")
        return PathChoice(path="standard", reason=f"fp4 MMA with clusters needs tcgen05; {gpu.arch} has none")
    if f.mfma:
        return PathChoice(path="mfma", reason=f"CDNA ({gpu.arch}): tl.dot lowers to MFMA matrix cores")
    if f.wgmma:
        if m <= GEMV_MAX_M:
            return PathChoice(path="standard", reason=f"M={m} <= {GEMV_MAX_M}: memory-bound decode; wgmma's "
                                                      "64-row instruction would be mostly padding")
        if f.tma and (k * DTYPE_BYTES[op.dtype]) % 16 == 0:
            return PathChoice(path="tma_wgmma", reason="sm_90a: TMA loads (rows 16-byte aligned) feeding "
                                                       "async wgmma in a persistent kernel")
        return PathChoice(path="wgmma", reason=f"sm_90a: wgmma; K*elem = {k * DTYPE_BYTES[op.dtype]:g} B "
                                               "is not 16-byte aligned, so no TMA descriptors")
    if f.tcgen05:
        return PathChoice(path="standard", reason=f"{gpu.arch}: wgmma is sm_90a-only and built-in templates "
                                                  "do not drive tcgen05 (a Blackwell plugin can)")
    if f.tensor_cores:
        return PathChoice(path="standard", reason=f"{gpu.arch or 'this GPU'}: mma.sync tensor cores "
                                                  "(no wgmma below sm_90 or on consumer Blackwell)")
    return PathChoice(path="standard", reason="no tensor cores known: FMA path")


def _family(gpu: GPUProfile) -> str:
    f = gpu.features
    if gpu.vendor == "amd" or gpu.arch.startswith("gfx"):
        return "rocm"
    if f.tcgen05:
        return "blackwell"
    if f.wgmma:
        return "hopper"
    if gpu.generation == "Blackwell consumer":
        return "blackwell_consumer"
    if f.fp8:
        return "ada"
    if f.bf16:
        return "ampere"
    return "legacy"


#: (kernel class, family) -> (impl, reason). Families from :func:`_family`.
_IMPLS: dict[tuple[str, str], tuple[str, str]] = {
    ("attention", "hopper"): ("flash-attention-3 (wgmma+tma)",
                              "FA3 overlaps wgmma with TMA loads and softmax: ~1.5-2x FA2 on H100"),
    ("attention", "ampere"): ("flash-attention-2", "FA2 is the mma.sync tiled attention for sm_80/86"),
    ("attention", "ada"): ("flash-attention-2", "FA2 supports sm_89; FA3 needs sm_90a wgmma"),
    ("attention", "blackwell"): ("cudnn/flashinfer tcgen05",
                                 "tcgen05 + TMEM attention kernels ship in cuDNN 9.7+/FlashInfer for sm_100a"),
    ("attention", "blackwell_consumer"): ("flash-attention-2",
                                          "sm_120 has no tcgen05/wgmma; mma.sync kernels apply"),
    ("attention", "rocm"): ("ck/aiter", "composable-kernel / AITER FMHA use MFMA on CDNA"),
    ("attention", "legacy"): ("torch sdpa (mem-efficient)", "no FlashAttention build below sm_80"),
    ("gemm", "hopper"): ("triton persistent tma+wgmma / cuBLAS",
                         "sm_90a full rate needs wgmma; TMA frees registers for larger tiles"),
    ("gemm", "blackwell"): ("cuBLASLt tcgen05 (2-CTA UMMA)", "tcgen05 with TMEM accumulators, 2-SM tiles"),
    ("gemm", "rocm"): ("hipBLASLt / triton mfma", "MFMA through hipBLASLt or Triton on CDNA"),
    ("quantized_gemm", "hopper"): ("fp8 wgmma (cuBLASLt) / marlin int4",
                                   "sm_90a has fp8 wgmma; weight-only int4 via Marlin-style mma.sync"),
    ("quantized_gemm", "ada"): ("fp8 cuBLASLt / marlin int4", "sm_89 has fp8 mma.sync"),
    ("quantized_gemm", "ampere"): ("marlin int4 (w4a16)", "no fp8 below sm_89: weight-only int4 with mma.sync"),
    ("quantized_gemm", "blackwell"): ("nvfp4 tcgen05 block-scaled", "sm_100a block-scaled UMMA for NVFP4/MXFP8"),
    ("quantized_gemm", "blackwell_consumer"): ("nvfp4 block-scaled mma.sync",
                                               "sm_120 has fp4 mma.sync with block scales"),
    ("quantized_gemm", "rocm"): ("hipBLASLt fp8", "fp8 MFMA on gfx942+"),
}
#: answers that do not depend on the family.
_ANY: dict[str, tuple[str, str]] = {
    "gemm": ("triton tiled mma.sync / cuBLAS", "mma.sync tensor cores; autoopt's gemm template ranks tiles"),
    "gemv": ("triton gemv split-K", "decode GEMV is memory-bound: stream W once at full bandwidth"),
    "rmsnorm": ("triton fused rmsnorm (single-pass or looped)",
                "memory-bound: one read and one write per element when the row fits on chip"),
    "layernorm": ("triton fused layernorm (single-pass or looped, with bias)",
                  "memory-bound: mean and variance in one pass over the row when it fits on chip"),
    "softmax": ("triton fused softmax (single-pass or online looped)", "memory-bound row reduction"),
    "rope": ("triton fused rope (in place on q/k)", "memory-bound: fuse with the QKV epilogue where possible"),
    "silu_mul": ("triton fused silu*mul", "memory-bound: one pass over gate and up, 16-byte vectors"),
    "swiglu": ("triton fused silu*mul", "memory-bound: one pass over gate and up, 16-byte vectors"),
    "elementwise": ("triton fused elementwise", "memory-bound: 16-byte vector loads, enough bytes in flight"),
    "quantized_gemm": ("torch int8 (_int_mm)", "no fp8/int4 fast path known for this GPU"),
    "attention": ("torch sdpa", "no specialised attention kernel known for this GPU"),
}


def default_impl(gpu: GPUProfile, kernel_class: str) -> ImplChoice:
    """Built-in implementation choice for a kernel class on this GPU family."""
    if kernel_class not in KERNEL_CLASSES:
        raise AutooptError(f"unknown kernel class {kernel_class!r}; expected one of {', '.join(KERNEL_CLASSES)}")
    fam = _family(gpu)
    impl, reason = _IMPLS.get((kernel_class, fam)) or _ANY[kernel_class]
    return ImplChoice(kernel_class=kernel_class, impl=impl, reason=f"{gpu.arch or gpu.name}: {reason}")
