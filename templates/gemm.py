"""Tiled Triton GEMM template (backend kernel ``gemm``): group-M ordering, optional split-K.

Keys: ``BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, num_warps, num_stages``.
Path: ``wgmma`` on sm_90a when ``BLOCK_M % 64 == 0`` and ``num_warps % 4 == 0``
(Triton emits wgmma for ``tl.dot`` then), ``mfma`` on CDNA, else ``standard``
(mma.sync). Serves ``gemm`` and ``gemv`` ops (the backend's ``gemm`` kernel
takes both), so decode shapes are compared against the gemv template.
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

__all__ = ["GemmTemplate", "blocks", "matmul_path"]

KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")
#: smallest block per dim: MMA M is 16 (mma.sync m16n8k16); N and K below 32 waste 16-byte vectors.
MIN_BM, MIN_BN, MIN_BK = 16, 32, 32
#: GROUP_M only changes L2 reuse (no per-tile cost): 1 (row-major) against 8 (Triton's usual
#: choice; a 8-row band of A stays in L2 while W columns stream) covers what it can change.
GROUPS = (1, 8)


def blocks(cands: tuple[int, ...], dim: int, minimum: int) -> list[int]:
    """Candidate block sizes no larger than ``max(minimum, next_pow2(dim))`` (the validate rule)."""
    cap = max(minimum, C.next_pow2(dim))
    return [b for b in cands if b <= cap] or [minimum]


def matmul_path(gpu: GPUProfile, bm: int, num_warps: int) -> str:
    """The path Triton takes for a tl.dot tile on this GPU."""
    f = gpu.features
    if f.wgmma and bm % 64 == 0 and num_warps % 4 == 0:
        return "wgmma"
    if f.mfma:
        return "mfma"
    return "standard"


def mma_kind(path: str) -> str:
    return {"wgmma": "wgmma", "tma_wgmma": "wgmma", "mfma": "mfma"}.get(path, "mma_sync")


def missing_keys(config: KernelConfig, keys: tuple[str, ...]) -> list[str]:
    gone = [k for k in keys if k not in config.params]
    extra = [k for k in config.params if k not in keys]
    out = [f"missing config keys {gone}"] if gone else []
    if extra:
        out.append(f"unknown config keys {extra} (expected {list(keys)})")
    return out


class GemmTemplate(Template):
    """Triton tiled GEMM with group-M swizzle and split-K for skinny shapes."""

    name = "gemm"
    ops = ("gemm", "gemv")
    kernel = "gemm"

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        return op.kind in self.ops and gpu.features.tensor_cores

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        m, n, k = op.shape
        sms = gpu.sm_count or 1
        bks = (32, 64, 128, 256) if op.dtype == "fp8" else (32, 64, 128)
        for bm in blocks((16, 32, 64, 128, 256), m, MIN_BM):
            tm = math.ceil(m / bm)
            # GROUP_M values >= the number of row tiles all order tiles the same: keep the first.
            groups = [g for g in GROUPS if g < tm] + [g for g in GROUPS if g >= tm][:1]
            for bn in blocks((32, 64, 128, 256), n, MIN_BN):
                tiles = tm * math.ceil(n / bn)
                for bk in blocks(bks, k, MIN_BK):
                    # split-K only when the output tiles leave SMs idle and K is long
                    splits = [s for s in (1, 2, 4, 8, 16)
                              if s == 1 or (tiles < sms and tiles * s <= 2 * sms and k // s >= max(256, bk))]
                    for warps in (2, 4, 8):
                        path = matmul_path(gpu, bm, warps)
                        for stages in (2, 3, 4, 5, 6):
                            for g in groups:
                                for s in splits:
                                    yield KernelConfig(kernel=self.kernel, template=self.name, path=path,
                                                       params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                                               "GROUP_M": g, "SPLIT_K": s, "num_warps": warps,
                                                               "num_stages": stages})

    # -- resources shared by validate and predict -----------------------------
    @staticmethod
    def resources(gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> tuple[int, float, int]:
        """(smem bytes, registers per thread, threads) of a config."""
        lim = C.limits(gpu)
        p = config.params
        e = DTYPE_BYTES[op.dtype]
        smem = C.gemm_smem_bytes(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.num_stages, e)
        regs = C.gemm_regs_per_thread(p["BLOCK_M"], p["BLOCK_N"], config.num_warps, lim.warp_size,
                                      wgmma=config.path in ("wgmma", "tma_wgmma"))
        return smem, regs, config.num_warps * lim.warp_size

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = missing_keys(config, KEYS)
        if out:
            return out
        if config.kernel != self.kernel:
            return [f"kernel {config.kernel!r} is not this template's {self.kernel!r}"]
        p = config.params
        m, n, k = op.shape
        lim = C.limits(gpu)
        bm, bn, bk, warps = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.num_warps
        out += C.check_dtype(gpu, op.dtype)
        for name, v, dim, lo in (("BLOCK_M", bm, m, MIN_BM), ("BLOCK_N", bn, n, MIN_BN), ("BLOCK_K", bk, k, MIN_BK)):
            out += C.check_pow2(name, v) or C.check_block_vs_dim(name, v, dim, lo)
        if out:
            return out
        out += C.check_threads(lim, warps)
        if config.num_stages < 1:
            out.append(f"num_stages={config.num_stages} must be >= 1")
        if p["GROUP_M"] < 1:
            out.append(f"GROUP_M={p['GROUP_M']} must be >= 1")
        out += C.check_split_k(p["SPLIT_K"], bk, k)
        want = matmul_path(gpu, bm, warps)
        if config.path != want:
            out.append(f"path {config.path!r} does not match what Triton emits here ({want!r})")
        if config.path == "wgmma":
            out += C.wgmma_problems(bm, bn, bk, warps, op.dtype)
        if out:
            return out
        smem, regs, threads = self.resources(gpu, op, config)
        return C.check_smem(lim, smem) + C.check_regs(lim, regs, threads)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        smem, regs, _ = self.resources(gpu, op, config)
        return predict_matmul(gpu, op, config, mma=mma_kind(config.path), smem_bytes=smem, regs_per_thread=regs)
