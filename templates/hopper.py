"""Hopper persistent TMA + WGMMA GEMM template (backend kernel ``gemm_tma``), sm_90a only.

Keys: ``BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, STREAM_K, num_warps, num_stages``; path
``tma_wgmma``. The grid is one program per SM walking tiles in group-M order
(Triton tutorial 09); A, W and C go through TMA descriptors, so the TMA rules
(16-byte row strides, box <= 256 per dim, >= 16-byte inner box row) and the
WGMMA rules (BLOCK_M % 64, whole warpgroups, N multiple of 8 up to 256, K per
instruction 16 / 32 for 16-/8-bit types) are hard constraints here. The C tile
is staged in its own shared-memory buffer for the TMA store (fp32 partials
under split-K). Split-K is offered only where the output tiles make fewer than
two waves over the SMs (see :func:`tma_splits`), and so is stream-K (``STREAM_K=1``:
the tiles' K-iterations dealt evenly to the SMs, partial tiles handed over in
L2; see ``backend/kernels/gemm_tma.py``). Configs stored before either existed
carry neither key and read as ``SPLIT_K=1, STREAM_K=0``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
    Leaves,
    StageFacts,
    TileTable,
    block_ks,
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

__all__ = ["HopperTmaGemmTemplate"]

KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "STREAM_K", "num_warps", "num_stages")
#: the cost model's and the bound's code for stream-K in place of a SPLIT_K value
STREAM = 0
MIN_BM, MIN_BN, MIN_BK = 64, 64, 32
BMS = BNS = (64, 128, 256)
#: GROUP_M 8 only: see templates/gemm.py GROUPS for the measurement behind it
WARPS, STAGES, GROUPS = (4, 8), (2, 3, 4, 5, 6), (8,)
#: K-slices offered when the tiles underfill the GPU: TMA zero-fills a ragged last slice, so any
#: count works, not only powers of two (3 and 6 matter: 96 tiles x 3 = 288 units = 2.2 waves on 132 SMs)
SPLITS = (2, 3, 4, 6, 8)
#: a slice keeps at least this many K elements: 4 BLOCK_K=64 iterations to amortise the pipeline fill
MIN_SLICE_K = 256


def tma_splits(gpu: GPUProfile, op: OpSpec, bm: int, bn: int, bk: int) -> list[int]:
    """SPLIT_K values for one tile: 1, plus the splits of :data:`SPLITS` when the output tiles make
    fewer than two waves over the SMs, keeping at most 4 waves of units and slices of at least
    :data:`MIN_SLICE_K` (and one BLOCK_K tile) of K."""
    m, n, k = op.shape
    sms = gpu.sm_count or 1
    tiles = -(-m // bm) * -(-n // bn)
    if tiles >= 2 * sms:
        return [1]
    return [1] + [s for s in SPLITS if tiles * s <= 4 * sms and k // s >= max(MIN_SLICE_K, bk)]


def stream_k_offered(gpu: GPUProfile, op: OpSpec, bm: int, bn: int) -> bool:
    """Stream-K where split-K is offered (fewer than two waves of output tiles); any K works."""
    m, n, _k = op.shape
    return -(-m // bm) * -(-n // bn) < 2 * (gpu.sm_count or 1)


def decompositions(gpu: GPUProfile, op: OpSpec, bm: int, bn: int, bk: int) -> list[int]:
    """Every way one tile's work is dealt: SPLIT_K values (1 first), then :data:`STREAM` if offered."""
    return tma_splits(gpu, op, bm, bn, bk) + ([STREAM] if stream_k_offered(gpu, op, bm, bn) else [])


def _split_params(split: int) -> dict[str, int]:
    """SPLIT_K and STREAM_K of a decomposition code (:data:`STREAM` or a SPLIT_K value)."""
    return {"SPLIT_K": 1, "STREAM_K": 1} if split == STREAM else {"SPLIT_K": split, "STREAM_K": 0}


def _params(config: KernelConfig) -> Mapping[str, int]:
    """The config's params with ``SPLIT_K=1`` and ``STREAM_K=0`` where missing (configs stored before
    either existed)."""
    p = config.params
    if "SPLIT_K" in p and "STREAM_K" in p:
        return p
    return {"SPLIT_K": 1, "STREAM_K": 0, **p}


class HopperTmaGemmTemplate(Template):
    """Persistent TMA-fed WGMMA GEMM for sm_90a."""

    name = "hopper-tma-gemm"
    ops = ("gemm",)
    kernel = "gemm_tma"
    priority = 1

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        f = gpu.features
        return op.kind in self.ops and f.tma and f.wgmma

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        m, n, k = op.shape
        for bm in blocks(BMS, m, MIN_BM):
            for bn in blocks(BNS, n, MIN_BN):
                for bk in blocks(block_ks(op.dtype), k, MIN_BK):
                    splits = decompositions(gpu, op, bm, bn, bk)
                    for warps in WARPS:
                        for stages in STAGES:
                            for g in GROUPS:
                                for s in splits:
                                    yield KernelConfig(kernel=self.kernel, template=self.name, path="tma_wgmma",
                                                       params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                                               "GROUP_M": g, **_split_params(s), "num_warps": warps,
                                                               "num_stages": stages})

    @staticmethod
    def resources(gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> tuple[int, float, int]:
        lim = C.limits(gpu)
        p = _params(config)
        # the TMA store stages the C tile in shared memory: fp32 partials under split-K
        epilogue = p["BLOCK_M"] * p["BLOCK_N"] * (4 if p["SPLIT_K"] > 1 else DTYPE_BYTES[op.out_dtype or op.dtype])
        smem = C.gemm_smem_bytes(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.num_stages,
                                 DTYPE_BYTES[op.dtype], epilogue_bytes=int(epilogue))
        regs = C.gemm_regs_per_thread(p["BLOCK_M"], p["BLOCK_N"], config.num_warps, lim.warp_size, wgmma=True)
        return smem, regs, config.num_warps * lim.warp_size

    @staticmethod
    def tma_rules(op: OpSpec, bm: int, bn: int, bk: int, split: int = 1) -> list[str]:
        """TMA descriptor rules for A [M,K], W ([N,K] or [K,N]) and C [M,N] (innermost dim first);
        under split-K, C is the fp32 workspace ``[SPLIT_K * M_PAD, N]``."""
        m, n, k = op.shape
        e = DTYPE_BYTES[op.dtype]
        oe = DTYPE_BYTES[op.out_dtype or op.dtype]
        out = C.tma_problems((k, m), (int(k * e),), (bk, bm), e, "A")
        if op.layout == "nk":
            out += C.tma_problems((k, n), (int(k * e),), (bk, bn), e, "W")
        else:
            out += C.tma_problems((n, k), (int(n * e),), (bn, bk), e, "W")
        if split > 1:
            m_pad = -(-m // bm) * bm
            return out + C.tma_problems((n, split * m_pad), (n * 4,), (bn, bm), 4, "split-K workspace")
        return out + C.tma_problems((n, m), (int(n * oe),), (bn, bm), oe, "C")

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        config = KernelConfig(kernel=config.kernel, template=config.template, path=config.path,
                              params=_params(config))
        out = config_problems(config, KEYS, self.kernel)
        if out:
            return out
        if not (gpu.features.tma and gpu.features.wgmma):
            return [f"TMA + WGMMA need sm_90a; {gpu.arch or gpu.name} has "
                    f"{'no TMA' if not gpu.features.tma else 'no wgmma'}"]
        if config.path != "tma_wgmma":
            return [f"path {config.path!r}: this kernel always runs 'tma_wgmma'"]
        m, n, k = op.shape
        p = config.params
        lim = C.limits(gpu)
        bm, bn, bk, warps = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.num_warps
        out += C.check_dtype(gpu, op.dtype)
        out += block_problems((("BLOCK_M", bm, m, MIN_BM), ("BLOCK_N", bn, n, MIN_BN),
                               ("BLOCK_K", bk, k, MIN_BK)))
        if out:
            return out
        out += C.check_threads(lim, warps)
        out += C.wgmma_problems(bm, bn, bk, warps, op.dtype)
        out += C.check_split_k(p["SPLIT_K"], bk, k)
        if p["STREAM_K"] not in (0, 1) or (p["STREAM_K"] and p["SPLIT_K"] != 1):
            out.append(f"STREAM_K={p['STREAM_K']} with SPLIT_K={p['SPLIT_K']}: STREAM_K is 0 or 1, "
                       "and stream-K (1) deals K itself, so SPLIT_K must be 1")
        out += self.tma_rules(op, bm, bn, bk, p["SPLIT_K"])
        if config.num_stages < 2:
            out.append(f"num_stages={config.num_stages}: the TMA pipeline needs >= 2 buffers")
        if p["GROUP_M"] < 1:
            out.append(f"GROUP_M={p['GROUP_M']} must be >= 1")
        if out:
            return out
        smem, regs, threads = self.resources(gpu, op, config)
        return C.check_smem(lim, smem) + C.check_regs(lim, regs, threads)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        smem, regs, _ = self.resources(gpu, op, config)
        p = config.params
        pred = predict_matmul(gpu, op, config, mma="wgmma", smem_bytes=smem, regs_per_thread=regs, persistent=True)
        sw = C.swizzle_bytes(p["BLOCK_K"], DTYPE_BYTES[op.dtype])
        n_inst = C.wgmma_instructions_per_tile(p["BLOCK_M"], p["BLOCK_K"], op.dtype)
        extra = f"; TMA {sw or 'no'}{'B' if sw else ''} swizzle, {n_inst} wgmma (N={p['BLOCK_N']}) per K-iter"
        return Prediction(us=pred.us, bound=pred.bound, roofline_pct=pred.roofline_pct,
                          reason=pred.reason + extra, breakdown=pred.breakdown)

    # -- branch and bound (see autoopt.pruning) ------------------------------------
    def tables(self, gpu: GPUProfile, dtype: str, out_dtype: str) -> LazyTiles:
        """Each tile's :class:`~autoopt.templates.gemm.TileTable` on this GPU and dtype pair, built on its
        first lookup.

        On an op whose TMA descriptors are valid (the space's boxes always are: <= 256 per dim,
        rows >= 32 B) validate's first problem is threads, else wgmma, else smem, else registers."""
        def build() -> LazyTiles:
            lim = C.limits(gpu)
            e, oe = DTYPE_BYTES[dtype], DTYPE_BYTES[out_dtype]
            smem_facts = StageFacts(gpu)
            rate = mma_ceiling_rate(gpu, dtype)

            def tile(bm: int, bn: int, bk: int) -> TileTable:
                warps = [warp_facts(gpu, w, C.check_threads(lim, w) + C.wgmma_problems(bm, bn, bk, w, dtype),
                                    "tma_wgmma", C.gemm_regs_per_thread(bm, bn, w, lim.warp_size, wgmma=True))
                         for w in WARPS]
                epilogue = int(bm * bn * oe)
                stages = [smem_facts(st, C.gemm_smem_bytes(bm, bn, bk, st, e, epilogue_bytes=epilogue))
                          for st in STAGES]
                return tile_table(warps, stages, partial(self._probe, gpu, dtype, out_dtype, bm, bn, bk),
                                  persistent=True, floor=floor_at_rate(rate, bm, bn, bk))
            return LazyTiles(tile)
        return cached((self.name, "tiles", gpu_key(gpu), dtype, out_dtype, constants()), build)

    def _probe(self, gpu: GPUProfile, dtype: str, out_dtype: str, bm: int, bn: int, bk: int, w: int,
               path: str, st: int) -> float:
        op = OpSpec(kind="gemm", shape=(bm, bn, bk), dtype=dtype, out_dtype=out_dtype)
        return probe_t_comp(self, gpu, op, KernelConfig(
            kernel=self.kernel, template=self.name, path=path,
            params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1, "STREAM_K": 0,
                    "num_warps": w, "num_stages": st}))

    def bounded_space(self, gpu: GPUProfile, op: OpSpec) -> BoundedSpace | None:
        """The space as tile -> num_warps -> num_stages -> GROUP_M configs with lower bounds."""
        f = gpu.features
        m, n, k = op.shape
        if (not (f.tma and f.wgmma) or C.check_dtype(gpu, op.dtype) or self.tma_rules(op, MIN_BM, MIN_BN, MIN_BK)
                or C.check_threads(C.limits(gpu), max(WARPS))):
            return None  # every config is rejected for the op itself: the exhaustive path words it
        # split-K tiles stage fp32 partials for the TMA store: their own table (smem per stage count)
        tables = self.tables(gpu, op.dtype, op.out_dtype or op.dtype)
        split_tables = self.tables(gpu, op.dtype, "fp32")
        bns, bks = blocks(BNS, n, MIN_BN), blocks(block_ks(op.dtype), k, MIN_BK)

        def walk() -> Iterator[tuple[TileTable, int, tuple[int, int, int], list[int], Leaves]]:
            for bm in blocks(BMS, m, MIN_BM):
                for bn in bns:
                    for bk in bks:
                        tile, leaves = (bm, bn, bk), partial(self._leaves, bm, bn, bk)
                        same = [1] + ([STREAM] if stream_k_offered(gpu, op, bm, bn) else [])  # C in out dtype
                        yield tables[tile], len(GROUPS) * len(same), tile, same, leaves
                        splits = tma_splits(gpu, op, bm, bn, bk)[1:]
                        if splits:
                            yield split_tables[tile], len(GROUPS) * len(splits), tile, splits, leaves
        return matmul_space(self.kernel, MatmulBound(gpu, op), len(WARPS) * len(STAGES), walk(),
                            persistent=True)

    def _leaves(self, bm: int, bn: int, bk: int, split: int, w: int, path: str,
                st: int) -> list[KernelConfig]:
        return [KernelConfig(kernel=self.kernel, template=self.name, path=path,
                             params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g,
                                     **_split_params(split), "num_warps": w, "num_stages": st}) for g in GROUPS]
