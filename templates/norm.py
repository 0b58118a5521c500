"""Row-normalisation template: RMSNorm, LayerNorm and softmax over the last dim N.

Kernels ``{rmsnorm,layernorm,softmax}_single`` hold the whole row on chip
(``BLOCK_N = next_pow2(N)``, one DRAM read and one write per element) and
``*_looped`` stream it in ``BLOCK_N`` chunks, reading it twice (the second read
mostly from L2). Keys: ``BLOCK_N, num_warps`` (+ ``ROWS_PER_PROGRAM`` for
single-pass, rows sharing a program when N is small).

Single-pass is feasible while the fp32 row fits the block's register share:
``ROWS * BLOCK_N / threads + 32`` registers per thread within 255 and
``threads x regs <= 65536`` per SM. On H100 a 32768-wide row fits (128 + 32
registers at 256 threads); a 65536-wide one never does (at 1024 threads 64 + 32
registers x 1024 > 65536, the whole register file), and a 131072-wide fp32 row
(512 KB) is twice the register file, so only looped works there, as measured
(single-pass wins up to N = 32768 on H100). ``rank(..., force=...)``
forces either variant.

``rmsnorm_split`` (keys ``BLOCK_N, SPLIT_N, num_warps``) splits each row over
``SPLIT_N`` programs in two launches (partial sums, then normalise): offered for
RMSNorm when the rows are too few to give every SM eight programs and wide enough
to give each program at least one ``BLOCK_N`` chunk; at 64 x 262144 one program
per row leaves 68 of 132 SMs idle (measured 36 % of copy bandwidth on H100).

``rmsnorm_coop`` (keys ``BLOCK_N, SPLIT_N, num_warps``; ``backend/kernels/norm_coop.py``)
splits each row the same way inside one launch: each program holds its chunk in
registers and the row's programs meet at an atomic counter, so the row is read once.
Offered where ``rmsnorm_split`` is, with ``SPLIT_N = ceil(N / BLOCK_N)`` and 16 to 64
row elements per thread, priced with the counter atomics' queueing (:func:`coop_sync_us`);
``validate`` keeps ``SPLIT_N`` at most half the programs
the chip holds at once, so the programs waiting at one row's counter can never fill
it (the kernel's co-residency argument).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.constants import CostConstants
from autoopt.kernels.cost import StreamBound, constants, predict_stream
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.pruning import BoundedSpace, Tally, cached, gpu_key
from autoopt.kernels.template import Prediction, Template
from autoopt.templates.gemm import missing_keys

__all__ = ["NormTemplate"]

SINGLE_KEYS = ("BLOCK_N", "ROWS_PER_PROGRAM", "num_warps")
LOOPED_KEYS = ("BLOCK_N", "num_warps")
SPLIT_KEYS = ("BLOCK_N", "SPLIT_N", "num_warps", "num_stages")
#: row splits and chunk widths offered to ``rmsnorm_split``
SPLIT_NS, SPLIT_BLOCKS, SPLIT_WARPS = (2, 4, 8, 16, 32, 64, 128, 256), (1024, 2048, 4096), (4, 8)
#: chunk loads in flight per program (software-pipelined loop); 1: none
SPLIT_STAGES = (1, 2, 3)
COOP_KEYS = ("BLOCK_N", "SPLIT_N", "num_warps")
#: chunk widths offered to ``rmsnorm_coop`` (the chunk lives in registers: 16-64 fp32 per thread)
COOP_BLOCKS, COOP_ELEMS_PER_THREAD = (4096, 8192, 16384), (16, 64)
#: rows below this many per SM are offered split programs: 64 x 262144 (0.5 per SM) split 16 ways
#: measured 53 % of copy on H100 against 36 % looped; 1024 x 65536 (7.8 per SM) looped 75 %
_SPLIT_ROWS_PER_SM = 8
#: fp32 values per column a looped kernel keeps live: rmsnorm (sum x^2, x), layernorm (sum, sum sq, x),
#: softmax (running max, running sum, x).
_LOOPED_LIVE = {"rmsnorm": 2, "layernorm": 3, "softmax": 3}
MIN_LOOPED_BLOCK = 256
#: rows sharing a single-pass program stop growing at this many elements per program.
_ROWS_ELEMS = 16384
#: single-pass configs keep at most this many row elements per thread: more serialises each
#: thread's loads and reduction. H200 sweep, RMSNorm 16384x8192: 128 per thread (2 warps)
#: 150.8 us, 16 per thread (16 warps) 137.0 us (benchmarks/results/h200/stream_sweep_run2.json).
MAX_ELEMS_PER_THREAD = 32


def coop_sync_us(programs: int, split: int, c: CostConstants) -> float:
    """``rmsnorm_coop``'s row barriers: ``programs`` programs, ``split`` of them at each row's counter."""
    return programs * c.coop_sync_us * split / (split + c.coop_sync_half_split)


class NormTemplate(Template):
    """Single-pass (row on chip) or looped (row streamed twice) row normalisation."""

    name = "norm"
    ops = ("rmsnorm", "layernorm", "softmax")

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        rows, n = op.shape
        bn = C.next_pow2(n)
        lim = C.limits(gpu)
        warp_opts = [w for w in (1, 2, 4, 8, 16, 32) if w * lim.warp_size <= lim.max_threads_per_block]
        for r in (1, 2, 4, 8, 16):
            if r > 1 and (r * bn > _ROWS_ELEMS or r > C.next_pow2(rows)):
                break
            for warps in warp_opts:
                # the widest block stays in even past the cap, so a row too wide for the chip is
                # still rejected by validate with the register reason
                if r * bn > MAX_ELEMS_PER_THREAD * warps * lim.warp_size and warps != warp_opts[-1]:
                    continue
                yield KernelConfig(kernel=f"{op.kind}_single", template=self.name, path="standard",
                                   params={"BLOCK_N": bn, "ROWS_PER_PROGRAM": r, "num_warps": warps})
        for b in (256, 512, 1024, 2048, 4096, 8192, 16384):
            if b > max(MIN_LOOPED_BLOCK, bn):
                break
            for warps in warp_opts:
                yield KernelConfig(kernel=f"{op.kind}_looped", template=self.name, path="standard",
                                   params={"BLOCK_N": b, "num_warps": warps})
        yield from self._split_space(gpu, op)
        yield from self._coop_space(gpu, op)

    def _split_space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        """``rmsnorm_split`` configs: only for RMSNorm with fewer than ``_SPLIT_ROWS_PER_SM`` rows per
        SM, with every program owning at least one chunk (``SPLIT_N * BLOCK_N <= N``) and at most 64
        programs per SM."""
        rows, n = op.shape
        sms = gpu.sm_count or 1
        if op.kind != "rmsnorm" or rows >= _SPLIT_ROWS_PER_SM * sms:
            return
        for b in SPLIT_BLOCKS:
            for sp in SPLIT_NS:
                if sp * b > n or rows * sp > 64 * sms:
                    continue
                for warps in SPLIT_WARPS:
                    for st in SPLIT_STAGES if -(-n // sp) > b else (1,):  # one chunk: nothing to pipeline
                        yield KernelConfig(kernel="rmsnorm_split", template=self.name, path="standard",
                                           params={"BLOCK_N": b, "SPLIT_N": sp, "num_warps": warps,
                                                   "num_stages": st})

    def _coop_space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        """``rmsnorm_coop`` configs: where ``rmsnorm_split`` is offered, one per chunk width and warp
        count with 16-64 row elements per thread and at least two chunks per row."""
        rows, n = op.shape
        sms = gpu.sm_count or 1
        if op.kind != "rmsnorm" or rows >= _SPLIT_ROWS_PER_SM * sms:
            return
        lo, hi = COOP_ELEMS_PER_THREAD
        warp_size = C.limits(gpu).warp_size
        for b in COOP_BLOCKS:
            if b >= n:
                break
            for warps in (4, 8, 16, 32):
                if lo <= b // (warps * warp_size) <= hi:
                    yield KernelConfig(kernel="rmsnorm_coop", template=self.name, path="standard",
                                       params={"BLOCK_N": b, "SPLIT_N": -(-n // b), "num_warps": warps})

    @staticmethod
    def regs(op: OpSpec, config: KernelConfig, threads: int) -> float:
        p = config.params
        if config.kernel == "rmsnorm_coop":
            return p["BLOCK_N"] / threads + C.REG_OVERHEAD
        if config.kernel.endswith("_single"):
            return p.get("ROWS_PER_PROGRAM", 1) * p["BLOCK_N"] / threads + C.REG_OVERHEAD
        if config.kernel.endswith("_split"):
            return _LOOPED_LIVE["rmsnorm"] * p["BLOCK_N"] / threads + C.REG_OVERHEAD
        return _LOOPED_LIVE[op.kind] * p["BLOCK_N"] / threads + C.REG_OVERHEAD

    def validate(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        single = config.kernel == f"{op.kind}_single"
        split = config.kernel == "rmsnorm_split" and op.kind == "rmsnorm"
        if config.kernel == "rmsnorm_coop" and op.kind == "rmsnorm":
            return missing_keys(config, COOP_KEYS) or self._coop_problems(gpu, op, config)
        if not (single or split) and config.kernel != f"{op.kind}_looped":
            extra = ", rmsnorm_split, rmsnorm_coop" if op.kind == "rmsnorm" else ""
            return [f"kernel {config.kernel!r} does not compute op {op.kind!r} "
                    f"(expected {op.kind}_single, {op.kind}_looped{extra})"]
        out = missing_keys(config, SINGLE_KEYS if single else SPLIT_KEYS if split else LOOPED_KEYS)
        if out:
            return out
        if split:
            return self._split_problems(gpu, op, config)
        if config.path != "standard":
            return [f"path {config.path!r}: norm kernels run 'standard'"]
        _rows, n = op.shape
        lim = C.limits(gpu)
        p = config.params
        bn = p["BLOCK_N"]
        out += C.check_pow2("BLOCK_N", bn)
        if single:
            r = p["ROWS_PER_PROGRAM"]
            out += C.check_pow2("ROWS_PER_PROGRAM", r)
            if bn < n:
                out.append(f"single-pass holds the whole row: BLOCK_N={bn} < N={n} "
                           f"(use BLOCK_N={C.next_pow2(n)} or the looped kernel)")
            out += C.check_block_vs_dim("BLOCK_N", bn, n, 1)
        else:
            out += C.check_block_vs_dim("BLOCK_N", bn, n, MIN_LOOPED_BLOCK)
        out += C.check_threads(lim, config.num_warps)
        if out:
            return out
        threads = config.num_warps * lim.warp_size
        elems = bn * p.get("ROWS_PER_PROGRAM", 1)
        if elems < threads:
            return [f"{threads} threads for {elems} elements: idle threads (use fewer warps)"]
        problems = C.check_regs(lim, self.regs(op, config, threads), threads)
        if problems and single:
            problems = [f"row of {bn} fp32 does not fit on chip with {threads} threads: {problems[0]}"]
        return problems

    def _split_problems(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        """validate for ``rmsnorm_split``: power-of-two blocks, every program owning a chunk, registers."""
        _rows, n = op.shape
        p, lim = config.params, C.limits(gpu)
        if config.path != "standard":
            return [f"path {config.path!r}: norm kernels run 'standard'"]
        out = C.check_pow2("BLOCK_N", p["BLOCK_N"]) + C.check_pow2("SPLIT_N", p["SPLIT_N"])
        if not 1 <= p["num_stages"] <= 4:
            out.append(f"num_stages={p['num_stages']}: 1 to 4 chunk loads in flight")
        if not out and p["SPLIT_N"] * p["BLOCK_N"] > n:
            out.append(f"SPLIT_N={p['SPLIT_N']} x BLOCK_N={p['BLOCK_N']} > N={n}: programs without a chunk "
                       f"(use fewer splits or a smaller block)")
        out += C.check_threads(lim, config.num_warps)
        if out:
            return out
        threads = config.num_warps * lim.warp_size
        if p["BLOCK_N"] < threads:
            return [f"{threads} threads for {p['BLOCK_N']} elements: idle threads (use fewer warps)"]
        return C.check_regs(lim, self.regs(op, config, threads), threads)

    def _coop_problems(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> list[str]:
        """validate for ``rmsnorm_coop``: chunks that cover the row with none empty, registers, and
        ``SPLIT_N`` within half of the programs the chip holds at once (so a row's waiting programs
        can never keep its other programs off the chip)."""
        _rows, n = op.shape
        p, lim = config.params, C.limits(gpu)
        if config.path != "standard":
            return [f"path {config.path!r}: norm kernels run 'standard'"]
        b, split = p["BLOCK_N"], p["SPLIT_N"]
        out = C.check_pow2("BLOCK_N", b) + C.check_threads(lim, config.num_warps)
        if not b * (split - 1) < n <= b * split:
            out.append(f"SPLIT_N={split} chunks of BLOCK_N={b} must cover N={n} with none empty "
                       f"(use SPLIT_N={-(-n // b)})")
        if split < 2:
            out.append(f"SPLIT_N={split}: one program per row is rmsnorm_single's job")
        if out:
            return out
        threads = config.num_warps * lim.warp_size
        if b < threads:
            return [f"{threads} threads for {b} elements: idle threads (use fewer warps)"]
        regs = self.regs(op, config, threads)
        out = C.check_regs(lim, regs, threads)
        if out:
            return out
        resident = lim.sm_count * C.occupancy(lim, smem_bytes=0, regs_per_thread=regs, threads=threads)
        if 2 * split > resident:
            out.append(f"SPLIT_N={split} programs meet at each row's counter, but the chip holds "
                       f"{resident} such programs at once: at most {resident // 2} (half) may wait "
                       f"(use a wider BLOCK_N)")
        return out

    def _coop_terms(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> dict[str, Any]:
        """predict_stream's arguments for ``rmsnorm_coop``: one chunk load per program, x read once,
        the weight re-read from L2 by every row."""
        rows, n = op.shape
        e = DTYPE_BYTES[op.dtype]
        p = config.params
        return {"programs": rows * p["SPLIT_N"], "iters": 1, "bytes_per_iter": p["BLOCK_N"] * e,
                "dram_bytes": op.min_bytes, "l2_bytes": float(max(0, rows - 1) * n * e)}

    def _split_terms(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> dict[str, Any]:
        """predict_stream's arguments for ``rmsnorm_split``: the first launch's chunks are the exposed
        loads; the second re-reads x in reverse order, from L2 up to its usable size, the rest from DRAM."""
        rows, n = op.shape
        e = DTYPE_BYTES[op.dtype]
        p = config.params
        chunk = math.ceil(math.ceil(n / p["SPLIT_N"]) / p["BLOCK_N"]) * p["BLOCK_N"]
        reread = rows * n * e
        l2_keep = (gpu.l2_bytes or 0) * constants().l2_usable_fraction
        return {"programs": rows * p["SPLIT_N"], "iters": chunk // p["BLOCK_N"], "bytes_per_iter": p["BLOCK_N"] * e,
                "stages": p["num_stages"],
                "dram_bytes": op.min_bytes + max(0.0, reread - l2_keep), "l2_bytes": min(float(reread), l2_keep)}

    def predict(self, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> Prediction:
        rows, n = op.shape
        e = DTYPE_BYTES[op.dtype]
        lim = C.limits(gpu)
        p = config.params
        threads = config.num_warps * lim.warp_size
        regs = self.regs(op, config, threads)
        if config.kernel == "rmsnorm_coop":
            t = self._coop_terms(gpu, op, config)
            pred = predict_stream(gpu, op, threads=threads, smem_bytes=0, regs_per_thread=regs,
                                  reason=f"rows split over {p['SPLIT_N']} programs of one launch, meeting at an "
                                         f"atomic counter; one read", **t)
            sync = coop_sync_us(t["programs"], p["SPLIT_N"], constants())
            return replace(pred, us=pred.us + sync, breakdown={**pred.breakdown, "sync_us": sync})
        if config.kernel.endswith("_split"):
            t = self._split_terms(gpu, op, config)
            pred = predict_stream(gpu, op, threads=threads, smem_bytes=0, regs_per_thread=regs,
                                  reason=f"split rows: {p['SPLIT_N']} programs per row, partials then normalise "
                                         f"(2 launches), second read mostly from L2", **t)
            launch = constants().launch_us  # the second launch
            return replace(pred, us=pred.us + launch,
                           breakdown={**pred.breakdown, "launch_us": pred.breakdown.get("launch_us", 0.0) + launch})
        if config.kernel.endswith("_single"):
            r = p["ROWS_PER_PROGRAM"]
            return predict_stream(gpu, op, programs=math.ceil(rows / r), threads=threads, smem_bytes=0,
                                  regs_per_thread=regs, iters=1, bytes_per_iter=r * n * e,
                                  dram_bytes=op.min_bytes,
                                  reason=f"single-pass: row of {n} on chip, {r} row(s)/program, one read")
        occ = max(1, C.occupancy(lim, smem_bytes=0, regs_per_thread=regs, threads=threads))
        live_rows = min(rows, lim.sm_count * occ)
        l2_keep = (gpu.l2_bytes or 0) * constants().l2_usable_fraction
        reread = rows * n * e
        from_l2 = live_rows * n * e <= l2_keep
        chunks = math.ceil(n / p["BLOCK_N"])
        # only the first pass waits on DRAM latency; the second re-reads chunks just touched (L2)
        return predict_stream(gpu, op, programs=rows, threads=threads, smem_bytes=0, regs_per_thread=regs,
                              iters=chunks, bytes_per_iter=p["BLOCK_N"] * e,
                              dram_bytes=op.min_bytes + (0 if from_l2 else reread),
                              l2_bytes=reread if from_l2 else 0.0,
                              reason=f"looped: {chunks} chunk(s) x 2 passes, second read from "
                                     f"{'L2' if from_l2 else 'DRAM'}")

    # -- branch and bound (see autoopt.pruning) ------------------------------------
    def bounded_space(self, gpu: GPUProfile, op: OpSpec) -> BoundedSpace:
        """Every config of the space, bounded by predict_stream: exactly for single-pass; for looped
        with the row re-read left out (it only adds DRAM or L2 time; the total is nondecreasing in both)."""
        lim = C.limits(gpu)
        # validate's answer for a config of the space depends on the op only through its kind: the
        # space's BLOCK_N always passes the shape checks (single: next_pow2(N); looped: <= max(256, that))
        memo = cached((self.name, "validate", gpu_key(gpu), op.kind), dict)
        bound = StreamBound(gpu, op)
        rows, n = op.shape
        e = DTYPE_BYTES[op.dtype]
        tally = Tally()
        roots: list[tuple[float, Any]] = []
        for cfg in self.space(gpu, op):  # <= 48 configs: bound each, predict only the best
            tally.considered += 1
            p = cfg.params
            key = (cfg.kernel, tuple(p.values()))
            hit = memo.get(key)
            if hit is None:
                problems = self.validate(gpu, op, cfg)
                threads = cfg.num_warps * lim.warp_size
                occ = max(1, C.occupancy(lim, smem_bytes=0, regs_per_thread=self.regs(op, cfg, threads),
                                         threads=threads))
                hit = memo[key] = (problems[0] if problems else None, occ)
            problem, occ = hit
            if problem is not None:
                tally.reject(cfg.kernel, problem)
                continue
            if cfg.kernel == "rmsnorm_split":
                t = self._split_terms(gpu, op, cfg)
                b = bound(t["programs"], occ, t["iters"], t["bytes_per_iter"], t["dram_bytes"], t["l2_bytes"],
                          t["stages"])
                b += bound.c.launch_us
            elif cfg.kernel == "rmsnorm_coop":
                t = self._coop_terms(gpu, op, cfg)
                b = bound(t["programs"], occ, 1, t["bytes_per_iter"], t["dram_bytes"], t["l2_bytes"])
                b += coop_sync_us(t["programs"], cfg.params["SPLIT_N"], bound.c)
            elif "ROWS_PER_PROGRAM" in p:
                r = p["ROWS_PER_PROGRAM"]
                b = bound(math.ceil(rows / r), occ, 1, r * n * e, op.min_bytes)
            else:
                b = bound(rows, occ, math.ceil(n / p["BLOCK_N"]), p["BLOCK_N"] * e, op.min_bytes)
            roots.append((b, cfg))
        return tally.space(roots)
