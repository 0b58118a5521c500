"""Tiled Triton GEMM template (backend kernel ``gemm``): group-M ordering, optional split-K.

Keys: ``BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, num_warps, num_stages``.
Path: ``wgmma`` on sm_90a when ``BLOCK_M % 64 == 0`` and ``num_warps % 4 == 0``
(Triton emits wgmma for ``tl.dot`` then), ``mfma`` on CDNA, else ``standard``
(mma.sync). Serves ``gemm`` and ``gemv`` ops (the backend's ``gemm`` kernel
takes both), so decode shapes are compared against the gemv template.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import MatmulBound, constants, peak_flops, predict_matmul
from autoopt.kernels.ops import DTYPE_BYTES, OpSpec
from autoopt.kernels.pruning import BoundedSpace, Tally, cached, count_rejection, gpu_key
from autoopt.kernels.template import Prediction, Template

__all__ = ["GemmTemplate", "LazyTiles", "StageFacts", "TileTable", "blocks", "expand_tile", "floor_at_rate",
           "matmul_path", "matmul_space", "mma_ceiling_rate", "mma_floor_us", "tile_table"]

KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")
#: smallest block per dim: MMA M is 16 (mma.sync m16n8k16); N and K below 32 waste 16-byte vectors.
MIN_BM, MIN_BN, MIN_BK = 16, 32, 32
#: GROUP_M only changes the order tiles are issued in. 8 (Triton's usual choice) was never slower
#: than 1 (row-major) on the H200 and up to 1.31x faster even where the cost model sees no DRAM
#: difference (TMA GEMM 256x4096x14336, 64x128x128 tiles, one wave: 74.1 us with GROUP_M=1,
#: 56.6 us with 8; benchmarks/results/h200/ranking_quality_run1.json), so only 8 is searched.
GROUPS = (8,)
BMS, BNS = (16, 32, 64, 128, 256), (32, 64, 128, 256)
SPLITS = (1, 2, 4, 8, 16)
WARPS, STAGES = (2, 4, 8), (2, 3, 4, 5, 6)
_NO_SPLIT = [1]  # shared: consumers of axes() only read it


def block_ks(dtype: str) -> tuple[int, ...]:
    """BLOCK_K candidates; fp8 adds 256 (256-byte rows, as BLOCK_K=128 at 16 bits)."""
    return (32, 64, 128, 256) if dtype == "fp8" else (32, 64, 128)


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


def config_problems(config: KernelConfig, keys: tuple[str, ...], kernel: str) -> list[str]:
    """What every matmul validate checks first: missing/unknown keys, else a kernel not ``kernel``."""
    out = missing_keys(config, keys)
    if not out and config.kernel != kernel:
        out = [f"kernel {config.kernel!r} is not this template's {kernel!r}"]
    return out


def block_problems(checks: tuple[tuple[str, int, int, int], ...]) -> list[str]:
    """Per (name, block, dim, minimum): not a power of two, else too large or small for the dim."""
    out: list[str] = []
    for name, v, dim, lo in checks:
        out += C.check_pow2(name, v) or C.check_block_vs_dim(name, v, dim, lo)
    return out


# -- branch and bound (see autoopt.pruning) ------------------------------------------------

@dataclass(frozen=True, slots=True, eq=False)
class TileTable:
    """What one (BLOCK_M, BLOCK_N, BLOCK_K) tile can run as on one GPU and dtype, for every shape:
    the valid (num_warps, num_stages) pairs with their occupancy, why the others fail, and a floor
    of their MMA time. The MMA times themselves are probed on the tile's first expansion
    (:meth:`variants`): a ranking expands ~1 tile in 5 (llama-3-70b on h100-sxm-8x: 15 of 224), so
    probing every tile up front cost ~5x the probes (~45 ms of a cold recommend on a 2-core box)."""

    #: (num_warps, path, ((num_stages, CTAs per SM), ...), most CTAs, most stages) of the valid pairs
    warps: tuple[tuple[int, str, tuple[tuple[int, int], ...], int, int], ...]
    #: at most the MMA time of any valid pair (see :func:`mma_floor_us`); 0.0 when none is valid.
    t_comp_floor: float
    max_ctas: int
    max_stages: int
    #: (num_warps, num_stages) pairs validate rejects, rule -> count, rule -> first message.
    invalid: int
    rules: tuple[tuple[str, int], ...]
    examples: tuple[tuple[str, str], ...]
    #: probe(num_warps, path, num_stages): the pair's per-iteration MMA time (predict_matmul's t_comp).
    probe: Callable[[int, str, int], float]
    _probed: list[Any] = field(default_factory=list)

    def variants(self) -> tuple[tuple[int, str, float, tuple[tuple[int, int, float], ...], int, int], ...]:
        """(num_warps, path, least t_comp, ((num_stages, CTAs per SM, t_comp us), ...), most CTAs, most
        stages) per valid num_warps, probing once per (num_warps, occupancy): t_comp depends on the
        stages only through the occupancy. Probed on first call, then kept."""
        if not self._probed:
            out = []
            for w, path, pairs, max_ctas, max_stages in self.warps:
                t_comp_of: dict[int, float] = {}
                for st, occ in pairs:
                    if occ not in t_comp_of:
                        t_comp_of[occ] = self.probe(w, path, st)
                timed = tuple((st, occ, t_comp_of[occ]) for st, occ in pairs)
                out.append((w, path, min(t_comp_of.values()), timed, max_ctas, max_stages))
            self._probed.append(tuple(out))  # a race probes twice and keeps the first: same values
        return self._probed[0]

    @property
    def t_comp_min(self) -> float:
        """The least MMA time of the tile's valid pairs (probes them all; 0.0 when none is valid)."""
        return min((v[2] for v in self.variants()), default=0.0)


def mma_floor_us(gpu: GPUProfile, dtype: str, rows: int, bn: int, bk: int, *, tensor: bool = True) -> float:
    """A floor of predict_matmul's per-iteration MMA time ``t_comp`` for any config of a tile:
    its ``2 * rows * bn * bk`` FLOPs (``rows``: the padded BLOCK_M, or the real rows on the FMA
    path) at :func:`mma_ceiling_rate`. ``tensor=False``: the FMA path (fp32 cores)."""
    return floor_at_rate(mma_ceiling_rate(gpu, dtype, tensor=tensor), rows, bn, bk)


def floor_at_rate(rate: float, rows: int, bn: int, bk: int) -> float:
    """:func:`mma_floor_us` given its :func:`mma_ceiling_rate` (computed once per tile table)."""
    return 2.0 * rows * bn * bk / rate * 1e6 if rate else 0.0


def mma_ceiling_rate(gpu: GPUProfile, dtype: str, *, tensor: bool = True) -> float:
    """FLOP/s of one SM that no config's MMA exceeds in predict_matmul (0.0: no peak for the dtype).

    predict_matmul runs a tile's FLOPs at ``peak * tc_efficiency / SMs`` scaled by factors that are
    fractions kept (MMA path, pointer-fed wgmma, single warpgroup, narrow wgmma; fit_constants caps
    them at 1) and multiplies the time by a shared-memory penalty >= 1. Taking every fraction at
    max(1, value) gives a ceiling for any installed constants; tests/test_rank_lazy_tables.py checks
    the floor against the probed time of every valid pair."""
    peak = peak_flops(gpu, dtype, tensor=tensor)
    if not peak:
        return 0.0
    c = constants()
    keep = c.tc_efficiency
    if tensor:
        for f in (c.mma_sync_fraction, c.pointer_wgmma_efficiency, c.single_warpgroup_efficiency,
                  c.narrow_wgmma_efficiency):
            keep *= max(1.0, f)
    return peak * keep / C.limits(gpu).sm_count


def tile_table(warps: list[tuple[int, str | None, str, float, str | None, int]],
               stages: list[tuple[int, str | None, int]], probe: Callable[[int, str, int], float], *,
               floor: float, persistent: bool = False) -> TileTable:
    """Combine a tile's per-num_warps and per-num_stages facts into a :class:`TileTable`.

    ``warps``: (num_warps, problem found before the resource checks, path, registers per thread,
    register problem, occupancy by registers and threads alone); ``stages``: (num_stages, smem
    problem, occupancy by smem alone). A config's first problem is the early one, else the smem
    one, else the register one (the order validate reports them in), and its occupancy is the
    smaller of the two partial ones: ``occupancy`` takes the min over smem, registers, threads and
    the block cap, and each partial call only adds terms no smaller than those it already has.
    ``probe(num_warps, path, num_stages)`` is the config's per-iteration MMA time (predict_matmul's
    t_comp), called lazily (:meth:`TileTable.variants`); ``floor`` is at most every such time
    (:func:`mma_floor_us`).
    """
    valid = []
    invalid = 0
    rules: Counter = Counter()
    examples: dict[str, str] = {}
    for w, early, path, _, reg_problem, occ_rt in warps:
        ok = []
        for st, smem_problem, occ_smem in stages:
            problem = early or smem_problem or reg_problem
            if problem is not None:
                invalid += 1
                count_rejection(rules, examples, problem)
                continue
            ok.append((st, 1 if persistent else max(1, min(occ_smem, occ_rt))))
        if ok:
            valid.append((w, path, tuple(ok), max(o for _, o in ok), ok[-1][0]))
    return TileTable(warps=tuple(valid), t_comp_floor=floor if valid else 0.0,
                     max_ctas=max((v[3] for v in valid), default=1),
                     max_stages=max((v[4] for v in valid), default=1), invalid=invalid,
                     rules=tuple(rules.items()), examples=tuple(examples.items()), probe=probe)


def probe_t_comp(template: Template, gpu: GPUProfile, op: OpSpec, config: KernelConfig) -> float:
    """The template's own prediction of ``config`` on a one-tile, one-K-iteration ``op``: its
    ``compute_us`` is then exactly the per-iteration MMA time, whatever factors the cost model has."""
    return template.predict(gpu, op, config).breakdown["compute_us"]


def warp_facts(gpu: GPUProfile, w: int, early: list[str], path: str,
               regs: float) -> tuple[int, str | None, str, float, str | None, int]:
    """One ``warps`` entry of :func:`tile_table` (registers and threads checked here)."""
    lim = C.limits(gpu)
    threads = w * lim.warp_size
    reg_problems = C.check_regs(lim, regs, threads)
    return (w, early[0] if early else None, path, regs, reg_problems[0] if reg_problems else None,
            C.occupancy(lim, smem_bytes=0, regs_per_thread=regs, threads=threads))


def stage_facts(gpu: GPUProfile, st: int, smem: int) -> tuple[int, str | None, int]:
    """One ``stages`` entry of :func:`tile_table` (shared memory checked here)."""
    lim = C.limits(gpu)
    problems = C.check_smem(lim, smem)
    return (st, problems[0] if problems else None,
            C.occupancy(lim, smem_bytes=smem, regs_per_thread=0, threads=1))


class StageFacts:
    """:func:`stage_facts` memoized by shared-memory bytes (tiles of equal ``(BM + BN) * BK`` share them)."""

    __slots__ = ("_seen", "gpu")

    def __init__(self, gpu: GPUProfile) -> None:
        self.gpu = gpu
        self._seen: dict[int, tuple[str | None, int]] = {}

    def __call__(self, st: int, smem: int) -> tuple[int, str | None, int]:
        hit = self._seen.get(smem)
        if hit is None:
            _, problem, occ = stage_facts(self.gpu, st, smem)
            hit = self._seen[smem] = (problem, occ)
        return (st, *hit)


class LazyTiles(dict):
    """tile key -> :class:`TileTable`, each built by ``build(*key)`` on its first lookup: an op's
    ranking reads only the tiles its shape allows (a decode GEMV's BLOCK_M=16 row of the GEMM
    tiles), so the rest are never built."""

    __slots__ = ("_build",)

    def __init__(self, build: Callable[..., TileTable]) -> None:
        super().__init__()
        self._build = build

    def __missing__(self, key: tuple[int, ...]) -> TileTable:
        value = self[key] = self._build(*key)  # a race builds twice and keeps one: equal tables
        return value


def expand_tile(bound: MatmulBound, tt: TileTable, tile: tuple[int, int, int], split: int, t_l2: float,
                leaves: Callable[[int, str, int], list[KernelConfig]], persistent: bool = False,
                ) -> list[tuple[float, Any]]:
    """Children of a tile node: one node per num_warps, bounded with its own least MMA time."""
    bm, bn, bk = tile
    ovh = bound.c.iter_overhead_us
    out = []
    for w, path, t_comp, stages, max_ctas, max_stages in tt.variants():
        out.append((bound(bm, bn, bk, split, max(t_comp, t_l2) + ovh, t_l2, max_ctas, max_stages, persistent),
                    partial(_expand_warps, bound, tile, split, t_l2, w, path, stages, leaves, persistent)))
    return out


def _expand_warps(bound: MatmulBound, tile: tuple[int, int, int], split: int, t_l2: float, w: int, path: str,
                  stages: tuple[tuple[int, int, float], ...],
                  leaves: Callable[[int, str, int], list[KernelConfig]], persistent: bool) -> list[tuple[float, Any]]:
    """Children of a (tile, num_warps) node: one per num_stages, bounded with its exact occupancy and
    MMA time (only L2 reuse is left at its best case), expanding into the leaf configs."""
    bm, bn, bk = tile
    ovh = bound.c.iter_overhead_us
    out = []
    for st, occ, t_comp in stages:
        b = bound(bm, bn, bk, split, max(t_comp, t_l2) + ovh, t_l2, occ, st, persistent)
        out.append((b, partial(_bounded_leaves, b, leaves, w, path, st)))
    return out


def _bounded_leaves(b: float, leaves: Callable[[int, str, int], list[KernelConfig]], w: int, path: str,
                    st: int) -> list[tuple[float, Any]]:
    return [(b, cfg) for cfg in leaves(w, path, st)]


#: leaves(SPLIT_K, num_warps, path, num_stages): the configs of one (tile, split, num_warps, num_stages) node.
Leaves = Callable[[int, int, str, int], list[KernelConfig]]


def matmul_space(kernel: str, bound: MatmulBound, per_table: int,
                 walk: Iterable[tuple[TileTable, int, tuple[int, int, int], Sequence[int], Leaves]], *,
                 persistent: bool = False) -> BoundedSpace:
    """A matmul template's :class:`BoundedSpace` from its tiles in space order (shared by the GEMM,
    GEMV and Hopper TMA templates). ``walk`` yields per tile: its table; ``times``, how often each of
    the table's ``per_table`` (num_warps, num_stages) pairs stands in the space (its GROUP_M x SPLIT_K
    values); the tile as the bound sees it (GEMV: BLOCK_M padded); its SPLIT_K values; its leaves.
    ``persistent``: one CTA per SM (the bound's occupancy is 1)."""
    tally = Tally()
    tiles, nodes = [], []
    for tt, times, tile, splits, leaves in walk:
        tally.considered += per_table * times
        if tt.invalid:
            tally.reject_counted(kernel, tt.invalid * times, tt.rules, tt.examples, times)
        if tt.warps:
            bm, bn, bk = tile
            for s in splits:
                ctas = 1 if persistent else tt.max_ctas
                tiles.append((bm, bn, bk, s, tt.t_comp_floor, ctas, tt.max_stages))
                nodes.append(partial(_expand_split, bound, tt, tile, s, leaves, persistent))
    return tally.space(list(zip(bound.tiles(tiles, persistent=persistent), nodes, strict=True)))


def _expand_split(bound: MatmulBound, tt: TileTable, tile: tuple[int, int, int], split: int, leaves: Leaves,
                  persistent: bool) -> list[tuple[float, Any]]:
    """Children of a (tile, SPLIT_K) root: :func:`expand_tile` with the tile's L2 time."""
    return expand_tile(bound, tt, tile, split, bound.l2_us(*tile), partial(leaves, split), persistent)


class GemmTemplate(Template):
    """Triton tiled GEMM with group-M swizzle and split-K for skinny shapes."""

    name = "gemm"
    ops = ("gemm", "gemv")
    kernel = "gemm"

    def applies(self, gpu: GPUProfile, op: OpSpec) -> bool:
        return op.kind in self.ops and gpu.features.tensor_cores

    @staticmethod
    def axes(gpu: GPUProfile, op: OpSpec) -> Iterator[tuple[int, int, int, list[int], list[int]]]:
        """(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M values, SPLIT_K values) of the space, in its order."""
        m, n, k = op.shape
        sms = gpu.sm_count or 1
        bks = blocks(block_ks(op.dtype), k, MIN_BK)
        for bm in blocks(BMS, m, MIN_BM):
            tm = math.ceil(m / bm)
            # GROUP_M values >= the number of row tiles all order tiles the same: keep the first.
            groups = [g for g in GROUPS if g < tm] + [g for g in GROUPS if g >= tm][:1]
            for bn in blocks(BNS, n, MIN_BN):
                tiles = tm * math.ceil(n / bn)
                for bk in bks:
                    # split-K only when the output tiles leave SMs idle and K is long
                    splits = _NO_SPLIT if tiles >= sms else [
                        s for s in SPLITS if s == 1 or (tiles * s <= 2 * sms and k // s >= max(256, bk))]
                    yield bm, bn, bk, groups, splits

    def space(self, gpu: GPUProfile, op: OpSpec) -> Iterator[KernelConfig]:
        for bm, bn, bk, groups, splits in self.axes(gpu, op):
            for warps in WARPS:
                path = matmul_path(gpu, bm, warps)
                for stages in STAGES:
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
        out = config_problems(config, KEYS, self.kernel)
        if out:
            return out
        p = config.params
        m, n, k = op.shape
        lim = C.limits(gpu)
        bm, bn, bk, warps = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], config.num_warps
        out += C.check_dtype(gpu, op.dtype)
        out += block_problems((("BLOCK_M", bm, m, MIN_BM), ("BLOCK_N", bn, n, MIN_BN),
                               ("BLOCK_K", bk, k, MIN_BK)))
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

    # -- branch and bound -----------------------------------------------------------
    def tables(self, gpu: GPUProfile, dtype: str) -> LazyTiles:
        """Each tile's :class:`TileTable` on this GPU and dtype, built on its first lookup and shared by
        every shape (cached per GPU content: the 8 GPUs of an 8-GPU profile share one).

        For a config of the space (blocks, split, group and path pass by construction) validate's
        first problem is: threads, else wgmma shape, else smem, else registers; see :func:`tile_table`."""
        def build() -> LazyTiles:
            lim = C.limits(gpu)
            e = DTYPE_BYTES[dtype]
            smem_facts = StageFacts(gpu)
            rate = mma_ceiling_rate(gpu, dtype)
            #: (BLOCK_M, BLOCK_N) -> warp_facts without early problems: registers do not depend on BLOCK_K
            by_warps: dict[tuple[int, int], list[tuple[int, str | None, str, float, str | None, int]]] = {}

            def tile(bm: int, bn: int, bk: int) -> TileTable:
                facts = by_warps.get((bm, bn))
                if facts is None:
                    facts = by_warps[(bm, bn)] = [
                        warp_facts(gpu, w, C.check_threads(lim, w), path,
                                   C.gemm_regs_per_thread(bm, bn, w, lim.warp_size, wgmma=path == "wgmma"))
                        for w in WARPS for path in (matmul_path(gpu, bm, w),)]
                warps = facts
                if any(f[2] == "wgmma" for f in facts):
                    warps = [f if f[1] is not None or f[2] != "wgmma" else
                             (f[0], next(iter(C.wgmma_problems(bm, bn, bk, f[0], dtype)), None), *f[2:])
                             for f in facts]
                stages = [smem_facts(st, C.gemm_smem_bytes(bm, bn, bk, st, e)) for st in STAGES]
                return tile_table(warps, stages, partial(self._probe, gpu, dtype, bm, bn, bk),
                                  floor=floor_at_rate(rate, max(bm, 16), bn, bk))
            return LazyTiles(tile)
        return cached((self.name, "tiles", gpu_key(gpu), dtype, constants()), build)

    def _probe(self, gpu: GPUProfile, dtype: str, bm: int, bn: int, bk: int, w: int, path: str,
               st: int) -> float:
        op = OpSpec(kind="gemm", shape=(bm, bn, bk), dtype=dtype)
        return probe_t_comp(self, gpu, op, KernelConfig(
            kernel=self.kernel, template=self.name, path=path,
            params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": 1, "num_warps": w,
                    "num_stages": st}))

    def bounded_space(self, gpu: GPUProfile, op: OpSpec) -> BoundedSpace | None:
        """The space as tile -> num_warps -> num_stages -> (GROUP_M, SPLIT_K) configs with lower bounds."""
        if C.check_dtype(gpu, op.dtype) or C.check_threads(C.limits(gpu), max(WARPS)):
            return None  # the exhaustive path words (and reports) these
        tables = self.tables(gpu, op.dtype)
        walk = ((tables[(bm, bn, bk)], len(groups) * len(splits), (bm, bn, bk), splits,
                 partial(self._leaves, bm, bn, bk, groups))
                for bm, bn, bk, groups, splits in self.axes(gpu, op))
        return matmul_space(self.kernel, MatmulBound(gpu, op), len(WARPS) * len(STAGES), walk)

    def _leaves(self, bm: int, bn: int, bk: int, groups: list[int], s: int, w: int, path: str,
                st: int) -> list[KernelConfig]:
        return [KernelConfig(kernel=self.kernel, template=self.name, path=path,
                             params={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g, "SPLIT_K": s,
                                     "num_warps": w, "num_stages": st}) for g in groups]
