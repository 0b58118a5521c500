"""Hard constraints: what a kernel config must satisfy to compile and run without spilling.

Every rule returns a list of messages (empty: the rule holds) naming the limit
it broke, e.g. ``"smem 245760 B > opt-in 232448 B"``. Templates call these from
``validate``; the cost model reuses the resource arithmetic (occupancy).

Limits come from the :class:`~autoopt.profile.GPUProfile`; where a profile
leaves one unknown, :func:`limits` falls back to the value the vendor documents
for every device of that vendor (CUDA C Programming Guide, "Technical
Specifications per Compute Capability"; AMD CDNA3 ISA guide), never a guess
that could admit a config the device refuses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.ops import DTYPE_BYTES

__all__ = [
    "REG_OVERHEAD",
    "Limits",
    "check_block_vs_dim",
    "check_dtype",
    "check_pow2",
    "check_regs",
    "check_smem",
    "check_split_k",
    "check_threads",
    "gemm_regs_per_thread",
    "gemm_smem_bytes",
    "is_pow2",
    "limits",
    "next_pow2",
    "occupancy",
    "swizzle_bytes",
    "tma_problems",
    "warp_grid",
    "wgmma_instr_shape",
    "wgmma_instructions_per_tile",
    "wgmma_problems",
    "whole_k_tiles",
]

#: registers per thread a Triton kernel spends beyond its data: addresses, loop
#: counters, masks, predicates (the brief's ~32; ptxas -v on Triton GEMMs shows 24-40).
REG_OVERHEAD = 32
#: register allocation granularity per thread on NVIDIA (256 regs per warp = 8 per thread).
_REG_GRANULE = 8


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Per-block and per-SM resource limits of one GPU, unknowns filled from vendor docs."""

    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    regs_per_block: int
    max_regs_per_thread: int
    smem_optin_bytes: int
    smem_per_sm_bytes: int
    #: SMEM the driver reserves per resident block (1 KB on sm_80+: CUDA guide, 8.x/9.x tables).
    smem_reserved_per_block: int
    sm_count: int


# CUDA guide table "Maximum number of resident blocks per SM" by compute capability.
_NV_MAX_BLOCKS = {(8, 6): 16, (8, 7): 16, (8, 9): 24, (7, 5): 16}
# "Maximum number of resident threads per SM": 2048 on 7.0, 8.0, 9.0, 10.x; 1536 on 8.6/8.9/12.x; 1024 on 7.5.
_NV_MAX_THREADS_SM = {(8, 6): 1536, (8, 7): 1536, (8, 9): 1536, (7, 5): 1024}
_LIMITS_CACHE: dict[int, tuple[GPUProfile, Limits]] = {}


def limits(gpu: GPUProfile) -> Limits:
    """Resolved limits of ``gpu`` (cached per profile object)."""
    hit = _LIMITS_CACHE.get(id(gpu))
    if hit is not None and hit[0] is gpu:
        return hit[1]
    amd = gpu.vendor == "amd" or gpu.arch.startswith("gfx")
    cc = gpu.cc or (0, 0)
    if amd:
        # CDNA3 ISA: wave64; 512 VGPRs (incl. AGPRs) per lane; 4 SIMDs x 512 x 64 lanes per CU;
        # LDS 64 KB per CU and per workgroup; 32 waves (2048 lanes) per CU.
        dflt = dict(warp_size=64, tpb=1024, tps=2048, blocks=32, regs_sm=131072, regs_blk=131072,
                    regs_thr=512, smem=65536, smem_sm=65536, reserved=0)
    else:
        tps = _NV_MAX_THREADS_SM.get(cc, 1536 if cc[0] == 12 else 2048)
        dflt = dict(warp_size=32, tpb=1024, tps=tps, blocks=_NV_MAX_BLOCKS.get(cc, 32),
                    regs_sm=65536, regs_blk=65536, regs_thr=255,
                    # 48 KB: static shared memory any CUDA device grants without opt-in.
                    smem=49152, smem_sm=49152, reserved=1024 if cc >= (8, 0) else 0)
    optin = gpu.smem_per_block_optin_bytes or gpu.smem_per_block_bytes or dflt["smem"]
    lim = Limits(
        warp_size=gpu.warp_size or dflt["warp_size"],
        max_threads_per_block=gpu.max_threads_per_block or dflt["tpb"],
        max_threads_per_sm=gpu.max_threads_per_sm or dflt["tps"],
        max_blocks_per_sm=dflt["blocks"],
        regs_per_sm=gpu.regs_per_sm or dflt["regs_sm"],
        regs_per_block=gpu.regs_per_block or gpu.regs_per_sm or dflt["regs_blk"],
        max_regs_per_thread=gpu.max_regs_per_thread or dflt["regs_thr"],
        smem_optin_bytes=optin,
        smem_per_sm_bytes=gpu.smem_per_sm_bytes or max(optin + dflt["reserved"], dflt["smem_sm"]),
        smem_reserved_per_block=dflt["reserved"],
        sm_count=gpu.sm_count or 1,
    )
    if len(_LIMITS_CACHE) > 256:
        _LIMITS_CACHE.clear()
    _LIMITS_CACHE[id(gpu)] = (gpu, lim)
    return lim


# -- generic rules ------------------------------------------------------------

def check_pow2(name: str, value: int) -> list[str]:
    if not is_pow2(value):
        return [f"{name}={value} is not a power of two (tl.arange needs power-of-two extents)"]
    return []


def check_threads(lim: Limits, num_warps: int) -> list[str]:
    """num_warps is a power of two and its threads fit one block."""
    if not is_pow2(num_warps):
        return [f"num_warps={num_warps} is not a power of two (Triton requires one)"]
    threads = num_warps * lim.warp_size
    if threads > lim.max_threads_per_block:
        return [f"num_warps={num_warps} x warp {lim.warp_size} = {threads} threads > "
                f"{lim.max_threads_per_block} per block"]
    return []


def check_smem(lim: Limits, smem_bytes: int) -> list[str]:
    if smem_bytes > lim.smem_optin_bytes:
        return [f"smem {smem_bytes} B > opt-in {lim.smem_optin_bytes} B"]
    return []


def round_regs(regs: float) -> int:
    return int(math.ceil(regs / _REG_GRANULE) * _REG_GRANULE)


def check_regs(lim: Limits, regs_per_thread: float, threads: int) -> list[str]:
    """Per-thread register cap (255 on NVIDIA; more spills) and the block's share of the file."""
    regs = math.ceil(regs_per_thread)
    out = []
    if regs > lim.max_regs_per_thread:
        out.append(f"~{regs} registers/thread > {lim.max_regs_per_thread} (would spill)")
    total = round_regs(regs) * threads
    cap = min(lim.regs_per_sm, lim.regs_per_block)
    if total > cap:
        out.append(f"{threads} threads x ~{round_regs(regs)} registers = {total} > {cap} per block")
    return out


def check_block_vs_dim(name: str, block: int, dim: int, minimum: int) -> list[str]:
    """A block may not exceed ``max(minimum, next_pow2(dim))``: more than half the tile would be padding."""
    cap = max(minimum, next_pow2(dim))
    if block > cap:
        return [f"{name}={block} > {cap} (next power of two of the problem's {dim}, min {minimum}): "
                f"mostly padding"]
    return []


def check_split_k(split_k: int, block_k: int, k: int) -> list[str]:
    """Every K-slice must get at least one BLOCK_K tile: ``SPLIT_K * BLOCK_K <= K``."""
    if split_k < 1:
        return [f"SPLIT_K={split_k} must be >= 1"]
    if split_k > 1 and split_k * block_k > k:
        return [f"SPLIT_K={split_k} x BLOCK_K={block_k} = {split_k * block_k} > K={k} (empty K-slices)"]
    return []


def whole_k_tiles(row: int, tile: int, split_k: int) -> int | None:
    """K-tiles each of ``split_k`` slices walks over a stored row of ``row`` units in tiles of ``tile``, or None
    when the row is not whole tiles split evenly (a kernel that loads unmasked along K cannot take it)."""
    if tile < 1 or split_k < 1 or row % tile or (row // tile) % split_k:
        return None
    return row // tile // split_k


def check_dtype(gpu: GPUProfile, dtype: str) -> list[str]:
    """The GPU must support the dtype's MMA: fp8 from sm_89 (or gfx942), bf16 from sm_80."""
    f = gpu.features
    if dtype == "fp8" and not f.fp8:
        return [f"fp8 needs native FP8 MMA (sm_89+ or gfx942+); {gpu.arch or 'this GPU'} has none"]
    if dtype == "bf16" and not f.bf16:
        return [f"bf16 needs sm_80+ (or CDNA); {gpu.arch or 'this GPU'} has no bf16 MMA"]
    if dtype == "fp4" and not f.fp4:
        return [f"fp4 needs native FP4 MMA (sm_100+); {gpu.arch or 'this GPU'} has none"]
    return []


def occupancy(lim: Limits, *, smem_bytes: int, regs_per_thread: float, threads: int) -> int:
    """Resident blocks per SM allowed by SMEM, registers, threads and the block cap (0: none fits)."""
    by_smem = lim.smem_per_sm_bytes // (smem_bytes + lim.smem_reserved_per_block) if smem_bytes else 1 << 30
    by_regs = lim.regs_per_sm // max(1, round_regs(regs_per_thread) * threads)
    by_threads = lim.max_threads_per_sm // max(1, threads)
    return int(max(0, min(by_smem, by_regs, by_threads, lim.max_blocks_per_sm)))


# -- GEMM resources -------------------------------------------------------------

def gemm_smem_bytes(bm: int, bn: int, bk: int, stages: int, elem_bytes: float, *,
                    epilogue_bytes: int = 0) -> int:
    """Pipelined operand buffers ``stages * (BM*BK + BN*BK) * elem`` plus a separate epilogue tile."""
    return int(stages * (bm * bk + bn * bk) * elem_bytes) + int(epilogue_bytes)


def warp_grid(bm: int, bn: int, num_warps: int) -> tuple[int, int]:
    """Per-warp tile (wm, wn): warps split the longer side first, as Triton's MMA layout does."""
    wm_count, wn_count = 1, 1
    while wm_count * wn_count < num_warps:
        if bm // wm_count >= bn // wn_count and bm // wm_count > 16:
            wm_count *= 2
        elif bn // wn_count > 8:
            wn_count *= 2
        else:
            wm_count *= 2
    return max(1, bm // wm_count), max(1, bn // wn_count)


def gemm_regs_per_thread(bm: int, bn: int, num_warps: int, warp_size: int, *, wgmma: bool) -> float:
    """Registers per thread of a tiled GEMM.

    fp32 accumulators ``BM*BN/threads`` + operand fragments + ``REG_OVERHEAD``.
    mma.sync keeps A/B fragments in registers: per warp ``(wm + wn)`` rows of a
    32-byte K-slice (16 bf16 / 32 fp8, one MMA k-step), double-buffered by
    Triton's prefetch pass: ``2 * (wm + wn) * 32 B / 4 B / 32 lanes``. WGMMA
    reads both operands from shared memory, so it holds only accumulators.
    E.g. 128x256 8 warps: wgmma 128+32 = 160, mma.sync 128+64+32 = 224.
    """
    threads = num_warps * warp_size
    acc = bm * bn / threads
    frags = 0.0
    if not wgmma:
        wm, wn = warp_grid(bm, bn, num_warps)
        frags = 2 * (wm + wn) * 32 / 4 / warp_size
    return acc + frags + REG_OVERHEAD


# -- Hopper TMA / WGMMA -----------------------------------------------------------

def swizzle_bytes(block_k: int, elem_bytes: float) -> int:
    """Shared-memory swizzle mode for a TMA box row of ``BLOCK_K * elem`` bytes (128/64/32, 0 = none)."""
    row = block_k * elem_bytes
    for mode in (128, 64, 32):
        if row >= mode:
            return mode
    return 0


def tma_problems(dims: tuple[int, ...], row_stride_bytes: tuple[int, ...], box: tuple[int, ...],
                 elem_bytes: float, what: str) -> list[str]:
    """TMA descriptor rules (CUDA driver API, cuTensorMapEncodeTiled).

    ``dims``/``box`` are innermost-first; ``row_stride_bytes`` are the strides of
    the outer dims. Global strides must be multiples of 16 B and < 2^40; dims
    < 2^32; each box dim <= 256; the inner box row must be >= 16 B.
    """
    out = []
    for d in dims:
        if d >= 1 << 32:
            out.append(f"{what}: TMA dimension {d} >= 2^32")
    for s in row_stride_bytes:
        if s % 16:
            out.append(f"{what}: TMA row stride {s} B is not a multiple of 16 B (pad the inner dim)")
        if s >= 1 << 40:
            out.append(f"{what}: TMA stride {s} B >= 2^40")
    for b in box:
        if b > 256:
            out.append(f"{what}: TMA box dimension {b} > 256")
    if box and box[0] * elem_bytes < 16:
        out.append(f"{what}: TMA box inner row {box[0]} x {elem_bytes} B < 16 B")
    return out


def wgmma_instr_shape(dtype: str) -> tuple[int, int, int]:
    """(M, max N, K) of one wgmma.mma_async: M=64 per warpgroup; K=16 for 16-bit, 32 for 8-bit, 8 for tf32."""
    k = {"bf16": 16, "fp16": 16, "fp8": 32, "int8": 32, "fp32": 8, "tf32": 8}.get(dtype, 16)
    return (64, 256, k)


def wgmma_problems(bm: int, bn: int, bk: int, num_warps: int, dtype: str) -> list[str]:
    """PTX ISA wgmma rules: BLOCK_M % 64 (one warpgroup = 4 warps per 64 rows), N a multiple of 8 in
    [8, 256], BLOCK_K a multiple of the instruction K."""
    m, nmax, k = wgmma_instr_shape(dtype)
    out = []
    if bm % m:
        out.append(f"wgmma needs BLOCK_M % {m} == 0, got {bm}")
    if num_warps % 4:
        out.append(f"wgmma needs whole warpgroups (num_warps % 4 == 0), got {num_warps}")
    if bn % 8 or not 8 <= bn <= nmax:
        out.append(f"wgmma N must be a multiple of 8 in [8, {nmax}], got BLOCK_N={bn}")
    if bk % k:
        out.append(f"wgmma K for {dtype} is {k}; BLOCK_K={bk} is not a multiple")
    return out


def wgmma_instructions_per_tile(bm: int, bk: int, dtype: str) -> int:
    """wgmma instructions one K-iteration issues: (BLOCK_M/64) * (BLOCK_K/K_inst), each N = BLOCK_N wide."""
    m, _, k = wgmma_instr_shape(dtype)
    return max(1, bm // m) * max(1, bk // k)


def elem_bytes(dtype: str) -> float:
    return DTYPE_BYTES[dtype]
