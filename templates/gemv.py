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
from functools import partial

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import MatmulBound, constants, predict_matmul
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.pruning import BoundedSpace, cached, gpu_key
from autoopt.kernels.template import Prediction, Template
from autoopt.templates.gemm import (
    LazyTiles,
    StageFacts,
    TileTable,
    block_problems,
    blocks,
    config_problems,
    floor_at_rate,
    matmul_space,
    mma_ceiling_rate,
    probe_t_comp,
    tile_table,
    warp_facts,
)

__all__ = ["GemvTemplate", "block_rules"]

KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
MIN_BN, MIN_BK = 16, 32
BNS, BKS = (16, 32, 64, 128, 256), (32, 64, 128, 256, 512)
SPLITS, WARPS, STAGES = (1, 2, 4, 8, 16, 32), (1, 2, 4, 8), (1, 2, 3, 4)


def dot_m(bm: int) -> int:
    """Rows the tensor-core path computes: mma.sync needs M >= 16 (the kernel's DOT_M)."""
    return max(16, bm)


def block_rules(gpu: GPUProfile, dtype: str, shape: tuple[int, int, int], bm: int, bn: int, bk: int) -> list[str]:
    """A GEMV config's first rules (shared with the quant-gemv template): the dtype's MMA, ``BLOCK_M =
    next_pow2(M)``, power-of-two ``BLOCK_N``/``BLOCK_K`` within the problem's N and K."""
    m, n, k = shape
    out = C.check_dtype(gpu, dtype)
    if not C.is_pow2(bm) or bm < m or bm > C.next_pow2(m):
        out.append(f"BLOCK_M={bm} must be next_pow2(M)={C.next_pow2(m)} (one program covers all M={m} rows)")
    return out + block_problems((("BLOCK_N", bn, n, MIN_BN), ("BLOCK_K", bk, k, MIN_BK)))


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

    @staticmethod
    def axes(gpu: GPUProfile, op: OpSpec) -> Iterator[tuple[int, int, list[int]]]:
        """(BLOCK_N, BLOCK_K, SPLIT_K values) of the space, in its order."""
        _m, n, k = op.shape
        sms = gpu.sm_count or 1
        for bn in blocks(BNS, n, MIN_BN):
            ntiles = math.ceil(n / bn)
            for bk in blocks(BKS, k, MIN_BK):
                splits = [s for s in SPLITS
                          if s == 1 or (ntiles < 2 * sms and ntiles * s <= 4 * sms and s * bk <= k)]
                yield bn, bk, splits

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        bm = C.next_pow2(op.shape[0])
        path = self.path_for(gpu, bm)
        for bn, bk, splits in self.axes(gpu, op):
            for warps in WARPS:
                for stages in STAGES:
                    for s in splits:
                        yield KernelConfig(kernel=self.kernel, template=self.name, path=path,
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
        return (GemvTemplate.smem_bytes(bm, bn, bk, config.num_stages, e),
                GemvTemplate.regs_per_thread(bm, bn, bk, config.num_warps, lim.warp_size, e),
                config.num_warps * lim.warp_size)

    @staticmethod
    def regs_per_thread(bm: int, bn: int, bk: int, num_warps: int, warp_size: int, e: float) -> float:
        threads = num_warps * warp_size
        if bm == 1:
            return bn * bk / threads + bn * bk * e / 4 / threads + C.REG_OVERHEAD
        return C.gemm_regs_per_thread(dot_m(bm), bn, num_warps, warp_size, wgmma=False)

    @staticmethod
    def smem_bytes(bm: int, bn: int, bk: int, stages: int, e: float) -> int:
        if bm == 1:
            return int(stages * (bn * bk + bk) * e) if stages > 1 else 0
        return C.gemm_smem_bytes(dot_m(bm), bn, bk, max(stages, 1), e)

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = config_problems(config, KEYS, self.kernel)
        if out:
            return out
        m, n, k = op.shape
        p = config.params
        lim = C.limits(gpu)
        bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
        out += block_rules(gpu, op.dtype, (m, n, k), bm, bn, bk)
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

    # -- branch and bound (see autoopt.pruning) ------------------------------------
    def tables(self, gpu: GPUProfile, dtype: str, bm: int) -> LazyTiles:
        """Each (BLOCK_N, BLOCK_K) tile's :class:`~autoopt.templates.gemm.TileTable` for this BLOCK_M
        (modelled at M = 1 on the FMA path, at the padded M = 16 on the dot path), built on its first
        lookup. For a config of the space validate's first problem is threads, else smem, else registers."""
        path = self.path_for(gpu, bm)

        def build() -> LazyTiles:
            lim = C.limits(gpu)
            e = DTYPE_BYTES[dtype]
            smem_facts = StageFacts(gpu)
            rate = mma_ceiling_rate(gpu, dtype, tensor=bm > 1)
            rows = dot_m(bm) if bm > 1 else 1

            def tile(bn: int, bk: int) -> TileTable:
                warps = [warp_facts(gpu, w, C.check_threads(lim, w), path,
                                    self.regs_per_thread(bm, bn, bk, w, lim.warp_size, e)) for w in WARPS]
                stages = [smem_facts(st, self.smem_bytes(bm, bn, bk, st, e)) for st in STAGES]
                return tile_table(warps, stages, partial(self._probe, gpu, dtype, bm, bn, bk),
                                  floor=floor_at_rate(rate, rows, bn, bk))
            return LazyTiles(tile)
        return cached((self.name, "tiles", gpu_key(gpu), dtype, bm, constants()), build)

    def _probe(self, gpu: GPUProfile, dtype: str, bm: int, bn: int, bk: int, w: int, path: str,
               st: int) -> float:
        op = OpSpec(kind="gemv", shape=(bm, bn, bk), dtype=dtype)
        return probe_t_comp(self, gpu, op, KernelConfig(
            kernel=self.kernel, template=self.name, path=path,
            params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "num_warps": w,
                    "num_stages": st}))

    def bounded_space(self, gpu: GPUProfile, op: OpSpec) -> BoundedSpace | None:
        """The space as (BLOCK_N, BLOCK_K, SPLIT_K) -> num_warps -> num_stages configs with lower bounds."""
        if C.check_dtype(gpu, op.dtype) or C.check_threads(C.limits(gpu), max(WARPS)):
            return None  # the exhaustive path words (and reports) these
        bm = C.next_pow2(op.shape[0])
        tile_m = dot_m(bm) if bm > 1 else 1
        tables = self.tables(gpu, op.dtype, bm)
        walk = ((tables[(bn, bk)], len(splits), (tile_m, bn, bk), splits, partial(self._leaves, bm, bn, bk))
                for bn, bk, splits in self.axes(gpu, op))
        return matmul_space(self.kernel, MatmulBound(gpu, op), len(WARPS) * len(STAGES), walk)

    def _leaves(self, bm: int, bn: int, bk: int, s: int, w: int, path: str, st: int) -> list[KernelConfig]:
        return [KernelConfig(kernel=self.kernel, template=self.name, path=path,
                             params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": s, "num_warps": w,
                                     "num_stages": st})]
