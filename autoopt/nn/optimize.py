"""``autoopt.optimize(model)``: swap a model's linears, norms and MLPs (gated and plain) for autoopt's kernels.

::

    report = autoopt.optimize(model)          # in place; returns an OptimizeReport
    print(report)                             # what was replaced, what was not and why, the kernels
    autoopt.restore(model)                    # the original modules back (or: with autoopt.optimize(model): ...)

The walk goes down the module tree from the root and looks at each child once:
:func:`~autoopt.nn.recognize.recognize` answers with one typed match (:mod:`autoopt.nn.match`), the
builder of that kind (:mod:`autoopt.nn.build`) makes the replacement, the check compares the two, and
the replacement is swapped in with its report row; a :class:`~autoopt.nn.match.NoMatch` is a kept or
skipped row with its reason. What it recognises, in order:

1. a **gated MLP** (``gate_proj``/``up_proj``/``down_proj`` + a SiLU or tanh-GELU ``act_fn``, checked
   to compute ``down(act(gate(x)) * up(x))``): replaced by :class:`~autoopt.nn.modules.AutooptGatedMLP`,
   one ``gate_up`` GEMM + fused ``swiglu``/``gelu_tanh_mul`` + the down GEMM; its children are not
   visited further (gate/up are *fused*, down is a replaced linear);
2. a **plain MLP** (exactly two chained linears + an exact-GELU, tanh-GELU or ReLU activation, checked to
   compute ``fc2(act(fc1(x)))``: StarCoder2, GPT-NeoX/Pythia, Phi, Falcon), not inside an attention:
   :class:`~autoopt.nn.modules.AutooptPlainMLP`, fc1 with its bias and the activation in the GEMM's
   epilogue, then fc2 (fc1 is *fused*, fc2 a replaced linear);
3. a **norm** (a 1-D weight + an epsilon attribute, checked against the RMSNorm, Gemma ``1 + weight``
   RMSNorm and LayerNorm formulas, with or without a bias): :class:`~autoopt.nn.modules.AutooptRMSNorm` /
   :class:`~autoopt.nn.modules.AutooptLayerNorm`;
4. a plain **linear** (its bias added in the GEMM's epilogue): :class:`~autoopt.nn.modules.AutooptLinear`;
5. a **MoE block** (transformers 5's sparse-MoE blocks: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE; a router to E
   experts whose ``gate_up_proj``/``down_proj`` are 3-D Parameters, checked to compute the SiLU-gated experts
   on the router's answer; recognised first): its experts child becomes
   :class:`~autoopt.nn.modules.AutooptMoEExperts`, all experts in one fused-MoE call on the model's own
   tensors; the block keeps its own forward, so the router (top-k, softmax, renormalisation as the config
   says) and a shared expert run as the model runs them. Its row is the block's (kind ``moe``), the router's
   row says it is kept, and the walk goes on into the block (a shared expert is a gated MLP of its own);

and otherwise descends into the child. Attention modules are left as the model's own (SDPA,
FlashAttention): only their projections are replaced. Where an attention has ``q_proj``, ``k_proj``
and ``v_proj`` linears reading one input, they become one **qkv** GEMM
(:class:`~autoopt.nn.modules.AutooptQKV` at ``q_proj``, its slices at ``k_proj``/``v_proj``; the three
are *fused* rows, the group a ``qkv`` row); ``o_proj`` is a replaced linear. Recognition rules:
:mod:`autoopt.nn.recognize`. Nothing assumes a sequential block: each module is replaced where it sits,
so parallel attention/MLP blocks (GPT-NeoX's ``use_parallel_residual``, Phi, Falcon's ``parallel_attn``)
call the replacements as they called the originals.

``check=True`` (the default) runs, once per distinct (kind, shape, dtype, device, variant), the
original and the replacement on two samples, ``[2, 8, features]`` and ``[2, 16, features]`` (16 rows:
the decode GEMV kind; 32 rows: the tiled GEMM kind; a MoE block: its own forward with the original experts
and with the replacement), and compares them (relative error
within 1e-4 fp32, 5e-3 fp16, 2e-2 bf16; 5e-3 for fp32 matmuls when torch allows TF32); a mismatch
or an exception keeps the original and is reported. With ``check=False`` recognition still runs its
torch-only probes, but the replacements are not run.

``keep_original=False`` (the default) builds each gated MLP's ``gate_up`` (and each attention's
``qkv``) once and re-points the original weights at its row slices: no weight exists twice (see
:class:`~autoopt.nn.modules.AutooptGatedMLP`); ``keep_original=True`` leaves the original tensors
untouched and costs the fused weights' size again (``2 * intermediate * hidden`` elements per MLP).

**Quantized weights** (``weights=``, :mod:`autoopt.nn.weights`): the linears, the fused gate_up and q/k/v
weights included, are quantized in place into the format (:mod:`autoopt.nn.quant_modules`), one module
at a time; each original 16-bit weight is freed once its quantized replacement is in place
(``keep_original=True`` keeps it, and :func:`restore` then gives back the original modules; without it
:func:`restore` raises :class:`~autoopt.errors.RestoreError` and changes nothing). The LM head (the
model's output embedding) and a weight shared with another tensor stay 16-bit, as
:mod:`autoopt.planning.quant` counts them. Every quantized replacement is checked on its own (its weights,
hence its error, differ from any other's) against its 16-bit layer on the same two samples; its relative
error is in its report row, and over the format's bound (:data:`autoopt.nn.compare.QUANT_BOUNDS`: fp8 6 %,
int8 3 %, int4 15 %) ``check=True`` keeps the layer 16-bit (its 16-bit replacement, checked as usual) and
the report says so. A replaced MoE block's experts (``ops`` with ``moe``) are quantized too, each expert on
its own (:class:`~autoopt.nn.quant_modules.AutooptQuantMoEExperts`, one ``fused_moe_quant`` call), in the
formats the fused-MoE kernel runs (W8A8 ``fp8``/``fp8_block``, ``int8``, ``int4`` with or without offsets; a
weight-only FP8 spec leaves them 16-bit and the row says why); the block is checked whole, against
:data:`MOE_BOUND_FACTOR` times the format's bound (three chained quantized products). A checkpoint's own
block-FP8 linears (transformers' ``FP8Linear``) are recognised whatever ``weights=`` says and run ``fp8_block``
on their own tensors, checked against their dequantized weight.
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoopt._log import get_logger
from autoopt.backend.accuracy import rel_error
from autoopt.errors import OpError, RestoreError, WeightFormatError
from autoopt.nn import _moe, dispatch
from autoopt.nn import attention as attention_runner
from autoopt.nn import decode_graphs as decode_graph_runners
from autoopt.nn import decode_layer as decode_layers
from autoopt.nn.build import build
from autoopt.nn.compare import quant_bound, sample, tolerance
from autoopt.nn.match import (
    DEFAULT_OPS,
    ONE_BY_ONE,
    OPS,
    QKV,
    Context,
    DenseMatch,
    GatedMLPMatch,
    MoEMatch,
    NoMatch,
    NormMatch,
    PlainMLPMatch,
    QKVMatch,
    QuantLinearMatch,
    Replacing,
)
from autoopt.nn.modules import (
    AutooptGatedMLP,
    AutooptLayerNorm,
    AutooptLinear,
    AutooptMoEExperts,
    AutooptPlainMLP,
    AutooptQKV,
    AutooptRMSNorm,
    FusedRows,
    Replacement,
)
from autoopt.nn.quant_modules import (
    AutooptQuantGatedMLP,
    AutooptQuantLinear,
    AutooptQuantMoEExperts,
    AutooptQuantQKV,
    QuantLinear,
    QuantReplacement,
)
from autoopt.nn.recognize import recognize
from autoopt.nn.report import OptimizeReport, Row
from autoopt.nn.weights import WeightChoice, hardware_of, resolve_weights

log = get_logger(__name__)

__all__ = ["OPS", "optimize", "restore"]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _unwrap(model: Any, what: str) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"autoopt.{what}() takes a torch.nn.Module, got {type(model).__name__}")
    inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule wraps the model
    return inner if isinstance(inner, nn.Module) else model


def _ops_set(ops: Any) -> tuple[str, ...]:
    if ops is None:
        return DEFAULT_OPS
    if isinstance(ops, str):
        ops = (ops,)
    if not isinstance(ops, Iterable):
        raise TypeError(f"autoopt.optimize(): ops= takes op names (a str or an iterable of str), got "
                        f"{type(ops).__name__}")
    names = list(ops)
    bad = [n for n in names if not isinstance(n, str) or n not in OPS]
    if bad:
        raise OpError(f"autoopt.optimize(): unknown op name(s) in ops=: {', '.join(map(repr, bad))}; "
                      f"choose from {', '.join(OPS)}")
    return tuple(n for n in OPS if n in names)


def _patterns(skip: Any) -> tuple[str, ...]:
    if isinstance(skip, str):
        return (skip,)
    items = tuple(skip)
    if not all(isinstance(s, str) for s in items):
        raise TypeError("autoopt.optimize(): skip= takes module-path patterns (fnmatch, e.g. 'lm_head' or "
                        "'model.layers.0.*'), as a str or an iterable of str")
    return items


# -- kernels: what the dispatch picks for a replacement's ops at the sample's size ---------------------------

#: tokens of the two check samples ``[2, tokens, features]``: 16 rows (the GEMV kind, M <= 16) and 32
#: rows (the GEMM kind). Small on purpose: under Triton's CPU interpreter every program costs.
CHECK_TOKENS = (8, 16)


def _describe(choice: dispatch.Choice, extra: str | None = None) -> str:
    if extra is not None:
        return f"torch ({extra})"
    if choice.fallback is not None:
        return f"torch ({choice.fallback})"
    assert choice.config is not None
    where = ", interpreter" if dispatch.interpreter_active() and choice.device.startswith("cpu") else ""
    return f"{choice.kernel} {choice.config.describe()} [{choice.source or 'predicted'}{where}]"


def _linear_choice(m: int, n: int, k: int, dtype: Any, device: Any) -> str:
    choice = dispatch.choose("linear", dispatch.matmul_kind(m), (m, n, k), dtype, device)
    extra = None
    if choice.fallback is None:
        extra = dispatch.tf32_problem(dtype, device, torch.get_float32_matmul_precision())
    return _describe(choice, extra)


def _quant_choice(lin: QuantLinear, m: int, dtype: Any) -> str:
    """What runs a quantized linear on ``m`` rows of ``dtype`` activations."""
    w = lin.packed()[0]
    choice = dispatch.choose("quant_linear", dispatch.matmul_kind(m), (m, lin.out_features, lin.in_features), dtype,
                             w.device, weight=lin.weight_format)
    if choice.fallback is not None and not choice.fallback.startswith(dispatch.VENDOR):
        return f"torch dequantize + matmul ({choice.fallback})"
    if choice.fallback is not None:
        return f"torch._scaled_mm after autoopt act_quant ({choice.fallback})"
    return _describe(choice)


def _kernels_at(rep: nn.Module, m: int, dtype: Any = None) -> dict[str, str]:
    """``op -> what runs it`` for ``rep`` on ``m`` rows, from the dispatch (cached; ranks if new); ``dtype``: the
    activations' dtype of a quantized replacement."""
    if isinstance(rep, AutooptQuantLinear):
        return {"quant_linear": _quant_choice(rep, m, dtype)}
    if isinstance(rep, AutooptQuantQKV):
        return {"qkv": _quant_choice(rep.qkv, m, dtype)}
    if isinstance(rep, AutooptQuantGatedMLP):
        i = rep.intermediate
        op, kind = ("swiglu", "silu_mul") if rep.activation == "silu" else ("gelu_tanh_mul", "gelu_tanh_mul")
        return {"gate_up": _quant_choice(rep.gate_up, m, dtype),
                op: _describe(dispatch.choose(op, kind, (m, i), dtype, rep.gate_up.packed()[0].device)),
                "down": _inner_linear_choice(rep.down_proj, m, dtype)}
    if isinstance(rep, AutooptLinear):
        w = rep.weight
        return {"linear": _linear_choice(m, w.shape[0], w.shape[1], w.dtype, w.device)}
    if isinstance(rep, AutooptQKV):
        w = rep.weight
        n = rep.out_features + sum(p.out_features for p in rep.parts)
        return {"qkv": _linear_choice(m, n, rep.in_features, w.dtype, w.device)}
    if isinstance(rep, (AutooptRMSNorm, AutooptLayerNorm)):
        w = rep.weight
        op, kind = ("rms_norm", "rmsnorm") if isinstance(rep, AutooptRMSNorm) else ("layer_norm", "layernorm")
        return {op: _describe(dispatch.choose(op, kind, (m, w.shape[0]), w.dtype, w.device))}
    if isinstance(rep, AutooptGatedMLP):
        w = rep.gate_proj.weight
        i, h = rep.intermediate, rep.gate_proj.in_features
        out = {"gate_up": _linear_choice(m, 2 * i, h, w.dtype, w.device) if rep.use_linear_op
               else "torch (linear not in ops=)"}
        op, kind = ("swiglu", "silu_mul") if rep.activation == "silu" else ("gelu_tanh_mul", "gelu_tanh_mul")
        out[op] = _describe(dispatch.choose(op, kind, (m, i), w.dtype, w.device))
        out["down"] = _inner_linear_choice(rep.down_proj, m, w.dtype)
        return out
    if isinstance(rep, AutooptMoEExperts):
        w = rep.gate_up_proj
        return {"fused_moe": _moe.kernels_at(m, rep.experts, rep.intermediate, rep.hidden, rep.top_k, w.dtype,
                                             w.device)}
    if isinstance(rep, AutooptQuantMoEExperts):
        return {"fused_moe": _moe.kernels_at(m, rep.experts, rep.intermediate, rep.hidden, rep.top_k,
                                             dtype if dtype is not None else torch.bfloat16,
                                             rep.packed("w13")[0].device, rep.weight_format)}
    if isinstance(rep, AutooptPlainMLP):
        fc1 = rep.fc1
        w = fc1.weight
        desc = _linear_choice(m, fc1.out_features, fc1.in_features, w.dtype, w.device)
        epilogue = f"{'bias + ' if fc1.bias is not None else ''}{rep.fused_activation}"
        return {"fc1": desc if desc.startswith("torch") else f"{desc}, epilogue {epilogue}",
                "fc2": _inner_linear_choice(rep.fc2, m)}
    return {}


def _inner_linear_choice(lin: nn.Module, m: int, dtype: Any = None) -> str:
    """What runs a fused MLP's last linear (down_proj, fc2) on ``m`` rows."""
    if isinstance(lin, AutooptQuantLinear):
        return _quant_choice(lin, m, dtype)
    if not isinstance(lin, AutooptLinear):
        return "torch (nn.Linear kept)"
    w = lin.weight
    return _linear_choice(m, lin.out_features, lin.in_features, w.dtype, w.device)


def _kernels(rep: nn.Module, dtype: Any = None) -> dict[str, str]:
    """What runs ``rep``'s ops at the check samples' sizes: ``op`` when one choice serves both, else
    ``op@16`` and ``op@32`` (rows)."""
    sizes = [2 * t for t in CHECK_TOKENS]
    per = [_kernels_at(rep, m, dtype) for m in sizes]
    out: dict[str, str] = {}
    for op in per[0]:
        descs = [p[op] for p in per]
        if all(d == descs[0] for d in descs):
            out[op] = descs[0]
        else:
            out.update({f"{op}@{m}": d for m, d in zip(sizes, descs, strict=True)})
    return out


def _backend(rows: list[Row]) -> str:
    runs = [k for r in rows if r.status == "replaced" for k in r.kernels.values()]
    if not runs:
        return "nothing replaced"
    triton = [k for k in runs if not k.startswith("torch")]
    if not triton:
        return "torch fallback"
    label = "triton-interpreter" if any(", interpreter]" in k for k in triton) else "triton"
    return label if len(triton) == len(runs) else f"{label} + torch fallback"


# -- the walk ---------------------------------------------------------------------------------------------------

@dataclass
class _Checked:
    ok: bool
    reason: str = ""
    error: float | None = None
    tolerance: float | None = None


def _compare(original: nn.Module, rep: nn.Module, x: torch.Tensor, tol: float) -> _Checked:
    """Run both forwards (hooks not fired) on ``x``; the verdict."""
    try:
        with torch.no_grad():
            ref = original.forward(x)
            out = rep.forward(x)
    except Exception as exc:
        return _Checked(ok=False, reason=f"check: the replacement raised {type(exc).__name__}: {exc}")
    if not isinstance(out, torch.Tensor) or out.dtype != getattr(ref, "dtype", None):
        return _Checked(ok=False, reason=f"check: output dtype {getattr(out, 'dtype', type(out))} differs from "
                                         f"the original's {getattr(ref, 'dtype', type(ref))}")
    err = rel_error(out, ref)
    if err <= tol:
        return _Checked(ok=True, error=err, tolerance=tol)
    return _Checked(ok=False, error=err, tolerance=tol,
                    reason=f"check failed: relative error {err:.3g} > {tol:g} on a {tuple(x.shape)} "
                           f"{_dtype_name(x.dtype)} sample")


#: the check's sample ``[2, tokens, in_features]`` for each match kind: its generator seed, an offset from zero
#: (a norm's: so that LayerNorm and RMSNorm differ) and whether the tolerance is a matmul's.
@dataclass(frozen=True, slots=True)
class _Sample:
    seed: int = 0
    offset: float = 0.0
    matmul: bool = True


_SAMPLES: dict[type, _Sample] = {DenseMatch: _Sample(), NormMatch: _Sample(offset=0.5, matmul=False),
                                 GatedMLPMatch: _Sample(seed=2), PlainMLPMatch: _Sample(seed=5),
                                 QKVMatch: _Sample(seed=3), QuantLinearMatch: _Sample(), MoEMatch: _Sample(seed=6)}
#: the model's own dtypes a quantized replacement's activations take
_HALF = (torch.bfloat16, torch.float16)


#: a quantized MoE block is checked whole (the fused call has no seam between its GEMMs): gate_up, then
#: silu(gate) * up, then down, three quantized products whose independent errors add in quadrature, so its
#: bound is the format's per-linear bound times sqrt(3). Measured on the tiny Mixtral, Qwen3-MoE and OLMoE of
#: tests/test_optimize_moe.py (fp16, every expert): per-GEMM error int4 0.086-0.098, fp8 W8A8 0.036, int8
#: 0.006 (medians); the blocks' 0.15-0.18, 0.061-0.066 and 0.010-0.011, 1.6-1.9x (sqrt(3) = 1.73).
MOE_BOUND_FACTOR = math.sqrt(3.0)


def moe_experts_16bit(spec: str) -> str:
    """Why a replaced MoE block's experts keep their 16-bit weights under ``weights=spec`` (its row and a note)."""
    why = _moe.expert_format_problem(spec)
    return f"its experts stay 16-bit: {why}" if why else "its experts stay 16-bit (they are not bfloat16/float16)"


def _quantized(match: Replacing) -> str | None:
    """The weight format ``match`` quantizes into (None: 16-bit)."""
    weight: str | None = getattr(match, "weight", None)
    return weight


def _bound(spec: str) -> float:
    from autoopt.kernels.quant import parse_weight

    return quant_bound(parse_weight(spec).name)


class _WithExperts(nn.Module):
    """A MoE block's own forward with its experts child swapped for the replacement, for the check: a shallow
    copy of the block holds the swap (the block itself is not touched)."""

    def __init__(self, block: nn.Module, name: str, experts: nn.Module) -> None:
        super().__init__()
        clone = copy.copy(block)
        clone.__dict__["_modules"] = {**block._modules, name: experts}
        self.__dict__["clone"] = clone  # not a child: this wrapper lives only for the check

    def forward(self, x: torch.Tensor) -> Any:
        return self.__dict__["clone"].forward(x)


class _Dequantized(nn.Module):
    """A checkpoint's FP8 linear as torch computes it on its dequantized weight: what its replacement is checked
    against (the original's own forward may need a GPU kernel library, and its quantization is the checkpoint's)."""

    def __init__(self, rep: QuantLinear) -> None:
        super().__init__()
        self.__dict__["rep"] = rep  # not a child: this wrapper lives only for the check

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from autoopt.nn.ops import dequant_linear

        rep: QuantLinear = self.__dict__["rep"]
        return dequant_linear(x, rep.quantized(), rep.bias)


@dataclass
class _Built:
    """A replacement built and checked: its match (the 16-bit one where a quantized one was over its bound),
    the verdict, and the note saying why it fell back to 16 bits (empty when it did not)."""

    match: Replacing
    rep: nn.Module
    verdict: _Checked
    note: str = ""


@dataclass
class _Walk:
    """One optimize() call: down the module tree, each module recognised once, then built, checked, swapped."""

    ops: tuple[str, ...]
    check: bool
    keep_original: bool
    skip: tuple[str, ...]
    #: the format linears are quantized into (None: 16-bit), and the linears kept 16-bit under it (id -> why)
    weights: str | None = None
    keep_16bit: dict[int, str] = field(default_factory=dict)
    #: whether the GPU has FP8 tensor cores (a checkpoint's FP8 linears run W8A8 there)
    w8a8: bool = True
    #: the model's 16-bit dtype: a quantized check's sample dtype where the module has no 16-bit tensor
    dtype: Any = torch.bfloat16
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: (parent, child name, replacement), both weakly: a report must not keep a deleted model alive.
    patches: list[tuple[Any, str, Any]] = field(default_factory=list)
    done: dict[int, nn.Module] = field(default_factory=dict)
    #: modules under a module the walk then descends into that it has dealt with already: the replacements it
    #: put in place there (the q/k/v parts, a MoE block's experts) and a replaced MoE block's router
    placed: set[int] = field(default_factory=set)
    checked: dict[tuple[Any, ...], _Checked] = field(default_factory=dict)
    #: what ran each fused MLP's inner linear: id(replacement) -> its build
    inner_built: dict[int, _Built] = field(default_factory=dict)

    # -- checking ---------------------------------------------------------------------------------

    def _verify(self, key: tuple[Any, ...], original: nn.Module, rep: nn.Module,
                make: Callable[[int], torch.Tensor], tol: float, *, quantized: bool = False) -> _Checked:
        """Run ``original`` and ``rep`` on ``make(tokens)`` for each of :data:`CHECK_TOKENS`, once per
        ``key``; the cached verdict after that. The error reported is the largest. A quantized replacement
        is measured even with ``check=False`` (its error is what its report row is for), but only
        ``check=True`` acts on it."""
        if not self.check and not quantized:
            return _Checked(ok=True)
        if key in self.checked:
            return self.checked[key]
        verdict = _Checked(ok=True, error=0.0, tolerance=tol)
        for tokens in CHECK_TOKENS:
            x = make(tokens)
            one = _compare(original, rep, x, tol)
            if not one.ok:
                verdict = one
                break
            verdict.error = max(verdict.error or 0.0, one.error or 0.0)
        if not self.check and verdict.error is not None:
            verdict = _Checked(ok=True, error=verdict.error, tolerance=tol)
        self.checked[key] = verdict
        if not verdict.ok:
            log.warning("autoopt.optimize: keeping %s modules of %s: %s", key[0], key[1:], verdict.reason)
        return verdict

    def _sample_dtype(self, m: nn.Module, rep: nn.Module) -> Any:
        if not isinstance(rep, QuantReplacement):
            return _weight(rep).dtype
        return next((p.dtype for p in m.parameters() if p.dtype in _HALF), self.dtype)

    def _check(self, match: Replacing, m: nn.Module, rep: nn.Module, inner: dict[str, nn.Module]) -> _Checked:
        """``rep`` against ``m`` on :data:`_SAMPLES`'s sample: once per distinct match (equal matches compute the
        same function), inner replacements, dtype and device; a quantized replacement (or one holding one) on its
        own, against its format's bound (the largest of its quantized parts')."""
        dtype, device = self._sample_dtype(m, rep), _weight(rep).device
        specs = [s for s in (_quantized(match), *(getattr(r, "weight_format", None) for r in inner.values()))
                 if s is not None]
        key: tuple[Any, ...] = (match.kind, match, tuple(type(r).__name__ for r in inner.values()), dtype, device)
        if specs:
            key += (id(m),)
        how = _SAMPLES[type(match)]
        original, candidate = m, rep
        if isinstance(rep, (AutooptQKV, AutooptQuantQKV)):  # the projections side by side, in attention's order
            original, candidate = _Stacked(*(m.get_submodule(c) for c in QKV)), _Stacked(rep, *rep.parts)
        elif isinstance(rep, AutooptQuantGatedMLP):
            # the quantized gate_up GEMM against gate and up side by side: the linear's own error, as each
            # quantized linear reports it (down_proj was checked on its own; its error would compound here)
            original, candidate = _Stacked(m.get_submodule("gate_proj"), m.get_submodule("up_proj")), rep.gate_up
            specs = specs[:1]
        elif isinstance(match, MoEMatch):  # the block's own forward (its router, a shared expert) on both sides
            candidate = _WithExperts(m, match.experts_name, rep)
        elif isinstance(match, QuantLinearMatch) and match.source == "checkpoint":
            assert isinstance(rep, QuantLinear)
            original = _Dequantized(rep)
        tol = max(_bound(s) for s in specs) if specs else tolerance(dtype, matmul=how.matmul)
        if specs and isinstance(match, MoEMatch):
            tol *= MOE_BOUND_FACTOR
        return self._verify(key, original, candidate,
                            lambda t: sample(match.in_features, dtype, device, tokens=t, seed=how.seed,
                                             offset=how.offset), tol, quantized=bool(specs))

    def _build(self, m: nn.Module, match: Replacing, inner: dict[str, nn.Module]) -> _Built:
        """``match``'s replacement of ``m``, checked; a quantized one over its format's bound gives way to the
        16-bit replacement (``check=True``), with the note saying so."""
        rep = build(m, match, inner)
        verdict = self._check(match, m, rep, inner)
        spec = _quantized(match)
        if verdict.ok or spec is None:
            return _Built(match=match, rep=rep, verdict=verdict)
        sixteen = match.sixteen_bit()  # type: ignore[union-attr]
        if sixteen is None:
            return _Built(match=match, rep=rep, verdict=verdict)
        note = f"kept 16-bit: {spec} {verdict.reason} (its format's bound)"
        del rep
        rep = build(m, sixteen, inner)
        return _Built(match=sixteen, rep=rep, verdict=self._check(sixteen, m, rep, inner), note=note)

    # -- rows and swaps ---------------------------------------------------------------------------

    def _swap(self, parent: nn.Module, name: str, original: nn.Module, rep: nn.Module) -> None:
        assert isinstance(rep, Replacement)
        parent._modules[name] = rep
        self.done[id(original)] = rep
        self.patches.append((weakref.ref(parent), name, weakref.ref(rep)))

    def _place(self, parent: nn.Module, name: str, m: nn.Module, rep: nn.Module, match: Replacing) -> None:
        """``rep`` in ``m``'s place; a fused q/k/v at the attention's q_proj, its parts at k_proj and v_proj; a MoE
        block's experts at its experts child."""
        if isinstance(match, MoEMatch):
            self._swap(m, match.experts_name, m.get_submodule(match.experts_name), rep)
            self.placed.add(id(rep))
            return
        if not isinstance(rep, (AutooptQKV, AutooptQuantQKV)):
            self._swap(parent, name, m, rep)
            return
        news: tuple[nn.Module, ...] = (rep, *rep.parts)
        for child, new in zip(QKV, news, strict=True):
            self._swap(m, child, m.get_submodule(child), new)
            self.placed.add(id(new))

    def _release(self, rep: nn.Module, path: str) -> None:
        """Free the 16-bit weights a placed quantized replacement no longer reads (``keep_original=False``)."""
        if not self.keep_original and isinstance(rep, QuantReplacement):
            rep.release(path)

    def _row(self, path: str, kind: str, status: str, module: nn.Module, reason: str = "", *,
             shape: str = "", dtype: Any = None, verdict: _Checked | None = None,
             kernels: dict[str, str] | None = None, weight: str = "") -> Row:
        w = getattr(module, "weight", None)
        dt = dtype if dtype is not None else (w.dtype if isinstance(w, torch.Tensor) else None)
        row = Row(path=path, kind=kind, status=status, reason=reason, module=type(module).__name__, shape=shape,
                  dtype=_dtype_name(dt) if dt is not None else "", kernels=kernels or {},
                  error=verdict.error if verdict is not None else None,
                  tolerance=verdict.tolerance if verdict is not None else None, weight=weight)
        self.rows.append(row)
        return row

    def _note(self, path: str, built: _Built) -> str:
        """The reason of a replaced row (also a report note): why it fell back to 16 bits, or why it stays
        16-bit under ``weights=``; empty for the others."""
        why = built.note
        if not why and self.weights is not None and isinstance(built.match, MoEMatch) and built.match.weight is None:
            why = moe_experts_16bit(self.weights)
        elif not why and self.weights is not None and _quantized(built.match) is None:
            why = self.keep_16bit.get(id(built.rep.__dict__.get("_autoopt_original")), "")
        if why:
            self.notes.append(f"{path}: {why}")
        return why

    def _inner_linear(self, lin: nn.Module, match: DenseMatch | QuantLinearMatch | NoMatch) -> nn.Module:
        """A fused MLP's last linear (down_proj, fc2): its replacement where ``match`` is one and its own check
        (cached per shape for 16-bit ones) passes, else ``lin`` itself. It runs inside the MLP either way."""
        if isinstance(match, NoMatch):
            return lin
        if id(lin) in self.done:
            return self.done[id(lin)]
        built = self._build(lin, match, {})
        if not built.verdict.ok:
            return lin
        self.inner_built[id(built.rep)] = built
        return built.rep

    def _inner_row(self, path: str, lin: nn.Module, rep: nn.Module, match: DenseMatch | QuantLinearMatch | NoMatch
                   ) -> None:
        """The row of a fused MLP's last linear at ``path``, once the MLP is replaced."""
        built = self.inner_built.get(id(rep))
        if built is not None:
            self.done.setdefault(id(lin), rep)
            dtype = self._sample_dtype(lin, rep)
            self._row(path, "linear", "replaced", lin, self._note(path, built), shape=match.shape, dtype=dtype,
                      verdict=built.verdict, kernels=_kernels(rep, dtype), weight=_quantized(built.match) or "")
            self._release(rep, path)
        elif isinstance(rep, Replacement):  # placed before (a shared module)
            self._row(path, "linear", "replaced", lin, "shared with another path", shape=match.shape)
        else:
            reason = match.reason if isinstance(match, NoMatch) else "check failed for this shape"
            self._row(path, "linear", "kept", lin, reason, shape=match.shape)

    # -- one module: recognize -> build -> check -> swap ------------------------------------------

    def visit(self, parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            path = f"{prefix}.{name}" if prefix else name
            if self.step(parent, name, child, path):
                continue
            self.visit(child, path)

    def step(self, parent: nn.Module, name: str, m: nn.Module, path: str) -> bool:
        """Handle ``m`` (at ``parent.name``); True when its subtree is done (do not descend)."""
        if id(m) in self.placed:
            return True
        shared = self.done.get(id(m))
        if shared is not None:  # the same module object reached again (shared): the same replacement
            assert isinstance(shared, Replacement)
            parent._modules[name] = shared
            self.patches.append((weakref.ref(parent), name, weakref.ref(shared)))
            self._row(path, shared.kind, "replaced", m, "shared with another path")
            return True
        match = recognize(m, context=Context(path=path, ops=self.ops, skip=self.skip, replaced=self.done,
                                             weights=self.weights, keep_16bit=self.keep_16bit, w8a8=self.w8a8))
        if isinstance(match, NoMatch):
            return self.keep(m, path, match)
        if isinstance(match, QKVMatch):  # the attention stays the model's; its q/k/v become one GEMM under it
            self._row(path, "attention", "kept", m, match.attention)
            self.replace(parent, name, m, path, match)
            return False
        if isinstance(match, MoEMatch):  # the block stays the model's; its experts become one fused-MoE call
            if self.replace(parent, name, m, path, match):
                self._router_row(m, path, match)
            return False  # on into the block: a shared expert is an MLP of its own
        # a fused MLP that is kept is descended into (its linears are tried one by one); anything else is done
        return self.replace(parent, name, m, path, match) or match.kind not in ONE_BY_ONE

    def _router_row(self, block: nn.Module, path: str, match: MoEMatch) -> None:
        """The row of a replaced MoE block's router: kept as the model's own (the walk does not visit it again)."""
        router = block.get_submodule(match.router_name)
        self.placed.add(id(router))
        others = (f"; {', '.join(match.others)}: as the block runs them, each looked at on its own" if match.others
                  else "")
        self._row(f"{path}.{match.router_name}", "router", "kept", router,
                  f"the model's own router (top-{match.top_k} of {match.experts}, its softmax and renormalisation as "
                  f"the config says) feeds {path}.{match.experts_name}'s fused-MoE call{others}",
                  shape=f"{match.hidden}->{match.experts}")

    def keep(self, m: nn.Module, path: str, match: NoMatch) -> bool:
        """The rows of a module that is not replaced; True when the walk does not descend into it."""
        if match.reason:
            self._row(path, match.kind, match.status, m, match.reason, shape=match.shape)
        if match.qkv is not None:
            self._row(f"{path}.qkv", "qkv", "kept", m, match.qkv)
        return not match.descend

    def replace(self, parent: nn.Module, name: str, m: nn.Module, path: str, match: Replacing) -> bool:
        """Build ``match``'s replacement of ``m``, check it and swap it in (True), or keep ``m`` with the reason."""
        inner = {child: self._inner_linear(m.get_submodule(child), sub) for child, sub in match.inner}
        fused = {child: m.get_submodule(child) for child in match.fused}  # the originals, before q/k/v are swapped
        built = self._build(m, match, inner)
        match, rep, verdict = built.match, built.rep, built.verdict
        where = f"{path}.qkv" if isinstance(match, QKVMatch) else path
        dtype = self._sample_dtype(m, rep)
        if not verdict.ok:
            if isinstance(rep, FusedRows):
                rep.untie()  # drops the stacked copy
            self._row(where, match.kind, "kept", m, verdict.reason + ONE_BY_ONE.get(match.kind, ""),
                      shape=match.shape, dtype=dtype, verdict=verdict, weight=_quantized(match) or "")
            return False
        if isinstance(rep, FusedRows) and not self.keep_original:
            rep.tie()
        self._place(parent, name, m, rep, match)
        self._row(where, match.kind, "replaced", m, self._note(where, built), shape=_replaced_shape(match),
                  dtype=dtype, verdict=verdict, kernels=_kernels(rep, dtype), weight=_quantized(match) or "")
        for child, lin in fused.items():
            self._row(f"{path}.{child}", "linear", "fused", lin, _fused_reason(path, match, rep),
                      shape=f"{lin.in_features}->{lin.out_features}", weight=_quantized(match) or "")
        for child, sub in match.inner:
            self._inner_row(f"{path}.{child}", m.get_submodule(child), inner[child], sub)
        self._release(rep, where)
        return True


def _weight(rep: nn.Module) -> torch.Tensor:
    """A replacement's first weight (a packed one's first buffer): the check's sample takes its device (and,
    16-bit, its dtype)."""
    t = next(rep.parameters(), None)
    return t if t is not None else next(rep.buffers())


def _replaced_shape(match: Replacing) -> str:
    return f"{match.shape} {match.activation}" if isinstance(match, PlainMLPMatch) else match.shape


def _fused_reason(path: str, match: Replacing, rep: nn.Module) -> str:
    """Why a linear inside the replacement at ``path`` has no replacement of its own: the GEMM that runs it."""
    if isinstance(match, PlainMLPMatch):
        bias = "its bias and " if match.fc1_bias else ""
        return f"runs in {path}'s fc1 GEMM, {bias}the {match.activation} in the epilogue"
    spec = _quantized(match)
    tied = isinstance(rep, FusedRows) and rep.tied
    if isinstance(match, QKVMatch):
        how = f"one {spec} weight" if spec else ("a slice of qkv_weight" if tied else "qkv_weight is a copy")
        return f"runs in {path}'s qkv GEMM ({how})"
    how = f"one {spec} weight" if spec else ("halves of gate_up" if tied else "gate_up is a copy")
    return f"runs in {path}'s gate_up GEMM ({how})"


class _Stacked(nn.Module):
    """Projections as one function of x (their outputs side by side), for the q/k/v and gate/up checks: called
    in the order attention calls them, so the fused replacement answers k and v from its stash."""

    def __init__(self, *mods: nn.Module) -> None:
        super().__init__()
        self.__dict__["mods"] = mods  # not children: this wrapper lives only for the check

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([m.forward(x) for m in self.__dict__["mods"]], dim=-1)


def _freed(reps: Iterable[nn.Module]) -> list[str]:
    """What optimize() freed under these replacements (their inner ones included): what blocks a restore."""
    out: list[str] = []
    for rep in reps:
        for mod in rep.modules():
            freed = mod.freed if isinstance(mod, QuantReplacement) else None
            if freed is not None and freed not in out:
                out.append(freed)
    return out


def _refuse_restore(reps: Iterable[nn.Module]) -> None:
    """RestoreError (before anything is restored) where a replacement's 16-bit weights were freed."""
    freed = _freed(reps)
    if freed:
        shown = "; ".join(freed[:3]) + (f"; and {len(freed) - 3} more" if len(freed) > 3 else "")
        raise RestoreError(f"autoopt.restore(): cannot put back {len(freed)} module(s) whose 16-bit weights "
                           f"optimize() freed when it quantized them: {shown}. optimize(..., keep_original=True) "
                           "keeps them for restore(); nothing was restored.", freed=tuple(freed))


def _restore_patches(patches: list[tuple[Any, str, Any]]) -> int:
    live = [(parent, name, rep) for parent_ref, name, rep_ref in reversed(patches)
            if (parent := parent_ref()) is not None and (rep := rep_ref()) is not None
            and parent._modules.get(name) is rep]
    _refuse_restore(rep for _, _, rep in live)
    for parent, name, rep in live:
        parent._modules[name] = rep.restore_original()
    return len(live)


def _keep_16bit(root: nn.Module) -> dict[int, str]:
    """The linears ``weights=`` leaves 16-bit (id -> why): the model's output embedding (the LM head: counted at
    the checkpoint dtype by :mod:`autoopt.planning.quant`, kept so by vLLM and ModelOpt), and a linear whose weight
    another module also holds (a tied head): quantizing it would keep the 16-bit tensor for the other."""
    out: dict[int, str] = {}
    owners: dict[int, set[int]] = {}
    for mod in root.modules():
        for p in mod.parameters(recurse=False):
            if p.numel():
                owners.setdefault(p.untyped_storage().data_ptr(), set()).add(id(mod))
    for name, mod in root.named_modules():
        w = getattr(mod, "weight", None)
        if isinstance(mod, nn.Linear) and isinstance(w, torch.Tensor) and w.numel() \
                and len(owners.get(w.untyped_storage().data_ptr(), ())) > 1:
            out[id(mod)] = f"16-bit: {name}'s weight is shared with another module (quantizing would keep both)"
    head = getattr(root, "get_output_embeddings", None)
    try:
        lm = head() if callable(head) else None
    except Exception:  # a model whose method needs more than itself: no head known
        lm = None
    if isinstance(lm, nn.Linear):
        out.setdefault(id(lm), "16-bit: the LM head stays in the checkpoint dtype (as autoopt.planning.quant "
                               "counts it; vLLM and ModelOpt keep it so); skip= others to keep them too")
    return out


def _model_dtype(root: nn.Module) -> Any:
    """The 16-bit dtype most of the model's float parameters have (bfloat16 when it has none)."""
    from collections import Counter

    counts = Counter(p.dtype for p in root.parameters() if p.dtype in _HALF)
    return counts.most_common(1)[0][0] if counts else torch.bfloat16


def _tensor_bytes(root: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage once (tied slices, shared tensors)."""
    seen: dict[int, int] = {}
    for t in (*root.parameters(), *root.buffers()):
        if t.numel() and t.device.type != "meta":
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _profile_gpu(profile: Any, device: Any) -> tuple[Any, Any]:
    """(the profile object, its GPU) for ``profile`` (a profile, a name/file, or None: the dispatch's for
    ``device``)."""
    from autoopt.hardware.profile import GPUProfile, HardwareProfile

    if profile is None:
        return None, dispatch.gpu_for(device)
    if isinstance(profile, str):
        from autoopt.hardware.library import load_profile

        profile = load_profile(profile)
    if isinstance(profile, HardwareProfile):
        return profile, profile.gpu
    if isinstance(profile, GPUProfile):
        return profile, profile
    raise TypeError(f"autoopt.optimize(): profile= takes a HardwareProfile, a GPUProfile, a profile name or None, "
                    f"got {type(profile).__name__}")


def _weights(root: nn.Module, weights: str | None, profile: Any, gpu: Any, device: Any, batch: int,
             context: int | None) -> WeightChoice:
    """``weights=`` resolved (:mod:`autoopt.nn.weights`), checked against the GPU and the model's dtypes."""
    given = profile if profile is not None else dispatch.profile()
    if given is None and getattr(device, "type", "cpu") != "cuda":
        given = dispatch.INTERPRETER_PROFILE
    choice = resolve_weights(weights, gpu=gpu, model=root, hardware=hardware_of(gpu, given), batch=batch,
                             context=context)
    if choice.spec is not None:
        dtypes = {m.weight.dtype for m in root.modules()
                  if isinstance(m, nn.Linear) and isinstance(m.weight, torch.Tensor)}
        if dtypes and not dtypes & set(_HALF):
            raise WeightFormatError(f"autoopt.optimize(weights={weights!r}) quantizes bfloat16/float16 weights; this "
                                    f"model's linears are {', '.join(sorted(map(_dtype_name, dtypes)))}: "
                                    "model.to(torch.bfloat16) first. The model is unchanged.", format=choice.spec,
                                    gpu=choice.gpu)
    return choice


def optimize(model: nn.Module, profile: Any = None, *, ops: str | Iterable[str] | None = None, check: bool = True,
             keep_original: bool = False, skip: str | Iterable[str] = (), weights: str | None = None,
             batch: int = 1, context: int | None = None, decode_graphs: bool = True) -> OptimizeReport:
    """Swap ``model``'s linears, norms and MLPs (gated and plain) for autoopt kernels, in place; returns the report.

    ``profile``: the hardware the kernel configs are ranked for (a profile, a known profile name or
    file); None keeps :mod:`autoopt.nn.dispatch`'s (the detected GPU, or a stand-in under Triton's
    interpreter). It is process-wide: it also applies to other models' autoopt ops.
    ``ops``: the kinds to replace, a subset of :data:`OPS` (by default :data:`DEFAULT_OPS`: all but ``moe``, which
    measured slower than transformers' grouped_mm experts, and ``decode_layer``, measured slower than the default
    compiled decode step); without ``linear`` the gated MLP's two GEMMs and a plain MLP's fc2 run through torch
    (its fc1 + activation GEMM is the ``plain_mlp`` op itself). ``check``: compare each distinct replacement with
    its original on a sample first, keeping the original on a mismatch (and, for a quantized replacement over its
    format's bound, the 16-bit weight). ``keep_original``: leave the original weights
    untouched (the gate/up weights and a copy in ``gate_up``; with ``weights=``, the 16-bit weights beside the
    packed ones, so :func:`restore` works). ``skip``: module-path patterns (``fnmatch``) to leave alone, e.g.
    ``"lm_head"``. ``weights``: quantize the linears in place (:mod:`autoopt.nn.weights`: ``"fp8"``, ``"fp8-wo"``,
    ``"int8"``, ``"int4"``, ``"int4-asym"`` ...; ``"auto"``: recommend()'s format for this model and GPU at
    ``batch`` and ``context``; None / ``"bf16"`` / ``"fp16"``: keep the 16-bit weights). ``decode_graphs``: on a
    GPU, ``generate()``'s compiled decode step (static cache) replays from autoopt's own CUDA graph, one per input
    signature, instead of going through Dynamo's guards and CUDA-graph trees every token
    (:mod:`autoopt.nn.decode_graphs`); False keeps transformers' own compiled call.

    Call it after moving the model to its device and dtype and before ``torch.compile``. The
    replacements run only their forward through the kernels when no input needs grad (inference);
    with grad enabled the ops run torch. Raises TypeError for a non-module, OpError for an unknown op,
    WeightFormatError for a format that is unknown or cannot run on the GPU (before touching the model).
    """
    root = _unwrap(model, "optimize")
    if not all(isinstance(flag, bool) for flag in (check, keep_original, decode_graphs)):
        raise TypeError("autoopt.optimize(): check=, keep_original= and decode_graphs= take a bool")
    if isinstance(root, Replacement):
        raise TypeError("autoopt.optimize(): this module is an autoopt replacement already; pass the model")
    ops_set, patterns = _ops_set(ops), _patterns(skip)
    device = next((p.device for p in root.parameters()), torch.device("cpu"))
    loaded, gpu = _profile_gpu(profile, device)
    choice = _weights(root, weights, loaded, gpu, device, batch, context)
    walk = _Walk(ops=ops_set, check=check, keep_original=keep_original, skip=patterns, weights=choice.spec,
                 keep_16bit=_keep_16bit(root) if choice.spec is not None else {},
                 w8a8=bool(gpu.features.fp8) if gpu is not None else True, dtype=_model_dtype(root))
    if loaded is not None:
        dispatch.set_profile(loaded)
    before = _tensor_bytes(root)
    walk.visit(root, "")
    if "attention" in ops_set and attention_runner.runs_on(device) and attention_runner.install(root):
        walk.notes.append(f"attention: one query token a row (decode) runs autoopt's decode-attention kernel "
                          f"(K/V read once per KV head), other calls transformers' SDPA (attn_implementation "
                          f"{attention_runner.NAME!r}; ops= without 'attention' keeps SDPA)")
    if "decode_layer" in ops_set:
        fused = decode_layers.install(root)
        walk.notes.append(f"decode_layer: {fused} decoder layers run a one-token step as five fused kernels "
                          "(norms, SwiGLU and residual adds inside the quantized GEMVs)" if fused else
                          "decode_layer: no decoder layer could fuse (it needs quantized q/k/v, o, gate_up and "
                          "down, autoopt RMSNorms and a known layer class)")
    if decode_graphs and device.type == "cuda" and decode_graph_runners.install(root):
        walk.notes.append("generate(): the compiled decode step replays from autoopt's CUDA graphs "
                          "(decode_graphs=False keeps transformers' own)")
    live = {id(r): r for _, _, ref in walk.patches if (r := ref()) is not None}
    extra = sum(r.extra_bytes() for r in live.values())
    report = OptimizeReport(rows=walk.rows, ops=walk.ops, check=walk.check, keep_original=walk.keep_original,
                            extra_bytes=extra, backend=_backend(walk.rows),
                            choices=[c.to_dict() for c in dispatch.choices()],
                            restore=_restorer(walk.patches, root), model=root, weights=choice.to_dict(),
                            notes=walk.notes, memory_bytes=(before, _tensor_bytes(root)))
    log.info("autoopt.optimize: %s", report.summary())
    return report


def _restorer(patches: list[tuple[Any, str, Any]], root: nn.Module) -> Callable[[], int]:
    model = weakref.ref(root)

    def restore_all() -> int:
        count = _restore_patches(patches)
        if (m := model()) is not None:
            decode_graph_runners.uninstall(m)
            attention_runner.uninstall(m)
            decode_layers.uninstall(m)
        return count
    return restore_all


def restore(model: nn.Module) -> int:
    """Put back every original module that :func:`optimize` replaced in ``model`` (the same module
    objects, with their own weight storage again); returns how many were put back. RestoreError, with
    nothing restored, where optimize() quantized a module and freed its 16-bit weights
    (``keep_original=False``)."""
    root = _unwrap(model, "restore")
    found: list[tuple[nn.Module, str, Replacement]] = []

    def visit(parent: nn.Module) -> None:
        for name, child in list(parent._modules.items()):
            if isinstance(child, Replacement):
                found.append((parent, name, child))
            elif child is not None:
                visit(child)

    visit(root)
    _refuse_restore(rep for _, _, rep in found if isinstance(rep, nn.Module))
    for parent, name, rep in found:
        parent._modules[name] = rep.restore_original()
    decode_graph_runners.uninstall(root)
    attention_runner.uninstall(root)
    decode_layers.uninstall(root)
    return len(found)
