"""Torch-facing ops on autoopt's ranked Triton kernels, each a ``torch.library.custom_op``.

===============================  =====================================  ===============================
public function                  custom op (``torch.ops.autoopt.*``)     Triton kernel (op kind ranked)
===============================  =====================================  ===============================
``linear(x, w, b, activation)``  ``linear``                              ``gemv`` M <= 16, ``gemm`` above
``quant_linear(x, qw.., b)``     ``quant_linear``                        ``quant_gemv`` / ``quant_gemm``
``rms_norm(x, weight, eps)``     ``rms_norm``                            ``rmsnorm_{single,looped}``
``layer_norm(x, w, b, eps)``     ``layer_norm``                          ``layernorm_{single,looped}``
``silu_mul(gate, up)``           ``silu_mul``                            ``silu_mul``
``gelu_tanh_mul(gate, up)``      ``gelu_tanh_mul``                       ``gelu_tanh_mul``
``swiglu(gate_up)``              ``swiglu``                              ``silu_mul`` (strided rows)
``add(x, y)``                    ``add``                                 ``add``
===============================  =====================================  ===============================

Every op flattens the leading dims (``[..., K]`` -> ``[M, K]``, a view whenever the leading dims
collapse, else a copy as ``torch.reshape`` makes), picks its kernel config through
:func:`autoopt.nn.dispatch.choose` (per op, kind, bucketed M, other dims, dtype and device; cached),
allocates its output with ``torch.empty`` and launches through
:func:`autoopt.backend.registry.prepare` (called on every call: binding a config costs 2-7 us of
Python, less than caching launchers keyed by data pointers would save safely). Outputs are always new
contiguous tensors (fallbacks too), which is what the fake implementations promise ``torch.compile``.

In plain eager mode the public functions call the implementation directly, skipping the dispatcher
(``torch.ops.autoopt.*`` costs ~10-20 us more a call); under ``torch.compile``/``torch.export``, in a
TorchDispatchMode (FakeTensorMode ...) or with tensor subclasses they call the custom op.

**Torch fallbacks** (the reason is logged once per op and reason, counted in
:func:`autoopt.nn.dispatch.fallback_counts`, and starts with one of
:data:`autoopt.nn.dispatch.FALLBACK_REASONS`): tensors not on a CUDA device (unless under Triton's
interpreter), dtypes other than float16/bfloat16/float32, shapes no config is valid for, bf16
matmuls under the interpreter (its bf16 ``tl.dot`` is wrong), fp32 matmuls while torch's
``float32_matmul_precision`` is ``"highest"`` (the kernels' fp32 dot is TF32), strides a kernel
cannot take, empty tensors, linear operands of 2^31 elements or more (the GEMM kernels index in 32
bits), ``add`` with broadcasting or type promotion, and autograd: these are
inference kernels with no backward, so when grad mode is on and an input requires grad the public
function runs the torch op (training keeps working; under ``torch.no_grad()`` /
``torch.inference_mode()`` or with ``requires_grad=False`` parameters the kernels run).

**Under torch.compile** a public function asks the dispatch at trace time (static shapes): where the
choice for its key is the torch op (a fallback, or cuBLAS predicted faster than autoopt's kernel) the
graph holds the torch op itself, which Inductor fuses and launches with none of a custom op's host
cost (~100 us a call on the H100's host at prefill shapes, ``benchmarks/results/h100/nn_overhead.json``);
otherwise it holds the custom op. Dynamic shapes always take the custom op.

**Bad input** raises what torch would (``ValueError`` for shapes, ``RuntimeError`` for dtype and
device mismatches, ``TypeError`` for non-tensors), naming the tensor, from the public function, the
custom op and its fake implementation alike: never a Triton compile error.

**CUDA graphs**: the launch path allocates only through torch's caching allocator (graph-safe),
never synchronises and never reads a tensor's values on the host. The config choice and the
kernel's compilation happen on the first call of each shape bucket, so run every bucket once
eagerly before capturing (see :mod:`autoopt.nn.dispatch`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from autoopt.backend.registry import prepare
from autoopt.kernels.constants import INDUCTOR_NORM_MAX_ROWS
from autoopt.nn.dispatch import (
    AUTOGRAD,
    BROADCAST,
    EMPTY,
    INDEX,
    STRIDES,
    VENDOR,
    Choice,
    choose,
    matmul_kind,
    note_fallback,
    tf32_problem,
)

__all__ = ["ACTIVATIONS", "add", "dequant_linear", "gelu_tanh_mul", "layer_norm", "linear", "quant_linear", "rms_norm",
           "silu_mul", "swiglu"]

_LIB = "autoopt"
#: the GEMM/GEMV kernels index A, W and C with 32-bit offsets (row index x row stride): larger operands
#: would wrap around, so they run torch (a 131072-token prefill into a K=28672 projection is one).
_INDEX_LIMIT = 2**31


# -- validation (public functions, custom ops and fake implementations share it) ------------------------
# Each check is a fast predicate (a few attribute reads: it runs on every call) and, only when that
# fails, a slow pass that finds what is wrong and raises with the tensor's name.

def _tensor(op: str, name: str, t: Any, *, optional: bool = False) -> None:
    if t is None and optional:
        return
    if not isinstance(t, Tensor):
        raise TypeError(f"autoopt.nn.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _same(op: str, **tensors: Tensor | None) -> None:
    """RuntimeError unless every given tensor has the first one's device and dtype."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise RuntimeError(f"autoopt.nn.{op}: expected all tensors on one device, but {first_name} is on "
                               f"{first.device} and {name} is on {t.device}")
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise RuntimeError(f"autoopt.nn.{op}: dtype mismatch: {first_name} is {first.dtype} and {name} is "
                               f"{t.dtype} (cast one of them)")


def _check_linear(x: Any, weight: Any, bias: Any) -> None:
    try:
        if (weight.dim() == 2 and x.dim() >= 1 and x.shape[-1] == weight.shape[1] and x.dtype == weight.dtype
                and x.device == weight.device
                and (bias is None or (bias.shape == (weight.shape[0],) and bias.dtype == x.dtype
                                      and bias.device == x.device))
                and isinstance(x, Tensor) and isinstance(weight, Tensor)
                and (bias is None or isinstance(bias, Tensor))):
            return
    except AttributeError:
        pass
    op = "linear"
    _tensor(op, "x", x)
    _tensor(op, "weight", weight)
    _tensor(op, "bias", bias, optional=True)
    if weight.dim() != 2:
        raise ValueError(f"autoopt.nn.linear: weight must be 2-D [out_features, in_features], got shape "
                         f"{tuple(weight.shape)}")
    if x.dim() < 1:
        raise ValueError("autoopt.nn.linear: x must have at least 1 dimension (its last is in_features), got a "
                         "0-d tensor")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"autoopt.nn.linear: x's last dim ({x.shape[-1]}) must equal weight.shape[1] "
                         f"(in_features={weight.shape[1]}); x has shape {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"autoopt.nn.linear: bias must have shape ({weight.shape[0]},) (out_features), got "
                         f"{tuple(bias.shape)}")
    _same(op, x=x, weight=weight, bias=bias)


def _param_ok(t: Any, x: Tensor, n: Any) -> bool:
    return t is None or (isinstance(t, Tensor) and t.shape == (n,) and t.device == x.device
                         and t.dtype.is_floating_point)


def _check_norm(op: str, x: Any, weight: Any, bias: Any) -> None:
    if isinstance(x, Tensor) and x.dim() >= 1 and _param_ok(weight, x, x.shape[-1]) \
            and _param_ok(bias, x, x.shape[-1]):
        return
    _tensor(op, "x", x)
    _tensor(op, "weight", weight, optional=True)
    _tensor(op, "bias", bias, optional=True)
    if x.dim() < 1:
        raise ValueError(f"autoopt.nn.{op}: x must have at least 1 dimension (normalised over its last), got a "
                         "0-d tensor")
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (n,):
            raise ValueError(f"autoopt.nn.{op}: {name} must have shape ({n},) (x's last dim), got "
                             f"{tuple(t.shape)}; x has shape {tuple(x.shape)}")
        if t is not None and t.device != x.device:
            raise RuntimeError(f"autoopt.nn.{op}: expected all tensors on one device, but x is on {x.device} "
                               f"and {name} is on {t.device}")
        if t is not None and not t.dtype.is_floating_point:
            raise RuntimeError(f"autoopt.nn.{op}: {name} must be a floating-point tensor, got {t.dtype}")


def _check_pair(op: str, a_name: str, a: Any, b_name: str, b: Any) -> None:
    if isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and a.dtype == b.dtype \
            and a.device == b.device:
        return
    _tensor(op, a_name, a)
    _tensor(op, b_name, b)
    if a.shape != b.shape:
        raise ValueError(f"autoopt.nn.{op}: {a_name} and {b_name} must have the same shape, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    _same(op, **{a_name: a, b_name: b})


def _check_swiglu(gate_up: Any) -> None:
    _tensor("swiglu", "gate_up", gate_up)
    if gate_up.dim() < 1 or gate_up.shape[-1] % 2:
        raise ValueError(f"autoopt.nn.swiglu: gate_up's last dim must be even (gate and up side by side, "
                         f"[..., 2 * intermediate]), got shape {tuple(gate_up.shape)}")


def _check_add(x: Any, y: Any) -> None:
    if isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape == y.shape and x.device == y.device:
        return
    _tensor("add", "x", x)
    _tensor("add", "y", y)
    if x.device != y.device and x.dim() and y.dim():
        raise RuntimeError(f"autoopt.nn.add: expected all tensors on one device, but x is on {x.device} and y "
                           f"is on {y.device}")
    try:
        torch.broadcast_shapes(x.shape, y.shape)
    except RuntimeError:
        raise ValueError(f"autoopt.nn.add: x of shape {tuple(x.shape)} and y of shape {tuple(y.shape)} are "
                         "neither equal nor broadcastable") from None


# -- shared helpers -------------------------------------------------------------------------------------

def _grad_needed(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


_PLAIN = (Tensor, torch.nn.Parameter)


def _direct(*tensors: Tensor | None) -> bool:
    """Whether a public function may call its implementation directly instead of through the dispatcher
    (``torch.ops.autoopt.*``, ~10-20 us more a call): in plain eager mode on plain tensors. Under
    ``torch.compile``/``torch.export`` tracing, inside a TorchDispatchMode (FakeTensorMode, FlopCounterMode,
    ...) or with tensor subclasses, the custom op is called, so torch sees the op."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    return all(t is None or type(t) in _PLAIN for t in tensors)


def _static_choice(op: str, kind: str, shape: tuple[Any, ...], dtype: Any, device: Any, **key: Any) -> Any:
    """At trace time: the dispatch's choice for a static, non-empty shape; None where a dim is symbolic (no key).
    ``key``: the rest of the dispatch key (a quantized linear's ``weight``)."""
    if not all(type(d) is int and d > 0 for d in shape):
        return None
    return choose(op, kind, shape, dtype, device, **key)


def _torch_chosen(op: str, kind: str, shape: tuple[Any, ...], dtype: Any, device: Any) -> bool:
    """At trace time: whether the dispatch runs the torch op for this key (:func:`_static_choice`); the fallback
    is noted once, as the graph will run it every call."""
    choice = _static_choice(op, kind, shape, dtype, device)
    if choice is None or choice.fallback is None:
        return False
    note_fallback(op, choice.fallback)
    return True


# torch.compile: dynamo hides whether a dim is symbolic, so the choice is made where it is visible: in a
# function dynamo does not trace but records whole, which AOTAutograd then traces on fake tensors
# (``torch._dynamo.nonstrict_trace``, torch >= 2.7). Without it the compiled graph holds the custom ops.
_NONSTRICT: Callable[[Callable[..., Tensor]], Callable[..., Tensor]] | None = getattr(
    torch._dynamo, "nonstrict_trace", None)


def _traced(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    return _NONSTRICT(fn) if _NONSTRICT is not None else fn


def _compiling() -> bool:
    """Whether a public function should route through its traced variant (under torch.compile)."""
    return _NONSTRICT is not None and torch.compiler.is_compiling()


def _present(*optional: Tensor | None) -> tuple[tuple[bool, ...], tuple[Tensor, ...]]:
    """Optional tensors as (which are given, the given ones): a traced function takes no None."""
    return tuple(t is not None for t in optional), tuple(t for t in optional if t is not None)


def _given(mask: tuple[bool, ...], tensors: tuple[Tensor, ...]) -> list[Tensor | None]:
    it = iter(tensors)
    return [next(it) if m else None for m in mask]


def _autograd_fallback(op: str) -> None:
    """Count and log (once) a public call that runs the torch op because autograd needs it; at trace time
    under torch.compile nothing is logged (the traced graph holds the torch op)."""
    if not torch.compiler.is_compiling():
        note_fallback(op, f"{AUTOGRAD} (an input requires grad with grad mode on; the Triton kernels have no "
                          "backward: run under torch.no_grad()/torch.inference_mode() or set requires_grad=False)")


def _fallback(op: str, reason: str, fn: Callable[[], Tensor]) -> Tensor:
    note_fallback(op, reason)
    return fn().contiguous()


def _rows(t: Tensor) -> tuple[int, int]:
    """(rows, N) of ``t`` seen as ``[rows, N]`` over its last dim (a 0-d tensor is one element)."""
    n = t.shape[-1] if t.dim() else 1
    return (t.numel() // n if n else 0), n


def _run(choice: Choice, inputs: dict[str, Tensor], out: Tensor, **kw: Any) -> None:
    assert choice.config is not None
    prepare(inputs, choice.config, out, **kw)()


_CONSTS: dict[tuple[str, int, Any, Any], Tensor] = {}


def _const(kind: str, n: int, dtype: Any, device: Any) -> Tensor:
    """A cached ones/zeros vector standing in for an absent norm weight/bias (made on the first call of a
    shape, so before any CUDA-graph capture that follows a warm-up)."""
    key = (kind, n, dtype, device)
    t = _CONSTS.get(key)
    if t is None:
        t = (torch.ones if kind == "ones" else torch.zeros)(n, dtype=dtype, device=device)
        _CONSTS[key] = t
    return t


def _unit(t: Tensor) -> Tensor:
    """A 1-D parameter with unit stride (a copy of N elements when it is strided: cheap)."""
    return t if t.stride(0) == 1 else t.contiguous()


# -- linear -------------------------------------------------------------------------------------------------

#: the activations ``linear(..., activation=)`` fuses into the GEMM epilogue, as torch computes them.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "relu": F.relu,
}


def _check_activation(activation: Any) -> None:
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"autoopt.nn.linear: activation must be None or one of {', '.join(map(repr, ACTIVATIONS))}, "
                         f"got {activation!r}")


def _torch_linear(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
    y = F.linear(x, weight, bias)
    return y if activation is None else ACTIVATIONS[activation](y)


def _linear_impl(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None = None) -> Tensor:
    _check_linear(x, weight, bias)
    _check_activation(activation)
    n, k = weight.shape
    flat = x.dim() == 2
    m = x.shape[0] if flat else math.prod(x.shape[:-1])

    def torch_op() -> Tensor:
        return _torch_linear(x, weight, bias, activation)

    if m == 0 or n == 0 or k == 0:
        return _fallback("linear", f"{EMPTY} (x {tuple(x.shape)}, weight {tuple(weight.shape)})", torch_op)
    if max(m * k, n * k, m * n) >= _INDEX_LIMIT:
        return _fallback("linear", f"{INDEX} (M={m}, N={n}, K={k}: an operand of 2^31 or more elements)", torch_op)
    choice = choose("linear", matmul_kind(m), (m, n, k), x.dtype, x.device)
    if choice.fallback is not None:
        return _fallback("linear", choice.fallback, torch_op)
    if x.dtype is torch.float32:
        why = tf32_problem(x.dtype, x.device, torch.get_float32_matmul_precision())
        if why is not None:
            return _fallback("linear", why, torch_op)
    a = x if flat else x.reshape(m, k)  # a view when the leading dims collapse, else a copy
    assert choice.config is not None
    if choice.config.kernel == "gemm_tma":
        why = _tma_problem(a, weight)
        if why is not None:
            return _fallback("linear", why, torch_op)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    inputs = {"a": a, "w": weight}
    if bias is not None:
        inputs["bias"] = _unit(bias)  # added to the fp32 accumulator in the GEMM's epilogue
    _run(choice, inputs, out, activation=activation)
    return out if flat else out.view(*x.shape[:-1], n)


_linear_op = torch.library.custom_op(
    f"{_LIB}::linear", mutates_args=(),
    schema="(Tensor x, Tensor weight, Tensor? bias, str? activation=None) -> Tensor")(_linear_impl)


@_linear_op.register_fake
def _linear_fake(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None = None) -> Tensor:
    _check_linear(x, weight, bias)
    _check_activation(activation)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _tma_problem(a: Tensor, w: Tensor) -> str | None:
    """Why the TMA GEMM cannot read ``a``/``w`` (TMA: unit inner stride, 16-byte aligned rows and base)."""
    for name, t in (("x", a), ("weight", w)):
        es = t.element_size()
        if t.stride(-1) != 1 or (t.stride(0) * es) % 16 or t.data_ptr() % 16:
            return (f"{STRIDES} ({name} has strides {tuple(t.stride())} at byte offset "
                    f"{t.data_ptr() % 16} mod 16; the chosen gemm_tma kernel (TMA) needs unit stride along K "
                    f"and 16-byte aligned rows)")
    return None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """``act(x @ weight.T + bias)``: ``torch.nn.functional.linear`` (``weight`` is ``nn.Linear``'s
    ``[out_features, in_features]``) over any leading batch dims of ``x``, then ``activation`` if given:
    ``"gelu"`` (exact, erf), ``"gelu_tanh"`` or ``"relu"``, as ``F.gelu`` / ``F.gelu(approximate="tanh")``
    / ``F.relu`` compute them.

    M (the product of the leading dims) <= 16 ranks the decode GEMV kinds, larger M the tiled GEMMs
    (see :mod:`autoopt.nn.dispatch` for the bucketing). ``x`` and ``weight`` may be strided (the
    kernels take both strides; the TMA GEMM, where chosen, needs unit stride along K and falls back to
    torch otherwise). ``bias`` and the activation are applied to the fp32 accumulator in the GEMM's
    epilogue before its one store (:mod:`autoopt.backend.kernels.epilogue`: the plain MLP's fc1 in one
    kernel). x, weight and bias must share dtype and device, as in torch.
    """
    if _grad_needed(x, weight, bias):
        _check_linear(x, weight, bias)
        _check_activation(activation)
        _autograd_fallback("linear")
        return _torch_linear(x, weight, bias, activation)
    if _direct(x, weight, bias):
        return _linear_impl(x, weight, bias, activation)
    if _compiling():
        mask, given = _present(bias)
        return _linear_traced(x, weight, activation or "", mask, *given)  # a traced function takes no None
    out: Tensor = torch.ops.autoopt.linear(x, weight, bias, activation)
    return out


@_traced
def _linear_traced(x: Tensor, weight: Tensor, act: str, mask: tuple[bool, ...], *given: Tensor) -> Tensor:
    (bias,) = _given(mask, given)
    activation = act or None
    _check_linear(x, weight, bias)
    _check_activation(activation)
    m = math.prod(x.shape[:-1])
    if _torch_chosen("linear", matmul_kind(m), (m, *weight.shape), x.dtype, x.device):
        return _torch_linear(x, weight, bias, activation)
    out: Tensor = torch.ops.autoopt.linear(x, weight, bias, activation)
    return out


# -- quantized linear ---------------------------------------------------------------------------------------

#: activation dtypes of a quantized linear (the kernels' A and output dtypes)
_QUANT_DTYPES = (torch.bfloat16, torch.float16)


def _check_quant_linear(x: Any, qweight: Any, scales: Any, offsets: Any, bias: Any, weight: Any, k: Any) -> None:
    op = "quant_linear"
    if (isinstance(x, Tensor) and isinstance(qweight, Tensor) and isinstance(scales, Tensor) and x.dim() >= 1
            and qweight.dim() == 2 and isinstance(k, int) and x.shape[-1] == k and x.dtype in _QUANT_DTYPES
            and x.device == qweight.device == scales.device and isinstance(weight, str)
            and (offsets is None or (isinstance(offsets, Tensor) and offsets.device == x.device))
            and (bias is None or (isinstance(bias, Tensor) and bias.shape == (qweight.shape[0],)
                                  and bias.dtype == x.dtype and bias.device == x.device))):
        return
    for name, t in (("x", x), ("qweight", qweight), ("scales", scales)):
        _tensor(op, name, t)
    _tensor(op, "offsets", offsets, optional=True)
    _tensor(op, "bias", bias, optional=True)
    if not isinstance(weight, str) or not isinstance(k, int):
        raise TypeError(f"autoopt.nn.quant_linear: weight= takes a format spec (str) and k= in_features (int), got "
                        f"{type(weight).__name__} and {type(k).__name__}")
    if qweight.dim() != 2:
        raise ValueError(f"autoopt.nn.quant_linear: qweight must be 2-D (packed [N, ...]), got {tuple(qweight.shape)}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"autoopt.nn.quant_linear: x's last dim must be the weight's in_features k={k}; x has shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in _QUANT_DTYPES:
        raise RuntimeError(f"autoopt.nn.quant_linear: x must be bfloat16 or float16 (the quantized kernels' "
                           f"activations), got {x.dtype}")
    if bias is not None and tuple(bias.shape) != (qweight.shape[0],):
        raise ValueError(f"autoopt.nn.quant_linear: bias must have shape ({qweight.shape[0]},), got "
                         f"{tuple(bias.shape)}")
    _same(op, x=x, bias=bias)
    for name, t in (("qweight", qweight), ("scales", scales), ("offsets", offsets)):
        if t is not None and t.device != x.device:
            raise RuntimeError(f"autoopt.nn.quant_linear: expected all tensors on one device, but x is on {x.device} "
                               f"and {name} is on {t.device}")


def _packed(qweight: Tensor, scales: Tensor, offsets: Tensor | None, weight: str, k: int) -> Any:
    """The :class:`~autoopt.backend.quant.QuantizedWeight` these tensors hold (not copied)."""
    from autoopt.backend.quant import QuantizedWeight
    from autoopt.kernels.quant import parse_weight

    return QuantizedWeight(fmt=parse_weight(weight), qweight=qweight, scales=scales, offsets=offsets,
                           n=qweight.shape[0], k=k)


def dequant_linear(x: Tensor, qw: Any, bias: Tensor | None) -> Tensor:
    """``x @ dequantize(W)^T + bias`` in torch, in x's dtype: the quantized linear where no kernel runs (a
    device without one, autograd, a shape no config serves). It builds the whole dequantized weight per call."""
    from autoopt.backend.quant import dequantize

    return F.linear(x, dequantize(qw).to(x.dtype), bias)


def _vendor_fp8(x2: Tensor, qw: Any, bias: Tensor | None) -> Tensor | None:
    """A W8A8 ``fp8`` GEMM as :mod:`autoopt.kernels.vendor` prices it (autoopt's activation quantization, then
    ``torch._scaled_mm`` with row-wise scales), or None where torch has no such path here."""
    from autoopt.backend.registry import torch_baseline
    from autoopt.kernels.ops import OpSpec

    m, k = x2.shape
    dtype = "bf16" if x2.dtype == torch.bfloat16 else "fp16"
    run = torch_baseline({"a": x2, **qw.tensors()}, OpSpec(kind="gemm", shape=(m, qw.n, k), dtype=dtype,
                                                           weight=qw.fmt.spec))
    if run is None:
        return None
    out: Tensor = run()
    return out if bias is None else out + bias


def _quant_linear_impl(x: Tensor, qweight: Tensor, scales: Tensor, offsets: Tensor | None, bias: Tensor | None,
                       weight: str, k: int) -> Tensor:
    _check_quant_linear(x, qweight, scales, offsets, bias, weight, k)
    qw = _packed(qweight, scales, offsets, weight, k)
    n = qw.n
    m = math.prod(x.shape[:-1])
    op = "quant_linear"

    def torch_op() -> Tensor:
        return dequant_linear(x, qw, bias)

    if m == 0 or n == 0:
        return _fallback(op, f"{EMPTY} (x {tuple(x.shape)}, weight [{n}, {k}])", torch_op)
    if max(m * k, m * n, qweight.numel()) >= _INDEX_LIMIT:
        return _fallback(op, f"{INDEX} (M={m}, N={n}, K={k}: an operand of 2^31 or more elements)", torch_op)
    choice = choose(op, matmul_kind(m), (m, n, k), x.dtype, x.device, weight=qw.fmt.spec)
    a = x.reshape(m, k)
    if a.stride(-1) != 1:
        a = a.contiguous()
    if choice.fallback is not None:
        if choice.fallback.startswith(VENDOR):
            out = _vendor_fp8(a, qw, bias)
            if out is not None:
                note_fallback(op, choice.fallback)
                return out.view(*x.shape[:-1], n)
        return _fallback(op, choice.fallback, torch_op)
    assert choice.config is not None
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    b = None if bias is None else _unit(bias)
    launcher = _quant_launcher(choice.config.kernel)
    if launcher is not None:
        launcher(a, qw, out, dict(choice.config.params), bias=b)()
    else:  # a quantized kernel added to the registry since: its own binding
        from autoopt.kernels.ops import OpSpec

        spec = OpSpec(kind=choice.kind, shape=(m, n, k), dtype=choice.dtype, weight=qw.fmt.spec)
        inputs = {"a": a, **qw.tensors(), **({"bias": b} if b is not None else {})}
        prepare(inputs, choice.config, out, spec)()
    return out.view(*x.shape[:-1], n)


_QUANT_LAUNCHERS: dict[str, Callable[..., Callable[[], None]]] = {}


def _quant_launcher(kernel: str) -> Callable[..., Callable[[], None]] | None:
    """The public launcher of a quantized kernel (``quant_gemv``, ``quant_gemv_swap``, ``quant_gemm``,
    ``quant_dequant_cublas``: ``(a, qw, out, params, *, bias)``), bound without the registry's input dict; None for
    another kernel."""
    if not _QUANT_LAUNCHERS:
        from autoopt.backend.kernels.quant_dequant import quant_dequant_cublas_prepare
        from autoopt.backend.kernels.quant_gemm import quant_gemm_prepare
        from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare
        from autoopt.backend.kernels.quant_gemv_swap import quant_gemv_swap_prepare

        _QUANT_LAUNCHERS.update(quant_gemv=quant_gemv_prepare, quant_gemv_swap=quant_gemv_swap_prepare,
                                quant_gemm=quant_gemm_prepare, quant_dequant_cublas=quant_dequant_cublas_prepare)
    return _QUANT_LAUNCHERS.get(kernel)


_quant_linear_op = torch.library.custom_op(
    f"{_LIB}::quant_linear", mutates_args=(),
    schema="(Tensor x, Tensor qweight, Tensor scales, Tensor? offsets, Tensor? bias, str weight, int k) -> Tensor",
)(_quant_linear_impl)


@_quant_linear_op.register_fake
def _quant_linear_fake(x: Tensor, qweight: Tensor, scales: Tensor, offsets: Tensor | None, bias: Tensor | None,
                       weight: str, k: int) -> Tensor:
    _check_quant_linear(x, qweight, scales, offsets, bias, weight, k)
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


def quant_linear(x: Tensor, qweight: Tensor, scales: Tensor, offsets: Tensor | None = None,
                 bias: Tensor | None = None, *, weight: str, k: int) -> Tensor:
    """``x @ dequant(W)^T + bias`` over a weight packed by :func:`autoopt.backend.quant.quantize` in the format
    ``weight`` (a :func:`~autoopt.kernels.quant.parse_weight` spec) from ``[N, k]``: ``qweight``, ``scales``
    and (int4 asymmetric) ``offsets`` are its tensors. x is bf16 or fp16 ``[..., k]``; the output has x's dtype.

    M <= 16 runs ``quant_gemv`` (activations never quantized), larger M ``quant_gemm`` (a W8A8 format
    quantizes the activations per token first) or, for a weight-only format where it is predicted faster,
    ``quant_dequant_cublas`` (W dequantized into a 16-bit scratch, then cuBLAS), each with the config
    ``rank()`` gives the op with this ``weight``; where cuBLAS is predicted faster for a W8A8 ``fp8`` GEMM
    (``predict_vendor_matmul``) it runs ``torch._scaled_mm`` after autoopt's activation quantization. With no
    kernel path (a CPU without the interpreter, a GPU no template serves, autograd) it runs
    :func:`dequant_linear` (logged, counted).
    """
    if _grad_needed(x, bias):
        _check_quant_linear(x, qweight, scales, offsets, bias, weight, k)
        _autograd_fallback("quant_linear")
        return dequant_linear(x, _packed(qweight, scales, offsets, weight, k), bias)
    if _direct(x, qweight, scales, offsets, bias):
        return _quant_linear_impl(x, qweight, scales, offsets, bias, weight, k)
    if _compiling():
        mask, given = _present(offsets, bias)
        return _quant_linear_traced(x, qweight, scales, weight, k, mask, *given)  # a traced function takes no None
    out: Tensor = torch.ops.autoopt.quant_linear(x, qweight, scales, offsets, bias, weight, k)
    return out


@_traced
def _quant_linear_traced(x: Tensor, qweight: Tensor, scales: Tensor, weight: str, k: int, mask: tuple[bool, ...],
                         *given: Tensor) -> Tensor:
    """Under torch.compile: where cuBLASLt's FP8 GEMM is chosen (a W8A8 ``fp8`` GEMM, static shapes), the graph
    holds the activation quantization (a traced Triton launch) and ``torch._scaled_mm`` themselves, and the
    compiled graph launches both: no custom op's Python a call. Where the dequantize + cuBLAS path is chosen, the
    same for its dequantization kernel and GEMM. Otherwise the custom op."""
    offsets, bias = _given(mask, given)
    _check_quant_linear(x, qweight, scales, offsets, bias, weight, k)
    qw = _packed(qweight, scales, offsets, weight, k)
    m = math.prod(x.shape[:-1])
    if _scaled_mm_chosen(m, qw, x):
        from autoopt.backend.kernels.act_quant import act_quant_traced

        a = x.reshape(m, k)
        q, s = act_quant_traced(a if a.stride(-1) == 1 else a.contiguous())
        out = torch._scaled_mm(q, qweight.t(), scale_a=s[:, None], scale_b=scales.float()[None, :],
                               out_dtype=x.dtype)
        out = out if bias is None else out + bias
        return out.view(*x.shape[:-1], qw.n)
    params = _dequant_mm_params(m, qw, x)
    if params is not None:
        from autoopt.backend.kernels.quant_dequant import dequant_traced

        a = x.reshape(m, k)
        out = F.linear(a, dequant_traced(qw, x.dtype, params), None if bias is None else bias.to(x.dtype))
        return out.view(*x.shape[:-1], qw.n)
    traced: Tensor = torch.ops.autoopt.quant_linear(x, qweight, scales, offsets, bias, weight, k)
    return traced


def _dequant_mm_params(m: Any, qw: Any, x: Tensor) -> dict[str, int] | None:
    """At trace time: the dequantization kernel's config where this static-shape quantized linear runs the
    dequantize + cuBLAS path on a GPU (weight-only formats at prefill sizes, as :func:`_quant_linear_impl`
    would run it), else None. The graph then holds the dequantization kernel and the GEMM: the custom op's body
    took 112-130 us of host time a call at 2048 x 4096 x 4096 in int4 on two H100 hosts
    (``benchmarks/results/h100/op_host.json``, ``op_host_direct.json``)."""
    if x.device.type != "cuda" or qw.fmt.quantizes_activations or type(m) is not int:  # a symbolic M: no key
        return None
    if max(m * qw.k, m * qw.n, qw.qweight.numel()) >= _INDEX_LIMIT:
        return None
    choice = _static_choice("quant_linear", matmul_kind(m), (m, qw.n, qw.k), x.dtype, x.device, weight=qw.fmt.spec)
    if choice is None or choice.fallback is not None or choice.config is None \
            or choice.config.kernel != "quant_dequant_cublas":
        return None
    return dict(choice.config.params)


def _scaled_mm_chosen(m: Any, qw: Any, x: Tensor) -> bool:
    """At trace time: whether this static-shape quantized linear runs the vendor W8A8 path (per-token ``fp8`` on
    an sm_90+ GPU, where the dispatch predicts cuBLASLt faster), as :func:`_quant_linear_impl` would run it."""
    fmt = qw.fmt
    if fmt.name != "fp8" or fmt.activation != "per_token" or type(m) is not int:  # a symbolic M has no key
        return False
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) < (9, 0):
        return False
    choice = _static_choice("quant_linear", matmul_kind(m), (m, qw.n, qw.k), x.dtype, x.device, weight=fmt.spec)
    if choice is None or choice.fallback is None or not choice.fallback.startswith(VENDOR):
        return False
    note_fallback("quant_linear", choice.fallback)
    return True


# -- norms --------------------------------------------------------------------------------------------------

def _norm(op: str, kind: str, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
          torch_op: Callable[[], Tensor]) -> Tensor:
    _check_norm(op, x, weight, bias)
    rows, n = _rows(x)
    if x.numel() == 0:
        return _fallback(op, f"{EMPTY} (x {tuple(x.shape)})", torch_op)
    choice = choose(op, kind, (rows, n), x.dtype, x.device)
    if choice.fallback is not None:
        return _fallback(op, choice.fallback, torch_op)
    if n > 1 and x.stride(-1) != 1:
        return _fallback(op, f"{STRIDES} (x has strides {tuple(x.stride())}; the norm kernels read rows with "
                             "unit stride along the normalised last dim)", torch_op)
    x2 = x.reshape(rows, n)  # a view (any row stride) when the leading dims collapse, else a copy
    w = _unit(weight) if weight is not None else _const("ones", n, x.dtype, x.device)
    inputs = {"x": x2, "weight": w}
    if kind == "layernorm":
        b = _unit(bias) if bias is not None else _const("zeros", n, x.dtype, x.device)
        inputs["bias"] = b
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _run(choice, inputs, out, eps=eps)
    return out.view(x.shape)


def _rms_norm_impl(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    return _norm("rms_norm", "rmsnorm", x, weight, None, eps,
                 lambda: F.rms_norm(x, (x.shape[-1],), weight, eps).to(x.dtype))


_rms_norm_op = torch.library.custom_op(
    f"{_LIB}::rms_norm", mutates_args=(), schema="(Tensor x, Tensor? weight, float eps) -> Tensor")(_rms_norm_impl)


@_rms_norm_op.register_fake
def _rms_norm_fake(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    _check_norm("rms_norm", x, weight, None)
    return x.new_empty(x.shape)


def _layer_norm_impl(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    return _norm("layer_norm", "layernorm", x, weight, bias, eps,
                 lambda: F.layer_norm(x, (x.shape[-1],), weight, bias, eps).to(x.dtype))


_layer_norm_op = torch.library.custom_op(
    f"{_LIB}::layer_norm", mutates_args=(),
    schema="(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor")(_layer_norm_impl)


@_layer_norm_op.register_fake
def _layer_norm_fake(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    _check_norm("layer_norm", x, weight, bias)
    return x.new_empty(x.shape)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dim: ``x / sqrt(mean(x^2) + eps) * weight`` (statistics in fp32), in x's dtype.

    ``weight`` is ``[N]`` (any float dtype: it is read as fp32) or None (no scale). Gemma's norm scales by
    ``1 + weight``: pass that sum. Rows may have any stride between them; the last dim must have unit
    stride (else torch runs, logged). Like ``F.rms_norm(x, (N,), weight, eps)``.
    """
    if _grad_needed(x, weight):
        _check_norm("rms_norm", x, weight, None)
        _autograd_fallback("rms_norm")
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    if _direct(x, weight):
        return _rms_norm_impl(x, weight, float(eps))
    if _compiling():
        mask, given = _present(weight)
        return _rms_norm_traced(x, float(eps), mask, *given)
    out: Tensor = torch.ops.autoopt.rms_norm(x, weight, float(eps))
    return out


def _left_to_inductor(rows: Any) -> bool:
    """Whether a traced RMSNorm of ``rows`` rows runs as Inductor's own: a static count of at most
    :data:`autoopt.kernels.constants.INDUCTOR_NORM_MAX_ROWS` (a decode step's), where Inductor fuses the residual
    add into it."""
    return type(rows) is int and 0 < rows <= INDUCTOR_NORM_MAX_ROWS


@_traced
def _rms_norm_traced(x: Tensor, eps: float, mask: tuple[bool, ...], *given: Tensor) -> Tensor:
    (weight,) = _given(mask, given)
    _check_norm("rms_norm", x, weight, None)
    rows = _rows(x)
    if _left_to_inductor(rows[0]) or _torch_chosen("rms_norm", "rmsnorm", rows, x.dtype, x.device):
        return F.rms_norm(x, (x.shape[-1],), weight, eps).to(x.dtype)
    if weight is not None and _rms_norm_triton_op_runs(x):
        traced: Tensor = torch.ops.autoopt.rms_norm_kernel(x, weight, eps)
        return traced
    out: Tensor = torch.ops.autoopt.rms_norm(x, weight, eps)
    return out


#: the norm kernels the RMSNorm ``triton_op`` launches: one launch over rows (the split and cooperative ones
#: allocate scratch and launch twice or spin on counters, and stay in the custom op)
_ROW_RMS_KERNELS = ("rmsnorm_single", "rmsnorm_looped")


def _rms_norm_triton_op_runs(x: Tensor) -> bool:
    """At trace time (static shapes): whether the RMSNorm ``triton_op`` takes ``x``: a GPU tensor whose last dim
    has unit stride and whose choice is one of :data:`_ROW_RMS_KERNELS`."""
    if x.device.type != "cuda" or x.numel() == 0 or (x.dim() and x.stride(-1) != 1):
        return False
    choice = _static_choice("rms_norm", "rmsnorm", _rows(x), x.dtype, x.device)
    return choice is not None and choice.fallback is None and choice.config is not None \
        and choice.config.kernel in _ROW_RMS_KERNELS


@torch.library.triton_op(f"{_LIB}::rms_norm_kernel", mutates_args=())
def _rms_norm_kernel_op(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm where the compiled graph launches the norm kernel itself (a ``triton_op``: ``norm_prepare`` launches
    through :func:`~autoopt.backend.kernels.traceable`), instead of the custom op's body in Python every call: under
    torch.compile on an H200 that body took 94-189 us of host time a call at 2048 x 4096, 65 calls a Llama-3-8B
    prefill (``benchmarks/results/h200/prefill_profile_int4*.json``), and a MoE prefill is bound by its host."""
    from autoopt.backend.kernels.norm import norm_prepare

    _check_norm("rms_norm", x, weight, None)
    rows, n = _rows(x)
    choice = choose("rms_norm", "rmsnorm", (rows, n), x.dtype, x.device)
    if choice.config is None or choice.config.kernel not in _ROW_RMS_KERNELS or x.stride(-1) != 1:
        return _rms_norm_impl(x, weight, eps)  # what the custom op runs
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    norm_prepare(choice.config.kernel, x.reshape(rows, n), _unit(weight), None, out.view(rows, n),
                 dict(choice.config.params), eps=eps)()
    return out


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last dim (statistics in fp32), in x's dtype; like
    ``F.layer_norm(x, (N,), weight, bias, eps)``. An absent weight/bias is a cached ones/zeros vector."""
    if _grad_needed(x, weight, bias):
        _check_norm("layer_norm", x, weight, bias)
        _autograd_fallback("layer_norm")
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    if _direct(x, weight, bias):
        return _layer_norm_impl(x, weight, bias, float(eps))
    if _compiling():
        mask, given = _present(weight, bias)
        return _layer_norm_traced(x, float(eps), mask, *given)
    out: Tensor = torch.ops.autoopt.layer_norm(x, weight, bias, float(eps))
    return out


@_traced
def _layer_norm_traced(x: Tensor, eps: float, mask: tuple[bool, ...], *given: Tensor) -> Tensor:
    weight, bias = _given(mask, given)
    _check_norm("layer_norm", x, weight, bias)
    if _torch_chosen("layer_norm", "layernorm", _rows(x), x.dtype, x.device):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps).to(x.dtype)
    out: Tensor = torch.ops.autoopt.layer_norm(x, weight, bias, eps)
    return out


# -- gated activations ------------------------------------------------------------------------------------------

def _gated(op: str, kind: str, gelu: bool, gate: Tensor, up: Tensor, torch_op: Callable[[], Tensor]) -> Tensor:
    """``act(gate) * up`` for equal-shape ``gate``/``up`` (views of one ``gate_up`` for swiglu)."""
    rows, n = _rows(gate)
    if gate.numel() == 0:
        return _fallback(op, f"{EMPTY} (gate {tuple(gate.shape)})", torch_op)
    choice = choose(op, kind, (rows, n), gate.dtype, gate.device)
    if choice.fallback is not None:
        return _fallback(op, choice.fallback, torch_op)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if gate.is_contiguous() and up.is_contiguous():
        _run(choice, {"x": gate, "y": up}, out)  # the registry's kernel for the ranked kind, flat
        return out
    from autoopt.backend.kernels.gated import gated_prepare, rows_view

    vg, vu = rows_view(gate), rows_view(up)
    if vg is None or vu is None:
        if op == "swiglu":
            name, t = "gate_up", gate
        else:
            name, t = ("gate", gate) if vg is None else ("up", up)
        return _fallback(op, f"{STRIDES} ({name} has shape {tuple(t.shape)} and strides {tuple(t.stride())}; "
                             "the gated kernel reads rows with unit stride along the last dim and one stride "
                             "between rows)", torch_op)
    assert choice.config is not None
    gated_prepare(gate, up, out, dict(choice.config.params), gelu=gelu)()
    return out


def _silu_mul_impl(gate: Tensor, up: Tensor) -> Tensor:
    _check_pair("silu_mul", "gate", gate, "up", up)
    return _gated("silu_mul", "silu_mul", False, gate, up, lambda: F.silu(gate) * up)


_silu_mul_op = torch.library.custom_op(
    f"{_LIB}::silu_mul", mutates_args=(), schema="(Tensor gate, Tensor up) -> Tensor")(_silu_mul_impl)


@_silu_mul_op.register_fake
def _silu_mul_fake(gate: Tensor, up: Tensor) -> Tensor:
    _check_pair("silu_mul", "gate", gate, "up", up)
    return gate.new_empty(gate.shape)


def _gelu_tanh_mul_impl(gate: Tensor, up: Tensor) -> Tensor:
    _check_pair("gelu_tanh_mul", "gate", gate, "up", up)
    return _gated("gelu_tanh_mul", "gelu_tanh_mul", True, gate, up,
                  lambda: F.gelu(gate, approximate="tanh") * up)


_gelu_tanh_mul_op = torch.library.custom_op(
    f"{_LIB}::gelu_tanh_mul", mutates_args=(), schema="(Tensor gate, Tensor up) -> Tensor")(_gelu_tanh_mul_impl)


@_gelu_tanh_mul_op.register_fake
def _gelu_tanh_mul_fake(gate: Tensor, up: Tensor) -> Tensor:
    _check_pair("gelu_tanh_mul", "gate", gate, "up", up)
    return gate.new_empty(gate.shape)


def _halves(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    i = gate_up.shape[-1] // 2
    return gate_up[..., :i], gate_up[..., i:]


def _swiglu_impl(gate_up: Tensor) -> Tensor:
    _check_swiglu(gate_up)
    gate, up = _halves(gate_up)
    return _gated("swiglu", "silu_mul", False, gate, up, lambda: F.silu(gate) * up)


_swiglu_op = torch.library.custom_op(
    f"{_LIB}::swiglu", mutates_args=(), schema="(Tensor gate_up) -> Tensor")(_swiglu_impl)


@_swiglu_op.register_fake
def _swiglu_fake(gate_up: Tensor) -> Tensor:
    _check_swiglu(gate_up)
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` (the SwiGLU activation of Llama's MLP), fused: one pass, math in fp32.

    ``gate`` and ``up`` must have the same shape, dtype and device. Contiguous inputs take the
    ``silu_mul`` kernel; row-strided ones (unit stride along the last dim) a strided variant of it;
    anything else runs torch (logged).
    """
    return _gated_public(gate, up, gelu=False)


def gelu_tanh_mul(gate: Tensor, up: Tensor) -> Tensor:
    """``gelu(gate, approximate="tanh") * up`` (GeGLU: Gemma's MLP activation), fused like :func:`silu_mul`."""
    return _gated_public(gate, up, gelu=True)


def _gated_torch(gate: Tensor, up: Tensor, gelu: bool) -> Tensor:
    return (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up


def _gated_public(gate: Tensor, up: Tensor, *, gelu: bool) -> Tensor:
    """The public path of :func:`silu_mul` and :func:`gelu_tanh_mul` (autograd, eager, compiled)."""
    op = "gelu_tanh_mul" if gelu else "silu_mul"
    if _grad_needed(gate, up):
        _check_pair(op, "gate", gate, "up", up)
        _autograd_fallback(op)
        return _gated_torch(gate, up, gelu)
    if _direct(gate, up):
        return _gelu_tanh_mul_impl(gate, up) if gelu else _silu_mul_impl(gate, up)
    if _compiling():
        return _gated_traced(gate, up, gelu)
    out: Tensor = getattr(torch.ops.autoopt, op)(gate, up)
    return out


@_traced
def _gated_traced(gate: Tensor, up: Tensor, gelu: bool) -> Tensor:
    op = "gelu_tanh_mul" if gelu else "silu_mul"
    _check_pair(op, "gate", gate, "up", up)
    if _torch_chosen(op, op, _rows(gate), gate.dtype, gate.device):
        return _gated_torch(gate, up, gelu)
    out: Tensor = getattr(torch.ops.autoopt, op)(gate, up)
    return out


def swiglu(gate_up: Tensor) -> Tensor:
    """``silu(gate) * up`` of a fused gate/up projection's output ``gate_up = [..., 2I]``: gate is the first
    I columns, up the last I (the order of ``torch.cat([gate_proj.weight, up_proj.weight])``).

    The two halves are read in place as row-strided views (no copy, no split): one pass, the output
    ``[..., I]`` contiguous. The config is the one ranked for ``silu_mul`` of ``[rows, I]``.
    """
    if _grad_needed(gate_up):
        _check_swiglu(gate_up)
        _autograd_fallback("swiglu")
        gate, up = _halves(gate_up)
        return F.silu(gate) * up
    if _direct(gate_up):
        return _swiglu_impl(gate_up)
    if _compiling():
        return _swiglu_traced(gate_up)
    out: Tensor = torch.ops.autoopt.swiglu(gate_up)
    return out


@_traced
def _swiglu_traced(gate_up: Tensor) -> Tensor:
    _check_swiglu(gate_up)
    gate, up = _halves(gate_up)
    if _torch_chosen("swiglu", "silu_mul", _rows(gate), gate.dtype, gate.device):
        return F.silu(gate) * up
    if _swiglu_triton_op_runs(gate):
        traced: Tensor = torch.ops.autoopt.swiglu_kernel(gate_up)
        return traced
    out: Tensor = torch.ops.autoopt.swiglu(gate_up)
    return out


def _swiglu_triton_op_runs(gate: Tensor) -> bool:
    """At trace time (static shapes): whether the SwiGLU ``triton_op`` takes this gate half: a GPU tensor
    whose rows the gated kernel reads (unit stride along the last dim, one stride between rows) and whose
    choice is a kernel (the fused-MoE op's reason: ``autoopt.nn._moe._fused_moe_traced``)."""
    from autoopt.backend.kernels.gated import rows_view

    if gate.device.type != "cuda":
        return False
    choice = _static_choice("swiglu", "silu_mul", _rows(gate), gate.dtype, gate.device)
    ok = choice is not None and choice.fallback is None and choice.config is not None
    return ok and rows_view(gate) is not None


@torch.library.triton_op(f"{_LIB}::swiglu_kernel", mutates_args=())
def _swiglu_kernel_op(gate_up: Tensor) -> Tensor:
    """SwiGLU where the compiled graph launches the gated kernel itself (a ``triton_op``: its launch goes
    through :func:`~autoopt.backend.kernels.traceable`), as the custom op's body does in Python every call:
    under torch.compile on an H100 machine that body took 364 us of host time a call at 2048 x 14336
    (``benchmarks/results/h100/fp8_prefill_host_l8_profile.json``)."""
    from autoopt.backend.kernels.gated import gated_prepare

    _check_swiglu(gate_up)
    gate, up = _halves(gate_up)
    choice = choose("swiglu", "silu_mul", _rows(gate), gate.dtype, gate.device)
    if choice.config is None:  # no kernel here (a CPU without the interpreter): what the custom op runs
        return _swiglu_impl(gate_up)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    gated_prepare(gate, up, out, dict(choice.config.params), gelu=False)()
    return out


# -- add ----------------------------------------------------------------------------------------------------------

def _add_impl(x: Tensor, y: Tensor) -> Tensor:
    _check_add(x, y)
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        return _fallback("add", f"{BROADCAST} (x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)} {y.dtype}; "
                                "the add kernel takes equal shapes and dtypes)", lambda: x + y)
    if x.numel() == 0:
        return _fallback("add", f"{EMPTY} (x {tuple(x.shape)})", lambda: x + y)
    choice = choose("add", "add", _rows(x), x.dtype, x.device)
    if choice.fallback is not None:
        return _fallback("add", choice.fallback, lambda: x + y)
    if not (x.is_contiguous() and y.is_contiguous()):
        bad, t = ("x", x) if not x.is_contiguous() else ("y", y)
        return _fallback("add", f"{STRIDES} ({bad} has strides {tuple(t.stride())}; the add kernel takes "
                                "contiguous tensors)", lambda: x + y)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run(choice, {"x": x, "y": y}, out)
    return out


_add_op = torch.library.custom_op(
    f"{_LIB}::add", mutates_args=(), schema="(Tensor x, Tensor y) -> Tensor")(_add_impl)


@_add_op.register_fake
def _add_fake(x: Tensor, y: Tensor) -> Tensor:
    _check_add(x, y)
    return (x + y).contiguous()  # torch's own shape, dtype and device rules, on fake tensors


def add(x: Tensor, y: Tensor) -> Tensor:
    """``x + y`` (the residual add). Equal shapes and dtypes run the ``add`` kernel (contiguous inputs);
    broadcasting and type promotion run torch (logged), giving what ``x + y`` gives."""
    if _grad_needed(x, y):
        _check_add(x, y)
        _autograd_fallback("add")
        return x + y
    if _direct(x, y):
        return _add_impl(x, y)
    if _compiling():
        return _add_traced(x, y)
    out: Tensor = torch.ops.autoopt.add(x, y)
    return out


@_traced
def _add_traced(x: Tensor, y: Tensor) -> Tensor:
    _check_add(x, y)
    if x.shape == y.shape and x.dtype == y.dtype and _torch_chosen("add", "add", _rows(x), x.dtype, x.device):
        return x + y
    out: Tensor = torch.ops.autoopt.add(x, y)
    return out


#: the public functions by custom-op name (tests, reports).
OPS: dict[str, Callable[..., Tensor]] = {"linear": linear, "rms_norm": rms_norm, "layer_norm": layer_norm,
                                         "silu_mul": silu_mul, "gelu_tanh_mul": gelu_tanh_mul, "swiglu": swiglu,
                                         "add": add, "quant_linear": quant_linear}
