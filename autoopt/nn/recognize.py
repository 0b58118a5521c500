"""Which modules of a model autoopt can serve, recognised by structure and checked by behaviour.

A class name proves nothing (every model family names its RMSNorm differently, and a class called
``...RMSNorm`` may compute something else), so each candidate is found by what it holds and then
*run once* on a sample input against the formula it claims to compute:

- **linear**: an ``nn.Linear`` (or a subclass) whose weight is a plain float16/bfloat16/float32
  Parameter. A subclass with its own ``forward`` is one only when it holds nothing but ``weight`` and
  ``bias`` and its forward computes ``x @ W^T + b`` on a sample (Falcon's ``FalconLinear``); one with
  more state (a LoRA adapter, quantisation scales) or another output computes something else.
- **norm**: a leaf module with a 1-D ``weight`` Parameter of size ``hidden`` and an epsilon attribute
  (``variance_epsilon``: Hugging Face Llama, Qwen2, Mistral; ``eps``: ``torch.nn.RMSNorm``,
  ``nn.LayerNorm``, Gemma; ``epsilon``), optionally a ``bias`` of the same size. Its output on
  ``x`` of shape ``[2, 8, hidden]`` (offset from zero, so that LayerNorm and RMSNorm differ) is
  compared with RMSNorm ``x / rms(x) * w``, Gemma's RMSNorm ``x / rms(x) * (1 + w)`` and LayerNorm
  ``(x - mean) / std * w + b``; the first within tolerance is what the module is.
- **gated MLP**: a module with ``gate_proj``, ``up_proj`` and ``down_proj`` linears (above) of
  matching shapes and an ``act_fn`` that computes SiLU or tanh-GELU (checked on a sample: exact
  erf-GELU differs from the tanh form by ~1e-3 and is not taken for it), whose output is
  ``down(act(gate(x)) * up(x))`` on a sample input.
- **plain MLP**: a module with exactly two linears (above) that chain (``fc1.out_features ==
  fc2.in_features``), one activation (its one parameter-free child module other than dropout, or a
  function held as ``act``/``act_fn``/``activation_fn``/``activation``) and no other weights:
  StarCoder2's ``c_fc``/``c_proj``, GPT-NeoX's and Falcon's ``dense_h_to_4h``/``dense_4h_to_h``,
  Phi's ``fc1``/``fc2``. The activation must compute exact GELU, tanh-GELU or ReLU on a sample
  (also at +-60, so a clipped GELU is not taken for GELU), and the module's output must be
  ``fc2(act(fc1(x)))`` on a sample input.
- **q/k/v projections**: an attention module's ``q_proj``, ``k_proj`` and ``v_proj``, three linears
  (above) reading the same ``in_features`` in one dtype and device, each with a bias or none with one.
  Fusing them changes no arithmetic (each output column is the same dot product), so there is no
  behavioural probe beyond the check ``optimize`` runs.

Probes run under ``torch.no_grad()`` on random inputs from a private generator (the global RNG is
never touched), in the module's own dtype and device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "ACT_ATTRS",
    "EPS_ATTRS",
    "FLOAT_DTYPES",
    "GATED_ACTIVATIONS",
    "PLAIN_ACTIVATIONS",
    "QKV",
    "GatedMLPMatch",
    "NormMatch",
    "PlainMLPMatch",
    "PlainMLPParts",
    "activation_of",
    "gated_mlp_parts",
    "linear_problem",
    "match_gated_mlp",
    "match_norm",
    "match_plain_mlp",
    "norm_parts",
    "plain_mlp_parts",
    "qkv_parts",
    "rel_error",
    "sample",
    "tolerance",
]

#: epsilon attribute names, in the order they are looked for.
EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
#: dtypes the kernels serve.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: relative Frobenius error ``||out - ref|| / ||ref||`` allowed, by dtype.
_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
#: fp32 matmuls at float32_matmul_precision 'high'/'medium' run as TF32 (10-bit mantissa).
_TOL_TF32 = 5e-3


def tolerance(dtype: torch.dtype, *, matmul: bool = False) -> float:
    """The relative error allowed for a module of ``dtype`` (looser for fp32 matmuls allowed to use TF32)."""
    tol = _TOL.get(dtype, 1e-4)
    if matmul and dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        tol = max(tol, _TOL_TF32)
    return tol


def rel_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 (inf when shapes differ or anything is not finite).

    Summed a chunk of about 2^20 elements at a time, so that checking an ``lm_head`` of a large
    vocabulary adds megabytes, not a float64 copy of its whole output, to the memory peak."""
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor) or out.shape != ref.shape:
        return math.inf
    width = out.shape[-1] if out.dim() and out.shape[-1] else 1
    o, r = out.detach().reshape(-1, width), ref.detach().reshape(-1, width)
    step = max(1, (1 << 20) // width)
    num = den = 0.0
    for i in range(0, o.shape[0], step):
        a, b = o[i:i + step].double(), r[i:i + step].double()
        d2, r2 = float((a - b).square().sum()), float(b.square().sum())
        if not (math.isfinite(d2) and math.isfinite(r2)):
            return math.inf
        num, den = num + d2, den + r2
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def sample(features: int, dtype: torch.dtype, device: torch.device, *, tokens: int = 8, offset: float = 0.0,
           seed: int = 0) -> torch.Tensor:
    """A ``[2, tokens, features]`` normal sample (plus ``offset``) from a private generator (the global
    RNG is not touched), in ``dtype`` on ``device``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(2, tokens, features, generator=gen, dtype=torch.float32) + offset
    return x.to(device=device, dtype=dtype)


def _plain_param(p: Any) -> str | None:
    """Why ``p`` cannot be served (None when it can): a float Parameter on a real device."""
    if not isinstance(p, nn.Parameter) or type(p.data) is not torch.Tensor:
        return f"its weight is a {type(p).__name__}, not a plain Parameter (quantised or a tensor subclass?)"
    if p.dtype not in FLOAT_DTYPES:
        return f"weight dtype {p.dtype} (kernels serve float16, bfloat16 and float32)"
    if p.device.type == "meta":
        return "weights on the meta device (not loaded yet)"
    return None


def _probe(m: nn.Module, x: torch.Tensor, reference: Callable[[], torch.Tensor]) -> float | str:
    """``m``'s output on ``x`` against ``reference()`` (both under no_grad): the relative error, or why they
    could not be compared (the forward raised, or gave no tensor of x's dtype)."""
    try:
        with torch.no_grad():
            out = m.forward(x)
            ref = reference()
    except Exception as exc:  # a module of another contract: not what it looked like
        return f"probe on a {tuple(x.shape)} {x.dtype} input raised {type(exc).__name__}: {exc}"
    if not isinstance(out, torch.Tensor) or out.dtype != x.dtype:
        return "probe output is not a tensor of the input's dtype"
    return rel_error(out, ref)


def linear_problem(m: nn.Module) -> str | None:
    """Why ``m`` is not a linear autoopt can serve; None when it is one."""
    if not isinstance(m, nn.Linear):
        return "not an nn.Linear"
    if "forward" in m.__dict__:
        return f"{type(m).__name__} has its forward patched on the instance (a hooked linear computes something else)"
    problem = _plain_param(m.weight)
    if problem is None and m.bias is not None:
        problem = _plain_param(m.bias)
        if problem is None and m.bias.dtype != m.weight.dtype:
            problem = f"bias dtype {m.bias.dtype} differs from weight dtype {m.weight.dtype}"
    if problem is None and type(m).forward is not nn.Linear.forward:
        problem = _own_forward_problem(m)
    return problem


def _own_forward_problem(m: nn.Linear) -> str | None:
    """Why a Linear subclass with its own ``forward`` cannot be served (None: it holds only weight and bias
    and computes ``x @ W^T + b``, as Falcon's ``FalconLinear`` does with a matmul and an add)."""
    name = type(m).__name__
    extra = [n for n, _ in m.named_parameters() if n not in ("weight", "bias")]
    extra += [n for n, _ in m.named_buffers()] + [n for n, _ in m.named_children()]
    if extra:
        return (f"{name} has its own forward and holds {', '.join(extra[:3])} besides weight and bias (an adapter "
                "or quantisation state: it computes something else)")
    w = m.weight
    x = sample(m.in_features, w.dtype, w.device, seed=4)
    err = _probe(m, x, lambda: F.linear(x, w, m.bias))
    if isinstance(err, str):
        return f"{name} has its own forward: {err}"
    tol = tolerance(w.dtype, matmul=True)
    if err > tol:
        return (f"{name} has its own forward, which does not compute x @ W^T + b on a probe (relative error "
                f"{err:.2g} > {tol:g})")
    return None


# -- norms -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NormMatch:
    """A recognised norm: ``kind`` is ``rms_norm`` or ``layer_norm``; ``unit_offset``: output scaled by
    ``1 + weight`` (Gemma); ``eps`` None means ``torch.finfo(dtype).eps`` (``torch.nn.RMSNorm(eps=None)``)."""

    kind: str
    eps_attr: str
    eps: float | None
    unit_offset: bool
    has_bias: bool
    error: float


def norm_parts(m: nn.Module) -> tuple[str, float | None, nn.Parameter] | None:
    """``(eps attribute, eps, weight)`` when ``m`` has a norm's structure (a leaf holding a 1-D weight
    and an epsilon), else None. A norm without an affine weight (``elementwise_affine=False``) is not one."""
    if next(iter(m.children()), None) is not None or isinstance(m, (nn.Linear, nn.Embedding)):
        return None
    w = getattr(m, "weight", None)
    if not isinstance(w, nn.Parameter) or w.dim() != 1:
        return None
    for attr in EPS_ATTRS:
        if hasattr(m, attr):
            eps = getattr(m, attr, None)
            if isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0:
                return attr, float(eps), w
            if eps is None and isinstance(m, getattr(nn, "RMSNorm", ())):
                return attr, None, w
    return None


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def match_norm(m: nn.Module) -> NormMatch | str:
    """What norm ``m`` computes (a :class:`NormMatch`), or why it is not recognised as one."""
    parts = norm_parts(m)
    if parts is None:
        return "not a norm: no 1-D weight with an epsilon attribute"
    eps_attr, eps, w = parts
    problem = _plain_param(w)
    if problem is not None:
        return problem
    bias = getattr(m, "bias", None)
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != w.shape):
        return f"bias of shape {tuple(getattr(bias, 'shape', ()))} does not match weight {tuple(w.shape)}"
    shape: Any = getattr(m, "normalized_shape", None)
    if shape is not None and tuple(shape) != tuple(w.shape):
        return f"normalised over {tuple(shape)}, not the last dimension alone"
    x = sample(w.shape[0], w.dtype, w.device, offset=0.5)
    try:
        with torch.no_grad():
            out = m.forward(x)
    except Exception as exc:  # a module of another shape contract: not a norm autoopt knows
        return f"probe on a {tuple(x.shape)} {x.dtype} input raised {type(exc).__name__}: {exc}"
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        return "probe output is not a tensor of the input's shape"
    if out.dtype != x.dtype:
        return f"output dtype {out.dtype} differs from input dtype {x.dtype} (weight and input dtypes mixed)"
    xf, wf = x.float(), w.detach().float()
    e = eps if eps is not None else torch.finfo(x.dtype).eps
    tol = tolerance(x.dtype)
    b = bias.detach().float() if bias is not None else None
    candidates: list[tuple[str, bool, Callable[[], torch.Tensor]]] = [
        ("layer_norm", False, lambda: F.layer_norm(xf, (xf.shape[-1],), wf, b, e)),
    ]
    if bias is None:  # an RMSNorm has no bias
        candidates[:0] = [("rms_norm", False, lambda: _rms(xf, e) * wf),
                          ("rms_norm", True, lambda: _rms(xf, e) * (1.0 + wf))]
    errors = []
    with torch.no_grad():
        for kind, unit_offset, formula in candidates:
            err = rel_error(out.float(), formula())
            if err <= tol:
                return NormMatch(kind=kind, eps_attr=eps_attr, eps=eps, unit_offset=unit_offset,
                                 has_bias=bias is not None, error=err)
            errors.append(f"{kind}{' (1 + weight)' if unit_offset else ''} {err:.2g}")
    return (f"holds a norm's weight and {eps_attr} but its output matches no norm formula within {tol:g} "
            f"(relative error: {', '.join(errors)})")


# -- gated MLP -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GatedMLPMatch:
    """A recognised gated MLP: ``down(act(gate(x)) * up(x))`` with ``activation`` ``silu`` or ``gelu_tanh``."""

    activation: str
    hidden: int
    intermediate: int
    has_bias: bool
    error: float


#: what each activation name computes (the reference the probes compare with).
_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "relu": F.relu,
}
#: the activations a gated MLP's fused ``act * mul`` kernels compute.
GATED_ACTIVATIONS = ("silu", "gelu_tanh")
#: the activations the GEMM epilogue computes (:mod:`autoopt.backend.kernels.epilogue`).
PLAIN_ACTIVATIONS = ("gelu", "gelu_tanh", "relu")


def gated_mlp_parts(m: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear, Any] | None:
    """``(gate_proj, up_proj, down_proj, act_fn)`` when ``m`` has a gated MLP's structure, else None."""
    parts = [getattr(m, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    act = getattr(m, "act_fn", None)
    if not all(isinstance(p, nn.Linear) for p in parts) or act is None or not callable(act):
        return None
    gate, up, down = parts
    assert isinstance(gate, nn.Linear) and isinstance(up, nn.Linear) and isinstance(down, nn.Linear)
    return gate, up, down, act


def activation_of(act: Any, device: torch.device, names: tuple[str, ...] = GATED_ACTIVATIONS) -> str | None:
    """Which of ``names`` ``act`` computes (within fp32 tolerance on two samples: normal values times 3, where
    GELU and tanh-GELU differ by ~1e-3, and -60..60, where a clipped or saturating look-alike departs), else
    None. ``act`` gets a copy of each sample (an in-place activation does not change the reference)."""
    probes = (sample(64, torch.float32, device, seed=1) * 3.0,
              torch.linspace(-60.0, 60.0, 128, device=device).reshape(2, 64))
    try:
        with torch.no_grad():
            outs = [act(z.clone()) for z in probes]
    except Exception:
        return None
    for name in names:
        if all(rel_error(out, _ACTS[name](z)) <= 1e-5 for out, z in zip(outs, probes, strict=True)):
            return name
    return None


def match_gated_mlp(m: nn.Module) -> GatedMLPMatch | str:
    """What gated MLP ``m`` is (a :class:`GatedMLPMatch`), or why it is not recognised as one."""
    parts = gated_mlp_parts(m)
    if parts is None:
        return "not a gated MLP: needs gate_proj, up_proj, down_proj linears and an act_fn"
    gate, up, down, act = parts
    for name, lin in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
        problem = linear_problem(lin)
        if problem is not None:
            return f"{name}: {problem}"
    hidden, inter = gate.in_features, gate.out_features
    if (up.in_features, up.out_features, down.in_features, down.out_features) != (hidden, inter, inter, hidden):
        return (f"projection shapes do not chain (gate {hidden}->{inter}, up {up.in_features}->{up.out_features}, "
                f"down {down.in_features}->{down.out_features})")
    w = gate.weight
    if any(p.weight.dtype != w.dtype or p.weight.device != w.device for p in (up, down)):
        return "gate/up/down weights differ in dtype or device"
    if (gate.bias is None) != (up.bias is None):
        return "gate_proj and up_proj disagree on bias"
    activation = activation_of(act, w.device, GATED_ACTIVATIONS)
    if activation is None:
        return (f"act_fn {type(act).__name__} computes neither SiLU nor tanh-GELU (exact erf-GELU and other "
                "activations have no fused kernel)")
    x = sample(hidden, w.dtype, w.device, seed=2)
    fn = _ACTS[activation]
    err = _probe(m, x, lambda: F.linear(fn(F.linear(x, gate.weight, gate.bias)) * F.linear(x, up.weight, up.bias),
                                        down.weight, down.bias))
    if isinstance(err, str):
        return err
    tol = tolerance(w.dtype, matmul=True)
    if err > tol:
        return (f"has gate/up/down projections but its output is not down(act(gate(x)) * up(x)) "
                f"(relative error {err:.2g} > {tol:g})")
    return GatedMLPMatch(activation=activation, hidden=hidden, intermediate=inter,
                         has_bias=gate.bias is not None or down.bias is not None, error=err)


# -- plain MLP -------------------------------------------------------------------------------------------

#: attribute names a plain MLP's activation is found under when it is a function, not a child module.
ACT_ATTRS = ("act", "act_fn", "activation_fn", "activation")


@dataclass(frozen=True, slots=True)
class PlainMLPParts:
    """A plain MLP's pieces: its two linears in the order they run, under their child names, and the
    activation between them (a module or a function)."""

    fc1_name: str
    fc1: nn.Linear
    fc2_name: str
    fc2: nn.Linear
    act: Any


@dataclass(frozen=True, slots=True)
class PlainMLPMatch:
    """A recognised plain MLP: ``fc2(act(fc1(x)))`` with ``activation`` one of :data:`PLAIN_ACTIVATIONS`."""

    activation: str
    fc1_name: str
    fc2_name: str
    hidden: int
    intermediate: int
    out_features: int
    has_bias: bool
    error: float


def _act_name(act: Any) -> str:
    return str(getattr(act, "__name__", type(act).__name__))


def plain_mlp_parts(m: nn.Module) -> PlainMLPParts | None:
    """``m``'s :class:`PlainMLPParts` when it has a plain MLP's structure (see the module docstring), else None.

    Containers (``nn.Sequential`` ...) are not taken: code may index them, which a replacement would break."""
    if isinstance(m, (nn.Linear, nn.Sequential, nn.ModuleList, nn.ModuleDict)):
        return None
    children = list(m.named_children())
    linears = [(n, c) for n, c in children if isinstance(c, nn.Linear)]
    if len(linears) != 2:
        return None
    rest = [c for _, c in children if not isinstance(c, nn.Linear)]
    if any(True for c in rest for _ in c.parameters()):
        return None  # other weights (a norm, a gate): more than two linears and an activation
    acts = [c for c in rest if not isinstance(c, (nn.Dropout, nn.Identity)) and next(c.buffers(), None) is None]
    acts += [m.__dict__[a] for a in ACT_ATTRS if callable(m.__dict__.get(a))]
    if len(acts) != 1:
        return None
    (n1, l1), (n2, l2) = linears
    assert isinstance(l1, nn.Linear) and isinstance(l2, nn.Linear)
    if l1.out_features == l2.in_features:  # child order first: a square MLP chains both ways
        return PlainMLPParts(n1, l1, n2, l2, acts[0])
    if l2.out_features == l1.in_features:
        return PlainMLPParts(n2, l2, n1, l1, acts[0])
    return None


def match_plain_mlp(m: nn.Module) -> PlainMLPMatch | str:
    """What plain MLP ``m`` is (a :class:`PlainMLPMatch`), or why it is not recognised as one."""
    parts = plain_mlp_parts(m)
    if parts is None:
        return "not a plain MLP: needs exactly two chained linears and one activation"
    fc1, fc2 = parts.fc1, parts.fc2
    for name, lin in ((parts.fc1_name, fc1), (parts.fc2_name, fc2)):
        problem = linear_problem(lin)
        if problem is not None:
            return f"{name}: {problem}"
    w = fc1.weight
    if fc2.weight.dtype != w.dtype or fc2.weight.device != w.device:
        return f"{parts.fc1_name}/{parts.fc2_name} weights differ in dtype or device"
    activation = activation_of(parts.act, w.device, PLAIN_ACTIVATIONS)
    if activation is None:
        return (f"activation {_act_name(parts.act)} computes none of exact GELU, tanh-GELU and ReLU (the GEMM "
                "epilogue has no other)")
    x = sample(fc1.in_features, w.dtype, w.device, seed=5)
    fn = _ACTS[activation]
    err = _probe(m, x, lambda: F.linear(fn(F.linear(x, w, fc1.bias)), fc2.weight, fc2.bias))
    if isinstance(err, str):
        return err
    tol = tolerance(w.dtype, matmul=True)
    if err > tol:
        return (f"has two chained linears and a {activation} activation but its output is not "
                f"{parts.fc2_name}({activation}({parts.fc1_name}(x))) (relative error {err:.2g} > {tol:g})")
    return PlainMLPMatch(activation=activation, fc1_name=parts.fc1_name, fc2_name=parts.fc2_name,
                         hidden=fc1.in_features, intermediate=fc1.out_features, out_features=fc2.out_features,
                         has_bias=fc1.bias is not None or fc2.bias is not None, error=err)


# -- q/k/v projections ------------------------------------------------------------------------------------

#: the child names of the projections one fused GEMM can serve, in the order attention code calls them.
QKV = ("q_proj", "k_proj", "v_proj")


def qkv_parts(m: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear] | str | None:
    """``m``'s q/k/v linears when one GEMM can serve them, a reason when it has them but cannot, None
    when ``m`` has no q/k/v projections."""
    lins = [getattr(m, name, None) for name in QKV]
    if not all(isinstance(lin, nn.Module) for lin in lins):
        return None
    for name, lin in zip(QKV, lins, strict=True):
        problem = linear_problem(lin)  # type: ignore[arg-type]
        if problem is not None:
            return f"{name}: {problem}"
    q, k, v = lins
    assert isinstance(q, nn.Linear) and isinstance(k, nn.Linear) and isinstance(v, nn.Linear)
    if len({lin.in_features for lin in (q, k, v)}) != 1:
        return "q/k/v read different in_features"
    if len({(lin.weight.dtype, lin.weight.device) for lin in (q, k, v)}) != 1:
        return "q/k/v weights differ in dtype or device"
    if len({lin.bias is None for lin in (q, k, v)}) != 1:
        return "some of q/k/v have a bias and some not"
    if len({id(lin) for lin in (q, k, v)}) != 3:
        return "q/k/v are not three distinct modules"
    return q, k, v
