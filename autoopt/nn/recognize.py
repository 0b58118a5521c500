"""Which modules of a model autoopt can serve: :func:`recognize` looks at one module once and returns one match.

The answer is one of :mod:`autoopt.nn.match`'s types: what to build (a dense linear, a norm, a gated or
plain MLP, an attention's fused q/k/v) or why not (:class:`~autoopt.nn.match.NoMatch`, with the reason
the report shows). Structure first (what the module holds), then the behaviour probe its kind has; a
kind not in ``ops=`` is not probed. :func:`autoopt.optimize`'s walk calls it once per module and builds
from the answer (:mod:`autoopt.nn.build`).

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
- **a MoE block** (transformers 5's Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE ... sparse-MoE blocks): a module with
  one child holding the experts as 3-D Parameters ``gate_up_proj`` and ``down_proj`` (``E`` experts; rows
  ``[gate; up]``) and a router child holding a ``weight`` of ``E`` rows. The router must be a linear to ``E``:
  run once on a sample, it answers ``(logits, weights, ids)`` with ``logits = x @ W^T (+ b)`` and ``top_k``
  integer ids in ``[0, E)`` per token. The experts must hold nothing else (no biases), and on the router's
  answer compute ``sum_k w_k * down_e(silu(gate_e(x)) * up_e(x))`` in one of the two layouts their shapes
  allow (``[E, 2N, K]``/``[E, K, N]``, or transposed); an ``act_fn`` that is not SiLU is named as the reason.
  gpt-oss's experts are refused by these rules: they hold biases, and compute a clamped SwiGLU
  (``(up + 1) * gate * sigmoid(alpha * gate)`` with gate/up interleaved), which the fused kernel does not.
- **a checkpoint's block-FP8 linear** (transformers' ``FP8Linear`` as its finegrained-FP8 integration
  loads DeepSeek-V3 and the Qwen3 ``-FP8`` checkpoints): a linear holding an e4m3 ``weight [N, K]`` and a
  float32 ``weight_scale_inv [ceil(N/128), ceil(K/128)]`` (one scale per 128 x 128 block, ``w = q * s``:
  autoopt's ``fp8_block`` scales), a ``block_size`` of 128 x 128 where it says one, dynamic activation
  scales (no ``activation_scale``). Recognised by those tensors, not the class name, whatever ``weights=``
  says: a :class:`~autoopt.nn.match.QuantLinearMatch` of source ``checkpoint``, run on its own tensors
  (``fp8_block``, W8A8 where the GPU has FP8 tensor cores, else ``fp8_block-wo``).

With ``weights=`` (:attr:`~autoopt.nn.match.Context.weights`) a linear, a gated MLP's gate/up and down, and an
attention's fused q/k/v are matched with that format (a linear as a
:class:`~autoopt.nn.match.QuantLinearMatch`), except the linears in ``Context.keep_16bit``; a plain MLP is
not fused (the quantized GEMM has no activation epilogue): its linears are quantized one by one.

Probes run under ``torch.no_grad()`` on random inputs from a private generator (the global RNG is
never touched), in the module's own dtype and device.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from autoopt.backend.accuracy import rel_error
from autoopt.nn._moe import torch_experts
from autoopt.nn.compare import FLOAT_DTYPES, sample, tolerance
from autoopt.nn.match import (
    DEFAULT_OPS,
    MOE_OFF,
    ONE_BY_ONE,
    OPS,
    QKV,
    Context,
    DenseMatch,
    GatedMLPMatch,
    Match,
    MoEMatch,
    NoMatch,
    NormMatch,
    PlainMLPMatch,
    QKVMatch,
    QuantLinearMatch,
)
from autoopt.nn.modules import Replacement

__all__ = [
    "ACT_ATTRS",
    "EPS_ATTRS",
    "GATED_ACTIVATIONS",
    "PLAIN_ACTIVATIONS",
    "MoEParts",
    "PlainMLPParts",
    "activation_of",
    "checkpoint_fp8_problem",
    "gated_mlp_parts",
    "linear_problem",
    "match_plain_mlp",
    "moe_parts",
    "norm_parts",
    "plain_mlp_parts",
    "qkv_parts",
    "recognize",
]

#: epsilon attribute names, in the order they are looked for.
EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
#: child names that make a module an attention (its own forward is kept; q/k/v may be fused under it).
_ATTENTION_CHILDREN = (("q_proj", "k_proj", "v_proj"), ("qkv_proj",), ("query_key_value",), ("c_attn",))


# -- one module, one answer ------------------------------------------------------------------------------


def recognize(m: nn.Module, *, context: Context) -> Match:
    """What ``m`` is: the one match its replacement is built from, or why not (a :class:`NoMatch`).

    In the order the walk always took: already optimised, ``skip=``, a forward patched on the instance,
    then by structure a MoE block, a gated MLP, a plain MLP (not inside an attention), a linear, a norm, an
    attention (its q/k/v), a leaf with weights autoopt has no kernel for, and else a container to descend into."""
    if isinstance(m, Replacement):
        return NoMatch(kind=m.kind, reason="already optimised", status="skipped")
    kind, parts = _structure(m)
    hit = _skip_hit(context.path, context.skip)
    if hit is not None:
        return NoMatch(kind=kind, reason=f"matches skip= pattern {hit!r}", status="skipped")
    if ("forward" in m.__dict__ or hasattr(m, "_hf_hook")) and kind != "module":
        return NoMatch(kind=kind, reason="its forward is patched on the instance (an accelerate offload hook?): "
                       "replacing it would drop that")
    if kind == "moe":
        return _moe(m, parts, context)
    attention = any(all(hasattr(m, c) for c in names) for names in _ATTENTION_CHILDREN)
    if kind == "gated_mlp" or (kind == "plain_mlp" and not attention):
        return _mlp(m, kind, parts, context)
    if kind == "linear":
        return _linear(parts, context)
    if kind == "norm":
        return _norm(m, parts, context.ops)
    if attention:
        return _attention(m, context)
    if next(iter(m.children()), None) is None and any(True for _ in m.parameters(recurse=False)):
        return NoMatch(kind="other", reason=f"{type(m).__name__}: no autoopt kernel for it")
    return NoMatch(kind="module", reason="", descend=True)


def _structure(m: nn.Module) -> tuple[str, Any]:
    """What ``m`` holds, looked at once: ``(kind, parts)``, kind ``linear``, ``moe``, ``gated_mlp``, ``plain_mlp``
    or ``norm`` with the parts its recogniser reads, else ``("module", None)``."""
    if isinstance(m, nn.Linear):
        return "linear", m
    finders: tuple[tuple[str, Callable[[nn.Module], Any]], ...] = (
        ("moe", moe_parts), ("gated_mlp", gated_mlp_parts), ("plain_mlp", plain_mlp_parts), ("norm", norm_parts))
    for kind, find in finders:
        parts = find(m)
        if parts is not None:
            return kind, parts
    return "module", None


def _skip_hit(path: str, patterns: tuple[str, ...]) -> str | None:
    return next((p for p in patterns if fnmatch.fnmatchcase(path, p)), None)


def _has_hooks(m: Any) -> bool:
    return any(getattr(m, d, None) for d in ("_forward_hooks", "_forward_pre_hooks"))


def _dense(m: nn.Linear, ops: tuple[str, ...], *, probe: bool = True) -> DenseMatch | NoMatch:
    """A linear as a match, or why not; ``probe=False`` for one whose :func:`linear_problem` was asked already
    (an MLP's last linear)."""
    shape = f"{m.in_features}->{m.out_features}"
    if "linear" not in ops:
        return NoMatch(kind="linear", reason="linear not in ops=", shape=shape)
    problem = linear_problem(m) if probe else None
    if problem is not None:
        return NoMatch(kind="linear", reason=problem, shape=shape)
    return DenseMatch(in_features=m.in_features, out_features=m.out_features, has_bias=m.bias is not None)


def _norm(m: nn.Module, parts: tuple[str, float | None, nn.Parameter], ops: tuple[str, ...]) -> NormMatch | NoMatch:
    """A norm as a match (probed: which formula it computes), or why not."""
    w = parts[2]
    if w.dtype not in FLOAT_DTYPES:
        return NoMatch(kind="norm", reason=f"weight dtype {w.dtype} (kernels serve float16, bfloat16, float32)")
    found = _norm_match(m, parts)
    if isinstance(found, str):
        return NoMatch(kind="norm", reason=found)
    if found.kind not in ops:
        return NoMatch(kind=found.kind, reason=f"{found.kind} not in ops=", shape=str(found.features))
    return found


def _mlp(m: nn.Module, kind: str, parts: Any, context: Context) -> GatedMLPMatch | PlainMLPMatch | NoMatch:
    """A gated or plain MLP (``kind``) as a match (probed), or why not: then its linears are tried one by one."""
    if kind not in context.ops:
        return NoMatch(kind=kind, reason=f"{kind} not in ops=", descend=True)
    if kind == "plain_mlp" and context.weights is not None:
        return NoMatch(kind=kind, reason=f"weights={context.weights}: the quantized GEMM has no activation epilogue, "
                       "so fc1 is not fused with it; its linears are quantized one by one", descend=True)
    found = _gated_mlp(m, parts, context.ops) if kind == "gated_mlp" else _plain_mlp(m, parts, context.ops)
    if not isinstance(found, str):
        hooked = next((c for c in found.fused if _has_hooks(m._modules[c])), None)
        if hooked is None:
            if isinstance(found, GatedMLPMatch):
                return _quantized_mlp(found, parts, context)
            return found
        # the fused GEMM reads its weight and never calls it
        found = f"{context.path}.{hooked} has forward hooks (the fused GEMM would not call them)"
    return NoMatch(kind=kind, reason=found + ONE_BY_ONE[kind], descend=True)


def _attention(m: nn.Module, context: Context) -> QKVMatch | NoMatch:
    """An attention: kept as the model's own, its q/k/v as one GEMM where they can be (a :class:`QKVMatch`)."""
    impl = getattr(getattr(m, "config", None), "_attn_implementation", None)
    note = f"attention stays the model's own ({impl or type(m).__name__}); its projections are rows of their own"
    parts = qkv_parts(m)
    if parts is None:
        return NoMatch(kind="attention", reason=note, descend=True)
    why = _qkv_blocker(parts, context)
    if why is not None:
        return NoMatch(kind="attention", reason=note, descend=True, qkv=why + ONE_BY_ONE["qkv"])
    assert not isinstance(parts, str)
    q, k, v = parts
    return QKVMatch(attention=note, in_features=q.in_features, out_features=(q.out_features, k.out_features,
                    v.out_features), has_bias=q.bias is not None, weight=_format_for(context, q, k, v))


def _format_for(context: Context, *linears: nn.Linear) -> str | None:
    """The format ``linears`` are quantized into together: ``context.weights`` where every one of them has a
    16-bit weight and none is kept 16-bit, else None."""
    if context.weights is None or "linear" not in context.ops:
        return None
    if any(id(lin) in context.keep_16bit or lin.weight.dtype not in _HALF for lin in linears):
        return None
    return context.weights


#: the weight dtypes a quantized format is made from
_HALF = (torch.bfloat16, torch.float16)


def _quantize_dense(found: DenseMatch | QuantLinearMatch | NoMatch, lin: nn.Linear, context: Context
                    ) -> DenseMatch | QuantLinearMatch | NoMatch:
    """``found`` (a linear's match) in ``context.weights`` where that applies to ``lin``."""
    spec = _format_for(context, lin) if isinstance(found, DenseMatch) else None
    if spec is None or isinstance(found, NoMatch):
        return found
    return QuantLinearMatch(in_features=found.in_features, out_features=found.out_features, has_bias=found.has_bias,
                            weight=spec, group_size=_group(spec))


def _group(spec: str) -> int | None:
    from autoopt.kernels.quant import parse_weight

    return parse_weight(spec).group_size


def _quantized_mlp(found: GatedMLPMatch, parts: Any, context: Context) -> GatedMLPMatch:
    """A gated MLP's match with its gate/up (fused) and down in ``context.weights`` where that applies."""
    gate, up, down, _ = parts
    if context.weights is None:
        return found
    from dataclasses import replace

    return replace(found, weight=_format_for(context, gate, up), down=_quantize_dense(found.down, down, context))


def _linear(m: nn.Linear, context: Context) -> DenseMatch | QuantLinearMatch | NoMatch:
    """A linear: a checkpoint's block-FP8 linear (run on its own tensors), else a dense one, quantized into
    ``context.weights`` where that applies."""
    problem = checkpoint_fp8_problem(m)
    if problem is None:
        if "linear" not in context.ops:
            return NoMatch(kind="linear", reason="linear not in ops=", shape=f"{m.in_features}->{m.out_features}")
        spec = "fp8_block" if context.w8a8 else "fp8_block-wo"
        return QuantLinearMatch(in_features=m.in_features, out_features=m.out_features, has_bias=m.bias is not None,
                                weight=spec, group_size=_group(spec), source="checkpoint")
    if problem:
        return NoMatch(kind="linear", reason=problem, shape=f"{m.in_features}->{m.out_features}")
    return _quantize_dense(_dense(m, context.ops), m, context)


def checkpoint_fp8_problem(m: nn.Module) -> str | None:
    """For a linear holding a checkpoint's FP8 weight (an e4m3 ``weight`` and a ``weight_scale_inv``): None when
    autoopt's ``fp8_block`` kernels can run it on those tensors, else why not. ``""`` when ``m`` holds no such
    weight (not a checkpoint FP8 linear at all)."""
    w, s = getattr(m, "weight", None), getattr(m, "weight_scale_inv", None)
    if not isinstance(w, torch.Tensor) or w.dtype != torch.float8_e4m3fn or not isinstance(s, torch.Tensor):
        return ""
    name = type(m).__name__
    n, k = getattr(m, "out_features", None), getattr(m, "in_features", None)
    if w.dim() != 2 or (n, k) != tuple(w.shape):
        return f"{name}: e4m3 weight of shape {tuple(w.shape)} is not [out_features, in_features]"
    if w.device.type == "meta":
        return "weights on the meta device (not loaded yet)"
    want = (-(-w.shape[0] // 128), -(-w.shape[1] // 128))
    if s.dtype != torch.float32 or tuple(s.shape) != want:
        return (f"{name}: weight_scale_inv is {str(s.dtype).removeprefix('torch.')} {tuple(s.shape)}; autoopt's "
                f"fp8_block kernels read float32 scales per 128 x 128 block, {want}")
    block = getattr(m, "block_size", None)
    if block is not None and tuple(block) != (128, 128):
        return f"{name}: block_size {tuple(block)}; autoopt's fp8_block kernels read 128 x 128 blocks"
    if getattr(m, "activation_scale", None) is not None:
        return (f"{name}: a static activation_scale; autoopt's fp8_block GEMM quantizes activations dynamically "
                "(per token per 128)")
    b = getattr(m, "bias", None)
    if b is not None and (not isinstance(b, torch.Tensor) or b.dtype not in _HALF):
        return f"{name}: bias of dtype {getattr(b, 'dtype', type(b).__name__)} (the kernels add a bf16/fp16 bias)"
    if "forward" in m.__dict__:
        return f"{name} has its forward patched on the instance"
    return None


def _qkv_blocker(parts: tuple[nn.Linear, nn.Linear, nn.Linear] | str, context: Context) -> str | None:
    """Why an attention's q/k/v (:func:`qkv_parts`) are not fused here (None: they are)."""
    if isinstance(parts, str):
        return parts
    if "qkv" not in context.ops or "linear" not in context.ops:
        return "qkv and linear must both be in ops= to fuse q/k/v"
    for name, lin in zip(QKV, parts, strict=True):
        path = f"{context.path}.{name}"
        hit = _skip_hit(path, context.skip)
        if hit is not None:
            return f"{path} matches skip= pattern {hit!r}"
        if id(lin) in context.replaced:
            return f"{path} is shared with another module"
        if _has_hooks(lin):
            return f"{path} has forward hooks (they would see a slice computed elsewhere)"
    return None


# -- linears ---------------------------------------------------------------------------------------------


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


def _norm_match(m: nn.Module, parts: tuple[str, float | None, nn.Parameter]) -> NormMatch | str:
    """What norm ``m`` computes (a :class:`NormMatch`, by a probe against each formula), or why it is not one."""
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
                return NormMatch(kind=kind, features=w.shape[0], eps=eps, unit_offset=unit_offset,
                                 has_bias=bias is not None)
            errors.append(f"{kind}{' (1 + weight)' if unit_offset else ''} {err:.2g}")
    return (f"holds a norm's weight and {eps_attr} but its output matches no norm formula within {tol:g} "
            f"(relative error: {', '.join(errors)})")


# -- gated MLP -------------------------------------------------------------------------------------------


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


def _gated_mlp(m: nn.Module, parts: tuple[nn.Linear, nn.Linear, nn.Linear, Any],
               ops: tuple[str, ...]) -> GatedMLPMatch | str:
    """What gated MLP ``m`` (with these ``parts``) computes (a :class:`GatedMLPMatch`, by a probe), or why it is
    not one autoopt serves."""
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
                         has_bias=gate.bias is not None or down.bias is not None, linear_op="linear" in ops,
                         down=_dense(down, ops, probe=False))


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


def match_plain_mlp(m: nn.Module, *, ops: tuple[str, ...] = OPS) -> PlainMLPMatch | NoMatch:
    """What plain MLP ``m`` is (a :class:`PlainMLPMatch`), or why it is not recognised as one: :func:`recognize`'s
    answer for a module known to be no attention, without ``skip=`` or hooks."""
    parts = plain_mlp_parts(m)
    found = (_plain_mlp(m, parts, ops) if parts is not None
             else "not a plain MLP: needs exactly two chained linears and one activation")
    return NoMatch(kind="plain_mlp", reason=found) if isinstance(found, str) else found


def _plain_mlp(m: nn.Module, parts: PlainMLPParts, ops: tuple[str, ...]) -> PlainMLPMatch | str:
    """What plain MLP ``m`` (with these ``parts``) computes (a :class:`PlainMLPMatch`, by a probe), or why it is
    not one autoopt serves."""
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
                         fc1_bias=fc1.bias is not None, fc2_bias=fc2.bias is not None,
                         fc2=_dense(fc2, ops, probe=False))


# -- q/k/v projections ------------------------------------------------------------------------------------


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


# -- MoE blocks -------------------------------------------------------------------------------------------

#: the Parameters a MoE block's experts child holds, one 3-D tensor per projection across the experts
_EXPERT_PARAMS = ("gate_up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class MoEParts:
    """A MoE block's pieces: its experts child and its router child (None: none fits), under their child
    names, and the names of its other children that hold weights (a shared expert and its gate)."""

    experts_name: str
    experts: nn.Module
    router_name: str | None
    router: nn.Module | None
    others: tuple[str, ...]

    @property
    def count(self) -> int:
        """E, the number of experts."""
        return int(self.experts.get_parameter("gate_up_proj").shape[0])


def _holds_experts(m: nn.Module) -> bool:
    gate_up, down = (m._parameters.get(name) for name in _EXPERT_PARAMS)
    return (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == down.dim() == 3
            and gate_up.shape[0] == down.shape[0])


def moe_parts(m: nn.Module) -> MoEParts | None:
    """``m``'s :class:`MoEParts` when it has a MoE block's structure (one child holding 3-D ``gate_up_proj`` and
    ``down_proj`` Parameters of ``E`` experts), else None. The router is the other child whose ``weight`` is
    2-D with ``E`` rows."""
    if isinstance(m, (nn.Linear, nn.ModuleList, nn.ModuleDict)):
        return None
    children = [(n, c) for n, c in m.named_children() if c is not None]
    experts = [(n, c) for n, c in children if _holds_experts(c)]
    if len(experts) != 1:
        return None
    experts_name, ex = experts[0]
    count = ex.get_parameter("gate_up_proj").shape[0]
    routers = [(n, c) for n, c in children if c is not ex and isinstance(w := getattr(c, "weight", None), torch.Tensor)
               and w.dim() == 2 and w.shape[0] == count]
    router_name, router = routers[0] if len(routers) == 1 else (None, None)
    others = tuple(n for n, c in children if c is not ex and c is not router
                   and next(c.parameters(), None) is not None)
    return MoEParts(experts_name, ex, router_name, router, others)


def _moe(m: nn.Module, parts: MoEParts, context: Context) -> MoEMatch | NoMatch:
    """A MoE block as a match (its router and experts probed), or why not: then the walk goes on into it (a
    shared expert is an MLP of its own)."""
    if "moe" not in context.ops:
        reason = MOE_OFF if context.ops == DEFAULT_OPS else "moe not in ops="
        if context.weights is not None:  # most of a MoE model's bytes are its experts: say they stay 16-bit
            reason += f"; under weights={context.weights} its experts stay 16-bit (ops with 'moe' quantizes them too)"
        return NoMatch(kind="moe", reason=reason, descend=True)
    found = _moe_match(m, parts, context)
    if isinstance(found, str):
        return NoMatch(kind="moe", reason=found, descend=True)
    return found


def _moe_match(m: nn.Module, parts: MoEParts, context: Context) -> MoEMatch | str:
    ex, count, name = parts.experts, parts.count, parts.experts_name
    router = parts.router
    if router is None or parts.router_name is None:
        return (f"{name} holds {count} experts but no one child is a router to {count} experts (a 2-D weight of "
                f"{count} rows)")
    extra = [n for n, _ in ex.named_parameters() if n not in _EXPERT_PARAMS]
    if extra:
        return (f"{name} holds {', '.join(extra[:3])} besides gate_up_proj and down_proj (per-expert biases or "
                "scales): the fused-MoE kernel computes bias-free 16-bit experts")
    if "forward" in ex.__dict__ or hasattr(ex, "_hf_hook"):
        return (f"{name}'s forward is patched on the instance (an accelerate offload hook?): replacing it would drop "
                "that")
    if id(ex) in context.replaced:
        return f"{name} is shared with another module already replaced"
    hit = _skip_hit(f"{context.path}.{name}", context.skip)
    if hit is not None:
        return f"{context.path}.{name} matches skip= pattern {hit!r}"
    gate_up, down = (ex.get_parameter(p) for p in _EXPERT_PARAMS)
    for label, p in (("gate_up_proj", gate_up), ("down_proj", down)):
        problem = _plain_param(p)
        if problem is not None:
            return f"{name}.{label}: {problem}"
    if down.dtype != gate_up.dtype or down.device != gate_up.device:
        return f"{name}: gate_up_proj and down_proj differ in dtype or device"
    rw = router.weight
    assert isinstance(rw, torch.Tensor)
    hidden = int(rw.shape[1])
    layouts = _moe_layouts(gate_up, down, hidden)
    if not layouts:
        return (f"{name}: gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)} are neither [E, 2N, K] "
                f"and [E, K, N] nor their transposes for the router's hidden size K = {hidden}")
    act = getattr(ex, "act_fn", None)
    if act is not None and callable(act) and activation_of(act, gate_up.device, ("silu",)) is None:
        return (f"{name}.act_fn {type(act).__name__} does not compute SiLU: the fused-MoE kernel computes "
                "silu(gate) * up")
    routed = _route(router, parts.router_name, count, hidden, gate_up.dtype, gate_up.device)
    if isinstance(routed, str):
        return routed
    x, weights, ids = routed
    errors = []
    for transposed, inter in layouts:
        err = _experts_error(ex, x, weights, ids, gate_up, down, transposed)
        if isinstance(err, str):
            return f"{name}: {err}"
        tol = tolerance(gate_up.dtype, matmul=True)
        if err <= tol:
            return MoEMatch(experts_name=name, router_name=parts.router_name, experts=count, top_k=int(ids.shape[1]),
                            hidden=hidden, intermediate=inter, activation="silu", transposed=transposed,
                            others=parts.others, weight=_expert_format(context, gate_up))
        errors.append(f"{'transposed' if transposed else '[E, 2N, K]'} {err:.2g}")
    return (f"{name}: its output on the router's answer is not sum_k w_k * down(silu(gate(x)) * up(x)) with rows "
            f"[gate; up] within {tolerance(gate_up.dtype, matmul=True):g} (relative error: {', '.join(errors)})")


def _expert_format(context: Context, gate_up: torch.Tensor) -> str | None:
    """The format a MoE block's 16-bit experts are quantized into: ``context.weights`` where the fused-MoE kernel
    runs it (:func:`autoopt.nn._moe.expert_format_problem`), else None (16-bit; optimize()'s row says why)."""
    if context.weights is None or gate_up.dtype not in _HALF:
        return None
    from autoopt.nn._moe import expert_format_problem

    return context.weights if expert_format_problem(context.weights) is None else None


def _moe_layouts(gate_up: torch.Tensor, down: torch.Tensor, hidden: int) -> list[tuple[bool, int]]:
    """``(transposed, N)`` for each layout the experts' shapes allow over hidden size ``hidden`` (both, in this
    order, when ``hidden == 2N``)."""
    e = gate_up.shape[0]
    out = []
    if gate_up.shape[2] == hidden and gate_up.shape[1] % 2 == 0 and tuple(down.shape) == (e, hidden,
                                                                                            gate_up.shape[1] // 2):
        out.append((False, gate_up.shape[1] // 2))
    if gate_up.shape[1] == hidden and gate_up.shape[2] % 2 == 0 and tuple(down.shape) == (e, gate_up.shape[2] // 2,
                                                                                           hidden):
        out.append((True, gate_up.shape[2] // 2))
    return out


def _route(router: nn.Module, name: str, count: int, hidden: int, dtype: torch.dtype, device: torch.device
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | str:
    """The router run once on a sample: ``(x, weights, ids)``, or why it is not a linear to ``count`` experts
    answering ``(logits, weights, ids)``."""
    x = sample(hidden, dtype, device, seed=6).reshape(-1, hidden)
    try:
        with torch.no_grad():
            out = router.forward(x)
    except Exception as exc:
        return f"router {name}: a probe on a {tuple(x.shape)} {x.dtype} input raised {type(exc).__name__}: {exc}"
    if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(isinstance(t, torch.Tensor) for t in out)):
        return f"router {name} does not answer (logits, weights, ids) tensors"
    logits, weights, ids = out
    t = x.shape[0]
    if tuple(logits.shape) != (t, count) or ids.dim() != 2 or ids.shape[0] != t or weights.shape != ids.shape \
            or ids.dtype.is_floating_point or not 1 <= ids.shape[1] <= count:
        return (f"router {name} answers logits {tuple(logits.shape)}, weights {tuple(weights.shape)}, ids "
                f"{tuple(ids.shape)} {ids.dtype}; expected [{t}, {count}] and two [{t}, top_k] (integer ids)")
    if int(ids.min()) < 0 or int(ids.max()) >= count:
        return f"router {name} answers expert ids outside [0, {count})"
    w = router.weight
    assert isinstance(w, torch.Tensor)
    with torch.no_grad():
        linear = F.linear(x.float(), w.float(), _bias_of(router))
    err = rel_error(logits.float(), linear)
    tol = tolerance(dtype, matmul=True)
    if err > tol:
        return f"router {name}'s logits are not x @ weight^T (+ bias): relative error {err:.2g} > {tol:g}"
    return x, weights, ids


def _bias_of(m: nn.Module) -> torch.Tensor | None:
    b = getattr(m, "bias", None)
    return b.float() if isinstance(b, torch.Tensor) else None


def _experts_error(ex: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, transposed: bool) -> float | str:
    """The experts' output on the router's answer against the fused kernel's formula in one layout."""
    try:
        with torch.no_grad():
            out = ex.forward(x, ids, weights)
            w13, w2 = (gate_up.transpose(1, 2), down.transpose(1, 2)) if transposed else (gate_up, down)
            ref = torch_experts(x.float(), w13.float(), w2.float(), weights.float(), ids)
    except Exception as exc:
        return (f"a probe on {tuple(x.shape)} {x.dtype} tokens routed to {tuple(ids.shape)} experts raised "
                f"{type(exc).__name__}: {exc}")
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        return "its output on a probe is not a tensor of the tokens' shape"
    return rel_error(out.float(), ref)
