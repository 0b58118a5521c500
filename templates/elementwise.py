"""Elementwise template (backend kernels ``silu_mul``, ``add``, ``gelu_tanh_mul``): one flat pass over the tensors.

Keys: ``BLOCK_SIZE, num_warps``. Each program handles ``BLOCK_SIZE`` elements;
each thread ``BLOCK_SIZE / (32 * num_warps)`` of them. Loads are full 16-byte
vectors when a thread owns at least ``16 / elem_bytes`` contiguous elements
(8 for bf16), which the reason reports.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial
from typing import Any

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import StreamBound, predict_stream
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.pruning import BoundedSpace, Tally, cached, gpu_key
from autoopt.kernels.template import Prediction, Template
from autoopt.templates.gemm import missing_keys

__all__ = ["ElementwiseTemplate"]

KEYS = ("BLOCK_SIZE", "num_warps")
#: silu_mul, add and gelu_tanh_mul all read two tensors and write one.
_INPUTS = 2
#: smallest block: one 16-byte vector for each of 32 threads of a warp at fp32 (32 x 4 elements).
MIN_BLOCK = 128
#: at most this many elements per thread: H200 sweep at 64M bf16 elements (SiLU-mul and add),
#: configs with <= 16 per thread ran 100.5-102.2 us, 32-64 per thread 103.6-105.4 us
#: (benchmarks/results/h200/stream_sweep_run2.json).
MAX_ELEMS_PER_THREAD = 16
BLOCK_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
WARPS = (1, 2, 4, 8, 16)


class ElementwiseTemplate(Template):
    """``out = silu(x) * y``, ``out = x + y`` and ``out = gelu_tanh(x) * y`` over flat tensors."""

    name = "elementwise"
    ops = ("silu_mul", "add", "gelu_tanh_mul")

    @staticmethod
    def pairs(gpu: GPUProfile, op: OpSpec) -> Iterator[tuple[int, int]]:
        """(BLOCK_SIZE, num_warps) of the space, in its order."""
        cap = max(MIN_BLOCK, C.next_pow2(op.numel))
        lim = C.limits(gpu)
        warp_opts = [w for w in WARPS if w * lim.warp_size <= lim.max_threads_per_block]
        for bs in BLOCK_SIZES:
            if bs > cap:
                break
            for warps in warp_opts:
                if bs <= MAX_ELEMS_PER_THREAD * warps * lim.warp_size:
                    yield bs, warps

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        for bs, warps in self.pairs(gpu, op):
            yield self._config(op, bs, warps)

    def _config(self, op: OpSpec, bs: int, warps: int) -> KernelConfig:
        return KernelConfig(kernel=op.kind, template=self.name, path="standard",
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

    # -- branch and bound (see autoopt.pruning) ------------------------------------
    @staticmethod
    def table(gpu: GPUProfile) -> dict[tuple[int, int], tuple[str | None, int, float, int]]:
        """(BLOCK_SIZE, num_warps) -> (validate's first problem or None, threads, elements per thread,
        programs per SM) on this GPU; the same for every op and dtype (registers hold fp32)."""
        def build() -> dict[tuple[int, int], tuple[str | None, int, float, int]]:
            lim = C.limits(gpu)
            out = {}
            for bs in BLOCK_SIZES:
                for w in WARPS:
                    threads = w * lim.warp_size
                    ept = bs / threads
                    regs = (_INPUTS + 1) * ept + C.REG_OVERHEAD
                    problems = C.check_threads(lim, w) or (
                        [f"BLOCK_SIZE={bs} < {threads} threads: idle threads"] if ept < 1
                        else C.check_regs(lim, regs, threads))
                    occ = max(1, C.occupancy(lim, smem_bytes=0, regs_per_thread=regs, threads=threads))
                    out[(bs, w)] = (problems[0] if problems else None, threads, ept, occ)
            return out
        return cached(("elementwise", "table", gpu_key(gpu)), build)

    def bounded_space(self, gpu: GPUProfile, op: OpSpec) -> BoundedSpace:
        """Every config of the space with its predicted time as the bound (exact up to rounding)."""
        table = self.table(gpu)
        bound = StreamBound(gpu, op)
        e = DTYPE_BYTES[op.dtype]
        tally = Tally()
        roots: list[tuple[float, Any]] = []
        for bs, w in self.pairs(gpu, op):  # 40 configs at most: bound each, predict only the best
            tally.considered += 1
            problem, _, _, occ = table[(bs, w)]
            if problem is not None:
                tally.reject(op.kind, problem)
                continue
            b = bound(math.ceil(op.numel / bs), occ, 1, _INPUTS * bs * e, op.min_bytes)
            roots.append((b, partial(_leaf, b, self._config, op, bs, w)))
        return tally.space(roots)


def _leaf(b: float, make: Any, op: OpSpec, bs: int, w: int) -> list[tuple[float, Any]]:
    return [(b, make(op, bs, w))]
