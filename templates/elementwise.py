"""Elementwise template (backend kernels ``silu_mul`` and ``add``): one flat pass over the tensors.

Keys: ``BLOCK_SIZE, num_warps``. Each program handles ``BLOCK_SIZE`` elements;
each thread ``BLOCK_SIZE / (32 * num_warps)`` of them. Loads are full 16-byte
vectors when a thread owns at least ``16 / elem_bytes`` contiguous elements
(8 for bf16), which the reason reports.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from autoopt import constraints as C
from autoopt.config import KernelConfig
from autoopt.cost import predict_stream
from autoopt.ops import DTYPE_BYTES, OpSpec
from autoopt.profile import GPUProfile
from autoopt.template import Prediction, Template
from autoopt.templates.gemm import missing_keys

__all__ = ["ElementwiseTemplate"]

KEYS = ("BLOCK_SIZE", "num_warps")
#: silu_mul and add both read two tensors and write one.
_INPUTS = 2
#: smallest block: one 16-byte vector for each of 32 threads of a warp at fp32 (32 x 4 elements).
MIN_BLOCK = 128


class ElementwiseTemplate(Template):
    """``out = silu(x) * y`` and ``out = x + y`` over flat tensors."""

    name = "elementwise"
    ops = ("silu_mul", "add")

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        cap = max(MIN_BLOCK, C.next_pow2(op.numel))
        lim = C.limits(gpu)
        warp_opts = [w for w in (1, 2, 4, 8, 16) if w * lim.warp_size <= lim.max_threads_per_block]
        for bs in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):
            if bs > cap:
                break
            for warps in warp_opts:
                yield KernelConfig(kernel=op.kind, template=self.name, path="standard",
                                   params={"BLOCK_SIZE": bs, "num_warps": warps})

    @staticmethod
    def per_thread(gpu: GPUProfile, config: KernelConfig) -> tuple[int, float]:
        threads = config.num_warps * C.limits(gpu).warp_size
        return threads, config.params["BLOCK_SIZE"] / threads

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = missing_keys(config, KEYS)
        if out:
            return out
        if config.kernel != op.kind:
            return [f"kernel {config.kernel!r} does not compute op {op.kind!r}"]
        if config.path != "standard":
            return [f"path {config.path!r}: elementwise kernels run 'standard'"]
        lim = C.limits(gpu)
        bs = config.params["BLOCK_SIZE"]
        out += C.check_pow2("BLOCK_SIZE", bs) or C.check_block_vs_dim("BLOCK_SIZE", bs, op.numel, MIN_BLOCK)
        out += C.check_threads(lim, config.num_warps)
        if out:
            return out
        threads, ept = self.per_thread(gpu, config)
        if ept < 1:
            return [f"BLOCK_SIZE={bs} < {threads} threads: idle threads"]
        # two inputs upcast to fp32 and the result live at once
        return C.check_regs(lim, (_INPUTS + 1) * ept + C.REG_OVERHEAD, threads)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        e = DTYPE_BYTES[op.dtype]
        bs = config.params["BLOCK_SIZE"]
        threads, ept = self.per_thread(gpu, config)
        vec = int(16 // e)
        programs = math.ceil(op.numel / bs)
        why = (f"vector width {vec} x {op.dtype} = 16 B, {ept:g} elements/thread"
               + ("" if ept >= vec else f" (< {vec}: partial vectors)"))
        return predict_stream(gpu, op, programs=programs, threads=threads, smem_bytes=0,
                              regs_per_thread=(_INPUTS + 1) * ept + C.REG_OVERHEAD, iters=1,
                              bytes_per_iter=_INPUTS * bs * e, dram_bytes=op.min_bytes, reason=why)
