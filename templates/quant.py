"""Templates over quantized weights (``OpSpec.weight``): decode GEMV (backend kernel ``quant_gemv``) and
prefill GEMM (``quant_gemm``).

``quant-gemv`` (kind ``gemv``, M <= 16), keys ``BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps,
num_stages``: ``BLOCK_M = next_pow2(M)``; ``BLOCK_M == 1`` runs FMAs (a ``BLOCK_K`` of any power of
two from 32: an int4 / block-FP8 tile holds whole groups or lies in one), ``BLOCK_M > 1`` a ``tl.dot``
at M = 16 whose tile lies in one group (``BLOCK_K <= group``).

``quant-gemm`` (kind ``gemm``), keys ``BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages``:
W8A8 formats (``fp8``, ``fp8_block``) need FP8 tensor cores (sm_89+; ``fp8-wo`` / ``fp8_block-wo``
run elsewhere); int4 ``BLOCK_K`` at most the group, block-FP8 ``BLOCK_K`` at most 128. Path as
``tl.dot`` takes it (``wgmma`` on sm_90a for 64-row blocks and whole warpgroups, else mma.sync).

Cost: :func:`~autoopt.kernels.cost.predict_matmul` (the model the plain GEMV/GEMM templates use,
calibrated on their timings) with the packed weight's bytes per element (scales included) and the
dequantization's CUDA-core time per K-iteration (:mod:`autoopt.kernels.quant_cost`), which overlaps
the MMA and the loads; a W8A8 GEMM adds its activation-quantization launch (a stream: A read in its
dtype, e4m3 A and the scales written). Both templates answer with bounds for branch and bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any, ClassVar

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.constants import CostConstants, in_graph
from autoopt.kernels.cost import constants, floor_us, matmul_work, peak_flops, predict_matmul
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.pruning import BoundedSpace, Tally
from autoopt.kernels.quant import WeightFormat
from autoopt.kernels.quant_cost import (
    BLOCK_FP8_SERIAL_FACTOR,
    DOT_GEMV_PROLOGUE_US,
    DOT_GEMV_SCALE,
    DequantWork,
    act_quant_us,
    cycles_per_weight,
    dequant_work,
    dot_gemv_load_factor,
    fp32_lanes,
    gemv_measured_factor,
    gemv_prologue_us,
    swap_gemv_us,
    swap_token_tile,
)
from autoopt.kernels.template import Prediction, Template
from autoopt.kernels.vendor import predict_vendor_matmul
from autoopt.templates.gemm import block_problems, blocks, config_problems, matmul_path, mma_kind
from autoopt.templates.gemv import STAGES, WARPS, GemvTemplate, block_rules

__all__ = ["QuantDequantCublasTemplate", "QuantGemmTemplate", "QuantGemvSwapTemplate", "QuantGemvTemplate"]

#: K-iterations of weight loads a weight-only quant_gemm keeps in flight, whatever its ``num_stages``: the packed W
#: tile is converted on CUDA cores before the dot takes it, and more stages than this bought nothing on an H100
#: (h100/quant_kernels_int4_m32.json, int4 at M = 32, the five Llama-3-8B linears, six configs each: stages 4
#: and 5 within 1-4 % of each other, 3 within 2-5 % of 4, 2 up to 1.43x slower). With it that table's
#: median |ln(predicted / measured)| went 0.32 -> 0.15 and its bias -0.18 -> -0.01; o and down (one CTA an SM,
#: latency-bound) are now priced within 5 % at 2-4 warps. int8 (12 rows at M = 32,
#: h100/quant_kernels_batched.json): 0.20 -> 0.15 at 3. The M = 2048 rows of the same files are compute-bound
#: and do not move. Not captured: 8 warps on o and down run 1.4-1.5x slower than priced; lm_head's 180.6 us is
#: priced 296 (two stages: WEIGHT_ONLY_TWO_STAGE_SLOWDOWN).
WEIGHT_LOAD_DEPTH = {"int4": 2.0, "int8": 3.0}
#: a weight-only quant_gemm's time at ``num_stages = 2`` over the model's, which prices two stages within 1 % of
#: three (these configs are compute- or DRAM-bound in the model, where the load depth does not bind). Measured
#: same-config pairs, two stages over three: int4 at M = 32 on an H100 (h100/quant_kernels_int4_m32.json) 1.12,
#: 1.24, 1.43 and on an H200 (h200/quant_kernels_int4_m32.json) 1.12, 1.28, 1.47 (gate_up at 2 and 4 warps,
#: lm_head at 8); int4's dot path at M = 2048 (h100/quant_kernels_int4dot_prefill.json) 1.23-1.29 (8 pairs).
#: The median, 1.25: where the model ranked a two-stage config first (gate_up and lm_head at M = 32) it now ranks
#: three. Older kernels' rows disagree in both directions (h100/quant_kernels.json 1.08-1.13;
#: quant_kernels_qperf.json int4-asym [256, 128, 64] 0.64-0.77) and are not used.
WEIGHT_ONLY_TWO_STAGE_SLOWDOWN = 1.25

#: the same cap for a W8A8 FP8 quant_gemm off the wgmma path: mma.sync takes no FP8 operands, so both tiles are
#: converted on CUDA cores before the dot, as a weight-only format's W tile is. h100/quant_kernels_batched.json
#: (fp8 at M = 32, the four layer linears, three configs each, all mma.sync): median |ln(predicted / measured)|
#: 0.147 -> 0.074 at 2 (0.247 at 1, 0.134 at 3), bias -0.147 -> -0.064; down (one CTA an SM, 56 K-iterations)
#: -0.28..-0.43 -> -0.03..-0.16. Its M = 2048 rows (wgmma, compute-bound) do not move.
FP8_MMA_SYNC_LOAD_DEPTH = 2.0


#: registers a per-row FMA-path tile element costs (``QuantGemvTemplate.resources``; was 2, which priced 16 x 512 on
#: 8 warps at ~104 registers, two CTAs an SM, where ptxas gives 74 and three fit). With the register-fed load depth
#: (``autoopt.kernels.cost.REGISTER_FED_DEPTH``) the H200 fp8 grid's picks went 1.109x -> 1.041x its best.
PER_ROW_REGS_PER_ELEMENT = 1.25


def _load_depth(op: OpSpec, config: KernelConfig) -> float | None:
    """K-iterations of loads a quant_gemm keeps in flight at most (None: its ``num_stages - 1``)."""
    fmt = _fmt(op)
    if not fmt.quantizes_activations:
        return WEIGHT_LOAD_DEPTH.get(fmt.name)
    return FP8_MMA_SYNC_LOAD_DEPTH if config.path != "wgmma" else None


GEMV_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
GEMM_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
#: a dot's K is BLOCK_K / 2 for int4 (two dots, one per nibble half): mma's 16-bit K step is 16
MIN_BK = 32
#: the plain GEMV's warps and stages (templates/gemv.py); its blocks and splits come through GemvTemplate.axes
GEMV_WARPS, GEMV_STAGES = WARPS, STAGES
GEMM_BMS, GEMM_BNS = (16, 32, 64, 128, 256), (32, 64, 128, 256)
GEMM_WARPS, GEMM_STAGES = (2, 4, 8), (2, 3, 4, 5)
#: GROUP_M only orders tiles; 8 was never slower than 1 for the plain GEMM (templates/gemm.py GROUPS)
GEMM_GROUP_M = 8
#: the dot path's tile rows: mma.sync's M (the kernel pads M to it)
DOT_TILE_M = 16


def _fmt(op: OpSpec) -> WeightFormat:
    fmt = op.weight_format
    assert fmt is not None  # applies() admits only ops with a weight
    return fmt


def _nvidia_tensor_cores(gpu: GPUProfile) -> bool:
    """The kernels are written for NVIDIA's mma/wgmma (e4m3fn, bit layouts); CDNA is not served."""
    f = gpu.features
    return f.tensor_cores and not f.mfma


def _packed_e(fmt: WeightFormat) -> float:
    """Bytes per weight of the packed codes alone (what a tile's loads and shared-memory stages hold)."""
    return fmt.weight_bits / 8


def _bk_problems(fmt: WeightFormat, bk: int, *, dot: bool) -> list[str]:
    """BLOCK_K against the format's groups (powers of two on both sides, so one divides the other)."""
    g = fmt.group_size
    if g and dot and bk > g:
        return [f"BLOCK_K={bk} > the {fmt.spec} group {g}: a dot tile must lie in one group"]
    return []


def _clock_mhz(gpu: GPUProfile) -> float:
    # the boost clock, as the datasheet peaks the cost model runs at assume (H100 SXM: 1980 MHz)
    return float(gpu.sm_clock_max_mhz or 1500)


def _bw(gpu: GPUProfile) -> float:
    return (gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs or 0.0) * 1e9


def _fixed_us(gpu: GPUProfile, op: OpSpec, split: int, c: CostConstants) -> tuple[float, float]:
    """(DRAM us with every operand read once, launches + split-K reduce + activation quantization us):
    the parts of a prediction a bound can take exactly or from below (see :func:`_bound`)."""
    m, n, k = op.shape
    out_e = DTYPE_BYTES[op.out_dtype or op.dtype]
    rate = _bw(gpu) * c.dram_efficiency
    moved = m * k * DTYPE_BYTES[op.compute_dtype] + _fmt(op).weight_bytes(n, k) + m * n * (4 * split if split > 1
                                                                                            else out_e)
    fixed = c.launch_us + act_quant_us(gpu, op)
    if split > 1:
        fixed += c.launch_us + (m * n * 4 * split + m * n * out_e) / rate * 1e6
    return moved / rate * 1e6, fixed


def _bound(gpu: GPUProfile, op: OpSpec, tile_m: int, bn: int, bk: int, split: int, alu_iter_us: float,
           consts: CostConstants | None = None) -> float:
    """A lower bound of :func:`predict_matmul` (plus the activation quantization) for every config with
    this tile and split whose CUDA-core time per K-iteration is at least ``alu_iter_us``.

    predict_matmul returns ``softmax(sm_us, dram_us) + reduce + launches``, nondecreasing in both
    arguments. ``sm_us = work * t_it_eff + fills + epilogue + fix-up`` with ``t_it_eff >= t_it =
    max(t_comp, t_l2, t_issue, alu) + iter_overhead >= max(alu_iter_us, t_l2) + iter_overhead`` (t_l2
    as predict_matmul computes it), ``fills >= dram_latency`` (at least one), the epilogue
    ``tiles_per_sm * epilogue_iters * t_it``, the fix-up >= 0. ``dram_us`` divides bytes >= A + W + C
    once (L2 re-reads >= 1x) by at most ``bandwidth * dram_efficiency`` (the in-flight and run-length
    factors are <= 1). The reduce, launches and activation quantization are added exactly.
    tests/test_quant_templates.py checks the bound against every config's prediction. ``consts``: the constants
    the prediction uses (default: those in effect)."""
    c = consts or constants()
    m, n, k = op.shape
    sms = C.limits(gpu).sm_count
    tiles_per_sm, _, work = matmul_work(m, n, k, tile_m, bn, bk, split, sms)
    e = DTYPE_BYTES[op.compute_dtype]
    it_bytes = (min(tile_m, m) * e / 1 + min(bn, n) * op.weight_elem_bytes / 1) * bk
    t_l2 = it_bytes / (_bw(gpu) * c.l2_bw_ratio / sms) * 1e6
    t_it = max(alu_iter_us, t_l2) + c.iter_overhead_us
    sm = (work + tiles_per_sm * c.epilogue_iters) * t_it + c.dram_latency_us
    dram, fixed = _fixed_us(gpu, op, split, c)
    hi = max(sm, dram)
    p = c.overlap_exponent
    return hi * ((sm / hi) ** p + (dram / hi) ** p) ** (1 / p) + fixed


def _idle(gpu: GPUProfile, smem: int, regs: float, warps: int) -> float:
    """1 / the share of an SM's four schedulers the resident warps keep busy (cost.SUBPARTITIONS)."""
    lim = C.limits(gpu)
    occ = max(1, C.occupancy(lim, smem_bytes=smem, regs_per_thread=regs, threads=warps * lim.warp_size))
    return 4 / min(4, occ * warps)


def _tile_alu_us(gpu: GPUProfile, work: DequantWork, bn: int, bk: int) -> float:
    """CUDA-core microseconds of dequantizing one ``[BLOCK_N, BLOCK_K]`` W tile on one SM at full issue."""
    return bn * bk * cycles_per_weight(gpu, work) / _clock_mhz(gpu)


def _valid_configs(t: Template, kernel: str, gpu: GPUProfile, op: OpSpec, tally: Tally) -> Iterator[KernelConfig]:
    """``t``'s space, counted in ``tally``; invalid configs rejected there (their first problem), never yielded."""
    for cfg in t.space(gpu, op):
        tally.considered += 1
        problems = t.validate(gpu, op, cfg)
        if problems:
            tally.reject(kernel, problems[0])
            continue
        yield cfg


class _QuantTemplate(Template):
    """What both templates share: ops with a packed weight only, NVIDIA tensor-core GPUs, and the space as
    one bounded root per tile (:meth:`node`, bounded by :meth:`node_bound`) over its valid configs."""

    kernel: ClassVar[str] = ""
    quantized_weights = True

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        return op.kind in self.ops and op.weight is not None and _nvidia_tensor_cores(gpu)

    def node(self, config: KernelConfig) -> tuple[int, ...]:
        """The root a valid config hangs under (its tile and split)."""
        raise NotImplementedError

    def node_bound(self, gpu: GPUProfile, op: OpSpec, key: tuple[int, ...]) -> float:
        """:func:`_bound` for every config under the root ``key``."""
        raise NotImplementedError

    def bounded_space(self, gpu: GPUProfile, op: OpSpec) -> BoundedSpace | None:
        """The roots, each with its valid configs beneath (validated here, so the report counts what
        space/validate would); tests/test_quant_templates.py checks every bound against the predictions."""
        tally = Tally()
        groups: dict[tuple[int, ...], tuple[float, list[KernelConfig]]] = {}
        for cfg in _valid_configs(self, self.kernel, gpu, op, tally):
            key = self.node(cfg)
            if key not in groups:
                groups[key] = (self.node_bound(gpu, op, key), [])
            groups[key][1].append(cfg)
        roots: list[tuple[float, Any]] = [(bound, lambda b=bound, ls=tuple(leaves): [(b, cfg) for cfg in ls])
                                          for bound, leaves in groups.values()]
        return tally.space(roots)


class QuantGemvTemplate(_QuantTemplate):
    """Decode GEMV over a packed quantized weight: stream it once, dequantize in registers."""

    name = "quant-gemv"
    ops = ("gemv",)
    kernel = "quant_gemv"

    @staticmethod
    def axes(gpu: GPUProfile, op: OpSpec) -> Iterator[tuple[int, int, list[int]]]:
        """(BLOCK_N, BLOCK_K, SPLIT_K values): the plain GEMV's axes over the stored (padded) K."""
        m, n, k = op.shape
        return GemvTemplate.axes(gpu, OpSpec(kind="gemv", shape=(m, n, _fmt(op).padded_k(k))))

    @staticmethod
    def block_ms(op: OpSpec) -> tuple[int, ...]:
        """``BLOCK_M`` values: ``next_pow2(M)``, and at M = 1 for symmetric int4 also the 16-row dot tile, each
        path faster on some linears: the dot path's loop takes ~3.4 SASS instructions a weight at one warp
        against the FMA path's ~5.8-6.5 (sm_90, counted offline), but since the FMA loop stages its tiles the
        best of each on the H100 (``quant_kernels_fma_pipelined.json``, Llama-3-8B) was dot 16.5 / 14.2 /
        44.0 / 28.3 us against FMA 15.0 / 13.4 / 42.7 / 31.0 (qkv / o / gate_up / down). Asymmetric int4
        keeps the FMA path: its dot tile also sums the activations for the offsets, and its best ran 1.03-1.36x
        the FMA path's (``quant_kernels_int4dot.json``, before the staging)."""
        m = op.shape[0]
        fmt = _fmt(op)
        if m == 1 and fmt.name == "int4" and fmt.symmetric:
            return 1, DOT_TILE_M
        return (C.next_pow2(m),)

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        for bm in self.block_ms(op):
            for bn, bk, splits in self.axes(gpu, op):
                for warps in GEMV_WARPS:
                    for stages in GEMV_STAGES:
                        for s in splits:
                            yield KernelConfig(kernel=self.kernel, template=self.name, path="standard",
                                               params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": s,
                                                       "num_warps": warps, "num_stages": stages})

    @staticmethod
    def resources(gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> tuple[int, float, int]:
        """(smem, regs/thread, threads). FMA path: the packed tile and its fp32 decode in registers (twice
        for per-channel formats, which keep a ``[BLOCK_N, BLOCK_K]`` fp32 accumulator); dot path: the
        GEMM's estimate at M = 16 plus the packed and the 16-bit tile. Pipelined loads (num_stages > 1)
        stage the packed tile and X's slice in shared memory; the dot path also converts the 16-bit
        tile through shared memory once."""
        lim = C.limits(gpu)
        fmt = _fmt(op)
        p = config.params
        bm, bn, bk, warps = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.num_warps
        threads = warps * lim.warp_size
        x_e, w_e = DTYPE_BYTES[op.dtype], _packed_e(fmt)
        packed = bn * bk * w_e
        stages = config.num_stages
        if bm == 1 and fmt.group_size is None:
            # the per-row loop is register-fed (no shared-memory stages) and ptxas folds the decode into the FMAs:
            # 1.25 registers per tile element beside the packed codes. ptxas -v for sm_90 on fp8 (Triton 3.9):
            # 29 / 57 / 74 / 121 registers at 8 / 16 / 32 / 64 elements a thread (16 x 128 ... 32 x 512 on 8 warps;
            # 32 x 128 on 4 warps 72, 16 x 512 on 4 warps 120), int8 16 x 512 on 8 warps 76
            regs = (PER_ROW_REGS_PER_ELEMENT * bn * bk + packed / 4) / threads + C.REG_OVERHEAD
            smem = 0
        elif bm == 1:
            regs = (bn * bk + packed / 4) / threads + C.REG_OVERHEAD
            smem = int(stages * (packed + bk * x_e)) if stages > 1 else 0
        else:
            regs = (C.gemm_regs_per_thread(16, bn, warps, lim.warp_size, wgmma=False)
                    + (packed + 2 * bn * bk) / 4 / threads)
            smem = int(max(stages, 1) * (16 * bk * x_e + packed)) + 2 * bn * bk
        return smem, regs, threads

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = config_problems(config, GEMV_KEYS, self.kernel)
        if out:
            return out
        fmt = _fmt(op)
        m, n, k = op.shape
        kp = fmt.padded_k(k)
        p = config.params
        lim = C.limits(gpu)
        bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
        # the 16-row dot tile at M = 1 (block_ms) stands in for next_pow2(M) in the GEMV's rules
        out += block_rules(gpu, op.dtype, (m, n, kp), C.next_pow2(m) if bm in self.block_ms(op) else bm, bn, bk)
        if out:
            return out
        out += _bk_problems(fmt, bk, dot=bm > 1)
        out += C.check_threads(lim, config.num_warps)
        if config.num_stages < 1:
            out.append(f"num_stages={config.num_stages} must be >= 1")
        out += C.check_split_k(p["SPLIT_K"], bk, kp)
        if config.path != "standard":
            out.append(f"path {config.path!r} is not the quant gemv kernel's ('standard')")
        if out:
            return out
        smem, regs, threads = self.resources(gpu, op, config)
        return C.check_smem(lim, smem) + C.check_regs(lim, regs, threads)

    @staticmethod
    def _work(op: OpSpec, bm: int, bn: int, bk: int) -> DequantWork:
        """Dequantization per weight on this config's path, with the dot path's per-tile scaling
        (int4: ``s P``, 1 FMA an output at M = 16; asymmetric adds ``z S``, 1 FMA an output and 16 row-sum
        adds a K column;
        block-FP8: one scale-and-add an output) spread over the tile's weights."""
        fmt = _fmt(op)
        work = dequant_work(fmt, fma=bm == 1, gemv=True)
        if bm > 1:
            extra = {"int4": 16 / bk + (0.0 if fmt.symmetric else 16 / bk + 16 / bn),
                     "fp8_block": 32 / bk}.get(fmt.name, 0.0)
            work = replace(work, fp_ops=work.fp_ops + extra)
        return work

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        """Priced as optimize()'s decode runs it, replayed from a CUDA graph: each launch (the split-K reduce's too)
        at :data:`~autoopt.kernels.constants.GRAPH_LAUNCH_US`, flagged ``launch_in_graph`` in the breakdown. On
        the H200 (``quant_kernels_fmagrid_graph.json``, 133 int4 configs timed replayed from a graph) a standalone
        launch priced every config 4-5 us over its time and sent ``down`` to one K-slice: 18.2 us against 15.1
        split in two; in-graph, rank()'s picks over the four linears sum to 1.06x the grid's best, from 1.12x."""
        smem, regs, _ = self.resources(gpu, op, config)
        p = config.params
        bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
        alu = _tile_alu_us(gpu, self._work(op, bm, bn, bk), bn, bk) * _idle(gpu, smem, regs, config.num_warps)
        # the dot path computes 16 rows (mma.sync's minimum); the FMA path only the real one
        as_tile = KernelConfig(kernel=config.kernel, path=config.path, template=config.template,
                               params={**p, "BLOCK_M": 1 if bm == 1 else 16, "GROUP_M": 1})
        # the grouped FMA loop (int4, block-FP8) stages its tiles through cp.async when num_stages > 1
        staged = bm > 1 or (_fmt(op).group_size is not None and config.num_stages > 1)
        pred = predict_matmul(gpu, op, as_tile, mma="fma" if bm == 1 else "mma_sync", smem_bytes=smem,
                              regs_per_thread=regs, alu_iter_us=alu, staged_loads=staged,
                              consts=in_graph(constants()))
        # node_bound stays a lower bound: the FMA path's factor is >= 1 and the dot path's scale is in the bound
        fmt = _fmt(op)
        load = 1.0 if bm == 1 else dot_gemv_load_factor(fmt, bn, bk, config.num_warps)
        factor = gemv_measured_factor(fmt) if bm == 1 else DOT_GEMV_SCALE * load
        prologue = gemv_prologue_us(fmt) if bm == 1 else DOT_GEMV_PROLOGUE_US
        reason = f"{pred.reason}; dequant {alu:.3g} us per K-iteration"
        if bm > 1:
            loads = f" x{load:.3g} (a thread's loads)" if load != 1.0 else ""
            reason += (f"; x{DOT_GEMV_SCALE:g}{loads} + {prologue:g} us measured (dot path, "
                       "quant_cost.DOT_GEMV_SCALE / _LOAD_EXPONENT / _PROLOGUE_US)")
        elif factor != 1.0:
            reason += f"; x{factor:g} measured ({fmt.spec} GEMV, quant_cost.GEMV_MEASURED_FACTOR)"
        if bm == 1 and prologue:
            reason += f"; +{prologue:g} us staged prologue (quant_cost.GEMV_PROLOGUE_US)"
        us = pred.us * factor + prologue
        return replace(pred, us=us, roofline_pct=pred.roofline_pct * pred.us / us, reason=reason,
                       breakdown={**pred.breakdown, "dequant_iter_us": alu, "measured_factor": factor,
                                  "prologue_us": prologue, "launch_in_graph": 1.0})

    def node(self, config: KernelConfig) -> tuple[int, ...]:
        p = config.params
        return p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["SPLIT_K"]

    def node_bound(self, gpu: GPUProfile, op: OpSpec, key: tuple[int, ...]) -> float:
        """At full issue (idle factor 1); the dot path modelled at M = 16 as predict does, launches in-graph."""
        bm, bn, bk, split = key
        alu = _tile_alu_us(gpu, self._work(op, bm, bn, bk), bn, bk)
        bound = _bound(gpu, op, 1 if bm == 1 else 16, bn, bk, split, alu, in_graph(constants()))
        if bm == 1:
            return bound
        # the loads' factor at its least: the tile spread over the most warps the space holds
        load = dot_gemv_load_factor(_fmt(op), bn, bk, max(GEMV_WARPS))
        return bound * DOT_GEMV_SCALE * min(1.0, load)


class QuantGemvSwapTemplate(_QuantTemplate):
    """Batched decode (2-32 tokens) with the weight tile as the MMA's A operand: 64 or 128 weight rows a program,
    the tokens in dots of N = 8 on each decoded tile (``quant_gemv_swap``). Beside ``quant-gemv``'s dot path (which
    pads the tokens to 16 as the MMA's M) and, at 17-32 tokens, ``quant-gemm``; rank() prices them all and takes the
    fastest. Serves fp8, int8 and symmetric int4 as GEMVs and, past 16 tokens, the weight-only ones (a W8A8 GEMM
    quantizes its activations, which this kernel does not); keys as ``quant-gemv``'s, ``BLOCK_M`` the token tile."""

    name = "quant-gemv-swap"
    ops = ("gemv", "gemm")
    kernel = "quant_gemv_swap"
    #: the most tokens: four dots of N = 8 on one decoded tile
    MAX_TOKENS = 32
    BLOCK_NS = (64, 128)
    WARPS = (4, 8)
    STAGES = (3, 5)
    SPLITS = (1, 2, 4, 8)

    @staticmethod
    def token_tile(m: int) -> int:
        """``BLOCK_M``: 8, 16 or 32 (one, two or four dots of N = 8 on each decoded tile)."""
        return swap_token_tile(m)

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        fmt = op.weight_format
        if not super().applies(gpu, op) or fmt is None or not 2 <= op.shape[0] <= self.MAX_TOKENS:
            return False
        if op.kind == "gemm" and fmt.quantizes_activations:
            return False
        return fmt.name in ("fp8", "int8") or (fmt.name == "int4" and fmt.symmetric)

    @staticmethod
    def block_ks(fmt: WeightFormat) -> tuple[int, ...]:
        """int4: a tile within one group (64 or 128 codes); fp8 / int8: 128 or 256 bytes of a row."""
        return (64, 128) if fmt.name == "int4" else (128, 256)

    def axes(self, op: OpSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(BLOCK_K values, warps) for the op's token tile. At 32 tokens four accumulators: 8 warps and int4's
        64-wide tile there ran 1.1-20x slower (``h200/gemv_swap_probe_m32_tree.json``: int4 gate_up 128 x 64 on 8
        warps 246 us against 42.3 on 4 at 128 x 128; int8 o on 8 warps 24.1 against 10.9), so they are left out."""
        fmt = _fmt(op)
        if self.token_tile(op.shape[0]) < 32:
            return self.block_ks(fmt), self.WARPS
        return (128,) if fmt.name == "int4" else self.block_ks(fmt), self.WARPS[:1]

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        """64-row tiles on 4 warps only: on 8 they ran 1.2-1.8x the 4-warp time of the same tile at M = 8, where
        the price (which saturates issue at 12 resident warps) ties them (h200/quant_kernels_m8_swap_graph.json:
        int4 gate_up 42.1 against 27.9 us, fp8 64.8 against 36.4)."""
        bks, warp_set = self.axes(op)
        for bn in self.BLOCK_NS:
            for bk in bks:
                for warps in warp_set if bn > 64 else warp_set[:1]:
                    for stages in self.STAGES:
                        for s in self.SPLITS:
                            yield KernelConfig(kernel=self.kernel, template=self.name, path="standard",
                                               params={"BLOCK_M": self.token_tile(op.shape[0]), "BLOCK_N": bn,
                                                       "BLOCK_K": bk,
                                                       "SPLIT_K": s, "num_warps": warps, "num_stages": stages})

    @staticmethod
    def resources(gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> tuple[int, float, int]:
        """(smem, regs/thread, threads): each stage holds the packed tile and the tokens' slice; registers hold
        the decoded 16-bit tile and the fp32 accumulator."""
        lim = C.limits(gpu)
        p = config.params
        bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
        threads = config.num_warps * lim.warp_size
        smem = int(config.num_stages * (bn * bk * _packed_e(_fmt(op)) + bm * bk * DTYPE_BYTES[op.dtype]))
        regs = (bn * bk * 2 + bn * bm * 4) / 4 / threads + C.REG_OVERHEAD
        return smem, regs, threads

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = config_problems(config, GEMV_KEYS, self.kernel)
        if out:
            return out
        fmt = _fmt(op)
        m, _, k = op.shape
        p = config.params
        bm, bn, bk, split = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["SPLIT_K"]
        if bm != self.token_tile(m):
            out.append(f"BLOCK_M={bm} must be the token tile {self.token_tile(m)} for M={m} (8 up to 8 tokens, "
                       f"16 up to 16, 32 up to {self.MAX_TOKENS})")
        if bn not in self.BLOCK_NS:
            out.append(f"BLOCK_N={bn} must be one of {self.BLOCK_NS} (the MMA's M: weight rows a program)")
        if bk not in self.block_ks(fmt):
            out.append(f"BLOCK_K={bk} must be one of {self.block_ks(fmt)} for {fmt.spec}")
        elif fmt.group_size and bk > fmt.group_size:
            out.append(f"BLOCK_K={bk} > the {fmt.spec} group {fmt.group_size}: a tile must lie in one group")
        if fmt.padded_k(k) != k:
            out.append(f"K={k} is padded to {fmt.padded_k(k)} in the packed rows (the kernel loads X unmasked)")
        kp = fmt.padded_k(k)
        tiles = C.whole_k_tiles(kp // 2, bk // 2, split) if fmt.name == "int4" else C.whole_k_tiles(kp, bk, split)
        if tiles is None or tiles < 2:
            out.append(f"K={k} must be at least two whole BLOCK_K={bk} tiles a split over SPLIT_K={split}")
        out += C.check_threads(C.limits(gpu), config.num_warps)
        if config.num_stages < 1:
            out.append(f"num_stages={config.num_stages} must be >= 1")
        if config.path != "standard":
            out.append(f"path {config.path!r} is not the swapped quant gemv kernel's ('standard')")
        if out:
            return out
        smem, regs, threads = self.resources(gpu, op, config)
        lim = C.limits(gpu)
        return C.check_smem(lim, smem) + C.check_regs(lim, regs, threads)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        """:func:`~autoopt.kernels.quant_cost.swap_gemv_us` (fitted on the H200's graph-replayed grid, whose
        constants and data are documented there): as optimize()'s decode runs it, replayed from a CUDA graph."""
        p = config.params
        t = swap_gemv_us(gpu, op, block_n=p["BLOCK_N"], block_k=p["BLOCK_K"], split_k=p["SPLIT_K"],
                         warps=config.num_warps)
        us = t.us
        reason = (f"swapped GEMV: {t.fixed_us:g} us fixed + x{t.scale:.3g} max(DRAM {t.dram_us:.3g}, "
                  f"busiest SM's stream {t.sm_stream_us:.3g}, decode {t.decode_us:.3g}) + loop {t.loop_us:.3g} us "
                  "(quant_cost.SWAP_GEMV_*, fitted on h200/gemv_swap_probe.json)")
        return Prediction(us=us, bound=t.bound, roofline_pct=min(100.0, 100.0 * floor_us(gpu, op) / us), reason=reason,
                          breakdown={"dram_us": t.dram_us, "sm_stream_us": t.sm_stream_us, "decode_us": t.decode_us,
                                     "loop_us": t.loop_us, "fixed_us": t.fixed_us, "launch_in_graph": 1.0})

    def node(self, config: KernelConfig) -> tuple[int, ...]:
        p = config.params
        return p["BLOCK_N"], p["BLOCK_K"], p["SPLIT_K"]

    def node_bound(self, gpu: GPUProfile, op: OpSpec, key: tuple[int, ...]) -> float:
        """The price at the most warps the space holds (only the decode term depends on warps, and falls)."""
        bn, bk, split = key
        return swap_gemv_us(gpu, op, block_n=bn, block_k=bk, split_k=split, warps=max(self.WARPS)).us


class QuantGemmTemplate(_QuantTemplate):
    """Prefill GEMM over a packed quantized weight: W8A8 on FP8 tensor cores, or W dequantized on chip."""

    name = "quant-gemm"
    ops = ("gemm",)
    kernel = "quant_gemm"

    @staticmethod
    def block_ks(fmt: WeightFormat) -> tuple[int, ...]:
        """BLOCK_K candidates: W8A8 fp8 adds 256 (a 256-byte e4m3 row, as 128 at 16 bits)."""
        return (32, 64, 128, 256) if fmt.name == "fp8" and fmt.quantizes_activations else (32, 64, 128)

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        fmt = _fmt(op)
        m, n, k = op.shape
        for bm in blocks(GEMM_BMS, m, 16):
            for bn in blocks(GEMM_BNS, n, 32):
                for bk in blocks(self.block_ks(fmt), fmt.padded_k(k), MIN_BK):
                    for warps in GEMM_WARPS:
                        path = matmul_path(gpu, bm, warps)
                        for stages in GEMM_STAGES:
                            yield KernelConfig(kernel=self.kernel, template=self.name, path=path,
                                               params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                                       "GROUP_M": GEMM_GROUP_M, "num_warps": warps,
                                                       "num_stages": stages})

    @staticmethod
    def resources(gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> tuple[int, float, int]:
        """(smem, regs/thread, threads): pipelined stages of A (in the MMA's dtype) and the packed W tile;
        weight-only paths also hold the dequantized 16-bit W tile once in shared memory (the dot's
        operand) and the packed + 16-bit tile in registers while they convert it."""
        lim = C.limits(gpu)
        fmt = _fmt(op)
        p = config.params
        bm, bn, bk, warps = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.num_warps
        threads = warps * lim.warp_size
        a_e, w_e = DTYPE_BYTES[op.compute_dtype], _packed_e(fmt)
        smem = int(config.num_stages * (bm * bk * a_e + bn * bk * w_e))
        regs = C.gemm_regs_per_thread(bm, bn, warps, lim.warp_size, wgmma=config.path == "wgmma")
        if not fmt.quantizes_activations:
            smem += 2 * bn * bk
            regs += bn * bk * (w_e + 2) / 4 / threads
        return smem, regs, threads

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = config_problems(config, GEMM_KEYS, self.kernel)
        if out:
            return out
        fmt = _fmt(op)
        p = config.params
        m, n, k = op.shape
        lim = C.limits(gpu)
        bm, bn, bk, warps = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.num_warps
        out += C.check_dtype(gpu, op.dtype)
        if fmt.quantizes_activations and not gpu.features.fp8:
            out.append(f"{fmt.spec} runs e4m3 x e4m3 on FP8 tensor cores (sm_89+); {gpu.arch or gpu.name} has "
                       f"none: use the weight-only '{fmt.name}-wo'")
        out += block_problems((("BLOCK_M", bm, m, 16), ("BLOCK_N", bn, n, 32),
                               ("BLOCK_K", bk, fmt.padded_k(k), MIN_BK)))
        if out:
            return out
        out += _bk_problems(fmt, bk, dot=True)
        if bk > max(self.block_ks(fmt)):
            out.append(f"BLOCK_K={bk} > {max(self.block_ks(fmt))} for {fmt.spec}")
        out += C.check_threads(lim, warps)
        if config.num_stages < 1:
            out.append(f"num_stages={config.num_stages} must be >= 1")
        if p["GROUP_M"] < 1:
            out.append(f"GROUP_M={p['GROUP_M']} must be >= 1")
        want = matmul_path(gpu, bm, warps)
        if config.path != want:
            out.append(f"path {config.path!r} does not match what Triton emits here ({want!r})")
        if config.path == "wgmma":
            # int4 runs two dots of BLOCK_K / 2 (one per nibble half)
            out += C.wgmma_problems(bm, bn, bk // 2 if fmt.name == "int4" else bk, warps, op.compute_dtype)
        if out:
            return out
        smem, regs, threads = self.resources(gpu, op, config)
        return C.check_smem(lim, smem) + C.check_regs(lim, regs, threads)

    @staticmethod
    def _alu_us(gpu: GPUProfile, op: OpSpec, bm: int, bn: int, bk: int, path: str) -> float:
        """CUDA-core us per K-iteration of a tile: dequantizing W (weight-only formats) with the per-tile
        scaling (int4: 2 FMAs an output and a row sum of A; block-FP8: a scale-and-add an output).
        Block-FP8 W8A8 adds each tile's dot and its scaling one after the other (the product must be
        complete before it is scaled: a serial chain within the warps), a lead to calibrate."""
        fmt = _fmt(op)
        clock = _clock_mhz(gpu)
        if fmt.quantizes_activations:
            if fmt.activation != "per_token_group":
                return 0.0
            scale = 2 * bm * bn / fp32_lanes(gpu) / clock  # acc += dot * (a_s * w_s): mul + fma an output
            peak = peak_flops(gpu, "fp8")
            c = constants()
            mma = 2.0 * bm * bn * bk / (peak * c.tc_efficiency / C.limits(gpu).sm_count) * 1e6 if peak else 0.0
            return (mma + scale) * BLOCK_FP8_SERIAL_FACTOR
        work = dequant_work(fmt, fma=False, wgmma=path == "wgmma")
        extra = {"int4": 2 * bm / bk + bm / bn, "fp8_block": 2 * bm / bk}.get(fmt.name, 0.0)
        work = replace(work, fp_ops=work.fp_ops + extra)
        return _tile_alu_us(gpu, work, bn, bk)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        smem, regs, _ = self.resources(gpu, op, config)
        p = config.params
        alu = self._alu_us(gpu, op, p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.path)
        alu *= _idle(gpu, smem, regs, config.num_warps)
        pred = predict_matmul(gpu, op, config, mma=mma_kind(config.path), smem_bytes=smem, regs_per_thread=regs,
                              alu_iter_us=alu, max_depth=_load_depth(op, config))
        if config.num_stages == 2 and not _fmt(op).quantizes_activations:
            slow = WEIGHT_ONLY_TWO_STAGE_SLOWDOWN
            pred = replace(pred, us=pred.us * slow, roofline_pct=pred.roofline_pct / slow,
                           reason=f"{pred.reason}; x{slow} for two stages")
        act = act_quant_us(gpu, op)
        reason = f"{pred.reason}; CUDA-core {alu:.3g} us per K-iteration"
        if not act:
            return replace(pred, reason=reason, breakdown={**pred.breakdown, "dequant_iter_us": alu})
        total = pred.us + act
        return replace(pred, us=total, roofline_pct=min(100.0, 100.0 * floor_us(gpu, op) / total),
                       reason=f"{reason}; + activation quantization {act:.2f} us (a second launch)",
                       breakdown={**pred.breakdown, "dequant_iter_us": alu, "act_quant_us": act})

    def node(self, config: KernelConfig) -> tuple[int, ...]:
        p = config.params
        return p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]

    def node_bound(self, gpu: GPUProfile, op: OpSpec, key: tuple[int, ...]) -> float:
        """With the smaller CUDA-core time of the tile's two paths, at full issue."""
        bm, bn, bk = key
        alu = min(self._alu_us(gpu, op, bm, bn, bk, path) for path in ("standard", "wgmma"))
        return _bound(gpu, op, bm, bn, bk, 1, alu)



#: the dequantization kernel's one config (``quant_dequant.py``): a [16, 256] tile, 2 warps. Of six tiles
#: timed on an H100 (benchmarks/results/h100/quant_perf_probe.json, M = 2048, the five Llama-3-8B
#: linears), the steadiest: int4 total 4957 us ([32, 256] x4 warps: 5046; [8, 1024]: 4814 but 175 us
#: on o where the others took 114). On the H200, over 28 tiles (h200/dequant_probe.json, the pass alone on the
#: four linears), it is 6 % behind the best on int4 (167 against 158 us a layer, [8, 512] x 8 warps) and 1 %
#: on int8 (177 against 174): kept.
DEQUANT_PARAMS = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 2}


class QuantDequantCublasTemplate(Template):
    """Prefill over a weight-only packed weight as a dequantization pass into a 16-bit scratch ``[N, K]``
    and cuBLAS's GEMM on it (``autoopt/backend/kernels/quant_dequant.py``).

    Cost: the pass as a stream (packed weight and scales read once, ``2 N K`` bytes written, at the
    streaming kernels' DRAM efficiency, plus a launch) plus :func:`~autoopt.kernels.vendor.predict_vendor_matmul`
    of the bf16/fp16 GEMM (cuBLAS's roofline fitted on the H100/H200). Offered only where that fit exists,
    for 16-bit activations, and for formats that leave activations alone (a W8A8 GEMM computes a
    different product). One config: the pass is bandwidth-bound whatever its tile. On an H100 probe
    (``benchmarks/results/h100/quant_perf_probe.json``: int4 and int8 on the five Llama-3-8B linears at
    M = 2048) this price was within median |ln(pred/measured)| ~0.06 of the measured path (worst: o int4,
    one tile, 0.35); the bf16 GEMM alone ran 0.9x-1.07x its vendor prediction."""

    name = "quant-dequant-cublas"
    ops = ("gemm",)
    kernel = "quant_dequant_cublas"
    quantized_weights = True

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        fmt = op.weight_format
        return (op.kind in self.ops and fmt is not None and not fmt.quantizes_activations
                and op.dtype in ("bf16", "fp16") and (op.out_dtype or op.dtype) == op.dtype
                and _nvidia_tensor_cores(gpu) and self._gemm_us(gpu, op) is not None)

    @staticmethod
    def _gemm_us(gpu: GPUProfile, op: OpSpec) -> float | None:
        return predict_vendor_matmul(gpu, OpSpec(kind="gemm", shape=op.shape, dtype=op.dtype))

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        yield KernelConfig(kernel=self.kernel, template=self.name, path="standard", params=dict(DEQUANT_PARAMS))

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        out = config_problems(config, tuple(DEQUANT_PARAMS), self.kernel)
        if out:
            return out
        p = config.params
        out += C.check_threads(C.limits(gpu), config.num_warps)
        for key in ("BLOCK_N", "BLOCK_K"):
            if p[key] < 16 or p[key] & (p[key] - 1):
                out.append(f"{key}={p[key]} must be a power of two >= 16")
        if config.path != "standard":
            out.append(f"path {config.path!r} is not the dequantize + cuBLAS kernel's ('standard')")
        return out

    @staticmethod
    def dequant_us(gpu: GPUProfile, op: OpSpec) -> float:
        """The dequantization pass: packed bytes read + the 16-bit weight written, as a stream."""
        c = constants()
        _, n, k = op.shape
        moved = _fmt(op).weight_bytes(n, k) + n * k * DTYPE_BYTES[op.dtype]
        bw = _bw(gpu)
        return c.launch_us + (moved / (bw * c.stream_dram_efficiency) * 1e6 if bw else 0.0)

    def bounded_space(self, gpu: GPUProfile, op: OpSpec) -> BoundedSpace | None:
        """Each valid config is its own root, bounded by its prediction (exact: two closed forms)."""
        tally = Tally()
        roots: list[tuple[float, Any]] = [(self.predict(gpu, op, cfg).us, cfg)
                                          for cfg in _valid_configs(self, self.kernel, gpu, op, tally)]
        return tally.space(roots)

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        gemm = self._gemm_us(gpu, op)
        assert gemm is not None  # applies() requires the fit
        deq = self.dequant_us(gpu, op)
        total = gemm + deq
        return Prediction(us=total, bound="compute" if gemm > deq else "memory",
                          roofline_pct=min(100.0, 100.0 * floor_us(gpu, op) / total),
                          reason=f"dequantize W to a 16-bit scratch {deq:.3g} us + cuBLAS GEMM {gemm:.3g} us",
                          breakdown={"dequant_us": deq, "vendor_gemm_us": gemm})
