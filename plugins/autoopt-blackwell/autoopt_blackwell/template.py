"""tcgen05 cluster GEMM template for sm_100a/sm_103a.

Hardware facts (NVIDIA Blackwell tuning guide, PTX ISA 8.7 tcgen05 section, CUTLASS sm100 kernels):
- tcgen05.mma accumulates in tensor memory (TMEM: 128 lanes x 512 columns of 32 bit per SM), so
  the accumulator costs no registers: a 128 x BLOCK_N fp32 tile takes BLOCK_N columns (<= 512).
- A 2-CTA MMA (cta_group::2) computes a 256 x N tile across a CTA pair: each CTA stages its own
  128 rows of A and half of B, halving B traffic per CTA. Here ``BLOCK_M = 256`` means that and
  needs ``CLUSTER_M = 2``.
- Clusters multicast TMA loads: a W tile is fetched once for the CLUSTER_M CTAs sharing it, an A
  tile once for CLUSTER_N; portable clusters have at most 8 CTAs.
"""

from __future__ import annotations

from collections.abc import Iterator

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import predict_matmul
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.template import Prediction, Template

KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "CLUSTER_M", "CLUSTER_N", "num_warps", "num_stages")
#: TMEM columns per SM (32-bit each, 128 lanes).
TMEM_COLUMNS = 512
#: largest portable cluster (CUDA guide, thread block clusters).
MAX_CLUSTER = 8
#: registers per thread: no accumulators; the epilogue drains TMEM in 32-column chunks.
EPILOGUE_REGS = 32 + C.REG_OVERHEAD


def path_for(dtype: str) -> str:
    return "fp4_cluster" if dtype in ("fp8", "fp4") else "tma"


class BlackwellClusterGemm(Template):
    """Persistent tcgen05 GEMM with 2-CTA MMA and cluster multicast."""

    name = "blackwell-tcgen05-gemm"
    ops = ("gemm",)
    kernel = "gemm_tcgen05"
    priority = 2

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        return op.kind in self.ops and gpu.features.tcgen05 and op.dtype in ("bf16", "fp16", "fp8", "fp4")

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        bks = (128, 256) if op.dtype in ("fp8", "fp4") else (64, 128)
        for bm, cms in ((128, (1, 2)), (256, (2,))):
            for bn in (64, 128, 256):
                for bk in bks:
                    for cm in cms:
                        for cn in (1, 2):
                            for warps in (4, 8):
                                for stages in (2, 3, 4, 5, 6):
                                    yield KernelConfig(
                                        kernel=self.kernel, template=self.name, path=path_for(op.dtype),
                                        params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "CLUSTER_M": cm,
                                                "CLUSTER_N": cn, "num_warps": warps, "num_stages": stages})

    @staticmethod
    def smem_bytes(op: OpSpec, p: dict) -> int:
        """Per CTA: 128 rows of A, and all of B (1-CTA) or half of it (2-CTA), per stage; C tile for TMA store."""
        e = DTYPE_BYTES[op.dtype]
        b_rows = p["BLOCK_N"] // 2 if p["BLOCK_M"] == 256 else p["BLOCK_N"]
        epilogue = 128 * p["BLOCK_N"] * DTYPE_BYTES[op.out_dtype or op.dtype]
        return int(p["num_stages"] * (128 + b_rows) * p["BLOCK_K"] * e + epilogue)

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        p = config.params
        gone = [k for k in KEYS if k not in p]
        if gone:
            return [f"missing config keys {gone}"]
        if not gpu.features.tcgen05:
            return [f"tcgen05 needs sm_100a/sm_103a; {gpu.arch or gpu.name} has none"]
        if config.path != path_for(op.dtype):
            return [f"path {config.path!r} for {op.dtype}; expected {path_for(op.dtype)!r}"]
        lim = C.limits(gpu)
        out = C.check_dtype(gpu, op.dtype) + C.check_threads(lim, config.num_warps)
        if p["BLOCK_M"] not in (128, 256):
            out.append(f"BLOCK_M={p['BLOCK_M']}: tcgen05 tiles are 128 (1-CTA) or 256 (2-CTA)")
        if p["BLOCK_M"] == 256 and p["CLUSTER_M"] % 2:
            out.append("BLOCK_M=256 is a 2-CTA MMA: CLUSTER_M must be even")
        if p["BLOCK_N"] % 16 or not 16 <= p["BLOCK_N"] <= 256:
            out.append(f"BLOCK_N={p['BLOCK_N']}: UMMA N is a multiple of 16 in [16, 256]")
        if p["BLOCK_N"] > TMEM_COLUMNS:
            out.append(f"accumulator needs {p['BLOCK_N']} TMEM columns > {TMEM_COLUMNS}")
        if p["CLUSTER_M"] * p["CLUSTER_N"] > MAX_CLUSTER:
            out.append(f"cluster {p['CLUSTER_M']}x{p['CLUSTER_N']} > {MAX_CLUSTER} CTAs (portable limit)")
        if (op.shape[2] * DTYPE_BYTES[op.dtype]) % 16:
            out.append(f"TMA row stride K*elem = {op.shape[2] * DTYPE_BYTES[op.dtype]:g} B is not 16-byte aligned")
        if out:
            return out
        threads = config.num_warps * lim.warp_size
        return C.check_smem(lim, self.smem_bytes(op, p)) + C.check_regs(lim, EPILOGUE_REGS, threads)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        p = config.params
        # one CTA computes 128 rows; a 2-CTA tile is two CTAs sharing B (multicast factor 2 on W)
        per_cta = KernelConfig(kernel=config.kernel, path=config.path, template=config.template,
                               params={"BLOCK_M": 128, "BLOCK_N": p["BLOCK_N"], "BLOCK_K": p["BLOCK_K"],
                                       "GROUP_M": p["CLUSTER_M"], "num_warps": config.num_warps,
                                       "num_stages": config.num_stages})
        pred = predict_matmul(gpu, op, per_cta, mma="tcgen05", smem_bytes=self.smem_bytes(op, p),
                              regs_per_thread=EPILOGUE_REGS, persistent=True,
                              multicast=(p["CLUSTER_M"], p["CLUSTER_N"]))
        return Prediction(us=pred.us, bound=pred.bound, roofline_pct=pred.roofline_pct,
                          reason=pred.reason + f"; cluster {p['CLUSTER_M']}x{p['CLUSTER_N']} multicast, "
                                                f"{'2' if p['BLOCK_M'] == 256 else '1'}-CTA UMMA, TMEM accumulator",
                          breakdown=pred.breakdown)
