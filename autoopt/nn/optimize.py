"""``autoopt.optimize(model)``: swap a model's linears, norms and MLPs (gated and plain) for autoopt's kernels.

::

    report = autoopt.optimize(model)          # in place; returns an OptimizeReport
    print(report)                             # what was replaced, what was not and why, the kernels
    autoopt.restore(model)                    # the original modules back (or: with autoopt.optimize(model): ...)

The walk goes down the module tree from the root. At each child it tries, in order:

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
the decode GEMV kind; 32 rows: the tiled GEMM kind), and compares them (relative error
within 1e-4 fp32, 5e-3 fp16, 2e-2 bf16; 5e-3 for fp32 matmuls when torch allows TF32); a mismatch
or an exception keeps the original and is reported. With ``check=False`` recognition still runs its
torch-only probes, but the replacements are not run.

``keep_original=False`` (the default) builds each gated MLP's ``gate_up`` (and each attention's
``qkv``) once and re-points the original weights at its row slices: no weight exists twice (see
:class:`~autoopt.nn.modules.AutooptGatedMLP`); ``keep_original=True`` leaves the original tensors
untouched and costs the fused weights' size again (``2 * intermediate * hidden`` elements per MLP).
"""

from __future__ import annotations

import fnmatch
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoopt._log import get_logger
from autoopt.errors import OpError
from autoopt.nn import dispatch
from autoopt.nn.modules import (
    AutooptGatedMLP,
    AutooptLayerNorm,
    AutooptLinear,
    AutooptPlainMLP,
    AutooptQKV,
    AutooptRMSNorm,
    Replacement,
)
from autoopt.nn.recognize import (
    FLOAT_DTYPES,
    QKV,
    GatedMLPMatch,
    NormMatch,
    PlainMLPMatch,
    gated_mlp_parts,
    linear_problem,
    match_gated_mlp,
    match_norm,
    match_plain_mlp,
    norm_parts,
    plain_mlp_parts,
    qkv_parts,
    rel_error,
    sample,
    tolerance,
)
from autoopt.nn.report import OptimizeReport, Row

log = get_logger(__name__)

__all__ = ["OPS", "optimize", "restore"]

#: what ``ops=`` can name: the kinds of module optimize() replaces.
OPS = ("linear", "rms_norm", "layer_norm", "gated_mlp", "plain_mlp", "qkv")
_ATTENTION_CHILDREN = (("q_proj", "k_proj", "v_proj"), ("qkv_proj",), ("query_key_value",), ("c_attn",))


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _unwrap(model: Any, what: str) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"autoopt.{what}() takes a torch.nn.Module, got {type(model).__name__}")
    inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule wraps the model
    return inner if isinstance(inner, nn.Module) else model


def _ops_set(ops: Any) -> tuple[str, ...]:
    if ops is None:
        return OPS
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


def _kernels_at(rep: Replacement, m: int) -> dict[str, str]:
    """``op -> what runs it`` for ``rep`` on ``m`` rows, from the dispatch (cached; ranks if new)."""
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
        out["down"] = _inner_linear_choice(rep.down_proj, m)
        return out
    if isinstance(rep, AutooptPlainMLP):
        fc1 = rep.fc1
        w = fc1.weight
        desc = _linear_choice(m, fc1.out_features, fc1.in_features, w.dtype, w.device)
        epilogue = f"{'bias + ' if fc1.bias is not None else ''}{rep.fused_activation}"
        return {"fc1": desc if desc.startswith("torch") else f"{desc}, epilogue {epilogue}",
                "fc2": _inner_linear_choice(rep.fc2, m)}
    return {}


def _inner_linear_choice(lin: nn.Module, m: int) -> str:
    """What runs a fused MLP's last linear (down_proj, fc2) on ``m`` rows."""
    if not isinstance(lin, AutooptLinear):
        return "torch (nn.Linear kept)"
    w = lin.weight
    return _linear_choice(m, lin.out_features, lin.in_features, w.dtype, w.device)


def _kernels(rep: Replacement) -> dict[str, str]:
    """What runs ``rep``'s ops at the check samples' sizes: ``op`` when one choice serves both, else
    ``op@16`` and ``op@32`` (rows)."""
    sizes = [2 * t for t in CHECK_TOKENS]
    per = [_kernels_at(rep, m) for m in sizes]
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


@dataclass
class _Walk:
    ops: tuple[str, ...]
    check: bool
    keep_original: bool
    skip: tuple[str, ...]
    rows: list[Row] = field(default_factory=list)
    #: (parent, child name, replacement), both weakly: a report must not keep a deleted model alive.
    patches: list[tuple[Any, str, Any]] = field(default_factory=list)
    done: dict[int, nn.Module] = field(default_factory=dict)
    #: replacements this walk put in place under a module it then descends into (the q/k/v parts)
    placed: set[int] = field(default_factory=set)
    checked: dict[tuple[Any, ...], _Checked] = field(default_factory=dict)

    # -- checking ---------------------------------------------------------------------------------

    def _verify(self, key: tuple[Any, ...], original: nn.Module, rep: nn.Module,
                make: Callable[[int], torch.Tensor], tol: float) -> _Checked:
        """Run ``original`` and ``rep`` on ``make(tokens)`` for each of :data:`CHECK_TOKENS`, once per
        ``key``; the cached verdict after that. The error reported is the largest."""
        if not self.check:
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
        self.checked[key] = verdict
        if not verdict.ok:
            log.warning("autoopt.optimize: keeping %s modules of %s: %s", key[0], key[1:], verdict.reason)
        return verdict

    # -- one module -------------------------------------------------------------------------------

    def _swap(self, parent: nn.Module, name: str, original: nn.Module, rep: nn.Module) -> None:
        assert isinstance(rep, Replacement)
        parent._modules[name] = rep
        self.done[id(original)] = rep
        self.patches.append((weakref.ref(parent), name, weakref.ref(rep)))

    def _row(self, path: str, kind: str, status: str, module: nn.Module, reason: str = "", *,
             shape: str = "", dtype: Any = None, verdict: _Checked | None = None,
             kernels: dict[str, str] | None = None) -> Row:
        w = getattr(module, "weight", None)
        dt = dtype if dtype is not None else (w.dtype if isinstance(w, torch.Tensor) else None)
        row = Row(path=path, kind=kind, status=status, reason=reason, module=type(module).__name__, shape=shape,
                  dtype=_dtype_name(dt) if dt is not None else "", kernels=kernels or {},
                  error=verdict.error if verdict is not None else None,
                  tolerance=verdict.tolerance if verdict is not None else None)
        self.rows.append(row)
        return row

    def linear(self, parent: nn.Module, name: str, m: nn.Linear, path: str) -> AutooptLinear | None:
        shape = f"{m.in_features}->{m.out_features}"
        if "linear" not in self.ops:
            self._row(path, "linear", "kept", m, "linear not in ops=", shape=shape)
            return None
        problem = linear_problem(m)
        if problem is not None:
            self._row(path, "linear", "kept", m, problem, shape=shape)
            return None
        w = m.weight
        rep = AutooptLinear(m)
        key = ("linear", m.in_features, m.out_features, m.bias is not None, w.dtype, w.device)
        verdict = self._verify(key, m, rep, lambda t: sample(m.in_features, w.dtype, w.device, tokens=t),
                               tolerance(w.dtype, matmul=True))
        if not verdict.ok:
            self._row(path, "linear", "kept", m, verdict.reason, shape=shape, verdict=verdict)
            return None
        self._swap(parent, name, m, rep)
        self._row(path, "linear", "replaced", m, shape=shape, verdict=verdict, kernels=_kernels(rep))
        return rep

    def norm(self, parent: nn.Module, name: str, m: nn.Module, path: str, match: NormMatch, w: torch.Tensor) -> bool:
        shape = f"{w.shape[0]}"
        if match.kind not in self.ops:
            self._row(path, match.kind, "kept", m, f"{match.kind} not in ops=", shape=shape)
            return False
        rep: nn.Module
        if match.kind == "rms_norm":
            rep = AutooptRMSNorm(m, eps=match.eps, unit_offset=match.unit_offset)
        else:
            rep = AutooptLayerNorm(m, eps=match.eps)
        key = (match.kind, w.shape[0], match.unit_offset, match.has_bias, match.eps, w.dtype, w.device)
        verdict = self._verify(key, m, rep, lambda t: sample(w.shape[0], w.dtype, w.device, tokens=t, offset=0.5),
                               tolerance(w.dtype))
        variant = " (1 + weight)" if match.unit_offset else ""
        if not verdict.ok:
            self._row(path, match.kind, "kept", m, verdict.reason, shape=shape + variant, verdict=verdict)
            return False
        self._swap(parent, name, m, rep)
        self._row(path, match.kind, "replaced", m, shape=shape + variant, verdict=verdict, kernels=_kernels(rep))
        return True

    def _inner_linear(self, lin: nn.Linear) -> nn.Module:
        """A fused MLP's last linear (down_proj, fc2): its replacement when ``linear`` is in ops= and its own
        check (cached per shape) passes, else ``lin`` itself. It runs inside the MLP either way."""
        if "linear" not in self.ops:
            return lin
        if id(lin) in self.done:
            return self.done[id(lin)]
        w = lin.weight
        key: tuple[Any, ...] = ("linear", lin.in_features, lin.out_features, lin.bias is not None, w.dtype, w.device)
        cand = AutooptLinear(lin)
        if self._verify(key, lin, cand, lambda t: sample(lin.in_features, w.dtype, w.device, tokens=t),
                        tolerance(w.dtype, matmul=True)).ok:
            return cand
        return lin

    def _inner_row(self, path: str, lin: nn.Linear, rep: nn.Module) -> None:
        """The row of a fused MLP's last linear at ``path``, once the MLP is replaced."""
        shape = f"{lin.in_features}->{lin.out_features}"
        if isinstance(rep, AutooptLinear):
            if id(lin) not in self.done:
                self.done[id(lin)] = rep
            self._row(path, "linear", "replaced", lin, shape=shape, kernels=_kernels(rep))
        else:
            self._row(path, "linear", "kept", lin,
                      "linear not in ops=" if "linear" not in self.ops else "check failed for this shape", shape=shape)

    def mlp(self, parent: nn.Module, name: str, m: nn.Module, path: str, kind: str) -> bool:
        """``m``, which has a gated or a plain MLP's structure (``kind``): replaced (True: its subtree is done)
        or kept with the reason (False: the walk goes on into its linears)."""
        if kind not in self.ops:
            self._row(path, kind, "kept", m, f"{kind} not in ops=")
            return False
        match = match_gated_mlp(m) if kind == "gated_mlp" else match_plain_mlp(m)
        if not isinstance(match, str):
            fused = ("gate_proj", "up_proj") if isinstance(match, GatedMLPMatch) else (match.fc1_name,)
            hooked = next((c for c in fused if _has_hooks(m._modules[c])), None)
            if hooked is not None:  # the fused GEMM reads its weight and never calls it
                match = f"{path}.{hooked} has forward hooks (the fused GEMM would not call them)"
        if isinstance(match, str):
            self._row(path, kind, "kept", m, match + "; its linears are tried one by one")
            return False
        if isinstance(match, GatedMLPMatch):
            return self.gated_mlp(parent, name, m, path, match)
        return self.plain_mlp(parent, name, m, path, match)

    def gated_mlp(self, parent: nn.Module, name: str, m: nn.Module, path: str, match: GatedMLPMatch) -> bool:
        gate, up, down, _ = gated_mlp_parts(m) or (None, None, None, None)
        assert isinstance(gate, nn.Linear) and isinstance(up, nn.Linear) and isinstance(down, nn.Linear)
        shape = f"{match.hidden}->2x{match.intermediate}->{match.hidden}"
        w = gate.weight
        down_rep = self._inner_linear(down)
        rep = AutooptGatedMLP(m, activation=match.activation, down_proj=down_rep, use_linear_op="linear" in self.ops)
        key = ("gated_mlp", match.hidden, match.intermediate, match.activation, match.has_bias,
               isinstance(down_rep, AutooptLinear), w.dtype, w.device)
        verdict = self._verify(key, m, rep, lambda t: sample(match.hidden, w.dtype, w.device, tokens=t, seed=2),
                               tolerance(w.dtype, matmul=True))
        if not verdict.ok:
            rep.untie()  # drops the gate_up copy
            self._row(path, "gated_mlp", "kept", m, verdict.reason + "; its linears are tried one by one",
                      shape=shape, dtype=w.dtype, verdict=verdict)
            return False
        if not self.keep_original:
            rep.tie()
        self._swap(parent, name, m, rep)
        self._row(path, "gated_mlp", "replaced", m, shape=shape, dtype=w.dtype, verdict=verdict,
                  kernels=_kernels(rep))
        for child, lin in (("gate_proj", gate), ("up_proj", up)):
            self._row(f"{path}.{child}", "linear", "fused", lin, f"runs in {path}'s gate_up GEMM "
                      f"({'halves of gate_up' if rep.tied else 'gate_up is a copy'})",
                      shape=f"{lin.in_features}->{lin.out_features}")
        self._inner_row(f"{path}.down_proj", down, down_rep)
        return True

    def plain_mlp(self, parent: nn.Module, name: str, m: nn.Module, path: str, match: PlainMLPMatch) -> bool:
        fc1: nn.Linear = m._modules[match.fc1_name]  # type: ignore[assignment]
        fc2: nn.Linear = m._modules[match.fc2_name]  # type: ignore[assignment]
        shape = f"{match.hidden}->{match.intermediate}->{match.out_features}"
        w = fc1.weight
        fc2_rep = self._inner_linear(fc2)
        rep = AutooptPlainMLP(m, fc1=match.fc1_name, fc2=match.fc2_name, activation=match.activation,
                              fc2_module=fc2_rep)
        key = ("plain_mlp", match.hidden, match.intermediate, match.out_features, match.activation,
               fc1.bias is not None, fc2.bias is not None, isinstance(fc2_rep, AutooptLinear), w.dtype, w.device)
        verdict = self._verify(key, m, rep, lambda t: sample(match.hidden, w.dtype, w.device, tokens=t, seed=5),
                               tolerance(w.dtype, matmul=True))
        if not verdict.ok:
            self._row(path, "plain_mlp", "kept", m, verdict.reason + "; its linears are tried one by one",
                      shape=shape, dtype=w.dtype, verdict=verdict)
            return False
        self._swap(parent, name, m, rep)
        self._row(path, "plain_mlp", "replaced", m, shape=f"{shape} {match.activation}", dtype=w.dtype,
                  verdict=verdict, kernels=_kernels(rep))
        self._row(f"{path}.{match.fc1_name}", "linear", "fused", fc1,
                  f"runs in {path}'s fc1 GEMM, {'its bias and ' if fc1.bias is not None else ''}the "
                  f"{match.activation} in the epilogue", shape=f"{fc1.in_features}->{fc1.out_features}")
        self._inner_row(f"{path}.{match.fc2_name}", fc2, fc2_rep)
        return True

    def qkv(self, attn: nn.Module, path: str, parts: tuple[nn.Linear, nn.Linear, nn.Linear] | str) -> bool:
        """Fuse ``attn``'s q/k/v projections into one GEMM (:class:`AutooptQKV`), or say why not; the
        walk then descends into ``attn`` (its o_proj, and q/k/v one by one where they were not fused)."""
        where = f"{path}.qkv"
        why = self._qkv_blocker(path, parts)
        if why is not None:
            self._row(where, "qkv", "kept", attn, why + "; q/k/v are tried one by one")
            return False
        assert not isinstance(parts, str)
        q, k, v = parts
        w = q.weight
        shape = f"{q.in_features}->{q.out_features}+{k.out_features}+{v.out_features}"
        rep = AutooptQKV(q, k, v)
        k_rep, v_rep = rep.parts
        key = ("qkv", q.in_features, q.out_features, k.out_features, v.out_features, q.bias is not None, w.dtype,
               w.device)
        verdict = self._verify(key, _Stacked(q, k, v), _Stacked(rep, k_rep, v_rep),
                               lambda t: sample(q.in_features, w.dtype, w.device, tokens=t, seed=3),
                               tolerance(w.dtype, matmul=True))
        if not verdict.ok:
            rep.untie()
            self._row(where, "qkv", "kept", attn, verdict.reason + "; q/k/v are tried one by one", shape=shape,
                      dtype=w.dtype, verdict=verdict)
            return False
        if not self.keep_original:
            rep.tie()
        news: tuple[nn.Module, ...] = (rep, k_rep, v_rep)
        for name, original, new in zip(QKV, parts, news, strict=True):
            self._swap(attn, name, original, new)
            self.placed.add(id(new))
        self._row(where, "qkv", "replaced", attn, shape=shape, dtype=w.dtype, verdict=verdict, kernels=_kernels(rep))
        for name, lin in zip(QKV, parts, strict=True):
            self._row(f"{path}.{name}", "linear", "fused", lin, f"runs in {path}'s qkv GEMM "
                      f"({'a slice of qkv_weight' if rep.tied else 'qkv_weight is a copy'})",
                      shape=f"{lin.in_features}->{lin.out_features}")
        return True

    def _qkv_blocker(self, path: str, parts: tuple[nn.Linear, nn.Linear, nn.Linear] | str) -> str | None:
        if isinstance(parts, str):
            return parts
        if "qkv" not in self.ops or "linear" not in self.ops:
            return "qkv and linear must both be in ops= to fuse q/k/v"
        for name, lin in zip(QKV, parts, strict=True):
            hit = next((p for p in self.skip if fnmatch.fnmatchcase(f"{path}.{name}", p)), None)
            if hit is not None:
                return f"{path}.{name} matches skip= pattern {hit!r}"
            if id(lin) in self.done:
                return f"{path}.{name} is shared with another module"
            if _has_hooks(lin):
                return f"{path}.{name} has forward hooks (they would see a slice computed elsewhere)"
        return None

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
        if isinstance(m, Replacement):
            self._row(path, m.kind, "skipped", m, "already optimised")
            return True
        hit = next((p for p in self.skip if fnmatch.fnmatchcase(path, p)), None)
        if hit is not None:
            self._row(path, _kind_of(m), "skipped", m, f"matches skip= pattern {hit!r}")
            return True
        if ("forward" in m.__dict__ or hasattr(m, "_hf_hook")) and _kind_of(m) != "module":
            self._row(path, _kind_of(m), "kept", m, "its forward is patched on the instance (an accelerate "
                      "offload hook?): replacing it would drop that")
            return True
        attention = any(all(hasattr(m, c) for c in names) for names in _ATTENTION_CHILDREN)
        if gated_mlp_parts(m) is not None:
            return self.mlp(parent, name, m, path, "gated_mlp")
        if not attention and plain_mlp_parts(m) is not None:
            return self.mlp(parent, name, m, path, "plain_mlp")
        if isinstance(m, nn.Linear):
            self.linear(parent, name, m, path)
            return True
        parts = norm_parts(m)
        if parts is not None:
            w = parts[2]
            if w.dtype not in FLOAT_DTYPES:
                self._row(path, "norm", "kept", m, f"weight dtype {w.dtype} (kernels serve float16, bfloat16, "
                          "float32)")
                return True
            norm_match = match_norm(m)
            if isinstance(norm_match, str):
                self._row(path, "norm", "kept", m, norm_match)
                return True
            self.norm(parent, name, m, path, norm_match, w)
            return True
        if attention:
            impl = getattr(getattr(m, "config", None), "_attn_implementation", None)
            self._row(path, "attention", "kept", m, f"attention stays the model's own ({impl or type(m).__name__}); "
                      "its projections are rows of their own")
            projections = qkv_parts(m)
            if projections is not None:
                self.qkv(m, path, projections)
            return False
        if next(iter(m.children()), None) is None and any(True for _ in m.parameters(recurse=False)):
            self._row(path, "other", "kept", m, f"{type(m).__name__}: no autoopt kernel for it")
            return True
        return False


class _Stacked(nn.Module):
    """Three projections as one function of x (their outputs side by side), for the q/k/v check: called in
    the order attention calls them, so the fused replacement answers k and v from its stash."""

    def __init__(self, q: nn.Module, k: nn.Module, v: nn.Module) -> None:
        super().__init__()
        self.__dict__["mods"] = (q, k, v)  # not children: this wrapper lives only for the check

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([m.forward(x) for m in self.__dict__["mods"]], dim=-1)


def _has_hooks(m: Any) -> bool:
    return any(getattr(m, d, None) for d in ("_forward_hooks", "_forward_pre_hooks"))


def _kind_of(m: nn.Module) -> str:
    if isinstance(m, nn.Linear):
        return "linear"
    if gated_mlp_parts(m) is not None:
        return "gated_mlp"
    if plain_mlp_parts(m) is not None:
        return "plain_mlp"
    if norm_parts(m) is not None:
        return "norm"
    return "module"


def _restore_patches(patches: list[tuple[Any, str, Any]]) -> int:
    n = 0
    for parent_ref, name, rep_ref in reversed(patches):
        parent, rep = parent_ref(), rep_ref()
        if parent is not None and rep is not None and parent._modules.get(name) is rep:
            parent._modules[name] = rep.restore_original()
            n += 1
    return n


def optimize(model: nn.Module, profile: Any = None, *, ops: str | Iterable[str] | None = None, check: bool = True,
             keep_original: bool = False, skip: str | Iterable[str] = ()) -> OptimizeReport:
    """Swap ``model``'s linears, norms and MLPs (gated and plain) for autoopt kernels, in place; returns the report.

    ``profile``: the hardware the kernel configs are ranked for (a profile, a known profile name or
    file); None keeps :mod:`autoopt.nn.dispatch`'s (the detected GPU, or a stand-in under Triton's
    interpreter). It is process-wide: it also applies to other models' autoopt ops.
    ``ops``: the kinds to replace, a subset of :data:`OPS` (all by default); without ``linear`` the
    gated MLP's two GEMMs and a plain MLP's fc2 run through torch (its fc1 + activation GEMM is the
    ``plain_mlp`` op itself). ``check``: compare each distinct replacement with its
    original on a sample first, keeping the original on a mismatch. ``keep_original``: leave the
    gate/up weights untouched and hold a copy in ``gate_up`` (doubles those weights' memory).
    ``skip``: module-path patterns (``fnmatch``) to leave alone, e.g. ``"lm_head"``.

    Call it after moving the model to its device and dtype and before ``torch.compile``. The
    replacements run only their forward through the kernels when no input needs grad (inference);
    with grad enabled the ops run torch. Raises TypeError for a non-module, OpError for an unknown op.
    """
    root = _unwrap(model, "optimize")
    if not isinstance(check, bool) or not isinstance(keep_original, bool):
        raise TypeError("autoopt.optimize(): check= and keep_original= take a bool")
    walk = _Walk(ops=_ops_set(ops), check=check, keep_original=keep_original, skip=_patterns(skip))
    if profile is not None:
        dispatch.set_profile(profile)
    if isinstance(root, Replacement):
        raise TypeError("autoopt.optimize(): this module is an autoopt replacement already; pass the model")
    walk.visit(root, "")
    live = {id(r): r for _, _, ref in walk.patches if (r := ref()) is not None}
    extra = sum(r.extra_bytes() for r in live.values())
    report = OptimizeReport(rows=walk.rows, ops=walk.ops, check=walk.check, keep_original=walk.keep_original,
                            extra_bytes=extra, backend=_backend(walk.rows),
                            choices=[c.to_dict() for c in dispatch.choices()],
                            restore=_restorer(walk.patches), model=root)
    log.info("autoopt.optimize: %s", report.summary())
    return report


def _restorer(patches: list[tuple[Any, str, Any]]) -> Callable[[], int]:
    return lambda: _restore_patches(patches)


def restore(model: nn.Module) -> int:
    """Put back every original module that :func:`optimize` replaced in ``model`` (the same module
    objects, with their own weight storage again); returns how many were put back."""
    root = _unwrap(model, "restore")
    count = 0

    def visit(parent: nn.Module) -> None:
        nonlocal count
        for name, child in list(parent._modules.items()):
            if isinstance(child, Replacement):
                parent._modules[name] = child.restore_original()
                count += 1
            elif child is not None:
                visit(child)

    visit(root)
    return count
