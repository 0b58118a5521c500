"""Rank a user's own kernel configs (``triton.Config`` lists) for one call, fastest predicted first.

:func:`autoopt.tuning.autotune.autotune` times only the head of this order, so the order is what
makes tuning cheap. Two models:

- **A known template** when the kernel matches one. A *matmul* (int arguments ``M``, ``N``, ``K``
  and every config carrying ``BLOCK_SIZE_M/N/K`` or ``BLOCK_M/N/K``) is translated into the
  ``gemm`` template's :class:`~autoopt.kernels.config.KernelConfig` (``GROUP_SIZE_M`` ->
  ``GROUP_M``, ``SPLIT_K`` 1 unless the config has one, the path Triton takes on this GPU) and
  predicted by the calibrated cost model (:func:`autoopt.search.ranking.predict_config`) for
  ``OpSpec(kind="gemm", shape=(M, N, K))`` in the tensors' dtype. A *GEMV* (``M`` <= 16 and configs
  with ``BLOCK_N``/``BLOCK_K`` but no ``BLOCK_M``) goes to the ``gemv`` template, and a *row
  reduction* (a softmax / layer norm / RMS norm kernel by name, with a row count and a column count
  ``N``/``n_cols`` and one ``BLOCK_SIZE``/``BLOCK_N`` per config) to the ``norm`` template.
  A config the template's rules reject (:class:`~autoopt.errors.ConfigError`: a tile that is mostly
  padding, shared memory over the GPU's opt-in limit, ...) is ranked after every valid one, ordered
  among the rejected by the generic model below, and can still be timed when ``top_k`` reaches it.
- **The generic resource model** otherwise (see :func:`generic_cost`): reads only the configs'
  ``BLOCK_*`` sizes, ``num_warps`` and ``num_stages`` and the call's integer arguments.

Ties keep the user's order (the sort is stable), so a model that cannot tell configs apart falls
back to the order the configs were written in. Nothing here imports torch or triton: configs and
tensors are read by duck typing (``.kwargs``, ``.num_warps``, ``.dtype``, ``.element_size()``).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError, ConfigError, OpError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels import constraints as C
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import constants
from autoopt.kernels.ops import DTYPE_BYTES, GEMV_MAX_M, OpSpec, normalize_dtype

log = get_logger(__name__)

__all__ = ["ConfigRanking", "RankedConfig", "config_dict", "generic_cost", "match_template", "rank_configs"]

#: argument names read as a matmul's / row reduction's dimensions (first match wins).
DIM_NAMES: dict[str, tuple[str, ...]] = {
    "M": ("M", "m"),
    "N": ("N", "n"),
    "K": ("K", "k"),
    "ROWS": ("n_rows", "num_rows", "rows", "M", "m"),
    "COLS": ("n_cols", "num_cols", "ncols", "N", "n"),
}
#: config keys giving a matmul's tile sizes, Triton tutorial spelling first.
BLOCK_KEYS: dict[str, tuple[str, ...]] = {
    "M": ("BLOCK_SIZE_M", "BLOCK_M"),
    "N": ("BLOCK_SIZE_N", "BLOCK_N"),
    "K": ("BLOCK_SIZE_K", "BLOCK_K"),
}
_GROUP_KEYS = ("GROUP_SIZE_M", "GROUP_M")
_ROW_BLOCK_KEYS = ("BLOCK_SIZE", "BLOCK_N", "BLOCK_SIZE_N")
#: kernel-name fragments -> norm template op kind (a row reduction's op cannot be read off its
#: arguments: softmax, layer norm and RMS norm all take (x, out, n_rows, n_cols, BLOCK)).
_NORM_KINDS = (("softmax", "softmax"), ("layer_norm", "layernorm"), ("layernorm", "layernorm"),
               ("rms", "rmsnorm"))
#: tensor dtypes outside OpSpec's aliases that still have an OpSpec dtype.
_EXTRA_DTYPES = {"float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}

# -- generic model constants --------------------------------------------------------------------
#: thread-instructions an SM issues per clock: 4 warp schedulers x 32 lanes on every NVIDIA SM
#: since Volta (CUDA C++ Programming Guide, "Compute Capabilities": 4 schedulers per SM for 7.x-9.x).
ISSUE_LANES_PER_SM = 128
#: SM clock when the profile has none (MHz): between A100's 1410 and H100 SXM's 1980 boost
#: clocks (NVIDIA datasheets); only the issue term's weight against the memory terms depends on it.
DEFAULT_CLOCK_MHZ = 1700
#: programs along a block dimension no argument pairs with (its problem size is unknown).
_UNKNOWN_DIM = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RankedConfig:
    """One user config in ranking order: its position in the list given, what the model said."""

    index: int
    label: str
    #: the model's estimate: microseconds for a template (``predicted_us``), relative microseconds
    #: for the generic model, the user's ``perf_model`` value; ``None`` when nothing was predicted.
    score: float | None
    model: str
    valid: bool = True
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "config": self.label, "model": self.model, "valid": self.valid,
                "score": None if self.score is None else float(f"{self.score:.6g}"), "reason": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigRanking:
    """Every config of one call, best predicted first, and the model that ranked them."""

    #: "gemm" | "gemv" | "norm" (a template), "generic", "perf_model" (the user's), "none" (no GPU
    #: profile: the given order, and every config is timed).
    model: str
    order: tuple[RankedConfig, ...]
    #: the op the template predicted, e.g. ``gemm[512x512x512] fp16``; empty for the other models.
    op: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "op": self.op, "note": self.note, "order": [r.to_dict() for r in self.order]}


# -- reading configs and arguments ----------------------------------------------------------------

def config_dict(config: Any) -> dict[str, Any]:
    """A ``triton.Config`` as plain JSON-able data (its meta-parameters and launch options)."""
    out: dict[str, Any] = {"kwargs": dict(getattr(config, "kwargs", {}) or {})}
    for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        value = getattr(config, name, None)
        if value is not None:
            out[name] = value
    return out


def config_label(config: Any) -> str:
    """``BLOCK_SIZE=128 num_warps=4 num_stages=3``: short, stable, for logs and reports."""
    d = config_dict(config)
    parts = [f"{k}={v}" for k, v in d["kwargs"].items()]
    parts += [f"{k}={d[k]}" for k in ("num_warps", "num_stages") if k in d]
    if d.get("num_ctas", 1) != 1:
        parts.append(f"num_ctas={d['num_ctas']}")
    if d.get("maxnreg") is not None:
        parts.append(f"maxnreg={d['maxnreg']}")
    return " ".join(parts)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _warps(config: Any) -> int:
    return _int(getattr(config, "num_warps", None)) or 4


def _stages(config: Any) -> int:
    return _int(getattr(config, "num_stages", None)) or 3  # triton.Config's default


def _dim(args: Mapping[str, Any], which: str) -> int | None:
    for name in DIM_NAMES[which]:
        v = _int(args.get(name))
        if v is not None and v > 0:
            return v
    return None


def _block(kwargs: Mapping[str, Any], names: Sequence[str]) -> int | None:
    for name in names:
        v = _int(kwargs.get(name))
        if v is not None:
            return v
    return None


def tensor_dtype(args: Mapping[str, Any]) -> tuple[str | None, float]:
    """(OpSpec dtype or None, bytes per element) of the first argument that has a dtype."""
    for value in args.values():
        dtype = getattr(value, "dtype", None)
        if dtype is None or isinstance(value, (int, float)):
            continue
        text = str(dtype).removeprefix("torch.")
        size = getattr(value, "element_size", None)
        elem = float(size()) if callable(size) else 0.0
        try:
            name: str | None = _EXTRA_DTYPES.get(text) or normalize_dtype(text)
        except OpError:
            name = None
        return name, elem or (DTYPE_BYTES[name] if name else 4.0)
    return None, 4.0


# -- known templates ------------------------------------------------------------------------------

Translate = Callable[[Any], KernelConfig]


def match_template(configs: Sequence[Any], args: Mapping[str, Any], kernel: str,
                   gpu: GPUProfile) -> tuple[str, OpSpec, Translate] | None:
    """(template name, op, config translator) when the kernel looks like one of autoopt's templates."""
    dtype, _ = tensor_dtype(args)
    if dtype is None:
        return None
    kwargs = [dict(getattr(c, "kwargs", {}) or {}) for c in configs]
    m, n, k = _dim(args, "M"), _dim(args, "N"), _dim(args, "K")
    try:
        if m and n and k and all(_block(kw, BLOCK_KEYS[d]) for kw in kwargs for d in "MNK"):
            return "gemm", OpSpec(kind="gemm", shape=(m, n, k), dtype=dtype, layout=_layout(args)), \
                partial_gemm(gpu)
        if (m and n and k and m <= GEMV_MAX_M and not any(_block(kw, BLOCK_KEYS["M"]) for kw in kwargs)
                and all(_block(kw, BLOCK_KEYS["N"]) and _block(kw, BLOCK_KEYS["K"]) for kw in kwargs)):
            return "gemv", OpSpec(kind="gemv", shape=(m, n, k), dtype=dtype), partial_gemv(gpu, m)
        rows, cols = _dim(args, "ROWS"), _dim(args, "COLS")
        kind = next((kd for frag, kd in _NORM_KINDS if frag in kernel.lower()), None)
        if (kind and rows and cols and dtype in ("fp16", "bf16", "fp32")
                and all(_block(kw, _ROW_BLOCK_KEYS) for kw in kwargs)):
            return "norm", OpSpec(kind=kind, shape=(rows, cols), dtype=dtype), partial_norm(kind, cols)
    except OpError as exc:  # e.g. a dtype the template's op does not take
        log.debug("kernel %s matches a template but its op is invalid: %s", kernel, exc)
    return None


def _layout(args: Mapping[str, Any]) -> str:
    """``kn`` when B is read row-major over N (the tutorial's ``stride_bn == 1``), else ``nk``."""
    return "kn" if args.get("stride_bn") == 1 and args.get("stride_bk") != 1 else "nk"


def _templates(module: str) -> Any:
    """A built-in template module (``templates/``, installed as ``autoopt.templates``; found beside
    the package in a source checkout run with ``PYTHONPATH=.``)."""
    from autoopt._paths import builtin_templates

    builtin_templates()
    return importlib.import_module(f"autoopt.templates.{module}")


def partial_gemm(gpu: GPUProfile) -> Translate:
    matmul_path = _templates("gemm").matmul_path

    def translate(config: Any) -> KernelConfig:
        kw = config.kwargs
        bm, warps = _block(kw, BLOCK_KEYS["M"]) or 0, _warps(config)
        return KernelConfig(kernel="gemm", template="gemm", path=matmul_path(gpu, bm, warps), params={
            "BLOCK_M": bm, "BLOCK_N": _block(kw, BLOCK_KEYS["N"]) or 0, "BLOCK_K": _block(kw, BLOCK_KEYS["K"]) or 0,
            "GROUP_M": _block(kw, _GROUP_KEYS) or 1, "SPLIT_K": _block(kw, ("SPLIT_K",)) or 1,
            "num_warps": warps, "num_stages": _stages(config)})
    return translate


def partial_gemv(gpu: GPUProfile, m: int) -> Translate:
    path_for = _templates("gemv").GemvTemplate.path_for
    bm = C.next_pow2(m)

    def translate(config: Any) -> KernelConfig:
        kw = config.kwargs
        return KernelConfig(kernel="gemv", template="gemv", path=path_for(gpu, bm), params={
            "BLOCK_M": bm, "BLOCK_N": _block(kw, BLOCK_KEYS["N"]) or 0, "BLOCK_K": _block(kw, BLOCK_KEYS["K"]) or 0,
            "SPLIT_K": _block(kw, ("SPLIT_K",)) or 1, "num_warps": _warps(config), "num_stages": _stages(config)})
    return translate


def partial_norm(kind: str, cols: int) -> Translate:
    def translate(config: Any) -> KernelConfig:
        kw = config.kwargs
        block = _block(kw, _ROW_BLOCK_KEYS) or 0
        if block >= cols:  # the whole row fits one block: the single-pass kernel's shape
            params = {"BLOCK_N": block, "ROWS_PER_PROGRAM": _block(kw, ("ROWS_PER_PROGRAM",)) or 1,
                      "num_warps": _warps(config)}
            return KernelConfig(kernel=f"{kind}_single", template="norm", params=params)
        return KernelConfig(kernel=f"{kind}_looped", template="norm",
                            params={"BLOCK_N": block, "num_warps": _warps(config)})
    return translate


# -- the generic resource model ------------------------------------------------------------------

def _block_dims(kwargs: Mapping[str, Any], args: Mapping[str, Any],
                key_names: Sequence[str]) -> list[tuple[str, int, int | None]]:
    """(suffix, block, problem dim or None) per ``BLOCK*`` meta-parameter of a config.

    ``BLOCK_SIZE_M`` / ``BLOCK_M`` pair with an integer argument named ``M`` (any case, or an alias
    in :data:`DIM_NAMES`); a bare ``BLOCK_SIZE`` pairs with the one integer key argument (a vector
    add's ``n_elements``), or the product of them when there are several."""
    out = []
    for name, value in kwargs.items():
        block = _int(value)
        if block is None or block <= 0 or not name.upper().startswith("BLOCK"):
            continue
        suffix = name.upper().removeprefix("BLOCK").removeprefix("_").removeprefix("SIZE").removeprefix("_")
        dim: int | None = None
        if suffix:
            lowered = {a.lower(): v for a, v in args.items()}
            dim = _int(args.get(suffix)) or _int(lowered.get(suffix.lower()))
            if dim is None and suffix in ("M", "N"):
                dim = _dim(args, "ROWS" if suffix == "M" else "COLS")
        else:
            ints = [v for v in (_int(args.get(k)) for k in key_names) if v]
            dim = math.prod(ints) if ints else None
        out.append((suffix, block, dim if dim and dim > 0 else None))
    return out


def generic_cost(config: Any, args: Mapping[str, Any], key_names: Sequence[str], gpu: GPUProfile,
                 elem_bytes: float) -> tuple[float | None, str]:
    """(relative time in microseconds, or None when the config cannot fit an SM; why) of one config.

    What a program does is read off the block sizes: each ``BLOCK_X`` paired with a problem
    dimension ``X`` tiles it (``ceil(X / BLOCK_X)`` programs along it), except ``K``, which is a
    loop inside each program (``ceil(K / BLOCK_K)`` iterations, the matmul convention). Per loop
    iteration a program loads one ``block x BLOCK_K`` tile per other dimension (one
    ``prod(blocks)`` tile when there is no ``K`` loop), does ``prod(blocks)`` lane-operations, and
    keeps ``prod(non-K blocks)`` fp32 values in registers (the accumulator); with a ``K`` loop Triton
    pipelines ``num_stages`` tiles in shared memory. From these and the GPU's limits:

    - occupancy: programs resident per SM (:func:`autoopt.kernels.constraints.occupancy`: threads,
      registers, shared memory); a config over the per-block shared memory, the thread limit or
      255 registers per thread is rejected (returned as None with the reason);
    - wave quantization: the busiest SM runs ``ceil(programs / SMs)`` programs, ``conc`` of them at
      once, in ``ceil(per_sm / conc)`` rounds;
    - per SM, the slowest of three rates (a roofline max): the SM's share of bandwidth for the tile
      bytes (L2->SM with a ``K`` loop, whose tiles other programs re-read; DRAM without one),
      :data:`ISSUE_LANES_PER_SM` lanes per clock (fewer when the resident threads are fewer) for
      the lane-operations, and DRAM latency hidden by ``conc x num_stages`` loads in flight; plus,
      with a ``K`` loop, one latency per round to fill the pipeline.

    The constants are the cost model's calibrated ones (``dram_latency_us``, ``l2_bw_ratio``,
    ``stream_dram_efficiency``).
    Only the order matters: the result ranks configs of one kernel against each other.
    """
    lim = C.limits(gpu)
    c = constants()
    kwargs = dict(getattr(config, "kwargs", {}) or {})
    warps, stages = _warps(config), _stages(config)
    threads = warps * lim.warp_size
    dims = _block_dims(kwargs, args, key_names)
    loop = [(b, d) for s, b, d in dims if s == "K"]
    tiled = [(b, d) for s, b, d in dims if s != "K"]
    programs = math.prod(math.ceil(d / b) if d else _UNKNOWN_DIM for b, d in tiled) if tiled else 1
    iters = math.prod(math.ceil(d / b) if d else 1 for b, d in loop) if loop else 1
    tile = math.prod(b for b, _ in tiled) if tiled else 1
    bk = math.prod(b for b, _ in loop) if loop else 1
    if loop:
        bytes_iter = sum(b for b, _ in tiled) * bk * elem_bytes if tiled else bk * elem_bytes
        smem = int(max(1, stages) * bytes_iter) if stages > 1 else 0
        depth = max(1, stages)
    else:
        bytes_iter, smem, depth = tile * elem_bytes, 0, 1
    regs = tile / threads + C.REG_OVERHEAD
    problems = C.check_threads(lim, warps) + C.check_smem(lim, smem) + C.check_regs(lim, regs, threads)
    if problems:
        return None, problems[0]
    occ = C.occupancy(lim, smem_bytes=smem, regs_per_thread=regs, threads=threads)
    if occ < 1:
        return None, f"no SM holds one program ({threads} threads, {smem} B shared memory, {regs:.0f} regs/thread)"
    sms = lim.sm_count
    per_sm = math.ceil(programs / sms)
    conc = min(occ, per_sm)
    clock_hz = (gpu.sm_clock_max_mhz or DEFAULT_CLOCK_MHZ) * 1e6
    bw = (gpu.mem_bandwidth_gbs or gpu.measured_bandwidth_gbs or 1000.0) * 1e9
    work = per_sm * iters
    # a K loop re-reads operand tiles other programs also read (served by L2: the SM's share of the
    # L2->SM bandwidth); without one each byte comes from DRAM once (the SM's share of streaming DRAM
    # bandwidth, as predict_stream)
    rate = bw * (c.l2_bw_ratio if loop else c.stream_dram_efficiency) / sms
    t_load = work * bytes_iter / rate * 1e6
    t_issue = work * tile * bk / (min(ISSUE_LANES_PER_SM, conc * threads) * clock_hz) * 1e6
    t_latency = work * c.dram_latency_us / (conc * depth)
    # a K loop pays one latency per round to fill its pipeline before iterations overlap; without
    # a loop, t_latency already is one latency per round
    fills = math.ceil(per_sm / conc) * c.dram_latency_us if loop else 0.0
    us = max(t_load, t_issue, t_latency) + fills
    return us, (f"{programs} programs, {per_sm}/SM ({conc} at once), {iters} iter(s), "
                f"{smem} B smem, {regs:.0f} regs/thread")


# -- ranking --------------------------------------------------------------------------------------

def rank_configs(configs: Sequence[Any], args: Mapping[str, Any], *, gpu: GPUProfile | None, kernel: str,
                 key_names: Sequence[str] = ()) -> ConfigRanking:
    """Every config of ``configs`` for a call with named arguments ``args``, best predicted first.

    ``gpu`` None (no GPU profile): the given order, model ``"none"`` (the caller times them all).
    """
    labels = [config_label(c) for c in configs]
    if gpu is None:
        return ConfigRanking(model="none", note="no GPU profile: configs kept in the order given",
                             order=tuple(RankedConfig(index=i, label=lb, score=None, model="none")
                                         for i, lb in enumerate(labels)))
    _, elem = tensor_dtype(args)
    generic: list[tuple[float | None, str]] = [generic_cost(c, args, key_names, gpu, elem) for c in configs]
    match = match_template(configs, args, kernel, gpu)
    rows: list[tuple[int, float, RankedConfig]] = []
    if match is not None:
        name, op, translate = match
        try:
            rows = _rank_by_template(name, op, translate, configs, labels, generic, gpu)
        except AutooptError as exc:  # the profile lacks what the model needs (e.g. bandwidth)
            log.warning("%s: the %s model cannot rank on %s (%s); using the generic model", kernel, name,
                        gpu.name, exc)
            match = None
    if match is None:
        for i, (lb, (score, why)) in enumerate(zip(labels, generic, strict=True)):
            rows.append((0 if score is not None else 2, score if score is not None else math.inf,
                         RankedConfig(index=i, label=lb, score=score, model="generic", valid=score is not None,
                                      reason=why)))
    rows.sort(key=lambda r: (r[0], r[1], r[2].index))
    order = tuple(r[2] for r in rows)
    if match is None:
        return ConfigRanking(model="generic", order=order)
    valid = sum(1 for r in order if r.valid and r.model == match[0])
    note = "" if valid else f"no config is valid for the {match[0]} model: ordered by the generic model"
    return ConfigRanking(model=match[0], op=match[1].label(), order=order, note=note)


def _rank_by_template(name: str, op: OpSpec, translate: Translate, configs: Sequence[Any], labels: list[str],
                      generic: list[tuple[float | None, str]],
                      gpu: GPUProfile) -> list[tuple[int, float, RankedConfig]]:
    from autoopt.search.ranking import predict_config

    rows = []
    for i, (cfg, lb) in enumerate(zip(configs, labels, strict=True)):
        try:
            pred = predict_config(gpu, op, translate(cfg))
        except ConfigError as exc:
            score = generic[i][0]
            reason = str(exc.reasons[0]) if exc.reasons else str(exc)
            rows.append((1 if score is not None else 2, score if score is not None else math.inf,
                         RankedConfig(index=i, label=lb, score=score, model="generic", valid=False,
                                      reason=f"{name} model rejects it: {reason}")))
            continue
        rows.append((0, pred.us, RankedConfig(index=i, label=lb, score=pred.us, model=name, reason=pred.reason)))
    return rows
