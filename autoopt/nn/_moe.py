"""The experts of a MoE block in one call: autoopt's Triton fused-MoE kernel where it can run, else torch.

:func:`fused_moe` computes, for ``hidden [M, K]``, ``w13 [E, 2N, K]`` (rows ``[gate; up]`` per expert),
``w2 [E, K, N]``, ``topk_weights [M, topk]`` and ``topk_ids [M, topk]``::

    out[m] = sum_j topk_weights[m, j] * w2[e] @ (silu(w13[e, :N] @ hidden[m]) * (w13[e, N:] @ hidden[m]))
    with e = topk_ids[m, j]

the contract of :func:`autoopt.backend.kernels.fused_moe.fused_experts` (imported lazily, on the first call
that can run it). It is a ``torch.library.custom_op`` (``torch.ops.autoopt.fused_moe``) like the dense ops
(:mod:`autoopt.nn.ops`): in plain eager mode the implementation is called directly, under ``torch.compile``
the custom op, or where the kernel runs on a GPU the ``triton_op`` ``torch.ops.autoopt.fused_moe_kernel``,
whose kernels the compiled graph launches without calling back into Python. It runs the kernel on CUDA
tensors, and on CPU tensors under Triton's interpreter, for float16, bfloat16 and float32; otherwise the torch
loop over the experts that :func:`torch_experts` is, for the same reasons the dense ops fall back
(:data:`autoopt.nn.dispatch.FALLBACK_REASONS`, noted once per reason): no CUDA device, another dtype, bf16
under the interpreter (its bf16 ``tl.dot`` is wrong), fp32 at ``float32_matmul_precision('highest')`` (the
kernel's fp32 dot is TF32), no tokens, autograd, and a build without the kernel (``UNAVAILABLE``).

Quantized experts (:func:`fused_moe_quant`, ``torch.ops.autoopt.fused_moe_quant``): the same contract over
experts packed per expert by :func:`autoopt.backend.quant.quantize` into a format the kernel runs
(:func:`expert_format_problem` says which: ``fp8`` and ``fp8_block`` W8A8, ``int8``, ``int4`` symmetric or
asymmetric), stacked ``[E, ...]``; the torch fallback dequantizes one expert at a time.

The kernel config for a token count M comes from :func:`_moe_config`, the one place that decides it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from autoopt.nn.dispatch import (
    AUTOGRAD,
    DTYPE,
    EMPTY,
    INTERPRETER_BF16,
    NO_CUDA,
    UNAVAILABLE,
    interpreter_active,
    note_fallback,
    tf32_problem,
)
from autoopt.nn.ops import _direct, _grad_needed

__all__ = ["ACTIVATIONS", "CONFIG_KEYS", "expert_format_problem", "fused_moe", "fused_moe_quant", "kernel_problem",
           "kernels_at", "torch_experts", "torch_experts_quant"]

#: the activations the fused kernel computes between its two GEMMs (``act(gate) * up``).
ACTIVATIONS = ("silu",)
#: the kernel config's keys, as vLLM's and SGLang's fused-MoE config files name them.
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
_KERNEL = "autoopt.backend.kernels.fused_moe"
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TRITON_OP_DTYPES = (torch.float16, torch.bfloat16)


# -- the config per token count ---------------------------------------------------------------------------


def _config_for(m: int, experts: int, n: int, k: int, topk: int, weight: str | None = None
                ) -> tuple[tuple[str, int], ...]:
    """The config the runtimes' files would hold for this shape (and experts' format): rank()'s pick for the
    fused_moe op at the runtime M key nearest ``m`` (vLLM's lookup: a new prefill length reuses its bucket's
    config instead of ranking, and compiling, one per length)."""
    from autoopt.runtimes.moe_configs import nearest_m

    return _ranked(nearest_m(m), experts, n, k, topk, weight)


@functools.lru_cache(maxsize=256)
def _ranked(key_m: int, experts: int, n: int, k: int, topk: int, weight: str | None = None
            ) -> tuple[tuple[str, int], ...]:
    """rank()'s pick for the fused_moe op on the GPU the ops rank for; a winner measured on this device
    before comes first (rank(measured=True))."""
    import torch

    from autoopt.kernels.ops import OpSpec
    from autoopt.nn.dispatch import _gpu_for
    from autoopt.search.moe import moe_config

    dev_type = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = _gpu_for(torch.device(dev_type), dev_type)
    if gpu is None:
        raise RuntimeError("no GPU profile to rank the fused-MoE config for")
    op = OpSpec(kind="fused_moe", shape=(key_m, experts, topk, n, k), dtype="bf16", weight=weight)
    return tuple(moe_config(op, gpu).items())


def _moe_config(m: int, experts: int, n: int, k: int, topk: int, weight: str | None = None) -> dict[str, int]:
    """The kernel config (:data:`CONFIG_KEYS`) for ``m`` tokens routed ``topk`` of ``experts`` experts of
    intermediate ``n`` over hidden ``k`` (in format ``weight``): a new dict each call (the kernel may keep it)."""
    return dict(_config_for(m, experts, n, k, topk, weight))


# -- which path runs ---------------------------------------------------------------------------------------


def _kernel() -> Callable[..., Tensor] | str:
    """The kernel's ``fused_experts``, or why it cannot be imported."""
    try:
        kernel: Callable[..., Tensor] = importlib.import_module(_KERNEL).fused_experts
    except ImportError as exc:
        return f"{UNAVAILABLE} ({_KERNEL} cannot be imported: {exc})"
    return kernel


def expert_format_problem(spec: str) -> str | None:
    """Why experts cannot be quantized into weight format ``spec`` (None: the fused kernel runs it): FP8
    experts run W8A8 only (on FP8 tensor cores; a weight-only FP8 spec is what a GPU without them gets)."""
    from autoopt.kernels.quant import parse_weight

    fmt = parse_weight(spec)
    if fmt.name.startswith("fp8") and not fmt.quantizes_activations:
        return (f"{fmt.spec} is weight-only FP8: the fused-MoE kernel runs FP8 experts W8A8, on FP8 tensor cores "
                "(sm_89+); int8 or int4 experts run on this GPU")
    return None


def _fp8_problem(weight: str | None, device: torch.device) -> str | None:
    """Why W8A8 FP8 experts cannot run on ``device`` (a CUDA GPU before sm_89), else None."""
    if weight is None or not weight.startswith("fp8") or device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= (8, 9):
        return None
    return f"{UNAVAILABLE} (FP8 experts need FP8 tensor cores, sm_89+; this GPU is sm_{major}{minor})"


def kernel_problem(m: int, dtype: torch.dtype, device: torch.device, weight: str | None = None) -> str | None:
    """Why ``m`` tokens of ``dtype`` on ``device`` (experts in format ``weight``) run torch rather than the fused
    kernel (None: the kernel runs), starting with one of :data:`autoopt.nn.dispatch.FALLBACK_REASONS`. Grad is
    not asked here."""
    dev_type = device.type
    interpreting = interpreter_active()
    if not (dev_type == "cuda" or (dev_type == "cpu" and interpreting)):
        return (f"{NO_CUDA} (tensors on {device}; Triton kernels run on CUDA devices, or on the CPU only under "
                "TRITON_INTERPRET=1)")
    if dtype not in _DTYPES or (weight is not None and dtype == torch.float32):
        covered = "float16 and bfloat16 for quantized experts" if weight is not None else \
            "float16, bfloat16 and float32"
        return f"{DTYPE} ({str(dtype).removeprefix('torch.')}; the kernel covers {covered})"
    if interpreting and dtype == torch.bfloat16:
        return (f"{INTERPRETER_BF16} (the interpreter's bf16 tl.dot gives wrong results in triton 3.9 with "
                "torch 2.13)")
    tf32 = tf32_problem(dtype, device, torch.get_float32_matmul_precision())
    if tf32 is not None:
        return tf32
    if m == 0:
        return f"{EMPTY} (no tokens)"
    fp8 = _fp8_problem(weight, device)
    if fp8 is not None:
        return fp8
    kernel = _kernel()
    return kernel if isinstance(kernel, str) else None


def kernels_at(m: int, experts: int, n: int, k: int, topk: int, dtype: torch.dtype, device: torch.device,
               weight: str | None = None) -> str:
    """What runs the experts of ``m`` tokens (in format ``weight``), as a report row says it: the kernel and its
    config, or torch and why."""
    problem = kernel_problem(m, dtype, device, weight)
    if problem is not None:
        return f"torch ({problem})"
    config = " ".join(f"{key}={value}" for key, value in _config_for(m, experts, n, k, topk, weight))
    where = ", interpreter" if interpreter_active() and device.type == "cpu" else ""
    fmt = f" {weight}" if weight is not None else ""
    return f"fused_moe{fmt} {config} [rank(){where}]"


# -- the op -------------------------------------------------------------------------------------------------


def _check_call(op: str, tensors: tuple[tuple[str, Any], ...], topk_weights: Any, topk_ids: Any,
                activation: Any) -> None:
    """What both ops take alike: tensors (``tensors`` lists them by name, ``hidden`` ``[M, K]`` first), the
    activation, a routing ``[M, topk]`` with integer ids, one device. ``op`` names the op in the messages."""
    named = (*tensors, ("topk_weights", topk_weights), ("topk_ids", topk_ids))
    for name, t in named:
        if not isinstance(t, Tensor):
            raise TypeError(f"autoopt.nn.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"autoopt.nn.{op}: activation must be one of {', '.join(map(repr, ACTIVATIONS))}, "
                         f"got {activation!r}")
    hidden = tensors[0][1]
    if hidden.dim() != 2:
        raise ValueError(f"autoopt.nn.{op}: hidden must be 2-D [M, K], got {tuple(hidden.shape)}")
    m = hidden.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"autoopt.nn.{op}: topk_ids and topk_weights must both be [M, topk] with M = {m}; got "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise RuntimeError(f"autoopt.nn.{op}: topk_ids must be an integer tensor, got {topk_ids.dtype}")
    for name, t in named[1:]:
        if t.device != hidden.device:
            raise RuntimeError(f"autoopt.nn.{op}: expected all tensors on one device, but hidden is on "
                               f"{hidden.device} and {name} is on {t.device}")


def _check(hidden: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any, activation: Any) -> None:
    _check_call("fused_moe", (("hidden", hidden), ("w13", w13), ("w2", w2)), topk_weights, topk_ids, activation)
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"autoopt.nn.fused_moe: w13 and w2 must be 3-D ([E, 2N, K], [E, K, N]); got "
                         f"{tuple(w13.shape)}, {tuple(w2.shape)}")
    m, k = hidden.shape
    e, two_n, _ = w13.shape
    if w13.shape[2] != k or two_n % 2 or tuple(w2.shape) != (e, k, two_n // 2):
        raise ValueError(f"autoopt.nn.fused_moe: w13 must be [E, 2N, K] and w2 [E, K, N] for hidden [M, K] = "
                         f"[{m}, {k}]; got w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")
    if w13.dtype != hidden.dtype or w2.dtype != hidden.dtype:
        raise RuntimeError(f"autoopt.nn.fused_moe: dtype mismatch: hidden is {hidden.dtype}, w13 {w13.dtype}, "
                           f"w2 {w2.dtype} (cast them alike)")


def torch_experts(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                  activation: str = "silu") -> Tensor:
    """The contract in torch: each expert's tokens gathered, its two GEMMs in the weights' dtype, the weighted
    outputs summed in float32 and cast to ``hidden``'s dtype once. Reads the per-expert counts on the host."""
    return _per_expert(hidden, topk_weights, topk_ids, w13.shape[0], lambda e: (w13[e], w2[e]))


def _per_expert(hidden: Tensor, topk_weights: Tensor, topk_ids: Tensor, experts: int,
                weights_of: Callable[[int], tuple[Tensor, Tensor]],
                act: Callable[[Tensor], Tensor] = lambda x: x) -> Tensor:
    """The loop of :func:`torch_experts` over the experts that got tokens, ``weights_of(e)`` giving expert
    ``e``'s ``([2N, K], [K, N])`` weights when its turn comes and ``act`` what each GEMM's input becomes."""
    m, k = hidden.shape
    topk = topk_ids.shape[1]
    out = torch.zeros(m, k, dtype=torch.float32, device=hidden.device)
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=experts).tolist()
    weights = topk_weights.reshape(-1).float()
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start:start + count]
        start += count
        tokens = pairs // topk
        g13, g2 = weights_of(e)
        n = g13.shape[0] // 2
        gate_up = F.linear(act(hidden[tokens]), g13)
        h = F.silu(gate_up[:, :n]) * gate_up[:, n:]
        out.index_add_(0, tokens, F.linear(act(h), g2).float() * weights[pairs, None])
    return out.to(hidden.dtype)


def _fused_moe_impl(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                    activation: str = "silu") -> Tensor:
    _check(hidden, w13, w2, topk_weights, topk_ids, activation)
    problem = kernel_problem(hidden.shape[0], hidden.dtype, hidden.device)
    if problem is not None:
        note_fallback("fused_moe", problem)
        return torch_experts(hidden, w13, w2, topk_weights, topk_ids, activation)
    return _run_kernel(hidden, w13, w2, topk_weights, topk_ids, activation)


def _run_kernel(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                activation: str) -> Tensor:
    """The fused kernel's path alone: no fallback and no read of a tensor's values on the host, so that it also
    runs as the body of the ``triton_op`` below (traced with fake tensors)."""
    kernel = _kernel()
    assert not isinstance(kernel, str)
    m, k = hidden.shape
    e, two_n, _ = w13.shape
    config = _moe_config(m, e, two_n // 2, k, topk_ids.shape[1])
    out: Tensor = kernel(hidden.contiguous(), w13, w2, topk_weights.float(), topk_ids, config=config,
                         activation=activation)
    return out


@torch.library.triton_op("autoopt::fused_moe_kernel", mutates_args=())
def _fused_moe_traced(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                      activation: str) -> Tensor:
    """Under ``torch.compile``, where the kernel runs: a ``triton_op``, whose align step, Triton kernels
    (launched through :func:`~autoopt.backend.kernels.traceable`) and torch ops the compiled graph launches
    itself. As a custom op the same work went back into Python every call: on the H100 a Qwen3-30B-A3B prefill
    (1 x 2048, 8 layers) took 30.7 ms to enqueue for 7.5 ms of kernels, ~0.8 ms of host time a MoE layer
    (``moe_e2e_prefill_trace.json``, ``moe_prefill_host_qwen3-30b-a3b.json``)."""
    _check(hidden, w13, w2, topk_weights, topk_ids, activation)
    return _run_kernel(hidden, w13, w2, topk_weights, topk_ids, activation)


_fused_moe_op = torch.library.custom_op(
    "autoopt::fused_moe", mutates_args=(),
    schema="(Tensor hidden, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, str activation) -> Tensor",
)(_fused_moe_impl)


@_fused_moe_op.register_fake
def _fused_moe_fake(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                    activation: str = "silu") -> Tensor:
    _check(hidden, w13, w2, topk_weights, topk_ids, activation)
    return hidden.new_empty(hidden.shape)


def fused_moe(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
              activation: str = "silu") -> Tensor:
    """The experts' output ``[M, K]`` for ``hidden [M, K]`` routed to ``topk_ids`` with ``topk_weights``
    (``[M, topk]``) over ``w13 [E, 2N, K]`` and ``w2 [E, K, N]`` (see the module docstring): the fused kernel,
    or torch where it cannot run."""
    if _grad_needed(hidden, w13, w2, topk_weights):
        _check(hidden, w13, w2, topk_weights, topk_ids, activation)
        if not torch.compiler.is_compiling():
            note_fallback("fused_moe", f"{AUTOGRAD} (an input requires grad with grad mode on; the kernel has no "
                                       "backward: run under torch.no_grad()/torch.inference_mode())")
        return torch_experts(hidden, w13, w2, topk_weights, topk_ids, activation)
    if _direct(hidden, w13, w2, topk_weights, topk_ids):
        return _fused_moe_impl(hidden, w13, w2, topk_weights, topk_ids, activation)
    if _triton_op_runs(hidden):
        traced: Tensor = torch.ops.autoopt.fused_moe_kernel(hidden, w13, w2, topk_weights, topk_ids, activation)
        return traced
    out: Tensor = torch.ops.autoopt.fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation)
    return out


def _triton_op_runs(hidden: Tensor) -> bool:
    """Whether the ``triton_op`` takes ``hidden``: 16-bit rows on a GPU, decided from metadata Dynamo traces
    (no ``torch.get_float32_matmul_precision()``, a graph break). Everything else goes through the custom op,
    which decides at run time: fp32 (its TF32 check), the fallback (it reads routing counts on the host) and the
    interpreter (a compiled graph cannot launch it). A CUDA build of torch ships Triton, so the kernel imports."""
    return hidden.device.type == "cuda" and hidden.dtype in _TRITON_OP_DTYPES and hidden.shape[0] != 0


# -- quantized experts -------------------------------------------------------------------------------------------


def _packed(weight: str, w: Tensor, s: Tensor, z: Tensor | None, e: int, rows: int, cols: int) -> Any:
    """Expert ``e`` of stacked packed experts as a :class:`~autoopt.backend.quant.QuantizedWeight` ``[rows, cols]``."""
    from autoopt.backend.quant import QuantizedWeight

    tensors = {"qweight": w[e], "scales": s[e]}
    if z is not None:
        tensors["offsets"] = z[e]
    return QuantizedWeight.of(weight, rows, cols, tensors)


def _check_quant(hidden: Any, w13: Any, w2: Any, w13_scale: Any, w2_scale: Any, topk_weights: Any,
                 topk_ids: Any, weight: Any, activation: Any) -> tuple[int, int]:
    """``(N, K)`` of packed experts that fit ``hidden`` and the routing; ValueError/TypeError naming what does not."""
    from autoopt.errors import OpError
    from autoopt.kernels.quant import parse_weight

    _check_call("fused_moe_quant", (("hidden", hidden), ("w13", w13), ("w2", w2), ("w13_scale", w13_scale),
                                    ("w2_scale", w2_scale)), topk_weights, topk_ids, activation)
    try:
        fmt = parse_weight(weight)
    except OpError as exc:
        raise ValueError(f"autoopt.nn.fused_moe_quant: {exc}") from None
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"autoopt.nn.fused_moe_quant: w13 and w2 must be 3-D (packed per expert); got "
                         f"{tuple(w13.shape)}, {tuple(w2.shape)}")
    m, k = hidden.shape
    e, two_n = w13.shape[:2]
    n = two_n // 2
    want13, want2 = (e, *fmt.packed_shape(two_n, k)), (e, *fmt.packed_shape(k, n))
    if two_n % 2 or tuple(w13.shape) != want13 or tuple(w2.shape) != want2:
        raise ValueError(f"autoopt.nn.fused_moe_quant: {fmt.spec} experts for hidden [M, K] = [{m}, {k}] are w13 "
                         f"{list(want13)} and w2 {list(want2)}; got {tuple(w13.shape)}, {tuple(w2.shape)}")
    return n, k


def torch_experts_quant(hidden: Tensor, w13: Tensor, w2: Tensor, w13_scale: Tensor, w2_scale: Tensor,
                        topk_weights: Tensor, topk_ids: Tensor, weight: str, w13_offset: Tensor | None = None,
                        w2_offset: Tensor | None = None, activation: str = "silu") -> Tensor:
    """The contract in torch over packed experts: :func:`torch_experts` with each routed expert dequantized (to
    ``hidden``'s dtype) when its turn comes, so no more than one expert is ever 16-bit. W8A8 formats quantize
    each GEMM's activations as the kernel does (per token, or per token per 128-group), then dequantize them."""
    from autoopt.backend.quant import dequantize, dequantize_activations, quantize_activations
    from autoopt.kernels.quant import parse_weight

    fmt = parse_weight(weight)

    def act(x: Tensor) -> Tensor:
        if not fmt.quantizes_activations:
            return x
        return dequantize_activations(*quantize_activations(x, fmt)).to(x.dtype)

    k, n = hidden.shape[1], w13.shape[1] // 2

    def weights_of(e: int) -> tuple[Tensor, Tensor]:
        return (dequantize(_packed(weight, w13, w13_scale, w13_offset, e, 2 * n, k)).to(hidden.dtype),
                dequantize(_packed(weight, w2, w2_scale, w2_offset, e, k, n)).to(hidden.dtype))

    return _per_expert(hidden, topk_weights, topk_ids, w13.shape[0], weights_of, act)


def _fused_moe_quant_impl(hidden: Tensor, w13: Tensor, w2: Tensor, w13_scale: Tensor, w2_scale: Tensor,
                          topk_weights: Tensor, topk_ids: Tensor, weight: str, w13_offset: Tensor | None = None,
                          w2_offset: Tensor | None = None, activation: str = "silu") -> Tensor:
    n, k = _check_quant(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, weight, activation)
    problem = kernel_problem(hidden.shape[0], hidden.dtype, hidden.device, weight)
    if problem is not None:
        note_fallback("fused_moe", problem)
        return torch_experts_quant(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, weight, w13_offset,
                                   w2_offset, activation)
    kernel = _kernel()
    assert not isinstance(kernel, str)
    config = _moe_config(hidden.shape[0], w13.shape[0], n, k, topk_ids.shape[1], weight)
    out: Tensor = kernel(hidden.contiguous(), w13, w2, topk_weights.float(), topk_ids, config=config,
                         activation=activation, w13_scale=w13_scale, w2_scale=w2_scale, w13_offset=w13_offset,
                         w2_offset=w2_offset)
    return out


_fused_moe_quant_op = torch.library.custom_op(
    "autoopt::fused_moe_quant", mutates_args=(),
    schema="(Tensor hidden, Tensor w13, Tensor w2, Tensor w13_scale, Tensor w2_scale, Tensor topk_weights, "
           "Tensor topk_ids, str weight, Tensor? w13_offset, Tensor? w2_offset, str activation) -> Tensor",
)(_fused_moe_quant_impl)


@_fused_moe_quant_op.register_fake
def _fused_moe_quant_fake(hidden: Tensor, w13: Tensor, w2: Tensor, w13_scale: Tensor, w2_scale: Tensor,
                          topk_weights: Tensor, topk_ids: Tensor, weight: str, w13_offset: Tensor | None = None,
                          w2_offset: Tensor | None = None, activation: str = "silu") -> Tensor:
    _check_quant(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, weight, activation)
    return hidden.new_empty(hidden.shape)


def fused_moe_quant(hidden: Tensor, w13: Tensor, w2: Tensor, w13_scale: Tensor, w2_scale: Tensor,
                    topk_weights: Tensor, topk_ids: Tensor, weight: str, w13_offset: Tensor | None = None,
                    w2_offset: Tensor | None = None, activation: str = "silu") -> Tensor:
    """:func:`fused_moe` over experts packed in format ``weight`` (the module docstring): ``w13``/``w2`` stacked
    per expert as :func:`autoopt.backend.quant.quantize` packs ``[2N, K]`` and ``[K, N]``, their scales (and
    int4-asym offsets) stacked alike. The fused kernel, or torch where it cannot run (packed weights carry
    no grad: only ``hidden`` and ``topk_weights`` can ask for one)."""
    args = (hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, weight, w13_offset, w2_offset, activation)
    if _grad_needed(hidden, topk_weights):
        _check_quant(hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, weight, activation)
        if not torch.compiler.is_compiling():
            note_fallback("fused_moe", f"{AUTOGRAD} (an input requires grad with grad mode on; the kernel has no "
                                       "backward: run under torch.no_grad()/torch.inference_mode())")
        return torch_experts_quant(*args)
    tensors = [t for t in (hidden, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, w13_offset, w2_offset)
               if t is not None]
    if _direct(*tensors):
        return _fused_moe_quant_impl(*args)
    out: Tensor = torch.ops.autoopt.fused_moe_quant(*args)
    return out
