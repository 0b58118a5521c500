"""What each backend kernel needs around it: inputs, launch, reference, tolerance, torch baseline.

Kernel names (``KernelConfig.kernel``) and the op kinds they serve:
``gemm``, ``gemm_tma`` (gemm, gemv), ``gemv`` (gemv), ``silu_mul``, ``add``, ``gelu_tanh_mul``,
``{rmsnorm,layernorm,softmax}_{single,looped}``, ``rmsnorm_split``, ``rmsnorm_coop``; over a quantized
weight (``OpSpec.weight``): ``quant_gemv`` (gemv), ``quant_gemv_swap`` (gemv; gemm to 32 rows), ``quant_gemm`` and
``quant_dequant_cublas`` (gemm: dequantize W to a 16-bit scratch, then cuBLAS; weight-only formats);
``fused_moe`` (fused_moe: a MoE layer's expert GEMMs over sorted, padded token slots, 16-bit or W8A8 FP8
experts; inputs ``x``, ``w13``, ``w2`` (+ ``*_scale``), ``topk_weights``, ``topk_ids``). The plain matmul kernels also
run with a fused bias + activation epilogue (a ``"bias"`` input, ``prepare(..., activation=)``): the same
config on the variant kernels of ``kernels/epilogue.py``, not ranked or measured apart. Inputs are fresh
random tensors (never zeros: zeros hide unwritten outputs and can run faster). The reference is float64 on
the same inputs. For a ``kn`` GEMM the weight is stored under ``"w_kn"`` (``[K, N]``) instead of ``"w"``
(``[N, K]``), so the input dict alone says the layout. A quantized weight is drawn like a plain one,
quantized (:func:`autoopt.backend.quant.quantize`) and given as its packed tensors (``qweight``,
``scales``, ``offsets``); its reference is the float64 matmul with the *dequantized* weight (and, for a
W8A8 GEMM, the activations quantized as the kernel does), so the check measures the kernel's error, not
the format's: quantization error against the original layer is ``autoopt.backend.accuracy.rel_error``'s
job. An optional ``bias`` ``[N]`` in the inputs is added by the quantized kernels and the reference.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import BackendError, ConfigError
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

log = get_logger(__name__)

__all__ = [
    "EPS",
    "KERNELS",
    "alloc_out",
    "check_kernel",
    "launch",
    "make_inputs",
    "prepare",
    "quantized_weight",
    "reference",
    "tolerance",
    "torch_baseline",
    "torch_dtype",
]

#: eps by op kind: RMSNorm 1e-6 (Llama's rms_norm_eps), LayerNorm 1e-5 (torch's default).
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}

#: relative Frobenius error ||out - ref|| / ||ref|| allowed, by input dtype.
#: fp32 matmuls run as TF32 on tensor cores (10-bit mantissa, ~3e-4 measured
#: relative error at K=4096), hence their own looser bound.
_TOL = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 1.5e-2, "fp8": 6e-2}
_TOL_TF32 = 5e-3
#: quantized weights, against the dequantized-weight reference, by output dtype. The kernels' products
#: are exact (codes and activations fit the dot's 16-bit type or fp32) and sums are fp32, so what is
#: left is the output's rounding: bf16 keeps 8 significant bits, 1.7e-3 relative Frobenius error on
#: normal data when rounded, 3.5e-3 truncated (Triton 3.9's interpreter truncates fp32 -> bf16:
#: measured on these kernels); fp16 2e-4; fp32 ~1e-6. Twice the worst as the bound. One exception: the
#: int4 GEMV's FMA path on bf16 activations rounds each byte's two products to bf16
#: (``quant_gemv.int4_pair_dot``): 2.5-2.7e-3 on the H100 (``h100/int4_gemv_ab.json``), inside the bound.
_TOL_QUANT = {"bf16": 8e-3, "fp16": 1e-3, "fp32": 1e-4}
#: W8A8 with one scale per row and column (``fp8``): the e4m3 products are exact but Hopper's fp8
#: MMA keeps ~14 bits of its accumulator over the whole K (DeepSeek-V3 technical report, 2024, §3.3.2:
#: up to ~2% relative error at K = 4096); the block format promotes to fp32 every K-tile and keeps
#: the bound above.
_TOL_W8A8_ROW = 2e-2


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelEntry:
    """One backend kernel: the op kinds it serves and the module holding its Triton source.

    ``module`` is what a stored measurement is tied to: when that file changes, the results store
    treats the kernel's old timings as stale.
    """

    name: str
    kinds: tuple[str, ...]
    module: str
    #: whether it reads a packed quantized weight (ops with ``weight`` set, and only those)
    quantized: bool = False
    #: whether it reads plain and quantized weights alike (``quantized`` then says nothing)
    any_weight: bool = False
    #: whether one call is many launches (torch ops between Triton kernels): timed replayed from a CUDA
    #: graph, since timing each call from the host measures the host's enqueue, not the GPU
    graph_timed: bool = False
    #: whether its graph-timed calls cycle over copies of the inputs whose bytes pass three L2s: a decode GEMV's
    #: weight (8-60 MB for Llama-3-8B's linears) fits in the L2, and one copy replayed would be timed from there
    rotate_inputs: bool = False


_KERNELS = "autoopt.backend.kernels"
KERNELS: dict[str, KernelEntry] = {
    "gemm": KernelEntry(name="gemm", kinds=("gemm", "gemv"), module=f"{_KERNELS}.gemm"),
    "gemm_tma": KernelEntry(name="gemm_tma", kinds=("gemm", "gemv"), module=f"{_KERNELS}.gemm_tma"),
    "gemv": KernelEntry(name="gemv", kinds=("gemv",), module=f"{_KERNELS}.gemv"),
    "silu_mul": KernelEntry(name="silu_mul", kinds=("silu_mul",), module=f"{_KERNELS}.elementwise"),
    "add": KernelEntry(name="add", kinds=("add",), module=f"{_KERNELS}.elementwise"),
    "gelu_tanh_mul": KernelEntry(name="gelu_tanh_mul", kinds=("gelu_tanh_mul",), module=f"{_KERNELS}.gated"),
    **{f"{k}_{v}": KernelEntry(name=f"{k}_{v}", kinds=(k,), module=f"{_KERNELS}.norm")
       for k in ("rmsnorm", "layernorm", "softmax") for v in ("single", "looped")},
    "rmsnorm_split": KernelEntry(name="rmsnorm_split", kinds=("rmsnorm",), module=f"{_KERNELS}.norm"),
    "rmsnorm_coop": KernelEntry(name="rmsnorm_coop", kinds=("rmsnorm",), module=f"{_KERNELS}.norm_coop"),
    # A decode GEMV runs replayed from optimize()'s decode graphs and is priced so (templates/quant.py); timed one
    # call at a time on an H200 host it took 11.8-62.5 us for o's configs (8.4 MB of int4) that run 6.5-14 us
    # replayed (benchmarks/results/h200/quant_kernels_fmagrid_{events,graph}.json): the host's enqueue.
    "quant_gemv": KernelEntry(name="quant_gemv", kinds=("gemv",), module=f"{_KERNELS}.quant_gemv", quantized=True,
                              graph_timed=True, rotate_inputs=True),
    "quant_gemv_swap": KernelEntry(name="quant_gemv_swap", kinds=("gemv", "gemm"), module=f"{_KERNELS}.quant_gemv_swap",
                                   quantized=True, graph_timed=True, rotate_inputs=True),
    "quant_gemm": KernelEntry(name="quant_gemm", kinds=("gemm",), module=f"{_KERNELS}.quant_gemm", quantized=True),
    "quant_dequant_cublas": KernelEntry(name="quant_dequant_cublas", kinds=("gemm",),
                                        module=f"{_KERNELS}.quant_dequant", quantized=True),
    # One fused_moe call is ~20 launches (the align's torch ops, two GEMMs, SwiGLU, the sum): timed per
    # call on the H100 host it took 495-1135 us for every M of Mixtral's TP8 shard, against the kernels'
    # 60-800 us (benchmarks/results/h100/moe_tune_scaling.json): the host's enqueue.
    "fused_moe": KernelEntry(name="fused_moe", kinds=("fused_moe",), module=f"{_KERNELS}.fused_moe", any_weight=True,
                             graph_timed=True),
}


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
            "fp8": torch.float8_e4m3fn, "fp64": torch.float64}[name]


def check_kernel(op: OpSpec, config: KernelConfig) -> None:
    """``ConfigError`` when the config's kernel is unknown or does not serve ``op.kind``."""
    entry = KERNELS.get(config.kernel)
    if entry is None:
        raise ConfigError(f"unknown backend kernel {config.kernel!r}; expected one of {', '.join(KERNELS)}",
                          reasons=(f"unknown kernel {config.kernel!r}",))
    if op.kind not in entry.kinds:
        raise ConfigError(f"kernel {config.kernel!r} serves {', '.join(entry.kinds)}, not {op.kind!r}",
                          reasons=(f"kernel {config.kernel!r} cannot run op kind {op.kind!r}",))
    if not entry.any_weight and entry.quantized != (op.weight is not None):
        want = "a quantized weight (OpSpec.weight)" if entry.quantized else f"a plain {op.dtype} weight"
        raise ConfigError(f"kernel {config.kernel!r} reads {want}; {op.label()} has "
                          f"{'weight ' + op.weight if op.weight else 'none'}",
                          reasons=(f"kernel {config.kernel!r} cannot run {op.label()}",))


def _randn(shape: tuple[int, ...], dtype: str, device: Any, gen: Any, scale: float = 1.0) -> Any:
    import torch

    if str(device) == "meta":  # shapes and dtypes only (see make_inputs(empty=True))
        return torch.empty(shape, dtype=torch_dtype(dtype), device="meta")

    t = torch.randn(shape, generator=gen, dtype=torch.float32, device="cpu") * scale
    return t.to(device=device).to(torch_dtype(dtype))


def make_inputs(op: OpSpec, device: Any, seed: int = 0, *, empty: bool = False) -> dict[str, Any]:
    """Fresh random inputs for ``op`` on ``device`` (drawn on the CPU from ``seed``, then moved).

    ``empty=True`` allocates the same tensors uninitialised: enough to compile a kernel for them
    (Triton specialises on dtypes, alignment and sizes, never on values), with no launch and no copy.
    """
    import torch

    if empty:
        out = {k: torch.empty(v.shape, dtype=v.dtype, device=device) for k, v in make_inputs(op, "meta", seed).items()}
        if op.kind == "fused_moe":  # its launcher's align step indexes by the expert ids: real ones, even to compile
            out.update(_moe_routing(op, device, torch.Generator(device="cpu").manual_seed(seed)))
        return out

    gen = torch.Generator(device="cpu").manual_seed(seed)
    if op.kind == "fused_moe":
        return _moe_inputs(op, device, gen)
    if op.weight is not None:
        return _quant_inputs(op, device, gen)
    if op.is_matmul:
        m, n, k = op.shape
        # W ~ N(0, 1/K) keeps outputs O(1) like a trained layer; fp8 keeps |x| far under e4m3's 448.
        a = _randn((m, k), op.dtype, device, gen)
        if op.layout == "kn":
            return {"a": a, "w_kn": _randn((k, n), op.dtype, device, gen, k ** -0.5)}
        return {"a": a, "w": _randn((n, k), op.dtype, device, gen, k ** -0.5)}
    rows, n = op.shape
    x = _randn((rows, n), op.dtype, device, gen)
    if op.kind in ("silu_mul", "add", "gelu_tanh_mul"):
        return {"x": x, "y": _randn((rows, n), op.dtype, device, gen)}
    if op.kind == "softmax":
        return {"x": x}
    # weights near 1 (as trained norms are), never all-equal, never zero
    w = (1.0 + 0.1 * torch.randn((n,), generator=gen)).to(device=device, dtype=torch_dtype(op.dtype))
    if op.kind == "rmsnorm":
        return {"x": x, "weight": w}
    b = (0.1 * torch.randn((n,), generator=gen)).to(device=device, dtype=torch_dtype(op.dtype))
    return {"x": x, "weight": w, "bias": b}


def _quant_inputs(op: OpSpec, device: Any, gen: Any) -> dict[str, Any]:
    """A, and W ~ N(0, 1/K) quantized on ``device`` into ``op``'s format (shapes only on ``meta``)."""
    import torch

    from autoopt.backend.quant import quantize

    fmt = op.weight_format
    assert fmt is not None
    m, n, k = op.shape
    a = _randn((m, k), op.dtype, device, gen)
    if str(device) == "meta":
        qdt = {"fp8": torch.float8_e4m3fn, "fp8_block": torch.float8_e4m3fn, "int8": torch.int8}.get(fmt.name,
                                                                                                   torch.uint8)
        sdt = torch.bfloat16 if fmt.scale_dtype == "bf16" else torch.float32
        out = {"a": a, "qweight": torch.empty(fmt.packed_shape(n, k), dtype=qdt, device="meta"),
               "scales": torch.empty(fmt.scale_shape(n, k), dtype=sdt, device="meta")}
        if not fmt.symmetric:
            out["offsets"] = torch.empty(fmt.scale_shape(n, k), dtype=sdt, device="meta")
        return out
    w = _randn((n, k), op.dtype, device, gen, k ** -0.5)
    return {"a": a, **quantize(w, fmt).tensors()}


def _moe_inputs(op: OpSpec, device: Any, gen: Any) -> dict[str, Any]:
    """A fused-MoE layer: ``x`` (``hidden`` ``[M, K]``, or the activation ``[M*topk, N]`` for the down GEMM
    alone), experts ``w13`` ``[E, 2N, K]`` and ``w2`` ``[E, K, N]`` ~ N(0, 1/fan-in) (quantized per expert into
    ``op.weight``'s format, scales ``w13_scale``/``w2_scale``; drawn from ``seed + 1`` whatever M, and kept for
    the next op of the same layer), and a routing drawn as a router makes one: softmax over random logits, its
    top-k (``topk_weights`` fp32, ``topk_ids`` int64)."""
    import torch

    m, _, topk, n, k = op.shape
    x = _randn((m * topk, n) if op.moe_gemm == "down" else (m, k), op.dtype, device, gen)
    out: dict[str, Any] = {"x": x, **_moe_routing(op, device, gen)}
    key = (op.shape[1:], op.dtype, op.weight, str(device), gen.initial_seed())
    held = {name: ref() for name, ref in _MOE_EXPERTS.get(key, {}).items()}
    if held and all(t is not None for t in held.values()):
        return {**out, **held}
    experts = _moe_experts(op, device, torch.Generator(device="cpu").manual_seed(gen.initial_seed() + 1))
    if str(device) != "meta":
        _MOE_EXPERTS.clear()
        _MOE_EXPERTS[key] = {name: weakref.ref(t) for name, t in experts.items()}
    return {**out, **experts}


#: the last experts drawn (one layer's, on one device), held weakly: while an op's inputs that hold them live
#: (the runner keeps the last few ops'), the next op of the layer reuses them, so a sweep over M (``export
#: moe-configs --tune``: 18 ops of one layer) draws them once, not once an M (Mixtral TP8's experts are 176 M
#: weights drawn on the CPU); nothing is kept past the runner's own cache
_MOE_EXPERTS: dict[tuple[Any, ...], dict[str, weakref.ref[Any]]] = {}


def _moe_experts(op: OpSpec, device: Any, gen: Any) -> dict[str, Any]:
    """The experts ``w13`` ``[E, 2N, K]`` and ``w2`` ``[E, K, N]`` of :func:`_moe_inputs`, from their own
    generator (the same experts for every M)."""
    import torch

    _, e, _, n, k = op.shape
    out: dict[str, Any] = {}
    fmt = op.weight_format
    for name, (rows, cols) in (("w13", (2 * n, k)), ("w2", (k, n))):
        if fmt is None:
            out[name] = _randn((e, rows, cols), op.dtype, device, gen, cols ** -0.5)
            continue
        if str(device) == "meta":
            qdt = {"int8": torch.int8, "int4": torch.uint8}.get(fmt.name, torch.float8_e4m3fn)
            out[name] = torch.empty((e, *fmt.packed_shape(rows, cols)), dtype=qdt, device="meta")
            out[f"{name}_scale"] = torch.empty((e, *fmt.scale_shape(rows, cols)), dtype=torch.float32, device="meta")
            if not fmt.symmetric:
                out[f"{name}_offset"] = torch.empty_like(out[f"{name}_scale"])
            continue
        from autoopt.backend.quant import quantize

        packed = [quantize(_randn((rows, cols), op.dtype, device, gen, cols ** -0.5), fmt) for _ in range(e)]
        out[name] = torch.stack([q.qweight for q in packed])
        out[f"{name}_scale"] = torch.stack([q.scales.float() for q in packed])
        if not fmt.symmetric:
            out[f"{name}_offset"] = torch.stack([q.offsets.float() for q in packed])
    return out


def _moe_routing(op: OpSpec, device: Any, gen: Any) -> dict[str, Any]:
    """A routing as a router makes one: softmax over random logits, its top-k (``topk_weights`` fp32,
    ``topk_ids`` int64), drawn on the CPU and moved."""
    import torch

    m, e, topk, _, _ = op.shape
    if str(device) == "meta":
        return {"topk_weights": torch.empty((m, topk), dtype=torch.float32, device="meta"),
                "topk_ids": torch.empty((m, topk), dtype=torch.int64, device="meta")}
    weights, ids = torch.softmax(torch.randn((m, e), generator=gen), dim=-1).topk(topk, dim=-1)
    return {"topk_weights": weights.to(device), "topk_ids": ids.to(device)}


def _moe_reference(inputs: dict[str, Any], op: OpSpec) -> Any:
    """The fused-MoE op in float64, one expert at a time, with the dequantized experts and (W8A8) the
    activations quantized as the kernel quantizes them (``quantize_activations``)."""
    import torch

    m, e, topk, n, k = op.shape
    fmt = op.weight_format

    def expert_weight(name: str, i: int) -> Any:
        if fmt is not None and fmt.name == "int4":  # packed codes: the quantizer's own dequantization
            from autoopt.backend.quant import QuantizedWeight, dequantize

            rows, cols = (2 * n, k) if name == "w13" else (k, n)
            packed = {"qweight": inputs[name][i], "scales": inputs[f"{name}_scale"][i]}
            if not fmt.symmetric:
                packed["offsets"] = inputs[f"{name}_offset"][i]
            q = QuantizedWeight.of(fmt, rows, cols, packed)
            return dequantize(q).to(torch.float64)
        w = inputs[name][i].to(torch.float64)
        if fmt is None:
            return w
        s = inputs[f"{name}_scale"][i].to(torch.float64)
        if fmt.name == "fp8_block":
            rows, cols = w.shape
            s = s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
            return w * s
        return w * s[:, None]

    def act(x: Any) -> Any:
        if fmt is None or not fmt.quantizes_activations:
            return x.to(torch.float64)
        from autoopt.backend.quant import quantize_activations

        q, s = quantize_activations(x, fmt)
        q = q.to(torch.float64)
        if s.dim() == 1:
            return q * s.to(torch.float64)[:, None]
        return q * s.to(torch.float64).repeat_interleave(128, 1)[:, :x.shape[1]]

    ids = inputs["topk_ids"].reshape(-1)
    slot_w = inputs["topk_weights"].reshape(-1).to(torch.float64)
    x = inputs["x"]
    rows = x.shape[0]
    if op.moe_gemm == "down":
        a = act(x)
        out = torch.zeros((rows, k), dtype=torch.float64, device=x.device)
        for i in range(e):
            sel = (ids == i).nonzero().flatten()
            out[sel] = (a[sel] @ expert_weight("w2", i).t()) * slot_w[sel, None]
        return out
    a = act(x)
    up = torch.zeros((m * topk, 2 * n), dtype=torch.float64, device=x.device)
    for i in range(e):
        sel = (ids == i).nonzero().flatten()
        up[sel] = a[sel // topk] @ expert_weight("w13", i).t()
    if op.moe_gemm == "gate_up":
        return up
    h = torch.nn.functional.silu(up[:, :n]) * up[:, n:]
    h = act(h.to(x.dtype)) if fmt is not None else h
    down = torch.zeros((m * topk, k), dtype=torch.float64, device=x.device)
    for i in range(e):
        sel = (ids == i).nonzero().flatten()
        down[sel] = h[sel] @ expert_weight("w2", i).t()
    return (down * slot_w[:, None]).view(m, topk, k).sum(dim=1)


def _moe_baseline(inputs: dict[str, Any], op: OpSpec) -> Callable[[], Any] | None:
    """A per-expert loop in torch, as transformers' eager experts run (16-bit experts, both GEMMs only)."""
    import torch
    import torch.nn.functional as F

    if op.weight is not None or op.moe_gemm != "both":
        return None
    x, w13, w2 = inputs["x"], inputs["w13"], inputs["w2"]
    ids, tw = inputs["topk_ids"], inputs["topk_weights"]
    e = w13.shape[0]

    def run() -> Any:
        out = torch.zeros_like(x)
        for i in range(e):
            tok, pos = torch.where(ids == i)
            if tok.numel() == 0:
                continue
            gate, up = F.linear(x[tok], w13[i]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, w2[i]) * tw[tok, pos, None].to(x.dtype)
            out.index_add_(0, tok, y)
        return out
    return run


def quantized_weight(inputs: dict[str, Any], op: OpSpec) -> Any:
    """The :class:`~autoopt.backend.quant.QuantizedWeight` held by ``inputs`` for ``op``."""
    from autoopt.backend.quant import QuantizedWeight

    if op.weight is None:
        raise BackendError(f"{op.label()} has no quantized weight")
    _, n, k = op.shape
    return QuantizedWeight.of(op.weight, n, k, inputs)


def alloc_out(op: OpSpec, device: Any) -> Any:
    """An uninitialised output of the op's shape and output dtype."""
    import torch

    if op.kind == "fused_moe":
        m, _, topk, n, k = op.shape
        rows_cols = {"both": (m, k), "gate_up": (m * topk, 2 * n), "down": (m * topk, k)}[op.moe_gemm or "both"]
        return torch.empty(rows_cols, dtype=torch_dtype(op.dtype), device=device)
    shape = (op.shape[0], op.shape[1]) if op.is_matmul else tuple(op.shape)
    return torch.empty(shape, dtype=torch_dtype(op.out_dtype or op.dtype), device=device)


def tolerance(op: OpSpec) -> float:
    """Largest relative Frobenius error accepted for ``op`` (TF32 bound for fp32 matmuls)."""
    if op.kind == "fused_moe":
        # W8A8 experts: Hopper's fp8 MMA accumulator (the W8A8 row bound) and, between the GEMMs, the
        # activation quantized from the kernel's 16-bit rows where the reference quantizes its own
        return _TOL_W8A8_ROW if op.weight is not None else _TOL[op.dtype]
    if op.weight is not None:
        fmt = op.weight_format
        assert fmt is not None
        if op.kind == "gemm" and fmt.activation == "per_token":
            return _TOL_W8A8_ROW
        return _TOL_QUANT[op.out_dtype or op.dtype]
    if op.is_matmul and op.dtype == "fp32":
        return _TOL_TF32
    return _TOL[op.dtype]


def _weight(inputs: dict[str, Any]) -> tuple[Any, str]:
    return (inputs["w_kn"], "kn") if "w_kn" in inputs else (inputs["w"], "nk")


def prepare(inputs: dict[str, Any], config: KernelConfig, out: Any,
            op: OpSpec | None = None, *, eps: float | None = None, activation: str | None = None
            ) -> Callable[[], None]:
    """Bind ``config`` to the tensors; returns a no-argument launcher (compiles on first call).

    Allocations (split-K workspace, descriptors) happen here, outside any timed region.
    ``op``, when given, is checked against the kernel's kinds. ``eps`` (norms only) overrides
    :data:`EPS` (a model's own ``rms_norm_eps``, say). A matmul given a ``"bias"`` input or an
    ``activation`` (``gelu``, ``gelu_tanh``, ``relu``) runs the same config with the epilogue
    ``act(a @ W^T + bias)`` fused (:mod:`autoopt.backend.kernels.epilogue`).
    """
    if op is not None:
        check_kernel(op, config)
    elif config.kernel not in KERNELS:
        raise ConfigError(f"unknown backend kernel {config.kernel!r}; expected one of {', '.join(KERNELS)}")
    params = dict(config.params)
    name = config.kernel
    if name == "fused_moe":
        if op is None:
            raise ConfigError("kernel 'fused_moe' needs the op (which GEMM, the weight format) to bind its inputs")
        from autoopt.backend.kernels.fused_moe import fused_moe_prepare
        return fused_moe_prepare(inputs["x"], inputs["w13"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"],
                                 out, config=params, w13_scale=inputs.get("w13_scale"),
                                 w2_scale=inputs.get("w2_scale"), gemm=op.moe_gemm or "both",
                                 w13_offset=inputs.get("w13_offset"), w2_offset=inputs.get("w2_offset"))
    if name in ("quant_gemv", "quant_gemv_swap", "quant_gemm", "quant_dequant_cublas"):
        if op is None:
            raise ConfigError(f"kernel {name!r} needs the op (its weight format) to bind its inputs")
        qw = quantized_weight(inputs, op)
        if name == "quant_gemv":
            from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare
            return quant_gemv_prepare(inputs["a"], qw, out, params, bias=inputs.get("bias"))
        if name == "quant_gemv_swap":
            from autoopt.backend.kernels.quant_gemv_swap import quant_gemv_swap_prepare
            return quant_gemv_swap_prepare(inputs["a"], qw, out, params, bias=inputs.get("bias"))
        if name == "quant_dequant_cublas":
            from autoopt.backend.kernels.quant_dequant import quant_dequant_cublas_prepare
            return quant_dequant_cublas_prepare(inputs["a"], qw, out, params, bias=inputs.get("bias"))
        from autoopt.backend.kernels.quant_gemm import quant_gemm_prepare
        return quant_gemm_prepare(inputs["a"], qw, out, params, bias=inputs.get("bias"))
    if name in ("gemm", "gemm_tma", "gemv"):
        w, layout = _weight(inputs)
        if inputs.get("bias") is not None or activation not in (None, "none"):
            from autoopt.backend.kernels.epilogue import epilogue_prepare
            return epilogue_prepare(name, inputs["a"], w, out, params, bias=inputs.get("bias"),
                                    activation=activation or "none", layout=layout)
        if name == "gemm":
            from autoopt.backend.kernels.gemm import gemm_prepare
            return gemm_prepare(inputs["a"], w, out, params, layout=layout)
        if name == "gemm_tma":
            from autoopt.backend.kernels.gemm_tma import gemm_tma_prepare
            return gemm_tma_prepare(inputs["a"], w, out, params, layout=layout)
        from autoopt.backend.kernels.gemv import gemv_prepare
        return gemv_prepare(inputs["a"], w, out, params, layout=layout)
    if name == "silu_mul":
        from autoopt.backend.kernels.elementwise import silu_mul_prepare
        return silu_mul_prepare(inputs["x"], inputs["y"], out, params)
    if name == "add":
        from autoopt.backend.kernels.elementwise import add_prepare
        return add_prepare(inputs["x"], inputs["y"], out, params)
    if name == "gelu_tanh_mul":
        from autoopt.backend.kernels.gated import gelu_tanh_mul_prepare
        return gelu_tanh_mul_prepare(inputs["x"], inputs["y"], out, params)
    if name == "rmsnorm_coop":
        from autoopt.backend.kernels.norm_coop import rmsnorm_coop_prepare
        return rmsnorm_coop_prepare(inputs["x"], inputs["weight"], out, params,
                                    eps=EPS["rmsnorm"] if eps is None else eps)
    from autoopt.backend.kernels.norm import norm_prepare
    return norm_prepare(name, inputs["x"], inputs.get("weight"), inputs.get("bias"), out, params,
                        eps=EPS.get(name.rsplit("_", 1)[0], 0.0) if eps is None else eps)


def launch(inputs: dict[str, Any], config: KernelConfig, out: Any, op: OpSpec | None = None) -> None:
    """Run ``config`` once on ``inputs`` writing ``out`` (prepare + launch)."""
    prepare(inputs, config, out, op)()


def reference(inputs: dict[str, Any], op: OpSpec) -> Any:
    """The op computed in float64 on the same inputs and device."""
    import torch

    def d(t: Any) -> Any:
        return t.to(torch.float64)

    if op.kind == "fused_moe":
        return _moe_reference(inputs, op)
    if op.weight is not None:
        from autoopt.backend.quant import reference_matmul

        return reference_matmul(inputs["a"], quantized_weight(inputs, op), gemm=op.kind == "gemm",
                                bias=inputs.get("bias"))
    if op.is_matmul:
        w, layout = _weight(inputs)
        return d(inputs["a"]) @ (d(w) if layout == "kn" else d(w).t())
    x = d(inputs["x"])
    if op.kind == "silu_mul":
        return torch.nn.functional.silu(x) * d(inputs["y"])
    if op.kind == "gelu_tanh_mul":
        return torch.nn.functional.gelu(x, approximate="tanh") * d(inputs["y"])
    if op.kind == "add":
        return x + d(inputs["y"])
    if op.kind == "softmax":
        return torch.softmax(x, dim=-1)
    if op.kind == "rmsnorm":
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + EPS["rmsnorm"]) * d(inputs["weight"])
    if op.kind == "layernorm":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), d(inputs["weight"]), d(inputs["bias"]),
                                              EPS["layernorm"])
    raise BackendError(f"no reference for op kind {op.kind!r}")


def _scaled_mm_baseline(inputs: dict[str, Any], op: OpSpec) -> Callable[[], Any] | None:
    """The vendor path of a W8A8 ``fp8`` GEMM as ``autoopt.kernels.vendor`` prices it: autoopt's activation
    quantization (``act_quant.py``), then cuBLASLt's FP8 GEMM with row-wise scales (``torch._scaled_mm``,
    sm_90+)."""
    import torch

    fmt = op.weight_format
    a = inputs["a"]
    if (fmt is None or fmt.name != "fp8" or not fmt.quantizes_activations or op.kind != "gemm"
            or a.device.type != "cuda" or torch.cuda.get_device_capability(a.device) < (9, 0)):
        return None
    from autoopt.backend.kernels.act_quant import act_quant_prepare

    m, k = a.shape
    aq = torch.empty((m, k), device=a.device, dtype=torch.float8_e4m3fn)
    s = torch.empty((m,), device=a.device, dtype=torch.float32)
    quant = act_quant_prepare(a, aq, s)
    w, ws = inputs["qweight"], inputs["scales"].float()[None, :]
    out_dtype = torch_dtype(op.out_dtype or op.dtype)

    def run() -> Any:
        quant()
        return torch._scaled_mm(aq, w.t(), scale_a=s[:, None], scale_b=ws, out_dtype=out_dtype)
    return run


def torch_baseline(inputs: dict[str, Any], op: OpSpec) -> Callable[[], Any] | None:
    """The plain-PyTorch way to compute ``op`` (cuBLAS, ATen kernels), for the ratio column.

    None where torch has no direct equivalent on this device (fp8 GEMM off sm_89+; a quantized weight
    other than a W8A8 ``fp8`` GEMM, which is ``torch._scaled_mm`` with row-wise scales on sm_90+).
    """
    import torch
    import torch.nn.functional as F

    if op.kind == "fused_moe":
        return _moe_baseline(inputs, op)
    if op.weight is not None:
        return _scaled_mm_baseline(inputs, op)
    if op.is_matmul:
        a = inputs["a"]
        w, layout = _weight(inputs)
        if op.dtype == "fp8":
            if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device) < (8, 9):
                return None
            one = torch.ones((), device=a.device, dtype=torch.float32)
            # _scaled_mm wants B column-major: W[N,K] row-major transposed is exactly that.
            b = w.t() if layout == "nk" else w.t().contiguous().t()
            return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        if layout == "kn":
            return lambda: torch.matmul(a, w)
        return lambda: F.linear(a, w)
    x = inputs["x"]
    if op.kind == "silu_mul":
        y = inputs["y"]
        return lambda: F.silu(x) * y
    if op.kind == "gelu_tanh_mul":
        y = inputs["y"]
        return lambda: F.gelu(x, approximate="tanh") * y
    if op.kind == "add":
        y = inputs["y"]
        return lambda: x + y
    if op.kind == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if op.kind == "rmsnorm":
        w = inputs["weight"]
        return lambda: F.rms_norm(x, (x.shape[-1],), w, EPS["rmsnorm"])
    w, b = inputs["weight"], inputs["bias"]
    return lambda: F.layer_norm(x, (x.shape[-1],), w, b, EPS["layernorm"])
