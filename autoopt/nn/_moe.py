"""The experts of a MoE block in one call: autoopt's Triton fused-MoE kernel where it can run, else torch.

:func:`fused_moe` computes, for ``hidden [M, K]``, ``w13 [E, 2N, K]`` (rows ``[gate; up]`` per expert),
``w2 [E, K, N]``, ``topk_weights [M, topk]`` and ``topk_ids [M, topk]``::

    out[m] = sum_j topk_weights[m, j] * w2[e] @ (silu(w13[e, :N] @ hidden[m]) * (w13[e, N:] @ hidden[m]))
    with e = topk_ids[m, j]

the contract of :func:`autoopt.backend.kernels.fused_moe.fused_experts` (imported lazily, on the first call
that can run it). It is a ``torch.library.custom_op`` (``torch.ops.autoopt.fused_moe``) like the dense ops
(:mod:`autoopt.nn.ops`): in plain eager mode the implementation is called directly, under ``torch.compile``
the custom op. It runs the kernel on CUDA tensors, and on CPU tensors under Triton's interpreter, for
float16, bfloat16 and float32; otherwise the torch loop over the experts that :func:`torch_experts` is, for
the same reasons the dense ops fall back (:data:`autoopt.nn.dispatch.FALLBACK_REASONS`, noted once per
reason): no CUDA device, another dtype, bf16 under the interpreter (its bf16 ``tl.dot`` is wrong), fp32 at
``float32_matmul_precision('highest')`` (the kernel's fp32 dot is TF32), no tokens, autograd, and a build
without the kernel (``UNAVAILABLE``).

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

__all__ = ["ACTIVATIONS", "CONFIG_KEYS", "fused_moe", "kernel_problem", "kernels_at", "torch_experts"]

#: the activations the fused kernel computes between its two GEMMs (``act(gate) * up``).
ACTIVATIONS = ("silu",)
#: the kernel config's keys, as vLLM's and SGLang's fused-MoE config files name them.
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
_KERNEL = "autoopt.backend.kernels.fused_moe"
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# -- the config per token count ---------------------------------------------------------------------------


def _config_for(m: int, experts: int, n: int, k: int, topk: int) -> tuple[tuple[str, int], ...]:
    """The config the runtimes' files would hold for this shape: rank()'s pick for the fused_moe op at the
    runtime M key nearest ``m`` (vLLM's lookup: a new prefill length reuses its bucket's config instead of
    ranking, and compiling, one per length)."""
    from autoopt.runtimes.moe_configs import nearest_m

    return _ranked(nearest_m(m), experts, n, k, topk)


@functools.lru_cache(maxsize=256)
def _ranked(key_m: int, experts: int, n: int, k: int, topk: int) -> tuple[tuple[str, int], ...]:
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
    op = OpSpec(kind="fused_moe", shape=(key_m, experts, topk, n, k), dtype="bf16")
    return tuple(moe_config(op, gpu).items())


def _moe_config(m: int, experts: int, n: int, k: int, topk: int) -> dict[str, int]:
    """The kernel config (:data:`CONFIG_KEYS`) for ``m`` tokens routed ``topk`` of ``experts`` experts of
    intermediate ``n`` over hidden ``k``: a new dict each call (the kernel may keep it)."""
    return dict(_config_for(m, experts, n, k, topk))


# -- which path runs ---------------------------------------------------------------------------------------


def _kernel() -> Callable[..., Tensor] | str:
    """The kernel's ``fused_experts``, or why it cannot be imported."""
    try:
        kernel: Callable[..., Tensor] = importlib.import_module(_KERNEL).fused_experts
    except ImportError as exc:
        return f"{UNAVAILABLE} ({_KERNEL} cannot be imported: {exc})"
    return kernel


def kernel_problem(m: int, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why ``m`` tokens of ``dtype`` on ``device`` run torch rather than the fused kernel (None: the kernel
    runs), starting with one of :data:`autoopt.nn.dispatch.FALLBACK_REASONS`. Grad is not asked here."""
    dev_type = device.type
    interpreting = interpreter_active()
    if not (dev_type == "cuda" or (dev_type == "cpu" and interpreting)):
        return (f"{NO_CUDA} (tensors on {device}; Triton kernels run on CUDA devices, or on the CPU only under "
                "TRITON_INTERPRET=1)")
    if dtype not in _DTYPES:
        return f"{DTYPE} ({str(dtype).removeprefix('torch.')}; the kernel covers float16, bfloat16 and float32)"
    if interpreting and dtype == torch.bfloat16:
        return (f"{INTERPRETER_BF16} (the interpreter's bf16 tl.dot gives wrong results in triton 3.9 with "
                "torch 2.13)")
    tf32 = tf32_problem(dtype, device, torch.get_float32_matmul_precision())
    if tf32 is not None:
        return tf32
    if m == 0:
        return f"{EMPTY} (no tokens)"
    kernel = _kernel()
    return kernel if isinstance(kernel, str) else None


def kernels_at(m: int, experts: int, n: int, k: int, topk: int, dtype: torch.dtype, device: torch.device) -> str:
    """What runs the experts of ``m`` tokens, as a report row says it: the kernel and its config, or torch and
    why."""
    problem = kernel_problem(m, dtype, device)
    if problem is not None:
        return f"torch ({problem})"
    config = " ".join(f"{key}={value}" for key, value in _config_for(m, experts, n, k, topk))
    where = ", interpreter" if interpreter_active() and device.type == "cpu" else ""
    return f"fused_moe {config} [rank(){where}]"


# -- the op -------------------------------------------------------------------------------------------------


def _check(hidden: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any, activation: Any) -> None:
    for name, t in (("hidden", hidden), ("w13", w13), ("w2", w2), ("topk_weights", topk_weights),
                    ("topk_ids", topk_ids)):
        if not isinstance(t, Tensor):
            raise TypeError(f"autoopt.nn.fused_moe: {name} must be a torch.Tensor, got {type(t).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"autoopt.nn.fused_moe: activation must be one of {', '.join(map(repr, ACTIVATIONS))}, "
                         f"got {activation!r}")
    if hidden.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"autoopt.nn.fused_moe: hidden must be 2-D [M, K], w13 and w2 3-D ([E, 2N, K], [E, K, N]); "
                         f"got {tuple(hidden.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}")
    m, k = hidden.shape
    e, two_n, _ = w13.shape
    if w13.shape[2] != k or two_n % 2 or tuple(w2.shape) != (e, k, two_n // 2):
        raise ValueError(f"autoopt.nn.fused_moe: w13 must be [E, 2N, K] and w2 [E, K, N] for hidden [M, K] = "
                         f"[{m}, {k}]; got w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"autoopt.nn.fused_moe: topk_ids and topk_weights must both be [M, topk] with M = {m}; got "
                         f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise RuntimeError(f"autoopt.nn.fused_moe: topk_ids must be an integer tensor, got {topk_ids.dtype}")
    for name, t in (("w13", w13), ("w2", w2), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if t.device != hidden.device:
            raise RuntimeError(f"autoopt.nn.fused_moe: expected all tensors on one device, but hidden is on "
                               f"{hidden.device} and {name} is on {t.device}")
    if w13.dtype != hidden.dtype or w2.dtype != hidden.dtype:
        raise RuntimeError(f"autoopt.nn.fused_moe: dtype mismatch: hidden is {hidden.dtype}, w13 {w13.dtype}, "
                           f"w2 {w2.dtype} (cast them alike)")


def torch_experts(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                  activation: str = "silu") -> Tensor:
    """The contract in torch: each expert's tokens gathered, its two GEMMs in the weights' dtype, the weighted
    outputs summed in float32 and cast to ``hidden``'s dtype once. Reads the per-expert counts on the host."""
    m, k = hidden.shape
    topk = topk_ids.shape[1]
    n = w13.shape[1] // 2
    out = torch.zeros(m, k, dtype=torch.float32, device=hidden.device)
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    weights = topk_weights.reshape(-1).float()
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start:start + count]
        start += count
        tokens = pairs // topk
        gate_up = F.linear(hidden[tokens], w13[e])
        h = F.silu(gate_up[:, :n]) * gate_up[:, n:]
        out.index_add_(0, tokens, F.linear(h, w2[e]).float() * weights[pairs, None])
    return out.to(hidden.dtype)


def _fused_moe_impl(hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor,
                    activation: str = "silu") -> Tensor:
    _check(hidden, w13, w2, topk_weights, topk_ids, activation)
    problem = kernel_problem(hidden.shape[0], hidden.dtype, hidden.device)
    if problem is not None:
        note_fallback("fused_moe", problem)
        return torch_experts(hidden, w13, w2, topk_weights, topk_ids, activation)
    kernel = _kernel()
    assert not isinstance(kernel, str)
    m, k = hidden.shape
    e, two_n, _ = w13.shape
    config = _moe_config(m, e, two_n // 2, k, topk_ids.shape[1])
    out: Tensor = kernel(hidden.contiguous(), w13, w2, topk_weights.float(), topk_ids, config=config,
                         activation=activation)
    return out


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
    out: Tensor = torch.ops.autoopt.fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation)
    return out
