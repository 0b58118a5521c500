"""The fused-MoE template (kind ``fused_moe``, backend kernel ``fused_moe``): the runtimes' own config space.

vLLM and SGLang run a MoE layer's two expert GEMMs through one Triton kernel each: the routed
tokens are sorted by expert and padded per expert to ``BLOCK_SIZE_M`` (the align step), and one
launch covers every expert, each M-block multiplying by its expert's weight. Configs use their keys
(``BLOCK_SIZE_M/N/K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``) and their tuning space
(:data:`SPACE`); one config serves both GEMMs, as in their config files.

Cost (:func:`moe_cost`), per GEMM, in :func:`~autoopt.kernels.cost.predict_matmul`'s terms and with
its constants (:mod:`autoopt.kernels.constants`, fitted on the dense GEMMs):

- the padded rows: ``sum_e E[ceil(c_e / BLOCK_SIZE_M)] * BLOCK_SIZE_M`` for each expert's token
  count ``c_e ~ Binomial(M, p_e)`` (uniform routing ``p_e = topk/E``; :func:`skewed_probs` for a
  Zipf-skewed stress case), so tiles = M-blocks x N-tiles and the MMA computes the padding;
- tensor-core work per K-iteration of a padded tile, wave quantization over the SMs, occupancy from
  shared memory and registers, pipeline depth (``num_stages - 1`` loads in flight per resident CTA)
  hiding DRAM latency, as the dense model;
- DRAM: the weights of the experts actually touched (``sum_e 1 - (1 - p_e)^M``: about
  ``min(E, M*topk)`` at decode), re-read per M-block of an expert unless ``GROUP_SIZE_M`` keeps its
  blocks together in L2 (the dense model's reuse rule per expert), the activations once (the gathered
  rows of A come from L2 while A fits it) and the output once;
- beside the GEMMs: the align step (two launches: count, then scatter), the W8A8 activation
  quantization before each GEMM, and for ``both`` the activation ``silu(gate) * up`` and the sum over
  top-k, priced as streams.

Leads a GPU run is to calibrate: the per-GEMM constants were fitted on dense GEMMs; gathered A rows
(pointer loads, no TMA) run at the pointer-wgmma efficiency the dense kernels measured.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import (
    SUBPARTITIONS,
    constants,
    floor_us,
    l2_reuse,
    mma_efficiency,
    overlap_max,
    peak_flops,
    run_efficiency,
    smem_intensity,
    wgmma_width_efficiency,
)
from autoopt.kernels.gpu_key import gpu_key
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.pruning import BoundedSpace, Tally, cached
from autoopt.kernels.quant import FP8_BLOCK
from autoopt.kernels.quant_cost import act_quant_us
from autoopt.kernels.template import Prediction, Template
from autoopt.templates.gemm import config_problems, matmul_path, mma_kind

__all__ = ["KEYS", "SPACE", "FusedMoeTemplate", "expected_blocks", "expected_touched", "moe_cost", "served",
           "skewed_probs", "uniform_probs"]

KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
#: the runtimes' tuning space for this kernel (vLLM's benchmark_moe.py grid), key -> values
SPACE: dict[str, tuple[int, ...]] = {
    "BLOCK_SIZE_M": (16, 32, 64, 128, 256),
    "BLOCK_SIZE_N": (32, 64, 128, 256),
    "BLOCK_SIZE_K": (32, 64, 128, 256),
    "GROUP_SIZE_M": (1, 16, 32, 64),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}
#: formats the backend kernel runs (autoopt/backend/kernels/fused_moe.py), by name: 16-bit experts (None), W8A8
#: FP8 per channel and per 128 x 128 block (not weight-only: FP8 experts run on FP8 tensor cores), W8A16 INT8 per
#: channel, W4A16 INT4 per channel per K-group, symmetric or with offsets (vLLM's int4_w4a16 with zero points)
FORMATS = (None, "fp8", "fp8_block", "int8", "int4")


def served(op: OpSpec) -> bool:
    """Whether the backend kernel runs ``op``'s weight format (any spelling of it: ``int4`` is ``int4-g128``)."""
    fmt = op.weight_format
    if fmt is None:
        return True
    return fmt.name in FORMATS and (not fmt.name.startswith("fp8") or fmt.quantizes_activations)
#: wgmma rate kept by a CTA of one warpgroup (4 warps) against two (8 warps) in this kernel, whose A rows come
#: through pointer loads: at M >= 1024 its 4-warp wgmma configs ran 7-15 % slower against the cost model than
#: its 8-warp ones (median log residuals -0.04 to -0.07 against -0.12 to -0.19; H100, vLLM's kernel, 144-config
#: grids of benchmarks/results/h100/moe_runtime_configs{,_factors}.json). 0.85 and MOE_SINGLE_CTA_SLOWDOWN
#: 1.02, chosen together on those two runs' grids (in sample; both runs moved alike), raise the grid replay
#: (measured time of the config the model ranks first among the grid's, over the grid's best; geomean over 48
#: (case, M) points) from 0.939 to 0.957 and from 0.900 to 0.916; 1.0 / 1.065 and up lose it again.
MOE_ONE_WARPGROUP_EFFICIENCY = 0.85
#: wgmma rate kept by a 64-row tile on 8 warps, whose two warpgroups split BLOCK_SIZE_N (each m64 x N/2), beyond
#: the narrower instruction's own factor (``wgmma_width_efficiency``). H100, vLLM's kernel, M >= 512 (compute
#: bound): such configs measured a median 1.217 and 1.259x the same config with 128 rows (140 and 72 pairs,
#: benchmarks/results/h100/moe_runtime_configs{,_run3_partial}.json) where the model said 1.134 and 1.185; below
#: M = 512 it matched (0.94-1.00 against 0.95-0.99). 0.90 brings it to 1.175 and 1.253. Zero-shot picks the
#: runs happened to time, over each run's fastest timed config (benchmarks/replay_moe.py), geomean: 0.947 ->
#: 0.957 (run 1, not used to fit), 0.950 -> 0.958, 0.940 -> 0.946, 0.936 -> 0.950 (the partial run 3); Mixtral's
#: M = 1024 and TP8 M = 4096 picks move to 128-row tiles.
MOE_SPLIT_N_EFFICIENCY = 0.90
#: a GEMM's SM time when one CTA fills an SM (its tile's prologue and epilogue hidden behind no other CTA):
#: a tie-breaker between configs the model prices within a few per cent (see above)
MOE_SINGLE_CTA_SLOWDOWN = 1.02
#: a GEMM's SM time on the wgmma path with ``num_stages = 2`` (one load in flight while its async MMAs hold the
#: other buffer), against the model's price of deeper pipelines. Relative residual of such configs (their
#: ln(measured / predicted) less the median of the point's other wgmma configs), vLLM's kernel: H100 0.95-1.12
#: and one 2.2 (11 configs, 128/256/128/x/8/2 at 1.01-1.05 from M = 256), H200 1.01-1.37 (7, bf16;
#: 128/256/128/x/8/2 at 1.14-1.37 from M = 256); pooled median 1.06 (18). On the H200 run of 2026-11-28
#: zero-shot picked 128/256/128/x/8/2 at five points, priced 0.5-1.6 % under 128/256/64/x/8/3 (or /8/4), which
#: measured 1.24-1.46x faster; with 1.06 the zero-shot replay (benchmarks/replay_moe.py) of that run goes
#: 0.888 -> 0.944 (min 0.683 -> 0.865), the H100 runs' 0.946-0.971 -> 0.947-0.976 (none lower by more than
#: 0.004).
MOE_WGMMA_TWO_STAGE_SLOWDOWN = 1.06
#: issue cost of this kernel's tile loads against the dense GEMM's 16-byte copies (``load_issue_us``, fitted on
#: a GEMV): its A rows are gathered through the sorted token ids and every W and A load is a pointer load
#: under a K-tail mask, so a thread spends more issue slots a copy; the wide tiles on few warps that need the
#: most copies a thread (16 x 256 x 128 on 4 warps: 34 a K-iteration) measured slowest against the model below
#: M = 256 (median residual +9.6 % on the H200, +3.1 % on the H100, against -0.3 % and -1.5 % for 16 x 64 x 128).
#: Grid replay (benchmarks/replay_moe.py: measured time of the model's first config over the grid's best,
#: geomean over (case, M) points) at 1 / 2.5 / 3 / 3.5 / 4: H200 graph-timed runs (fitted on these)
#: 0.951 / 0.963 / 0.962 / 0.963 / 0.963, lowest point 0.771 -> 0.885 at 3; the H200 event-timed runs
#: 0.949 / 0.958 / 0.954 / 0.954 / 0.953; the H100 runs (not used to choose) 0.951 / 0.955 / 0.957 / 0.958 / 0.952.
MOE_LOAD_ISSUE_FACTOR = 3.0
#: DRAM time of a GEMM whose CTA fills its SM alone (occupancy 1), against the model's stream: no sibling CTA
#: streams while its pipeline fills and its epilogue stores. Below M = 256 such configs measured +5.6 % against
#: the point's median residual on the H200 (graph-timed; occupancy 3-6: -3 to -9 %). With
#: MOE_LOAD_ISSUE_FACTOR, grid replay (benchmarks/replay_moe.py) at 1 / 1.03 / 1.05 / 1.1 / 1.2, geomean:
#: H200 graph-timed (fitted on these) 0.962 / 0.972 / 0.974 / 0.974 / 0.974, H200 event-timed 0.954 / 0.961 /
#: 0.959 / 0.960 / 0.960, H100 (not used to choose) 0.957 / 0.967 / 0.966 / 0.967 / 0.967. Without the
#: issue factor the same 1.05 lost on the H100's few-expert points (Mixtral at M = 64-256: 0.95 -> 0.94).
MOE_SINGLE_CTA_DRAM_SLOWDOWN = 1.05
#: the binomial sums run over mean +- this many standard deviations (the tails beyond hold < 1e-30)
_SD_WINDOW = 12.0


# -- routing statistics --------------------------------------------------------------------------

def uniform_probs(e: int, topk: int) -> tuple[float, ...]:
    """Each expert's chance to be among one token's top-k under uniform routing: ``topk / E``."""
    return (topk / e,) * e


def skewed_probs(e: int, topk: int, skew: float = 1.0) -> tuple[float, ...]:
    """A Zipf-skewed routing (stress case): expert i's share ``(i+1)^-skew``, scaled so the chances sum
    to ``topk`` with none above 1 (the excess of a capped expert spread over the rest, as water-filling)."""
    w = [(i + 1) ** -skew for i in range(e)]
    probs = [0.0] * e
    free = list(range(e))
    left = float(topk)
    while free:
        total = sum(w[i] for i in free)
        over = [i for i in free if left * w[i] / total >= 1.0]
        if not over:
            for i in free:
                probs[i] = left * w[i] / total
            break
        for i in over:
            probs[i] = 1.0
            free.remove(i)
            left -= 1.0
    return tuple(probs)


@lru_cache(maxsize=4096)
def _expected_ceil(m: int, p: float, block_m: int) -> float:
    """``E[ceil(c / block_m)]`` for ``c ~ Binomial(m, p)`` (summed in log space over the mass)."""
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return float(-(-m // block_m))
    mean, sd = m * p, math.sqrt(m * p * (1 - p))
    lo, hi = max(0, int(mean - _SD_WINDOW * sd) - 1), min(m, int(mean + _SD_WINDOW * sd) + 2)
    lp, lq, lm = math.log(p), math.log1p(-p), math.lgamma(m + 1)
    total = 0.0
    for c in range(max(lo, 1), hi + 1):
        total += math.exp(lm - math.lgamma(c + 1) - math.lgamma(m - c + 1) + c * lp + (m - c) * lq) * -(-c // block_m)
    return total


def expected_blocks(m: int, probs: Sequence[float], block_m: int) -> float:
    """Expected M-blocks after the align step: ``sum_e E[ceil(c_e / BLOCK_SIZE_M)]`` (times BLOCK_SIZE_M:
    the padded token count)."""
    return sum(_expected_ceil(m, p, block_m) for p in probs)


def expected_touched(m: int, probs: Sequence[float]) -> float:
    """Expected distinct experts hit by ``m`` tokens: ``sum_e 1 - (1 - p_e)^m``."""
    return sum(1.0 - (1.0 - p) ** m for p in probs)


# -- resources and the per-GEMM model ----------------------------------------------------------------

def _stream_us(gpu: GPUProfile, moved: float, launches: int = 1) -> float:
    """A bandwidth-bound pass: ``moved`` bytes at the streaming kernels' DRAM efficiency, plus launches."""
    c = constants()
    bw = (gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs or 0.0) * 1e9
    return launches * c.launch_us + (moved / (bw * c.stream_dram_efficiency) * 1e6 if bw else 0.0)


def _bytes(op: OpSpec) -> tuple[float, float, float]:
    """(A bytes per element in the MMA, packed W bytes per element on chip, output bytes per element)."""
    fmt = op.weight_format
    w_e = DTYPE_BYTES[op.dtype] if fmt is None else 0.5 if fmt.name == "int4" else 1.0
    return DTYPE_BYTES[op.compute_dtype], w_e, DTYPE_BYTES[op.dtype]


def resources(gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> tuple[int, float, int]:
    """(smem, regs/thread, threads): ``num_stages`` buffers of an A and a W tile, the dense GEMM's
    register estimate (fp32 accumulators and, on mma.sync, operand fragments)."""
    lim = C.limits(gpu)
    p = config.params
    bm, bn, bk, warps = p["BLOCK_SIZE_M"], p["BLOCK_SIZE_N"], p["BLOCK_SIZE_K"], config.num_warps
    a_e, w_e, _ = _bytes(op)
    smem = int(config.num_stages * (bm * bk * a_e + bk * bn * w_e))
    regs = C.gemm_regs_per_thread(bm, bn, warps, lim.warp_size, wgmma=config.path == "wgmma")
    return smem, regs, warps * lim.warp_size


@dataclass(frozen=True, slots=True)
class _Gemm:
    """One expert GEMM of the op: output width, reduction, distinct A rows, A/W/out bytes per element."""

    n_out: int
    k_in: int
    a_rows: int
    w_bytes: float  # one expert's stored weight (packed + scales)
    w_e: float  # stored bytes per weight element (what DRAM streams)


def _gemms(op: OpSpec) -> list[_Gemm]:
    m, _, topk, n, k = op.shape
    out = []
    for name, (n_out, k_in) in zip(("gate_up", "down"), ((2 * n, k), (k, n)), strict=True):
        if op.moe_gemm in ("both", name):
            wb = op.moe_weight_bytes(n_out, k_in)
            # gate_up gathers the M hidden rows; down reads its M*topk rows once each
            out.append(_Gemm(n_out, k_in, m if name == "gate_up" else m * topk, wb, wb / (n_out * k_in)))
    return out


class _Ctx:
    """What every config of one (GPU, op, routing) shares, computed once: the GEMMs, rates, bytes per
    element, and per BLOCK_SIZE_M the routing statistics and the fixed steps."""

    __slots__ = ("a_e", "alu", "bw", "c", "fixed", "gemms", "gpu", "l2", "lim", "op", "peak", "probs", "smem_need",
                 "stats", "touched")

    def __init__(self, gpu: GPUProfile, op: OpSpec, probs: tuple[float, ...]) -> None:
        self.gpu, self.op, self.probs = gpu, op, probs
        self.c = c = constants()
        self.lim = C.limits(gpu)
        self.gemms = _gemms(op)
        self.a_e = DTYPE_BYTES[op.compute_dtype]
        self.bw = (gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs or 0.0) * 1e9
        self.l2 = (gpu.l2_bytes or 0) * c.l2_usable_fraction
        self.peak = peak_flops(gpu, op.compute_dtype)
        # predict_matmul's shared-memory demand: bytes a clock the MMAs need at peak over what the SM serves
        self.smem_need = (self.peak / (self.lim.sm_count * gpu.sm_clock_max_mhz * 1e6) / c.smem_bytes_per_clk
                          if self.peak and gpu.sm_clock_max_mhz else 0.0)
        self.touched = expected_touched(op.shape[0], probs)
        self.stats: dict[int, tuple[float, int, float]] = {}
        self.fixed: dict[int, dict[str, float]] = {}
        self.alu: dict[tuple[int, int, int, str], float] = {}

    def blocks(self, bm: int) -> tuple[float, int, float]:
        """(expected M-blocks, as launched (whole), real rows per block) for BLOCK_SIZE_M ``bm``."""
        hit = self.stats.get(bm)
        if hit is None:
            m, _, topk, _, _ = self.op.shape
            f = expected_blocks(m, self.probs, bm)
            hit = self.stats[bm] = (f, max(1, math.ceil(f - 1e-9)), m * topk / f)
        return hit

    def fixed_us(self, bm: int) -> dict[str, float]:
        hit = self.fixed.get(bm)
        if hit is None:
            hit = self.fixed[bm] = _fixed_us(self.gpu, self.op, self.blocks(bm)[0], bm)
        return hit


_CTX: dict[tuple[Any, ...], _Ctx] = {}


def _context(gpu: GPUProfile, op: OpSpec, probs: tuple[float, ...]) -> _Ctx:
    key = (id(gpu), op, probs, id(constants()))
    ctx = _CTX.get(key)
    if ctx is None or ctx.gpu is not gpu:
        if len(_CTX) > 256:
            _CTX.clear()
        ctx = _CTX[key] = _Ctx(gpu, op, probs)
    return ctx


def _sm_us(x: _Ctx, g: _Gemm, blocks: int, rows_per_block: float, bm: int, bn: int, bk: int, warps: int,
           stages: int, path: str, occ: int, alu_iter_us: float) -> tuple[float, float, int]:
    """(SM-side us, MMA us per K-iteration, tiles per SM) of one GEMM: predict_matmul's per-SM expressions
    over ``blocks`` M-blocks of ``rows_per_block`` real rows each."""
    c, gpu = x.c, x.gpu
    sms = x.lim.sm_count
    mma = mma_kind(path)
    tiles_per_sm = -(-(blocks * -(-g.n_out // bn)) // sms)
    work = tiles_per_sm * max(1, -(-g.k_in // bk))
    conc = max(1, min(occ, tiles_per_sm))
    t_comp = 0.0
    if x.peak:
        rate = x.peak * c.tc_efficiency * mma_efficiency(gpu, mma, c) / sms
        idle = 1.0
        if mma == "wgmma":
            rate *= c.pointer_wgmma_efficiency  # gathered A rows: pointer loads, never TMA
            if occ * warps < 8:
                rate *= c.single_warpgroup_efficiency
            if warps < 8:
                rate *= MOE_ONE_WARPGROUP_EFFICIENCY
            elif bm < 64 * (warps // 4):
                rate *= MOE_SPLIT_N_EFFICIENCY
            rate *= wgmma_width_efficiency(bm, bn, warps, c)
        else:
            idle = SUBPARTITIONS / min(SUBPARTITIONS, occ * warps)
        smem_pen = max(1.0, x.smem_need / smem_intensity(bm, bn, warps, x.a_e, mma)) if x.smem_need else 1.0
        t_comp = 2.0 * max(bm, 16) * bn * bk / rate * max(smem_pen, idle) * 1e6  # padded rows computed too
    # masked rows of a block are not fetched: only its real rows of A come through L2
    it_bytes = (min(bm, rows_per_block) * x.a_e + min(bn, g.n_out) * g.w_e) * bk
    t_l2 = it_bytes / (x.bw * c.l2_bw_ratio / sms) * 1e6
    t_issue = it_bytes / (warps * x.lim.warp_size * 16) * c.load_issue_us * MOE_LOAD_ISSUE_FACTOR
    t_it = max(t_comp, t_l2, t_issue, alu_iter_us) + c.iter_overhead_us
    t_it_eff = max(t_it, (c.dram_latency_us + t_l2) / (max(stages - 1, 0.5) * conc))
    fills = -(-tiles_per_sm // conc) * c.dram_latency_us
    epilogue = tiles_per_sm * c.epilogue_iters * t_it
    slowdown = (MOE_SINGLE_CTA_SLOWDOWN if occ == 1 else 1.0) * \
        (MOE_WGMMA_TWO_STAGE_SLOWDOWN if stages == 2 and mma == "wgmma" else 1.0)
    return (work * t_it_eff + fills + epilogue) * slowdown, t_comp, tiles_per_sm


def _dram_bytes(x: _Ctx, g: _Gemm, blocks: float, bm: int, bn: int, group_m: int, conc_grid: int, *,
                reuse: bool = True) -> tuple[float, int, int]:
    """(bytes from DRAM, A passes, W passes): touched experts' weights, activations, output. Each expert's
    W is re-read per band of its M-blocks that L2 cannot serve (the dense model's rule, per expert:
    ``GROUP_SIZE_M`` consecutive blocks walk the N-tiles together); ``reuse=False`` prices perfect reuse
    (a lower bound)."""
    m, _, topk, _, _ = x.op.shape
    a_distinct = g.a_rows * g.k_in * x.a_e
    # gathered rows of the same token for other experts come from L2 while A fits it
    a_bytes = a_distinct if a_distinct <= x.l2 else m * topk * g.k_in * x.a_e
    ra, rw = 1, 1
    per_expert = blocks / max(x.touched, 1e-9)
    if reuse and per_expert > 1.0:
        tm = math.ceil(per_expert - 1e-9)
        tn = -(-g.n_out // bn)
        ra, rw = l2_reuse(tm, tn, group_m, conc_grid, bm * g.k_in * x.a_e, min(bn, g.n_out) * g.k_in * g.w_e, x.l2)
    out = m * topk * g.n_out * DTYPE_BYTES[x.op.dtype]
    return a_bytes * ra + x.touched * g.w_bytes * rw + out, ra, rw


def _fixed_us(gpu: GPUProfile, op: OpSpec, blocks: float, block_m: int) -> dict[str, float]:
    """What does not depend on the GEMM tiles: the align step, activation quantization, activation and sum."""
    m, _, topk, n, k = op.shape
    slots = m * topk
    e = DTYPE_BYTES[op.dtype]
    # align: the ids read by the count and the scatter pass, sorted ids (padded) and expert ids written
    out = {"align_us": _stream_us(gpu, 2 * 4 * slots + 4 * blocks * block_m + 4 * blocks, launches=2)}
    fmt = op.weight_format
    if fmt is not None and fmt.quantizes_activations:
        act = 0.0
        for g in _gemms(op):  # each GEMM quantizes its A rows (hidden, or the activation's output)
            act += act_quant_us(gpu, OpSpec(kind="gemm", shape=(g.a_rows, 1, g.k_in), dtype=op.dtype, weight=op.weight))
        out["act_quant_us"] = act
    if op.moe_gemm == "both":
        out["activation_us"] = _stream_us(gpu, slots * 3 * n * e)  # read gate and up, write silu(gate) * up
        out["sum_us"] = _stream_us(gpu, slots * k * e + m * k * e)  # top-k partial rows read, one row written
    return out


def _alu_iter_us(gpu: GPUProfile, op: OpSpec, bm: int, bn: int, bk: int, path: str) -> float:
    """CUDA-core us per K-iteration beyond the MMA: block-FP8 scales each K-tile's product and int4 decodes
    its codes and scales the tile's product (the quant-gemm template's price of those steps: the same tile
    code); per-channel FP8 scales once after the loop; 16-bit none."""
    fmt = op.weight_format
    if fmt is None or fmt.name not in ("fp8_block", "int4"):
        return 0.0
    from autoopt.templates.quant import QuantGemmTemplate

    _, _, _, n, k = op.shape
    sur = OpSpec(kind="gemm", shape=(bm, n, k), dtype=op.dtype, weight=op.weight)
    return QuantGemmTemplate._alu_us(gpu, sur, bm, bn, bk, path)


def moe_cost(gpu: GPUProfile, op: OpSpec, config: KernelConfig, probs: Sequence[float] | None = None,
             *, bound: bool = False) -> Prediction:
    """Predicted time of ``op`` (kind ``fused_moe``) under ``config``; ``probs``: each expert's chance to be
    in one token's top-k (default uniform, :func:`skewed_probs` for a stress case). ``bound=True`` prices
    perfect L2 reuse (a lower bound over GROUP_SIZE_M)."""
    us, parts, terms = _cost(gpu, op, config, probs, bound=bound, detail=True)
    m, e, topk, _, _ = op.shape
    floor = floor_us(gpu, op)
    terms["floor_us"] = floor
    f = terms["padded_rows"] / config.params["BLOCK_SIZE_M"]
    reason = (f"{f:.1f} M-blocks ({terms['padded_rows']:.0f} padded rows for {m * topk} routed), "
              f"{terms['touched_experts']:.1f} of {e} experts touched; " + "; ".join(parts))
    return Prediction(us=us, bound="compute" if terms["compute_us"] > terms["dram_us"] else "memory",
                      roofline_pct=min(100.0, 100.0 * floor / us), reason=reason, breakdown=terms)


def _cost(gpu: GPUProfile, op: OpSpec, config: KernelConfig, probs: Sequence[float] | None, *, bound: bool,
          detail: bool) -> tuple[float, list[str], dict[str, float]]:
    """moe_cost's total (and, with ``detail``, its parts and terms)."""
    p = config.params
    bm, bn, bk, group = p["BLOCK_SIZE_M"], p["BLOCK_SIZE_N"], p["BLOCK_SIZE_K"], p["GROUP_SIZE_M"]
    warps, stages = config.num_warps, config.num_stages
    _, e, topk, _, _ = op.shape
    x = _context(gpu, op, uniform_probs(e, topk) if probs is None else tuple(probs))
    c = x.c
    blocks_f, blocks, rows_per_block = x.blocks(bm)
    smem, regs, threads = resources(gpu, op, config)
    occ = max(1, C.occupancy(x.lim, smem_bytes=smem, regs_per_thread=regs, threads=threads))
    akey = (bm, bn, bk, config.path)
    alu = x.alu.get(akey)
    if alu is None:
        alu = x.alu[akey] = _alu_iter_us(gpu, op, bm, bn, bk, config.path)
    total = dram_total = compute_total = 0.0
    parts = []
    for g in x.gemms:
        sm, t_comp, tiles_per_sm = _sm_us(x, g, blocks, rows_per_block, bm, bn, bk, warps, stages, config.path,
                                          occ, alu)
        conc_grid = min(blocks * -(-g.n_out // bn), x.lim.sm_count * occ)
        moved, ra, rw = _dram_bytes(x, g, blocks_f, bm, bn, group, conc_grid, reuse=not bound)
        dram = moved / (x.bw * c.dram_efficiency) * 1e6 / run_efficiency(bn, bk, g.w_e, "nk", c)
        if occ == 1:
            dram *= MOE_SINGLE_CTA_DRAM_SLOWDOWN
        us = overlap_max(sm, dram, c.overlap_exponent) + c.launch_us
        total += us
        if detail:
            dram_total += dram
            compute_total += tiles_per_sm * max(1, -(-g.k_in // bk)) * t_comp
            parts.append(f"{g.n_out}x{g.k_in}: {us:.3g} us (W x{rw}, A x{ra})")
    fixed = x.fixed_us(bm)
    total += sum(fixed.values())
    terms: dict[str, float] = {}
    if detail:
        terms = {"padded_rows": blocks_f * bm, "touched_experts": x.touched, "ctas_per_sm": float(occ), **fixed,
                 "dram_us": dram_total, "compute_us": compute_total, "launch_us": c.launch_us * len(parts)}
    return total, parts, terms


# -- the template ----------------------------------------------------------------------------------------

class FusedMoeTemplate(Template):
    """vLLM/SGLang's fused-MoE Triton kernel family (autoopt's own kernel runs the same configs)."""

    name = "fused-moe-triton"
    ops = ("fused_moe",)
    kernel = "fused_moe"
    quantized_weights = True

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        return (op.kind in self.ops and gpu.features.tensor_cores and not gpu.features.mfma
                and served(op))

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        s = SPACE
        for bm in s["BLOCK_SIZE_M"]:
            for bn in s["BLOCK_SIZE_N"]:
                for bk in s["BLOCK_SIZE_K"]:
                    for group in s["GROUP_SIZE_M"]:
                        for warps in s["num_warps"]:
                            path = matmul_path(gpu, bm, warps)
                            for stages in s["num_stages"]:
                                yield KernelConfig(kernel=self.kernel, template=self.name, path=path,
                                                   params={"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                                                           "GROUP_SIZE_M": group, "num_warps": warps,
                                                           "num_stages": stages})

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = config_problems(config, KEYS, self.kernel)
        if out:
            return out
        p = config.params
        lim = C.limits(gpu)
        for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            out += C.check_pow2(key, p[key])
        if p["BLOCK_SIZE_M"] < 16 or p["BLOCK_SIZE_N"] < 16 or p["BLOCK_SIZE_K"] < 16:
            out.append("BLOCK_SIZE_M/N/K must be >= 16 (tl.dot's smallest tile)")
        if p["GROUP_SIZE_M"] < 1:
            out.append(f"GROUP_SIZE_M={p['GROUP_SIZE_M']} must be >= 1")
        if config.num_stages < 1:
            out.append(f"num_stages={config.num_stages} must be >= 1")
        out += C.check_threads(lim, config.num_warps)
        if out:
            return out
        out += C.check_dtype(gpu, op.compute_dtype)
        fmt = op.weight_format
        if fmt is not None and fmt.name == "fp8_block" and p["BLOCK_SIZE_K"] > FP8_BLOCK:
            # a K-tile must lie in one scale block (vLLM clamps BLOCK_SIZE_K to the block; this config
            # would not run as written)
            out.append(f"BLOCK_SIZE_K={p['BLOCK_SIZE_K']} > the fp8_block scale block {FP8_BLOCK}: a K-tile "
                       "must lie in one block")
        if fmt is not None and fmt.name == "int4":
            g = fmt.group_size or 0
            bk = p["BLOCK_SIZE_K"]
            if not (32 <= bk <= g and g % bk == 0):
                # two dots of BLOCK_SIZE_K / 2 codes (mma's 16-bit K step is 16), inside one scale group
                out.append(f"BLOCK_SIZE_K={bk}: int4 experts take 32 to the group {g}, dividing it (a K-tile lies "
                           "in one group)")
        want = matmul_path(gpu, p["BLOCK_SIZE_M"], config.num_warps)
        if config.path != want:
            out.append(f"path {config.path!r} does not match what Triton emits here ({want!r})")
        elif config.path == "wgmma":
            out += C.wgmma_problems(p["BLOCK_SIZE_M"], p["BLOCK_SIZE_N"], p["BLOCK_SIZE_K"], config.num_warps,
                                    op.compute_dtype)
        if out:
            return out
        smem, regs, threads = resources(gpu, op, config)
        return C.check_smem(lim, smem) + C.check_regs(lim, regs, threads)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        return moe_cost(gpu, op, config)

    def _valid(self, gpu: GPUProfile, op: OpSpec) -> tuple[tuple[KernelConfig, ...], Tally]:
        """The valid configs and the tally of rejections; validation reads only the GPU, the dtypes and the
        weight format (no shape), so it is done once per (GPU, formats) and shared."""
        def build() -> tuple[tuple[KernelConfig, ...], Tally]:
            tally = Tally()
            ok = []
            for cfg in self.space(gpu, op):
                tally.considered += 1
                problems = self.validate(gpu, op, cfg)
                if problems:
                    tally.reject(self.kernel, problems[0])
                else:
                    ok.append(cfg)
            return tuple(ok), tally
        key = ("fused-moe-valid", gpu_key(gpu), op.dtype, op.weight)
        valid, tally = cached(key, build)
        return valid, tally

    def bounded_space(self, gpu: GPUProfile, op: OpSpec) -> BoundedSpace | None:
        """One root per (tile, warps, stages), bounded by its prediction at perfect L2 reuse (the reuse
        factors are >= 1 and the smooth max is nondecreasing, so no GROUP_SIZE_M beneath can be faster);
        tests/test_moe_template.py checks every bound against the predictions."""
        valid, seen = self._valid(gpu, op)
        tally = Tally(considered=seen.considered, rejected=seen.rejected,
                      reasons={k: Counter(v) for k, v in seen.reasons.items()}, examples=dict(seen.examples))
        groups: dict[tuple[Any, ...], list[KernelConfig]] = {}
        for cfg in valid:
            p = cfg.params
            key = (p["BLOCK_SIZE_M"], p["BLOCK_SIZE_N"], p["BLOCK_SIZE_K"], cfg.num_warps, cfg.num_stages)
            groups.setdefault(key, []).append(cfg)
        roots: list[tuple[float, Any]] = []
        for leaves in groups.values():
            b = _cost(gpu, op, leaves[0], None, bound=True, detail=False)[0]
            roots.append((b, lambda b=b, ls=tuple(leaves): [(b, cfg) for cfg in ls]))
        return tally.space(roots)
