"""Analytic cost model: predicted time of a valid kernel config, in pure Python.

Matmuls (:func:`predict_matmul`) are modelled per SM: every SM runs
``ceil(tiles / SMs)`` tiles (wave quantization), each tile takes K-iterations
limited by the tensor-core rate (scaled by the MMA path and by shared-memory
operand bandwidth for the tile shape), by the SM's share of L2 bandwidth, and
by latency hiding (``num_stages - 1`` loads in flight per resident CTA); the
whole grid is also held to DRAM bandwidth for the bytes it really moves after
L2 reuse (group-M ordering, L2 size). Split-K adds fp32 partial traffic and a
reduce launch. Streaming kernels (elementwise, norms) use the same per-SM
latency/bandwidth view (:func:`predict_stream`).

Every tunable number lives in :class:`CostConstants`; :func:`autoopt.search.calibration.fit_constants`
refits them from measured timings in one call and :func:`using` installs a set.
"""

from __future__ import annotations

import math

from autoopt._log import get_logger
from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.constants import (
    DEFAULT_CONSTANTS,
    FRACTIONS,
    CostConstants,
    constants,
    explicit,
    set_constants,
    using,
)
from autoopt.kernels.constraints import Limits, limits, occupancy, warp_grid
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.template import Prediction

log = get_logger(__name__)

__all__ = [
    "DEFAULT_CONSTANTS",
    "FRACTIONS",
    "REGISTER_FED_DEPTH",
    "CostConstants",
    "MatmulBound",
    "StreamBound",
    "constants",
    "explicit",
    "floor_us",
    "l2_reuse",
    "matmul_lower_bound",
    "mma_efficiency",
    "overlap_max",
    "peak_flops",
    "predict_matmul",
    "predict_stream",
    "set_constants",
    "smem_intensity",
    "using",
    "wgmma_width_efficiency",
]


# -- shared quantities ---------------------------------------------------------------

def peak_flops(gpu: GPUProfile, dtype: str, *, tensor: bool = True) -> float | None:
    """Dense datasheet peak FLOP/s for ``dtype`` (fp32 matmuls run as TF32 on tensor cores, Triton's
    default). The constants were fitted against datasheet rates, so a measured rate is used only
    where the profile has no datasheet value."""
    def rate(d: str) -> float | None:
        return gpu.tflops(d, measured=False) or gpu.tflops(d)

    if not tensor:
        t = rate("fp32")
    elif dtype == "fp32":
        t = rate("tf32") if gpu.features.tf32 else None
        t = t or rate("fp32")
    else:
        t = rate(dtype)
    return t * 1e12 if t else None


def _bw(gpu: GPUProfile) -> float:
    """Spec bandwidth (what ``dram_efficiency`` was fitted against), else the measured one."""
    bw = gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs
    if not bw:
        raise AutooptError(f"GPU {gpu.name!r} has no memory bandwidth in its profile; "
                           "the cost model needs mem_bandwidth_gbs (or a measured value)")
    return bw * 1e9


_FLOOR_CACHE: dict[tuple[int, OpSpec], tuple[GPUProfile, float]] = {}


def floor_us(gpu: GPUProfile, op: OpSpec) -> float:
    """The physical floor: max(FLOPs at peak, minimum bytes at spec bandwidth), no launch."""
    hit = _FLOOR_CACHE.get((id(gpu), op))
    if hit is not None and hit[0] is gpu:
        return hit[1]
    peak = peak_flops(gpu, op.compute_dtype, tensor=op.uses_tensor_cores)
    t_c = op.flops / peak if peak else 0.0
    floor = max(t_c, op.min_bytes / _bw(gpu)) * 1e6
    if len(_FLOOR_CACHE) > 1024:
        _FLOOR_CACHE.clear()
    _FLOOR_CACHE[(id(gpu), op)] = (gpu, floor)
    return floor


def _finish(gpu: GPUProfile, op: OpSpec, terms: dict[str, float], total: float, reason: str) -> Prediction:
    bound_terms = {"compute": terms.get("compute_us", 0.0),
                   "memory": max(terms.get("dram_us", 0.0), terms.get("l2_us", 0.0)),
                   "latency": terms.get("latency_us", 0.0) + terms.get("launch_us", 0.0)}
    bound = max(bound_terms, key=bound_terms.__getitem__)
    floor = floor_us(gpu, op)
    terms["floor_us"] = floor
    return Prediction(us=total, bound=bound, roofline_pct=min(100.0, 100.0 * floor / total),
                      reason=reason, breakdown=terms)


def overlap_max(a: float, b: float, p: float) -> float:
    """Smooth max ``(a^p + b^p)^(1/p)``: overlapped terms never overlap perfectly, and the smaller
    one still moves the total (so configs tied on their bound still rank by the other term)."""
    hi = max(a, b)
    if hi <= 0:
        return 0.0
    return hi * ((a / hi) ** p + (b / hi) ** p) ** (1 / p)


# -- matmul ---------------------------------------------------------------------------

#: MMA flavours a matmul tile can run on.
MMA_KINDS = ("mma_sync", "wgmma", "tcgen05", "mfma", "fma")
#: sub-partitions (processing blocks) of an NVIDIA SM since Volta, SIMDs of an AMD CU: a warp (wavefront)
#: issues on one; warp-level MMA and FMA throughput needs one resident warp on each
SUBPARTITIONS = 4


def mma_efficiency(gpu: GPUProfile, mma: str, c: CostConstants) -> float:
    f = gpu.features
    if mma == "mma_sync" and (f.wgmma or f.tcgen05):
        return c.mma_sync_fraction  # full rate on sm_90a/sm_100a needs wgmma/tcgen05
    return 1.0


def wgmma_width_efficiency(bm: int, bn: int, num_warps: int, c: CostConstants) -> float:
    """wgmma rate kept for the width N of each warpgroup's instruction (its 64-row slice of the tile):
    every m64nNk16 re-reads its 64x16 A fragment from shared memory, so narrower instructions move
    more bytes per FLOP. N = 256, the widest: 1; N = 128: ``n128_wgmma_efficiency``; below that,
    ``narrow_wgmma_efficiency`` (fitted as the step from 128 to 64) once more per halving. The halvings
    separate 64-row tiles on 4 warps (N = 64) from 8 (two N = 32 slices): at 16 x 6144 x 4096 on the
    H100, 64 x 64 x 128 ran 30.3 us on 4 warps and 32.7 on 8 (two runs, as each one's pick:
    benchmarks/results/h100/ranking_samerun_m16_256_{smsp,n128}.json); one factor priced them alike."""
    groups = max(1, num_warps // 4)
    groups_m = max(1, min(groups, bm // 64))
    width = bn // max(1, groups // groups_m)
    if width >= 256:
        return 1.0
    halvings = (128 // max(width, 1)).bit_length() - 1  # 0 at N = 128, 1 at 64, 2 at 32
    return c.n128_wgmma_efficiency * c.narrow_wgmma_efficiency ** halvings


def smem_intensity(bm: int, bn: int, num_warps: int, e: float, mma: str) -> float:
    """FLOP per byte of shared memory read by the MMA: per warp tile (mma.sync) or per 64-row
    warpgroup slice with N = BLOCK_N (wgmma/tcgen05 read both operands from SMEM)."""
    if mma in ("wgmma", "tcgen05"):
        m = 64 if mma == "wgmma" else min(bm, 128)
        return 2.0 * m * bn / ((m + bn) * e)
    wm, wn = warp_grid(bm, bn, num_warps)
    return 2.0 * wm * wn / ((wm + wn) * e)


def l2_reuse(tm: int, tn: int, group_m: int, conc: int, a_blk: float, w_blk: float, l2: float) -> tuple[int, int]:
    """DRAM reads of each A row-block and each W column-block after L2 reuse.

    Tiles are issued in group-M order (``group_m`` row-blocks walked column by
    column) and ``conc`` run at once. A W column-block is read together by the
    rows whose tiles run side by side: the group's rows, or more when a wave
    spans several whole rows (``conc // tn``); any other row re-reads it from
    DRAM unless all of W stays in L2 meanwhile. Measured on an H200 (TMA GEMM,
    256x28672x4096, 2 row-blocks): GROUP_M=1 131.9 us, GROUP_M=8 106.3 us,
    because with GROUP_M=1 the second row-block's use of a W tile comes a whole
    wave (~230 MB of W) after the first. An A row-block is re-read per column
    wave unless the wave's operands fit the usable L2.
    """
    g = max(1, min(group_m, tm))
    r = min(tm, max(g, conc // max(tn, 1)))
    w_passes = math.ceil(tm / r)
    rw = 1 if w_passes == 1 or tn * w_blk + r * a_blk <= l2 else w_passes
    cols = max(1, min(tn, conc // r))
    a_passes = math.ceil(tn / cols)
    ra = 1 if a_passes == 1 or r * a_blk + cols * w_blk <= l2 else a_passes
    return ra, rw


#: K-iterations of loads in flight in a loop whose loads go straight to registers (``staged_loads`` False: the FMA
#: path), whatever ``num_stages``: the compiler issues the next iteration's loads ahead of the FMAs, and the stage
#: count is not a pipeline there. On the H200's graph-timed fp8 decode GEMV grid
#: (``benchmarks/results/h200/quant_kernels_fp8_grid_graph.json``) every config timed at 3 and 4 stages measured the
#: same (6 pairs, within 0.4 %) where the model priced 4 up to 12 % faster, and rank() put 16 x 256 at 4 stages first
#: on qkv (12.59 us; 16 x 512, 9.56). At 2 (as 3 stages) the grid's picks sum to 1.065x its best (1.109x before),
#: median |ln(predicted / measured)| unchanged (0.123); with ptxas's registers too
#: (``templates/quant.py``, ``PER_ROW_REGS_PER_ELEMENT``) 1.041x and 0.102. On the H100's older fp8 / int8 rows
#: (``h100/quant_kernels.json``) the picks' sum goes 1.037 -> 1.034; the bf16 GEMV's stream sweeps
#: (``h200/stream_sweep_run2.json``, ``stream_gemv16.json``) keep every top-1. In the model, fp8's graphed Llama-3-8B
#: step 3.472 -> 3.326 ms (``h200/step_variants_fp8_{before,after}.json``, one call).
REGISTER_FED_DEPTH = 2.0

def predict_matmul(gpu: GPUProfile, op: OpSpec, config: KernelConfig, *, mma: str = "mma_sync",
                   smem_bytes: int, regs_per_thread: float, persistent: bool = False,
                   multicast: tuple[int, int] = (1, 1), alu_iter_us: float = 0.0,
                   staged_loads: bool | None = None, consts: CostConstants | None = None,
                   max_depth: float | None = None) -> Prediction:
    """Predicted time of a tiled matmul config (see module docstring).

    ``mma``: one of :data:`MMA_KINDS`; ``multicast``: (CTAs sharing each W tile,
    CTAs sharing each A tile) through cluster TMA multicast, dividing L2 reads.
    A quantized weight (``op.weight``) streams at its packed bytes per element, A at the MMA's
    dtype (e4m3 for a W8A8 GEMM, else the activations'); ``alu_iter_us`` is the CUDA-core time
    of one K-iteration of a tile beyond the MMA (dequantizing the W tile), which overlaps it:
    an iteration takes the longer of the two. ``staged_loads``: whether the tiles come through
    cp.async/TMA stages (default: every path but ``fma``, whose loads go straight to registers).
    ``max_depth``: at most this many K-iterations of loads in flight whatever ``num_stages`` (a kernel whose
    loads feed CUDA-core work before the MMA, :data:`autoopt.templates.quant.WEIGHT_LOAD_DEPTH`).
    """
    c = consts or constants()
    lim: Limits = limits(gpu)
    staged = mma != "fma" if staged_loads is None else staged_loads
    p = config.params
    m, n, k = op.shape
    e = DTYPE_BYTES[op.compute_dtype]
    w_e = op.weight_elem_bytes if op.weight else e
    out_e = DTYPE_BYTES[op.out_dtype or op.dtype]
    bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
    split = 0 if p.get("STREAM_K", 0) else p.get("SPLIT_K", 1)  # 0: stream-K (see matmul_work)
    warps, stages = config.num_warps, config.num_stages
    sms = lim.sm_count
    threads = warps * lim.warp_size
    occ = max(1, occupancy(lim, smem_bytes=smem_bytes, regs_per_thread=regs_per_thread, threads=threads))
    if persistent:
        occ = 1  # grid = NUM_SMS programs, one per SM

    tm, tn = math.ceil(m / bm), math.ceil(n / bn)
    tiles = tm * tn * max(split, 1)
    tiles_per_sm, k_iters, work = matmul_work(m, n, k, bm, bn, bk, split, sms)
    conc = min(occ, tiles_per_sm)

    # Compute per K-iteration on one SM (padded tile: the MMA computes masked rows too).
    peak = peak_flops(gpu, op.compute_dtype, tensor=mma != "fma")
    it_flops = 2.0 * (max(bm, 16) if mma != "fma" else min(bm, m)) * bn * bk
    t_comp = 0.0
    smem_pen = 1.0
    idle = 1.0  # 1 / the share of the SM's sub-partitions that resident warps keep busy
    if peak:
        rate = peak * c.tc_efficiency * mma_efficiency(gpu, mma, c) / sms
        if mma == "wgmma" and not persistent:
            rate *= c.pointer_wgmma_efficiency
        if mma == "wgmma":
            if occ * warps < 8:
                rate *= c.single_warpgroup_efficiency
            rate *= wgmma_width_efficiency(bm, bn, warps, c)
        if mma in ("mma_sync", "mfma", "fma"):
            # An SM is four sub-partitions, each with its own warp scheduler, tensor core and FMA units, and
            # a warp runs on one of them (H100 whitepaper; AMD CUs: four SIMDs): fewer than four resident
            # warps leave units idle. On the H100 a 32x256 tile with 2 warps and 1 CTA/SM measured 52.7 us
            # against 35.2 us with 4 warps (phi-3-mini qkv, 77x9216x3072). ``occ``, not the concurrency
            # the grid reaches, so that the branch-and-bound probe (a one-tile op) sees the same factor.
            idle = SUBPARTITIONS / min(SUBPARTITIONS, occ * warps)
        if mma != "fma" and gpu.sm_clock_max_mhz:
            need = peak / (sms * gpu.sm_clock_max_mhz * 1e6) / c.smem_bytes_per_clk
            smem_pen = max(1.0, need / smem_intensity(bm, bn, warps, e, mma))
        # shared-memory bandwidth is the SM's, not a sub-partition's: the slower of the two limits holds
        # (16x64 tiles with 2 warps, smem-bound either way, measured as fast as with 4 on the H200)
        t_comp = it_flops / rate * max(smem_pen, idle) * 1e6
    # L2 -> SM: rows of A/W actually present (masked rows are not fetched), divided by multicast.
    bw = _bw(gpu)
    if op.weight:
        it_bytes = (min(bm, m) * e / multicast[1] + min(bn, n) * w_e / multicast[0]) * bk
    else:  # the expression MatmulBound.l2_us repeats, rounding alike
        it_bytes = (min(bm, m) / multicast[1] + min(bn, n) / multicast[0]) * bk * e
    t_l2 = it_bytes / (bw * c.l2_bw_ratio / sms) * 1e6
    t_issue = it_bytes / (threads * 16) * c.load_issue_us if mma != "fma" else 0.0
    t_it = max(t_comp, t_l2, t_issue, alu_iter_us) + c.iter_overhead_us
    # a stage lands latency + its transfer time after issue; depth stages cover that many iterations
    depth = max(stages - 1, 0.5) if max_depth is None else min(max(stages - 1, 0.5), max_depth)
    if not staged:  # loads straight to registers: num_stages is no pipeline there
        depth = min(depth, REGISTER_FED_DEPTH)
    t_it_eff = max(t_it, (c.dram_latency_us + t_l2) / (depth * conc))
    if split == 0:
        t_it_eff /= c.stream_k_efficiency
    fills = math.ceil(tiles_per_sm / conc) * c.dram_latency_us
    if persistent:
        fills = c.dram_latency_us + (tiles_per_sm - 1) * c.dram_latency_us * c.persistent_fill_fraction
    epilogue = tiles_per_sm * c.epilogue_iters * t_it
    sm_us = (work * t_it_eff + fills + epilogue
             + stream_fixup_us(bm, bn, split, bw * c.l2_bw_ratio / sms, c, k_iters, work))

    # DRAM: operands after L2 reuse, output (or fp32 partials) once.
    l2_eff = (gpu.l2_bytes or 0) * c.l2_usable_fraction
    conc_grid = min(tiles, sms * occ)
    ra, rw = l2_reuse(tm, tn, p.get("GROUP_M", 1), conc_grid, min(bm, m) * k * e, min(bn, n) * k * w_e, l2_eff)
    a_bytes, w_bytes = m * k * e, n * k * w_e
    out_bytes = m * n * (4 * split if split > 1 else out_e)  # stream-K partials stay in L2
    dram_bytes = a_bytes * ra + w_bytes * rw + out_bytes
    # register-fed loads (the FMA path) need enough warps in flight; cp.async/TMA stages do not
    in_flight = 1.0 if staged else min(1.0, conc * warps / c.warps_for_full_bandwidth)
    dram_us = dram_bytes / (bw * c.dram_efficiency * in_flight) * 1e6
    dram_us = max(dram_us, busiest_sm_dram_us(m, n, k, bm, bn, split, e, sms, bw * c.dram_efficiency, c, bk,
                                              w_e=w_e if op.weight else None))
    dram_us /= run_efficiency(bn, bk, w_e, op.layout, c)
    launch = c.launch_us
    reduce_us = 0.0
    if split > 1:  # fp32 partials read back by a second kernel, output written once
        reduce_us = (m * n * 4 * split + m * n * out_e) / (bw * c.dram_efficiency) * 1e6
        launch += c.launch_us
    main_us = overlap_max(sm_us, dram_us, c.overlap_exponent)
    total = main_us + reduce_us + launch

    compute_us = work * t_comp
    terms = {
        "compute_us": compute_us,
        "l2_us": work * t_l2,
        "dram_us": dram_us + reduce_us,
        "latency_us": max(0.0, sm_us - work * t_it),
        "launch_us": launch,
        "waves": (waves := tiles / (sms * occ)),
        "ctas_per_sm": float(occ),
        "dram_mb": dram_bytes / 1e6,
        "smem_penalty": smem_pen,
    }
    reason = (f"{tiles} tiles over {sms} SMs x {occ} CTA/SM ({waves:.2f} waves), {k_iters} K-iters; "
              f"{dram_bytes / 1e6:.1f} MB DRAM (A x{ra}, W x{rw}); {mma} path")
    if split > 1:
        reason += f"; split-K {split}: +{m * n * 4 * split * 2 / 1e6:.2f} MB fp32 partials, +1 launch"
    if split == 0:
        reason += f"; stream-K: {work} K-iterations per SM, partial tiles handed over in L2"
    return _finish(gpu, op, terms, total, reason)


def matmul_work(m: int, n: int, k: int, bm: int, bn: int, bk: int, split: int, sms: int
                ) -> tuple[int, int, int]:
    """(tiles an SM runs, K-iterations per tile, K-iterations on the busiest SM) of a grid.

    ``split`` >= 1: ``tm * tn * split`` work units dealt whole to the SMs. ``split == 0``: stream-K,
    the ``tm * tn * ceil(k / bk)`` iterations cut into one equal range per SM; an SM then touches at
    most ``ceil(tiles / sms) + 1`` tiles (a range may start and end inside one)."""
    tiles = -(-m // bm) * -(-n // bn)
    if split == 0:
        k_iters = max(1, -(-k // bk))
        work = -(-(tiles * k_iters) // sms)
        return min(-(-tiles // sms) + 1, work), k_iters, work
    tiles_per_sm = -(-(tiles * split) // sms)
    k_iters = max(1, -(-k // split // bk))  # ceil(ceil(k / split) / bk)
    return tiles_per_sm, k_iters, tiles_per_sm * k_iters


def stream_fixup_us(bm: int, bn: int, split: int, l2_rate_per_sm: float, c: CostConstants, k_iters: int = 1,
                    work: int = 1) -> float:
    """Stream-K's hand-over (``split == 0``) on the busiest finisher: the programs sharing a tile each
    write one fp32 partial tile through L2, and the finisher (the tile's last program) reads every
    other one back in turn, then a flag round trip at DRAM latency; 0 for any other decomposition.
    A tile of ``k_iters`` iterations cut into ranges of ``work`` is shared by up to
    ``ceil(k_iters / work) + 1`` programs (2 when a range holds a whole tile): the 70B TP=8 qkv shard
    at M = 512 (40 tiles of 128 iterations, ranges of 39) has 5, and measured 42.2 us for stream-K
    against 33.9 at SPLIT_K=3 on the H100 (benchmarks/results/h100/hw_limit_skdram.json)."""
    if split != 0:
        return 0.0
    sharers = 2 if work >= k_iters else -(-k_iters // max(work, 1)) + 1
    return sharers * bm * bn * 4 / l2_rate_per_sm * 1e6 + c.dram_latency_us


def run_efficiency(bn: int, bk: int, e: float, layout: str, c: CostConstants) -> float:
    """Share of DRAM bandwidth a tiled stream keeps when each K-iteration reads only ``run`` contiguous
    bytes of each row of W (``BLOCK_K`` elements of a K-contiguous ``nk`` weight, ``BLOCK_N`` of a ``kn``
    one): ``1 / (1 + (dram_run_bytes / run)^4)``; 1 when ``dram_run_bytes`` is 0."""
    if not c.dram_run_bytes:
        return 1.0
    run = (bk if layout == "nk" else bn) * e
    return 1.0 / (1.0 + (c.dram_run_bytes / run) ** 4)


def busiest_sm_dram_us(m: int, n: int, k: int, bm: int, bn: int, split: int, e: float, sms: int,
                       dram_rate: float, c: CostConstants, bk: int = 1, *, w_e: float | None = None) -> float:
    """DRAM time of the SM with the most tiles, at :attr:`CostConstants.sm_dram_share` of its even
    share of ``dram_rate``. Each tile's W block is fetched from DRAM once per row of M-tiles sharing
    it (the rest come from L2), and its A block once per column of N-tiles; so the term binds only
    where M or N is one tile wide and the tiles spread unevenly over the SMs (decode, skinny prefill).
    Stream-K (``split == 0``, ``bk`` given) spreads K-iterations evenly instead of whole tiles.
    ``w_e``: bytes per element of W when they differ from A's ``e`` (a quantized weight)."""
    tm, tn = -(-m // bm), -(-n // bn)
    # bytes per element of K one tile brings in
    per_k = (min(bn, n) / tm + min(bm, m) / tn) * e if w_e is None else min(bn, n) / tm * w_e + min(bm, m) / tn * e
    if split == 0:
        # each SM streams its K-iterations at the rate stream-K keeps (segment restarts and
        # hand-overs stall the stream as they stall the MMAs): H200 decode-batch GEMMs at M = 16
        # (benchmarks/results/h200/ranking_samerun_m16_256.json) measured 1.37-1.69x the prediction
        # without this factor, the data-parallel configs of the same shapes 0.93x
        work = matmul_work(m, n, k, bm, bn, bk, 0, sms)[2]
        return work * bk * per_k / (c.sm_dram_share * c.stream_k_efficiency * dram_rate / sms) * 1e6
    tiles_per_sm = -(-(tm * tn * split) // sms)
    return tiles_per_sm * -(-k // split) * per_k / (c.sm_dram_share * dram_rate / sms) * 1e6


# -- lower bounds of predict_matmul (branch-and-bound ranking) ---------------------------
#
# The ranking prunes whole groups of configs whose lower bound already exceeds the k-th best
# prediction found so far, so these must never exceed what predict_matmul returns. They take the
# per-iteration MMA time ``t_comp`` from the caller (templates read it off predict_matmul's own
# ``compute_us`` for a one-tile, one-iteration probe, so efficiency factors added to t_comp carry
# over), repeat predict_matmul's other expressions in the same order, and replace each quantity
# that varies inside a group by its most favourable value. Proof, term by term, for every config
# with these blocks/split whose per-iteration time t_it = max(t_comp, t_l2) + iter_overhead_us is
# >= iter_us, occupancy occ <= max_ctas and num_stages <= max_stages (tests/test_rank_pruning.py):
#   conc = min(occ, tiles_per_sm) <= conc_hi; depth = max(stages - 1, 0.5) <= depth_hi, so
#   t_it_eff = max(t_it, (lat + t_l2) / (depth * conc)) >= max(iter_us, (lat + t_l2) / (depth_hi * conc_hi));
#   fills = ceil(tiles_per_sm / conc) * lat >= ceil(tiles_per_sm / conc_hi) * lat (persistent: exact);
#   epilogue = tiles_per_sm * epilogue_iters * t_it >= the same with iter_us (constants are >= 0);
#   dram_us: the reuse factors ra, rw from l2_reuse are >= 1, so perfect reuse (1, 1) is a floor;
#     its busiest-SM floor depends only on the blocks and split: exact;
#   reduce_us and launch depend only on split-K and the shape: exact;
#   overlap_max(a, b, p) = (a^p + b^p)^(1/p) is nondecreasing in a and in b for a, b >= 0, p > 0.
# Hence softmax(sm_lb, dram_lb) + reduce + launch <= predict_matmul(...).us.


class MatmulBound:
    """Lower bounds of :func:`predict_matmul` for one (GPU, op, constants); see the proof above.

    Built once per op; each call is a few float operations, so a ranking can bound
    every tile of an op before predicting any config.
    """

    __slots__ = ("_split1", "c", "dram_base", "dram_rate", "e", "k", "l2_rate", "layout", "m", "n", "out_e", "sms")

    def __init__(self, gpu: GPUProfile, op: OpSpec, consts: CostConstants | None = None) -> None:
        if op.weight:
            raise AutooptError(f"MatmulBound bounds plain matmuls; {op.label()} has a quantized weight")
        c = self.c = consts or constants()
        self.sms = limits(gpu).sm_count
        m, n, k = self.m, self.n, self.k = op.shape
        e = self.e = DTYPE_BYTES[op.dtype]
        self.layout = op.layout
        self.out_e = DTYPE_BYTES[op.out_dtype or op.dtype]
        bw = _bw(gpu)
        self.l2_rate = bw * c.l2_bw_ratio / self.sms
        self.dram_rate = bw * c.dram_efficiency
        self.dram_base = m * k * e + n * k * e  # A and W read once each (perfect L2 reuse)
        self._split1 = self._fixed(1)

    def _fixed(self, split: int) -> tuple[float, float]:
        """(DRAM us with perfect reuse, reduce + launch us) of a split: the same for every tile."""
        c, m, n, out_e = self.c, self.m, self.n, self.out_e
        dram_us = (self.dram_base + m * n * (4 * split if split > 1 else out_e)) / self.dram_rate * 1e6
        launch = c.launch_us
        reduce_us = 0.0
        if split > 1:
            reduce_us = (m * n * 4 * split + m * n * out_e) / self.dram_rate * 1e6
            launch += c.launch_us
        return dram_us, reduce_us + launch

    def l2_us(self, bm: int, bn: int, bk: int, multicast: tuple[int, int] = (1, 1)) -> float:
        """predict_matmul's ``t_l2``: L2->SM time of one K-iteration (exact)."""
        it_bytes = (min(bm, self.m) / multicast[1] + min(bn, self.n) / multicast[0]) * bk * self.e
        return it_bytes / self.l2_rate * 1e6

    def tiles(self, tiles: list[tuple[int, int, int, int, float, int, int]],
              persistent: bool = False) -> list[float]:
        """:meth:`__call__` for many ``(bm, bn, bk, split, t_comp, max_ctas, max_stages)`` at once, with
        ``iter_us = max(t_comp, t_l2) + iter_overhead_us`` (the same expressions, without a call per tile)."""
        c = self.c
        m, n, k, sms, e, l2_rate = self.m, self.n, self.k, self.sms, self.e, self.l2_rate
        lat, ovh, epi, pff, p = (c.dram_latency_us, c.iter_overhead_us, c.epilogue_iters,
                                 c.persistent_fill_fraction, c.overlap_exponent)
        inv_p = 1 / p
        out = []
        for bm, bn, bk, split, t_comp, max_ctas, max_stages in tiles:
            t_l2 = (min(bm, m) / 1 + min(bn, n) / 1) * bk * e / l2_rate * 1e6
            iter_us = max(t_comp, t_l2) + ovh
            tiles_per_sm, k_iters, work = matmul_work(m, n, k, bm, bn, bk, split, sms)
            if persistent:
                t_eff = max(iter_us, (lat + t_l2) / max(max_stages - 1, 0.5))
                fills = lat + (tiles_per_sm - 1) * lat * pff
            else:
                conc = min(max(1, max_ctas), tiles_per_sm)
                t_eff = max(iter_us, (lat + t_l2) / (max(max_stages - 1, 0.5) * conc))
                fills = -(-tiles_per_sm // conc) * lat
            if split == 0:
                t_eff /= c.stream_k_efficiency
            a = (work * t_eff + fills + tiles_per_sm * epi * iter_us
                 + stream_fixup_us(bm, bn, split, l2_rate, c, k_iters, work))
            b, fixed = self._split1 if split == 1 else self._fixed(split)
            b = max(b, busiest_sm_dram_us(m, n, k, bm, bn, split, e, sms, self.dram_rate, c, bk))
            b /= run_efficiency(bn, bk, e, self.layout, c)
            hi = a if a > b else b
            out.append(fixed if hi <= 0 else hi * ((a / hi) ** p + (b / hi) ** p) ** inv_p + fixed)
        return out

    def __call__(self, bm: int, bn: int, bk: int, split: int, iter_us: float, l2_us: float, max_ctas: int,
                 max_stages: int, persistent: bool = False) -> float:
        """Lower bound over configs with these blocks and split whose ``t_it >= iter_us``, occupancy
        ``<= max_ctas`` and ``num_stages <= max_stages``; ``l2_us`` is :meth:`l2_us` of the blocks."""
        c = self.c
        # integer ceil-division: equal to predict_matmul's math.ceil of the float quotient here
        # (operands < 2^40, so the quotient is never within one ulp of an integer it is not)
        tiles_per_sm, k_iters, work = matmul_work(self.m, self.n, self.k, bm, bn, bk, split, self.sms)
        lat = c.dram_latency_us
        if persistent:
            t_eff = max(iter_us, (lat + l2_us) / max(max_stages - 1, 0.5))
            fills = lat + (tiles_per_sm - 1) * lat * c.persistent_fill_fraction
        else:
            conc = min(max(1, max_ctas), tiles_per_sm)
            t_eff = max(iter_us, (lat + l2_us) / (max(max_stages - 1, 0.5) * conc))
            fills = -(-tiles_per_sm // conc) * lat
        if split == 0:
            t_eff /= c.stream_k_efficiency
        a = (work * t_eff + fills + tiles_per_sm * c.epilogue_iters * iter_us
             + stream_fixup_us(bm, bn, split, self.l2_rate, c, k_iters, work))
        b, fixed = self._split1 if split == 1 else self._fixed(split)
        b = max(b, busiest_sm_dram_us(self.m, self.n, self.k, bm, bn, split, self.e, self.sms, self.dram_rate, c,
                                      bk))
        b /= run_efficiency(bn, bk, self.e, self.layout, c)
        p = c.overlap_exponent
        hi = a if a > b else b  # overlap_max(a, b, p), inlined
        if hi <= 0:
            return fixed
        return hi * ((a / hi) ** p + (b / hi) ** p) ** (1 / p) + fixed


def matmul_lower_bound(gpu: GPUProfile, op: OpSpec, *, block_m: int, block_n: int, block_k: int,
                       split_k: int = 1, t_comp_us: float, max_ctas_per_sm: int, max_stages: int,
                       persistent: bool = False, multicast: tuple[int, int] = (1, 1),
                       consts: CostConstants | None = None) -> float:
    """A lower bound of ``predict_matmul(...).us`` over every config with these blocks, split-K and
    multicast whose per-iteration MMA time is at least ``t_comp_us``, whose occupancy is at most
    ``max_ctas_per_sm`` and ``num_stages`` at most ``max_stages`` (any GROUP_M). Proof in the
    comment above :class:`MatmulBound`."""
    b = MatmulBound(gpu, op, consts)
    t_l2 = b.l2_us(block_m, block_n, block_k, multicast)
    return b(block_m, block_n, block_k, split_k, max(t_comp_us, t_l2) + b.c.iter_overhead_us, t_l2,
             max_ctas_per_sm, max_stages, persistent)


# -- streaming kernels (elementwise, norms) ------------------------------------------

def predict_stream(gpu: GPUProfile, op: OpSpec, *, programs: int, threads: int, smem_bytes: int,
                   regs_per_thread: float, iters: int, bytes_per_iter: float, dram_bytes: float,
                   l2_bytes: float = 0.0, reason: str = "", stages: int = 1,
                   consts: CostConstants | None = None) -> Prediction:
    """Predicted time of a bandwidth-bound kernel: ``programs`` programs, each ``iters`` iterations
    loading ``bytes_per_iter`` (the latency-exposed loads); ``dram_bytes`` in total from DRAM and
    ``l2_bytes`` more re-read from L2. ``stages``: loads a program keeps in flight (a software-pipelined
    loop), each hiding its share of the DRAM latency."""
    c = consts or constants()
    lim = limits(gpu)
    sms = lim.sm_count
    bw = _bw(gpu)
    occ = max(1, occupancy(lim, smem_bytes=smem_bytes, regs_per_thread=regs_per_thread, threads=threads))
    per_sm = math.ceil(programs / sms)
    conc = min(occ, per_sm)
    # per SM: the bytes move at the SM's L2 port share unless latency with `conc` programs in flight
    t_bw = bytes_per_iter / (bw * c.l2_bw_ratio / sms) * 1e6
    t_iter = max(t_bw, c.dram_latency_us / (conc * stages))
    sm_us = per_sm * iters * t_iter
    in_flight = min(1.0, conc * threads / lim.warp_size / c.warps_for_full_bandwidth)
    dram_us = dram_bytes / (bw * c.stream_dram_efficiency * in_flight) * 1e6
    l2_us = l2_bytes / (bw * c.l2_bw_ratio) * 1e6
    peak = peak_flops(gpu, "fp32", tensor=False)
    compute_us = op.flops / peak * 1e6 if peak else 0.0
    main = overlap_max(overlap_max(sm_us, dram_us + l2_us, c.overlap_exponent), compute_us, c.overlap_exponent)
    total = main + c.launch_us
    terms = {"compute_us": compute_us, "dram_us": dram_us, "l2_us": l2_us,
             "latency_us": max(0.0, sm_us - per_sm * iters * t_bw), "launch_us": c.launch_us,
             "ctas_per_sm": float(occ), "waves": programs / (sms * occ), "dram_mb": dram_bytes / 1e6}
    text = f"{programs} programs over {sms} SMs x {occ}/SM, {iters} iter(s) each; {dram_bytes / 1e6:.2f} MB DRAM"
    return _finish(gpu, op, terms, total, f"{reason}; {text}" if reason else text)


class StreamBound:
    """:func:`predict_stream`'s time without its Prediction, for branch and bound (one GPU and op).

    Same expressions in the same order, so with the same arguments it equals
    ``predict_stream(...).us`` up to rounding. It is a lower bound when the caller
    passes a lower bound of ``dram_bytes``/``l2_bytes`` (the total is nondecreasing
    in both: the smooth max :func:`overlap_max` is nondecreasing in each argument).
    """

    __slots__ = ("c", "compute_us", "dram_rate", "l2_rate", "l2_total_rate", "lat", "sms")

    def __init__(self, gpu: GPUProfile, op: OpSpec, consts: CostConstants | None = None) -> None:
        c = self.c = consts or constants()
        self.sms = limits(gpu).sm_count
        bw = _bw(gpu)
        self.l2_rate = bw * c.l2_bw_ratio / self.sms
        # without predict_stream's in-flight factor (<= 1): a lower bound of its DRAM time
        self.dram_rate = bw * c.stream_dram_efficiency
        self.l2_total_rate = bw * c.l2_bw_ratio
        peak = peak_flops(gpu, "fp32", tensor=False)
        self.compute_us = op.flops / peak * 1e6 if peak else 0.0

    def __call__(self, programs: int, occ: int, iters: int, bytes_per_iter: float, dram_bytes: float,
                 l2_bytes: float = 0.0, stages: int = 1) -> float:
        """``occ``: resident programs per SM as predict_stream computes it (``max(1, occupancy(...))``)."""
        c = self.c
        per_sm = math.ceil(programs / self.sms)
        conc = min(occ, per_sm)
        t_bw = bytes_per_iter / self.l2_rate * 1e6
        t_iter = max(t_bw, c.dram_latency_us / (conc * stages))
        sm_us = per_sm * iters * t_iter
        dram_us = dram_bytes / self.dram_rate * 1e6
        l2_us = l2_bytes / self.l2_total_rate * 1e6
        p = c.overlap_exponent
        return overlap_max(overlap_max(sm_us, dram_us + l2_us, p), self.compute_us, p) + c.launch_us
