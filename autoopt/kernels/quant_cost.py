"""What dequantizing a packed weight costs the SM: instructions per weight and the rates that run them.

A kernel over a quantized weight streams fewer bytes than a bf16 one but spends CUDA-core
instructions turning codes into numbers. At decode on an H100, int4 at ~3 TB/s is ~5.8e12 weights/s:
with one int->float conversion a weight (16 a clock per SM) the conversions alone would take
132 SMs x 1.98 GHz x 16 = 4.2e12/s, so dequantization, not bandwidth, would bind. The kernels
(``autoopt/backend/kernels/quant_gemv.py``, ``quant_gemm.py``) therefore turn codes into floats by bit
tricks, and this module prices what they run: :func:`dequant_work` counts instructions per weight
per format and path, :func:`cycles_per_weight` runs them at the SM's rates (whichever of issue, INT32,
FP32, conversion and shared-memory bandwidth binds), and the templates hand the result to
:func:`autoopt.kernels.cost.predict_matmul` as the CUDA-core time of a K-iteration, which overlaps
the MMA and the loads (the slower of them sets the iteration).

Status of the numbers: the per-SM rates are datasheet values (sources beside each); the
instruction counts are derived by hand from the kernels' source (what each line compiles to, as
counted in the comments), not read from SASS and not fitted: leads a GPU run is to calibrate
(``benchmarks/quant_kernels.py`` measures achieved GB/s per format and path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.constants import constants
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.quant import FP8_BLOCK, WeightFormat

__all__ = [
    "BLOCK_FP8_SERIAL_FACTOR",
    "DEQUANT_RATES",
    "DOT_GEMV_LOAD_EXPONENT",
    "DOT_GEMV_LOAD_REF_BYTES",
    "DOT_GEMV_PROLOGUE_US",
    "DOT_GEMV_SCALE",
    "DOT_MEASURED_FACTOR",
    "GEMV_DOT_MEASURED_FACTOR",
    "GEMV_MEASURED_FACTOR",
    "GEMV_PROLOGUE_US",
    "MMA_MEASURED_FACTOR",
    "SWAP_GEMV_DECODE_CYCLES",
    "SWAP_GEMV_SCALE",
    "DequantRates",
    "DequantWork",
    "SwapGemvTerms",
    "act_quant_us",
    "cycles_per_weight",
    "dequant_work",
    "dot_gemv_load_factor",
    "fp32_lanes",
    "gemv_measured_factor",
    "gemv_prologue_us",
    "swap_gemv_us",
    "swap_token_tile",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DequantRates:
    """Per-SM, per-clock rates of the units dequantization uses (NVIDIA sm_80..sm_90)."""

    #: lane-instructions issued a clock: 4 warp schedulers, one 32-lane warp instruction each (H100 and
    #: A100 whitepapers: four processing blocks per SM)
    issue: float = 128.0
    #: INT32 lanes (shifts, logic, integer adds): 64 per SM on GA100 and GH100 (whitepapers: 16 INT32
    #: units per processing block); CUDA C++ Programming Guide, arithmetic throughput table: 64 for 8.x/9.0
    int32: float = 64.0
    #: type conversions other than 8/16 -> 32-bit integer widening ("all other type conversions"): 16 a
    #: clock per SM for compute capability 7.x-9.0 (CUDA C++ Programming Guide, same table)
    cvt: float = 16.0
    #: shared-memory bytes a clock per SM: 32 banks x 4 B (CUDA guide, all sm_5x+); matches
    #: CostConstants.smem_bytes_per_clk
    smem_bytes: float = 128.0


DEQUANT_RATES = DequantRates()

#: Measured over hand-counted work of the Triton dequantize-in-the-K-loop GEMM (``quant_gemm.py``, dot
#: path), fitted on timed configs of Llama-3-8B's linears at M = 2048 on the H100 (replayed by
#: ``benchmarks/replay_quant.py``). int4, since its codes decode by PTX (``quant_gemv.int4_unpack16``):
#: ``quant_kernels_int4dot_prefill.json``, 32 configs over both int4 formats ran 2.3-3.5x the hand
#: count's price (gate_up 842 us priced, 1931-2979 measured); x16 takes median |ln(pred/measured)| from
#: 1.01 to 0.21. The factor stands for what the count misses (the wgmma operand's trip through shared
#: memory after the decode, loads the pipeliner does not stage, spills at 128 x 256 tiles), not an
#: instruction count. int8 x1.5 (first run, ``quant_kernels.json``: median |ln| 0.28 -> 0.03). e4m3
#: weight-only was not timed: x1, a lead. The GEMV's dot path (M <= 16) keeps the hand count: its
#: conversion runs on the packed bytes in registers (Triton moves the layout change before the decode),
#: and on ``quant_kernels_int4dot.json`` (642 dot configs) no factor from 0.5 to 16 beat x1's median
#: |ln| 0.33 (symmetric).
DOT_MEASURED_FACTOR = {"int4": 16.0, "int4-asym": 16.0, "int8": 1.5}
#: The same GEMM on mma.sync (tiles under 64 rows: the decoded tile reaches the MMA in registers, Triton
#: moving the layout change before the decode). The wgmma factor above over-priced it: at M = 32 on the
#: H100 (``quant_kernels_batched.json``, 12 int4 configs over the four linears) x16 priced 1.65x the
#: measured median, so rank() sent M = 32 to dequantize + cuBLAS, 1.3-3.1x slower than the Triton GEMM.
#: Fitted there (in-sample): x4 takes median |ln(pred/measured)| 0.141 (x1) -> 0.108 (x6: 0.114); M = 2048
#: stays on wgmma, unchanged (0.21).
MMA_MEASURED_FACTOR = {"int4": 4.0, "int4-asym": 4.0}
#: The decode GEMV's dot path (M 2..16, and symmetric int4 at M = 1), by format: int4 keeps the hand
#: count (``quant_kernels_int4dot.json``: no factor from 0.5 to 16 beat x1); e4m3 (``fp8``, its weights
#: converted to bf16 for the dot) at M = 8 ran 1.0-1.9x its hand-counted price over 12 configs
#: (``quant_kernels_batched.json``): x2 takes median |ln(pred/measured)| 0.301 -> 0.152 there (in-sample;
#: x2.5: 0.160).
GEMV_DOT_MEASURED_FACTOR = {"int4": 1.0, "fp8": 2.0, "int8": 1.0}
#: The decode GEMV's dot path (M 2..16) whole, on the H200 replayed from a CUDA graph
#: (``benchmarks/results/h200/quant_kernels_m8_m16_graph.json``: rank()'s first six configs per linear, format and
#: M = 8 / 16, 144 timed over Llama-3-8B's four linears): its price ran 0.78-0.90x the small linears' (qkv, o,
#: down) and 1.10-1.74x gate_up's, the shape of a fixed cost per launch (the cp.async stages filling before the
#: first MMA, the last wave alone) charged in proportion instead. x0.9 + 3.0 us takes median |ln(pred/measured)|
#: int4 0.152 -> 0.082, fp8 0.215 -> 0.076, int8 0.211 -> 0.097 (with int8's hand count, below); one pair for the
#: three formats (per format the best pairs were 0.8 + 3, 0.8 + 5, 1.0 + 1). Out of sample, the H200's nine
#: one-GPU regret tables re-scored: graphed rows 120 -> 124 / 124 within 15 %, int8 graphed at batch 8 / 16
#: 1.13 / 1.17 -> 0.95 / 0.98, int4 0.96 / 0.93 -> 0.99 / 0.96 (fp8 unchanged, 0.93 / 0.90).
DOT_GEMV_SCALE = 0.9
DOT_GEMV_PROLOGUE_US = 3.0
#: The dot path's weight bytes a thread loads each K-iteration (``BLOCK_N x BLOCK_K x bytes a weight / threads``)
#: move its time as ``(bytes / DOT_GEMV_LOAD_REF_BYTES) ** exponent``, by format: a thread's loads and their
#: conversions issue in turn, so the same tile on fewer warps runs longer than its bytes say, and more warps on
#: small slices run shorter. fp8 at M = 8 / 16 on the H200, rank()'s first 24 configs per linear replayed from a
#: CUDA graph (``h200/quant_kernels_fp8_m8_m16_top24_graph.json``, 192 configs): priced without it, 32 / 64 bytes a
#: thread ran 0.81-0.94x their price, 256 bytes 1.15-1.30x (o's 32 x 256 tile on 2 warps 19.7 us against 10.9 on
#: 4, priced alike), and rank()'s first config measured 1.86x the grid's best on o, 1.44 / 1.60x on qkv. At 0.1:
#: that grid's median |ln| 0.121 -> 0.110, rank()'s first configs o 1.03x, qkv 1.23 / 1.33x, gate_up 1.15 /
#: 1.13x the best (down's first not in the grid); on the earlier six-a-linear grid (quant_kernels_m8_m16_graph.json)
#: int8's o 1.63 / 1.18x -> 1.00x, median |ln| fp8 0.076 -> 0.087, int8 0.097 -> 0.105. int4 (half-byte weights,
#: paired conversions) keeps the same picks with or without it and is priced in its decode step within 3 % of
#: its traces (0.996x at batch 8, 0.973x at 32), which the term would move 2-7 % under: none. What it leaves: two
#: stages of a 128-deep K tile run 6-16 % over three or four (too little in flight), priced alike; split-K 2-4 on
#: 4-8 warps is the grid's best on qkv and down and ranks below one K-slice.
DOT_GEMV_LOAD_EXPONENT = {"fp8": 0.1, "int8": 0.1}
DOT_GEMV_LOAD_REF_BYTES = 128.0


def dot_gemv_load_factor(fmt: WeightFormat, block_n: int, block_k: int, warps: int) -> float:
    """:data:`DOT_GEMV_LOAD_EXPONENT`'s factor for a dot-path decode GEMV tile of ``fmt`` on ``warps`` warps."""
    exponent = DOT_GEMV_LOAD_EXPONENT.get(fmt.name, 0.0)
    per_thread = block_n * block_k * fmt.weight_bits / 8 / (32 * warps)
    return float((per_thread / DOT_GEMV_LOAD_REF_BYTES) ** exponent)


#: The int4 decode GEMV (FMA path, M = 1) against its hand count, refitted after the paired-bf16 decode
#: and elementwise accumulation (``quant_gemv.int4_pair_dot``): on the H100 FMA grid
#: (``benchmarks/results/h100/quant_kernels_fmagrid.json``, 141 symmetric and 129 asymmetric timed configs
#: over Llama-3-8B's four decode linears) x1.15 takes median |ln(pred/measured)| to 0.135 (x1: 0.175, median
#: ratio 0.84) and x1.4 the asymmetric to 0.151 (x1: 0.336, ratio 0.71: its per-tile activation sums for the
#: offsets, a cross-thread reduction, are not in the hand count). The kernel before (fp32 decode, group sums
#: inside the loop) ran 1.5x its count (``quant_kernels_qperf.json``). Symmetric int4 again after the word
#: path (``int4_word_dot``, 2.5 instructions a weight) with launches priced in-graph, on the H200 timed
#: replayed from a graph (``benchmarks/results/h200/quant_kernels_fmagrid_graph.json``, 133 configs): x1.15
#: keeps median |ln| 0.088, median ratio 1.02 (x1.1: 0.088, x1.0: 0.124, x1.3: 0.145). Symmetric int4 is now
#: priced at its hand count plus :data:`GEMV_PROLOGUE_US` instead of x1.15.
GEMV_MEASURED_FACTOR = {"int4": 1.0, "int4-asym": 1.4}
#: us the symmetric int4 decode GEMV (FMA path, M = 1) pays a launch beyond its hand count: its loop stages the
#: packed weights through cp.async, so no FMA starts until the first stages land, and its last wave drains
#: alone; a fixed cost, which the x1.15 it replaces charged in proportion (so the small ``o`` and ``qkv`` GEMVs,
#: ~7 us, were priced 0.76-0.87x their time and the 23 us gate_up 1.03x). On the H200's graph-replayed grid
#: (``benchmarks/results/h200/quant_kernels_fmagrid_graph.json``, 133 symmetric configs, the word path) x1 + 1.75
#: takes median |ln(pred/measured)| 0.088 -> 0.076 (x1 + 1.5: 0.077, + 2.0: 0.081; x1.05 + 1.0: 0.082) and
#: rank()'s picks keep 1.058x the grid's best; their prices against their times: qkv 7.47 / 7.85, o 6.89 / 6.82,
#: gate_up 22.81 / 23.53, down 14.20 / 15.10 us (6.57, 5.91, 24.21, 14.31 at x1.15). The per-row fp8 grid
#: (``quant_kernels_fp8_grid_graph.json``) asks for none (+0.5: 0.103 -> 0.089, within noise; not taken).
GEMV_PROLOGUE_US = {"int4": 1.75}
#: Block-FP8 W8A8: each K-tile's dot completes before its scaling (a serial chain per tile). The hand
#: count (the tile's MMA at tc_efficiency + the scaling FMAs) under-priced it 2.65x on the same run
#: (gate_up 492 us predicted, 1301-1410 measured); x3.0 fits the 15 configs (median |ln| 0.97 -> 0.03).
BLOCK_FP8_SERIAL_FACTOR = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DequantWork:
    """Instructions (lane-instructions) per weight element, by the unit that runs them."""

    int_ops: float = 0.0
    fp_ops: float = 0.0
    cvt_ops: float = 0.0
    #: shared-memory bytes per weight moved to give the MMA its operand (dot paths only)
    smem_bytes: float = 0.0


def gemv_prologue_us(fmt: WeightFormat) -> float:
    """us the decode GEMV's launch pays before its loop streams, by format (0 where none was found)."""
    return GEMV_PROLOGUE_US.get(fmt.name, 0.0) if fmt.name != "int4" or fmt.symmetric else 0.0


def gemv_measured_factor(fmt: WeightFormat) -> float:
    """What the decode GEMV's measured time runs over its hand count, by format (1 where none was found)."""
    if fmt.name == "int4":
        return GEMV_MEASURED_FACTOR["int4" if fmt.symmetric else "int4-asym"]
    return 1.0


def dequant_work(fmt: WeightFormat, *, fma: bool, wgmma: bool = False, w8a8: bool = False,
                 gemv: bool = False) -> DequantWork:
    """Per-weight work of the code the kernels run for ``fmt`` (hand counts, see the module docstring).

    ``fma``: the M = 1 GEMV path (fp32 FMAs, the FMA itself counted: one a weight); else a dot path
    (the tensor cores multiply). ``w8a8``: a GEMM on e4m3 activations and weights, which dequantizes
    nothing (GEMVs never quantize activations, so they pass False). ``wgmma``: the dot reads its W
    operand from shared memory (sm_90a), so the dequantized tile is stored there once (2 bytes a
    weight); mma.sync takes it in registers through a layout conversion via shared memory (stored
    and read back: 4 bytes a weight). ``gemv``: the decode GEMV's dot path, priced by the hand count
    (``DOT_MEASURED_FACTOR`` is the GEMM's).
    """
    if w8a8:
        return DequantWork()
    # Every path first takes the byte out of its loaded 32-bit word (a PRMT/SHF: 1 op a byte).
    if fma:
        if fmt.name == "int4" and fmt.symmetric:
            # quant_gemv.int4_word_dot's PTX, a 32-bit word (8 weights) a call: PRMT 1, SHF 3, LOP3 4 to
            # decode, SHL 1 and LOP3 1 to widen the bf16 pair's lanes (INT: 10), 8 paired bf16 FMAs (4 make
            # q - 8, 4 multiply and chain all four bytes' products into one pair), one FADD of the lanes and
            # one FFMA of scaled accumulation (FP: 10). Read in the sm_90 SASS of the loop (BLOCK_N 32,
            # BLOCK_K 256, 2 warps, Triton 3.9): 390 instructions for 128 weights a thread (3.05 a weight)
            # against 456 (3.56) for the per-byte int4_pair_dot below, which asymmetric int4 keeps.
            return DequantWork(int_ops=1.25, fp_ops=1.25)
        if fmt.name == "int4":
            # quant_gemv.int4_pair_dot's PTX, 4 bytes a call: PRMT 1, SHF 3, LOP3 4 to decode, SHL 2 and LOP3 2
            # to widen the bf16 sums (INT: 12 per 8 weights), 8 paired bf16 FMAs (4 make q - 8, 4 multiply
            # and add), then one FFMA a byte of scaled accumulation (FP: 12 per 8). Read in the sm_90 SASS
            # of the loop (BLOCK_N 16, 4 warps): 4.1 instructions a weight at BLOCK_K 512 and 3.6 at 1024
            # with the address and load work, against 6.5 and 6.0 for the fp32 decode and in-loop group sums
            # it replaced.
            return DequantWork(int_ops=1.5, fp_ops=1.5)
        # int8: extract, shift, xor (1 + (q+128)/256); e4m3: extract (sign-extending), shift, and: 3 INT32
        # ops; one FFMA; per-row/group scaling amortised over >= 128 weights (~0.05)
        return DequantWork(int_ops=3.0, fp_ops=1.05)
    smem = 2.0 if wgmma else 4.0
    if fmt.name == "int4":
        # quant_gemv.int4_unpack16's PTX, 4 bytes a call: PRMT 1, SHF 3, LOP3 4 (INT) and 4 paired
        # bf16x2/f16x2 FMAs (q - 8, two values each) per 8 weights; the per-tile scaling is priced by the
        # template (it scales with BLOCK_M, not the weight count); times the measured factor
        key = "int4" if fmt.symmetric else "int4-asym"
        f = GEMV_DOT_MEASURED_FACTOR["int4"] if gemv else (DOT_MEASURED_FACTOR if wgmma else MMA_MEASURED_FACTOR)[key]
        return DequantWork(int_ops=1.0 * f, fp_ops=0.5 * f, smem_bytes=smem * f)
    if fmt.name == "int8":
        # extract 1, int8 -> fp32 (I2F) 1 conversion, fp32 -> 16-bit packed in pairs (F2F x2) half a one;
        # times the measured factor (the GEMV's own: the prefill GEMM's x1.5 priced the M = 8 / 16 GEMV's
        # conversions as its bound, gate_up 77 us against 36-50 measured on the H200)
        f = GEMV_DOT_MEASURED_FACTOR["int8"] if gemv else DOT_MEASURED_FACTOR["int8"]
        return DequantWork(int_ops=1.0 * f, cvt_ops=1.5 * f, smem_bytes=smem)
    # e4m3 weight-only: extract, shift, and 3; one FMUL by 2^120; fp32 -> 16-bit pair packing half a conversion
    f = GEMV_DOT_MEASURED_FACTOR["fp8"] if gemv else 1.0
    return DequantWork(int_ops=3.0 * f, fp_ops=1.0 * f, cvt_ops=0.5 * f, smem_bytes=smem * f)


def fp32_lanes(gpu: GPUProfile) -> float:
    """FP32 lanes per SM a clock from the profile's non-tensor FP32 peak (H100: 67 TFLOP/s /
    (2 x 132 SMs x 1.98 GHz) = 128; A100: 64), 128 when the profile lacks the numbers."""
    peak = gpu.tflops("fp32", measured=False) or gpu.tflops("fp32")
    if peak and gpu.sm_count and gpu.sm_clock_max_mhz:
        return peak * 1e12 / (2 * gpu.sm_count * gpu.sm_clock_max_mhz * 1e6)
    return 128.0


def cycles_per_weight(gpu: GPUProfile, work: DequantWork, rates: DequantRates = DEQUANT_RATES) -> float:
    """SM clocks per weight element: the busiest of issue, INT32, FP32, conversion and shared memory."""
    total = work.int_ops + work.fp_ops + work.cvt_ops
    return max(total / rates.issue, work.int_ops / rates.int32, work.fp_ops / fp32_lanes(gpu),
               work.cvt_ops / rates.cvt, work.smem_bytes / rates.smem_bytes)


def act_quant_us(gpu: GPUProfile, op: OpSpec) -> float:
    """The W8A8 activation-quantization launch (``act_quant.py``) before a GEMM: A read once in its
    dtype (the second pass over a row hits L1/L2), e4m3 A and fp32 scales written, at the streaming
    kernels' DRAM efficiency, plus a launch. 0 for formats that leave A alone, and for GEMVs."""
    fmt = op.weight_format
    if fmt is None or op.kind != "gemm" or not fmt.quantizes_activations:
        return 0.0
    c = constants()
    m, _, k = op.shape
    groups = 1 if fmt.activation == "per_token" else math.ceil(k / FP8_BLOCK)
    moved = m * k * (DTYPE_BYTES[op.dtype] + 1) + m * groups * 4
    bw = (gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs or 0.0) * 1e9
    return c.launch_us + (moved / (bw * c.stream_dram_efficiency) * 1e6 if bw else 0.0)


#: The swapped decode GEMV (``backend/kernels/quant_gemv_swap.py``: the weight tile as the MMA's A, the tokens in
#: dots of N = 8), priced by :func:`swap_gemv_us`: a fixed cost (the launch, the pipeline's fill and the epilogue),
#: the split-K reduce's launch, a scale (``SWAP_GEMV_SCALE`` by format and token tile) times the slowest of
#: the DRAM stream (every byte once at the streaming efficiency), the busiest SM's stream (an SM pulls at most
#: ``SWAP_GEMV_SM_STREAM_SHARE`` times its even share of the datasheet bandwidth: with fewer programs than SMs the
#: kernel slows in proportion, 32 programs of 128 rows ran Llama-3-8B's down at 58-71 us against 20-22 over 256) and
#: its decode (``SWAP_GEMV_DECODE_CYCLES`` lane-cycles a weight, full issue from ``SWAP_GEMV_FULL_ISSUE_WARPS``
#: resident warps), and ``SWAP_GEMV_TILE_US`` a K-tile of the serial loop. The shape of the price was fitted by grid
#: search on one H200 (``h200/gemv_swap_probe.json``: Llama-3-8B's four linears at M = 8, int4 / fp8 / int8, 516
#: checked configs graph-replayed; rank()'s pick over the grid's best 1.00-1.19, mean 1.088) with one scale, 1.1,
#: which left int4 priced low at every token count (median ln(predicted / measured) -0.23 / -0.24 / -0.29 at 8 / 16
#: / 32 tokens; the batch-32 decode step with int4 priced 0.82x and picked over int8, 5.5 % regret on Qwen2.5-7B:
#: h200/regret_*_b32_swap.json). The scale is now per format and token tile (``SWAP_GEMV_SCALE``), each the median
#: of what the six fastest configs of each linear need (what rank() picks and a step is priced from; the median over
#: all configs sat 12-17 % above them): 16 and 32 tokens run two and four dots of N = 8 on each decoded tile (int4
#: two a half, one per nibble, so its scale grows fastest). Grids: 8 tokens ``h200/gemv_swap_probe.json``, 16
#: ``h200/gemv_swap_probe_m16_tree.json``, 32 ``h200/gemv_swap_probe_m32_tree.json`` (int4 and int8, the configs the
#: template offers there; fp8 at 32 tokens is weight-only fp8 and takes int8's growth, 1.44x, unmeasured).
SWAP_GEMV_FIXED_US = 4.5
SWAP_GEMV_REDUCE_US = 1.5
SWAP_GEMV_SCALE = {"int4": {8: 1.43, 16: 1.82, 32: 2.64}, "fp8": {8: 1.01, 16: 1.20, 32: 1.45},
                   "int8": {8: 0.86, 16: 0.96, 32: 1.24}}
SWAP_GEMV_TILE_US = 0.05
SWAP_GEMV_SM_STREAM_SHARE = 1.1
SWAP_GEMV_DECODE_CYCLES = {"int4": 8.0, "fp8": 3.0, "int8": 3.0}
SWAP_GEMV_FULL_ISSUE_WARPS = 12


@dataclass(frozen=True, slots=True, kw_only=True)
class SwapGemvTerms:
    """The terms of :func:`swap_gemv_us` (microseconds), for a prediction's breakdown."""

    dram_us: float
    sm_stream_us: float
    decode_us: float
    loop_us: float
    fixed_us: float
    #: SWAP_GEMV_SCALE of the format and token tile
    scale: float

    @property
    def us(self) -> float:
        return self.fixed_us + self.scale * max(self.dram_us, self.sm_stream_us, self.decode_us) + self.loop_us

    @property
    def bound(self) -> str:
        """Which of the three streams binds: ``memory`` (DRAM), ``sm_stream`` or ``alu`` (the decode)."""
        top = max(self.dram_us, self.sm_stream_us, self.decode_us)
        return "memory" if top == self.dram_us else "sm_stream" if top == self.sm_stream_us else "alu"


def swap_token_tile(m: int) -> int:
    """The swapped GEMV's ``BLOCK_M`` for ``m`` tokens: 8, 16 or 32 (dots of N = 8 on each decoded tile)."""
    return 8 if m <= 8 else 16 if m <= 16 else 32


def swap_gemv_us(gpu: GPUProfile, op: OpSpec, *, block_n: int, block_k: int, split_k: int, warps: int
                 ) -> SwapGemvTerms:
    """The swapped decode GEMV's price for ``op`` (a gemv over a packed weight) on ``gpu``, at one config."""
    fmt = op.weight_format
    assert fmt is not None
    c = constants()
    m, n, k = op.shape
    kp = fmt.padded_k(k)
    sms = gpu.sm_count or 1
    bw = (gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs or 0.0) * 1e3  # bytes a microsecond
    e = DTYPE_BYTES[op.dtype]
    moved = fmt.weight_bytes(n, k) + m * k * e + m * n * e
    per_sm = math.ceil(math.ceil(n / block_n) * split_k / sms)  # programs on the busiest SM
    weights_sm = per_sm * block_n * kp / split_k
    clock = gpu.sm_clock_max_mhz or 1500.0
    decode = weights_sm * SWAP_GEMV_DECODE_CYCLES[fmt.name] / (clock * 32 * min(per_sm * warps,
                                                                                SWAP_GEMV_FULL_ISSUE_WARPS))
    fixed = SWAP_GEMV_FIXED_US + (SWAP_GEMV_REDUCE_US if split_k > 1 else 0.0)
    return SwapGemvTerms(dram_us=moved / (bw * c.stream_dram_efficiency) if bw else 0.0,
                         sm_stream_us=weights_sm * fmt.weight_bits / 8 / (SWAP_GEMV_SM_STREAM_SHARE * bw / sms)
                         if bw else 0.0,
                         decode_us=decode, loop_us=SWAP_GEMV_TILE_US * kp / block_k / split_k, fixed_us=fixed,
                         scale=SWAP_GEMV_SCALE[fmt.name][swap_token_tile(m)])
