"""Decode GEMV template (backend kernel ``gemv``) for M = 1..16.

Keys: ``BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages``. One
program owns ``BLOCK_N`` rows of W and one K-slice and reuses each W tile for
all M rows: ``BLOCK_M = next_pow2(M)`` (a power of two >= M). ``BLOCK_M == 1``
runs FMAs into a ``[BLOCK_N, BLOCK_K]`` fp32 accumulator; ``BLOCK_M > 1`` runs
``tl.dot`` with M padded to 16 (the MMA minimum), as the kernel does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from autoopt import constraints as C
from autoopt.config import KernelConfig
from autoopt.cost import predict_matmul
from autoopt.ops import DTYPE_BYTES, OpSpec
from autoopt.profile import GPUProfile
from autoopt.template import Prediction, Template
from autoopt.templates.gemm import blocks, missing_keys

__all__ = ["GemvTemplate"]

KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
MIN_BN, MIN_BK = 16, 32


def dot_m(bm: int) -> int:
    """Rows the tensor-core path computes: mma.sync needs M >= 16 (the kernel's DOT_M)."""
    return max(16, bm)


class GemvTemplate(Template):
    """Memory-bound decode GEMV/skinny GEMM: stream W once at full bandwidth."""

    name = "gemv"
    ops = ("gemv",)
    kernel = "gemv"

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        return op.kind in self.ops

    @staticmethod
    def path_for(gpu: GPUProfile, bm: int) -> str:
        return "mfma" if bm > 1 and gpu.features.mfma else "standard"

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        m, n, k = op.shape
        sms = gpu.sm_count or 1
        bm = C.next_pow2(m)
        for bn in blocks((16, 32, 64, 128, 256), n, MIN_BN):
            ntiles = math.ceil(n / bn)
            for bk in blocks((32, 64, 128, 256, 512), k, MIN_BK):
                splits = [s for s in (1, 2, 4, 8, 16, 32)
                          if s == 1 or (ntiles < 2 * sms and ntiles * s <= 4 * sms and s * bk <= k)]
                for warps in (1, 2, 4, 8):
                    for stages in (1, 2, 3, 4):
                        for s in splits:
                            yield KernelConfig(kernel=self.kernel, template=self.name, path=self.path_for(gpu, bm),
                                               params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": s,
                                                       "num_warps": warps, "num_stages": stages})

    @staticmethod
    def resources(gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> tuple[int, float, int]:
        """(smem, regs/thread, threads). FMA path: ``[BLOCK_N, BLOCK_K]`` fp32 accumulator plus the
        loaded W tile in registers; dot path: the GEMM estimate at M = 16. Pipelined loads
        (num_stages > 1) stage W (and X) tiles in shared memory."""
        lim = C.limits(gpu)
        p = config.params
        e = DTYPE_BYTES[op.dtype]
        bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
        threads = config.num_warps * lim.warp_size
        stages = config.num_stages
        if bm == 1:
            regs = bn * bk / threads + bn * bk * e / 4 / threads + C.REG_OVERHEAD
            smem = int(stages * (bn * bk + bk) * e) if stages > 1 else 0
        else:
            regs = C.gemm_regs_per_thread(dot_m(bm), bn, config.num_warps, lim.warp_size, wgmma=False)
            smem = C.gemm_smem_bytes(dot_m(bm), bn, bk, max(stages, 1), e)
        return smem, regs, threads

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = missing_keys(config, KEYS)
        if out:
            return out
        if config.kernel != self.kernel:
            return [f"kernel {config.kernel!r} is not this template's {self.kernel!r}"]
        m, n, k = op.shape
        p = config.params
        lim = C.limits(gpu)
        bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
        out += C.check_dtype(gpu, op.dtype)
        if not C.is_pow2(bm) or bm < m or bm > C.next_pow2(m):
            out.append(f"BLOCK_M={bm} must be next_pow2(M)={C.next_pow2(m)} (one program covers all M={m} rows)")
        for name, v, dim, lo in (("BLOCK_N", bn, n, MIN_BN), ("BLOCK_K", bk, k, MIN_BK)):
            out += C.check_pow2(name, v) or C.check_block_vs_dim(name, v, dim, lo)
        if out:
            return out
        out += C.check_threads(lim, config.num_warps)
        if config.num_stages < 1:
            out.append(f"num_stages={config.num_stages} must be >= 1")
        out += C.check_split_k(p["SPLIT_K"], bk, k)
        if config.path != self.path_for(gpu, bm):
            out.append(f"path {config.path!r} is not the gemv kernel's ({self.path_for(gpu, bm)!r})")
        if out:
            return out
        smem, regs, threads = self.resources(gpu, op, config)
        return C.check_smem(lim, smem) + C.check_regs(lim, regs, threads)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        smem, regs, _ = self.resources(gpu, op, config)
        bm = config.params["BLOCK_M"]
        # model the dot path at its padded M; the FMA path computes only the real rows
        as_tile = KernelConfig(kernel=config.kernel, path=config.path, template=config.template,
                               params={**config.params, "BLOCK_M": dot_m(bm) if bm > 1 else 1, "GROUP_M": 1})
        mma = "fma" if bm == 1 else ("mfma" if config.path == "mfma" else "mma_sync")
        return predict_matmul(gpu, op, as_tile, mma=mma, smem_bytes=smem, regs_per_thread=regs)
