"""The cost model's calibratable numbers and the set in use now.

Kept apart from :mod:`autoopt.kernels.cost` (the predictions) so start-up code that only compares
or reads constants (the shipped rank cache's freshness check, the split planner's launch cost) does
not import the prediction code and its hardware-limit tables: ~4 ms of a cold ``recommend()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from autoopt._serde import from_plain, to_plain
from autoopt.errors import AutooptError

__all__ = ["DEFAULT_CONSTANTS", "FRACTIONS", "GRAPH_LAUNCH_US", "INDUCTOR_NORM_MAX_ROWS", "CostConstants", "constants",
           "explicit", "in_graph", "set_constants", "using"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CostConstants:
    """Every calibratable number of the cost model.

    Defaults marked "fitted" come from ``benchmarks/calibrate.py`` on 5,000+ correctness-checked
    timings of plain and TMA GEMM configs on an H200 (torch 2.11, triton 3.6); the rest are the
    cited priors. H100 and H200 share the SM, so the fractions carry over; rates come from the
    profile. Refit with :func:`autoopt.search.calibration.fit_constants` for another GPU family.
    """

    #: fraction of the datasheet dense tensor peak a well-shaped GEMM sustains: H100 SXM cuBLAS
    #: 774 of 989.4 TFLOP/s bf16 at 4096^3 (shared/hardware-captures/README.md) = 0.78.
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 0.78
    tc_efficiency: float = 0.7964
    #: mma.sync (Ampere-style) issue rate relative to wgmma/tcgen05 on GPUs that have the latter:
    #: FlashAttention-2 (mma.sync) reaches ~350-400 TFLOP/s on H100 where FA3 (wgmma) reaches
    #: ~600-660 (Shah et al. 2024, FlashAttention-3, fig. 6) -> ~0.6.
    mma_sync_fraction: float = 0.62
    #: sustained/spec DRAM bandwidth: 3.00 TB/s measured copy / 3.35 spec on H100 (hardware-captures).
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 0.9
    dram_efficiency: float = 0.7567
    #: L2->SM bandwidth as a multiple of DRAM bandwidth. A100: 5120 B/clk x 1.41 GHz = 7.2 TB/s
    #: (NVIDIA A100 whitepaper) / 2.04 TB/s = 3.5; prior, to be fitted on Hopper.
    l2_bw_ratio: float = 3.6
    #: share of L2 that keeps reused operand blocks alive (H100's L2 is two partitions with
    #: duplication across them; streaming data evicts the rest).
    l2_usable_fraction: float = 0.5
    #: DRAM load-to-use latency seen by a CTA (us): ~0.6-0.8 us on A100/H100 pointer-chase
    #: microbenchmarks; fill cost of each tile's pipeline and the latency term of streaming.
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 0.7
    dram_latency_us: float = 0.9803
    #: fixed cost of one kernel launch seen by torch-timed code on H100: ~4-6 us (brief).
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 4.5
    launch_us: float = 5.2093
    #: shared-memory bandwidth per SM per clock: 32 banks x 4 B (CUDA guide, all sm_5x+).
    smem_bytes_per_clk: float = 128.0
    #: fixed cost of one K-iteration beyond its MMAs (barrier wait, address and loop bookkeeping):
    #: ~80 cycles at ~2 GHz; makes BLOCK_K=32 lose to 64 on compute-bound shapes (prior).
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 0.04
    iter_overhead_us: float = 0.0324
    #: fraction of per-tile pipeline fill a persistent kernel still pays (prefetch across tiles).
    persistent_fill_fraction: float = 0.3
    #: cost of the epilogue of one tile relative to one K-iteration (layout conversion + store).
    epilogue_iters: float = 1.0

    #: wgmma fed by pointer loads (cp.async through registers) instead of TMA: fraction of the
    #: TMA kernel's MMA rate it keeps. Prior from the H200 grid (benchmarks/results/h200_gemm_grid.json):
    #: 4096^3 bf16 best pointer-based tile 226.5 us vs 196.7 us for the TMA persistent kernel -> 0.87.
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 0.87
    pointer_wgmma_efficiency: float = 0.8042
    #: wgmma rate kept when an SM holds a single warpgroup (one CTA of 4 warps): with nothing to
    #: overlap its MMA waits and epilogue the tensor cores idle. H200 grid, 256x28672x4096:
    #: 64x128x128 tiles with 4 warps at 1 CTA/SM 150.6 us vs 121.2 us for 256x128 with 8 warps (prior).
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 0.8
    single_warpgroup_efficiency: float = 0.9336
    #: wgmma rate kept when each warpgroup's instruction is narrower than N = 128 (a 64x64 slice
    #: re-reads A from shared memory twice as often per FLOP). Same grid: 64x128 tiles with 8 warps
    #: (two 64x64 warpgroup slices) 158 us vs 128x128 with 8 warps 123 us (prior).
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 0.8
    narrow_wgmma_efficiency: float = 0.84
    #: wgmma rate kept when each warpgroup's instruction is N = 128 rather than 256 (two m64n128k16
    #: for one m64n256k16: the A fragment is read twice as often). Same-run grids at M = 4096
    #: (benchmarks/results/{h100,h200}/ranking_samerun_m4096_{skdram,smsp}.json): 128x256x64 (N = 256
    #: per warpgroup) beat 256x128x64 and 128x128x64 (N = 128; 8 warps) on 14 of 16 shape-runs, by
    #: 2-9 % (4096^3 on the H200: 184.3 against 202.7 us). Chosen by benchmarks/replay_ranking.py.
    n128_wgmma_efficiency: float = 0.95

    #: sustained/spec DRAM bandwidth of streaming kernels (elementwise, norms, GEMV), which read
    #: and write each byte once like a copy: the device-to-device copy reaches 4221 of 4800 GB/s
    #: on the H200 (benchmarks/results/h200/autoopt_profile.json) and 3000 of 3350 on the H100.
    stream_dram_efficiency: float = 0.88
    #: warps resident per SM that keep DRAM busy; with fewer, bandwidth falls in proportion (too
    #: few loads in flight). H200 stream sweep (benchmarks/results/h200/stream_sweep_run2.json),
    #: GEMV 1x4096x14336 with 2 programs per SM: 2 warps each 65.0 us, 4 warps 37.2, 8 warps 35.6;
    #: GEMV 1x6144x4096 with ~3 per SM: 4 warps 19.3, 8 warps 18.8. 16 ranks the sweep best (top-1
    #: geomean 0.967 of the best timed config over 9 ops, against 0.960 with 8).
    warps_for_full_bandwidth: float = 16.0

    #: DRAM bandwidth one SM can pull, as a multiple of its even share (total / SM count): a grid
    #: that leaves SMs idle, or gives some SMs one tile more than others, cannot make the busy SMs
    #: stream faster to compensate. Fitted on decode gate_up 1x28672x4096 bf16, the GEMM kernel with
    #: BLOCK_N=256 (112 tiles, one per SM on 112 of 132 SMs) against the best GEMV config of the same
    #: sweep: H100 99.9 vs 91.1 us, H200 73.1 vs 65.1 us (benchmarks/results/{h100,h200}/tune_llm.jsonl),
    #: where a per-SM cap h predicts (132 / 112) / h: h = 1.07 and 1.05.
    sm_dram_share: float = 1.06

    #: K-iteration rate the stream-K TMA kernel keeps relative to the data-parallel one (its segments
    #: restart the TMA/WGMMA pipeline inside a while loop and a finisher waits on its neighbours' flags).
    #: H200, 12 skinny GEMMs (benchmarks/results/h200/hw_limit_streamk.json): measured over predicted
    #: with 1.0 has median 1.27 for stream-K against 1.01 for the other decompositions; 0.70 brings it
    #: to 1.00 and picks best among each shape's decompositions (0.976 of the measured best, geomean).
    stream_k_efficiency: float = 0.70

    #: contiguous bytes per row of W per K-iteration at which a tiled matmul's DRAM stream keeps half its
    #: bandwidth (``cost.run_efficiency``: 0.73 at 64-byte runs, 0.97 at 128, ~1 from 256; 0 turns it off).
    #: The decode lm_head sweeps (1x128256x4096 bf16, 45 configs each) ran BLOCK_K = 32 (64-byte runs)
    #: at 0.49-0.65 of the best config and BLOCK_K = 64 at 0.81-1.0, all predicted alike
    #: (benchmarks/results/{h100,h200}/wide_sweep.json). 50 was chosen by benchmarks/replay_ranking.py:
    #: top-1 of the GEMV sweeps 0.950 -> 0.973 (H100) and 0.936 -> 0.969 (H200); the broad sweeps, the
    #: H100 calibration sweep and the H200 grid (4,373 timings) rank as well or better (0.963 -> 0.966).
    dram_run_bytes: float = 50.0

    #: serialised cost per program of ``rmsnorm_coop``'s row barrier (us), reached when many programs share
    #: a row: every program arrives at, spins on and leaves its row's counters with atomics, which queue
    #: at the counter's L2 slice, so the cost per program grows with the programs per counter ``S`` as
    #: ``S / (S + coop_sync_half_split)``. Fitted on 75 coop timings of 6 shapes on the H100
    #: (benchmarks/results/h100/norm_coop_probe*.json, least squares on log time): 4.6 ns and 12; median
    #: |log error| 0.078, against 0.119 for a flat 4.5 ns per program (which overstated 1024x65536, 8 per row).
    coop_sync_us: float = 0.0046
    coop_sync_half_split: float = 12.0

    #: issue cost of one 16-byte global->shared copy per thread (us): a K-iteration cannot finish
    #: before each thread has issued its share of the A and W tiles. H200 GEMV sweep at M = 16
    #: (benchmarks/results/h200/stream_gemv16.json), 16x6144x4096: a 16x64x256 tile on 1 warp
    #: (80 copies per thread per iteration) 25.8 us, on 2 warps (40) 22.2 us.
    load_issue_us: float = 0.01

    #: exponent of the smooth max joining overlapped terms (SM time vs DRAM time): 1 would add
    #: them (no overlap), infinity takes the max (perfect overlap); 4 leaves ~19% when equal (prior).
    #: fitted on the H200 grid (benchmarks/results/calibration_h200.json); prior 4.0
    overlap_exponent: float = 3.3237

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Any) -> CostConstants:
        return from_plain(cls, data, lambda msg, where: AutooptError(f"cost constants: {where}: {msg}"))


DEFAULT_CONSTANTS = CostConstants()
_active: list[CostConstants] = [DEFAULT_CONSTANTS]

#: constants that are fractions of a peak or rate: a fit keeps them in (0, 1], a stored set must too.
FRACTIONS = frozenset({"tc_efficiency", "mma_sync_fraction", "dram_efficiency", "l2_usable_fraction",
                       "persistent_fill_fraction", "pointer_wgmma_efficiency", "single_warpgroup_efficiency",
                       "stream_dram_efficiency", "narrow_wgmma_efficiency", "n128_wgmma_efficiency"})


#: what one kernel costs inside a CUDA-graph replay beyond its own work, in us. The cost model's times
#: include a standalone launch (``CostConstants.launch_us``, ~5.2 us, what torch-timed code sees); a
#: replayed graph issues its kernels back to back. H100, Llama-3-8B decode step in one graph
#: (``benchmarks/results/h100/e2e_llama-3-8b_agreement_profile.json``): norms ran 1.69 us and the fused
#: activations 1.19 us each, which the model prices at ~1.0 us of work, and the step's 6.52 ms exceeded
#: its ~420 kernels' summed time by 0.17 ms (0.4 us each): 0.6-1.1 us a kernel, taken as 1.0. H200, int4
#: decode GEMVs timed replayed from a graph (``benchmarks/results/h200/quant_kernels_fmagrid_graph.json``):
#: ``o``'s rank-1 config priced 6.6 us with it, measured 6.8.
GRAPH_LAUNCH_US = 1.0


#: under torch.compile, an RMSNorm over at most this many rows (a decode step's) is Inductor's own, which takes the
#: residual add before it into its reduction: one kernel where autoopt's norm, opaque to Inductor, leaves two (the
#: add and the norm). optimize() runs it so (``autoopt.nn.ops``) and recommend() prices it so. H200, int4
#: Llama-3-8B, batch 1, the compiled step replayed from a CUDA graph in one process: 2.987 ms with autoopt's norm,
#: 2.934 ms with Inductor's (3.108 / 3.059 ms in a second pair; ``benchmarks/results/h200/step_variants.json``).
INDUCTOR_NORM_MAX_ROWS = 16


def in_graph(consts: CostConstants) -> CostConstants:
    """``consts`` with each launch priced as a replayed CUDA graph's (:data:`GRAPH_LAUNCH_US`)."""
    return replace(consts, launch_us=GRAPH_LAUNCH_US)


def constants() -> CostConstants:
    """The constants predictions use now."""
    return _active[-1]


@contextlib.contextmanager
def using(consts: CostConstants) -> Iterator[CostConstants]:
    """Predict with ``consts`` inside the block (rankings are cached per constants)."""
    _active.append(consts)
    try:
        yield consts
    finally:
        _active.pop()


def set_constants(consts: CostConstants) -> None:
    """Install calibrated constants for the rest of the process."""
    _active[0] = consts


def explicit() -> bool:
    """Whether the constants in use were chosen on purpose: inside a :func:`using` block (any set,
    the defaults included) or after :func:`set_constants` installed another set. The ranking then
    leaves them alone; otherwise it applies the device's calibrated constants when it has some."""
    return len(_active) > 1 or _active[0] is not DEFAULT_CONSTANTS
