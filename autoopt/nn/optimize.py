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

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoopt._log import get_logger
from autoopt.errors import OpError
from autoopt.nn import dispatch
from autoopt.nn.build import build
from autoopt.nn.compare import rel_error, sample, tolerance
from autoopt.nn.match import (
    ONE_BY_ONE,
    OPS,
    QKV,
    Context,
    DenseMatch,
    GatedMLPMatch,
    NoMatch,
    NormMatch,
    PlainMLPMatch,
    QKVMatch,
    Replacing,
)
from autoopt.nn.modules import (
    AutooptGatedMLP,
    AutooptLayerNorm,
    AutooptLinear,
    AutooptPlainMLP,
    AutooptQKV,
    AutooptRMSNorm,
    FusedRows,
    Replacement,
)
from autoopt.nn.recognize import recognize
from autoopt.nn.report import OptimizeReport, Row

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


def _kernels_at(rep: nn.Module, m: int) -> dict[str, str]:
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


def _kernels(rep: nn.Module) -> dict[str, str]:
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


#: the check's sample ``[2, tokens, in_features]`` for each match kind: its generator seed, an offset from zero
#: (a norm's: so that LayerNorm and RMSNorm differ) and whether the tolerance is a matmul's.
@dataclass(frozen=True, slots=True)
class _Sample:
    seed: int = 0
    offset: float = 0.0
    matmul: bool = True


_SAMPLES: dict[type, _Sample] = {DenseMatch: _Sample(), NormMatch: _Sample(offset=0.5, matmul=False),
                                 GatedMLPMatch: _Sample(seed=2), PlainMLPMatch: _Sample(seed=5),
                                 QKVMatch: _Sample(seed=3)}


@dataclass
class _Walk:
    """One optimize() call: down the module tree, each module recognised once, then built, checked, swapped."""

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

    def _check(self, match: Replacing, m: nn.Module, rep: nn.Module, inner: dict[str, nn.Module]) -> _Checked:
        """``rep`` against ``m`` on :data:`_SAMPLES`'s sample, once per distinct match (equal matches compute the
        same function), inner replacements, dtype and device."""
        w = _weight(rep)
        key = (match.kind, match, tuple(isinstance(r, AutooptLinear) for r in inner.values()), w.dtype, w.device)
        how = _SAMPLES[type(match)]
        original, candidate = m, rep
        if isinstance(rep, AutooptQKV):  # the three projections side by side, called in attention's order
            original, candidate = _Stacked(*(m.get_submodule(c) for c in QKV)), _Stacked(rep, *rep.parts)
        return self._verify(key, original, candidate,
                            lambda t: sample(match.in_features, w.dtype, w.device, tokens=t, seed=how.seed,
                                             offset=how.offset),
                            tolerance(w.dtype, matmul=how.matmul))

    # -- rows and swaps ---------------------------------------------------------------------------

    def _swap(self, parent: nn.Module, name: str, original: nn.Module, rep: nn.Module) -> None:
        assert isinstance(rep, Replacement)
        parent._modules[name] = rep
        self.done[id(original)] = rep
        self.patches.append((weakref.ref(parent), name, weakref.ref(rep)))

    def _place(self, parent: nn.Module, name: str, m: nn.Module, rep: nn.Module) -> None:
        """``rep`` in ``m``'s place; a fused q/k/v at the attention's q_proj, its parts at k_proj and v_proj."""
        if not isinstance(rep, AutooptQKV):
            self._swap(parent, name, m, rep)
            return
        news: tuple[nn.Module, ...] = (rep, *rep.parts)
        for child, new in zip(QKV, news, strict=True):
            self._swap(m, child, m.get_submodule(child), new)
            self.placed.add(id(new))

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

    def _inner_linear(self, lin: nn.Module, match: DenseMatch | NoMatch) -> nn.Module:
        """A fused MLP's last linear (down_proj, fc2): its replacement where ``match`` is one and its own check
        (cached per shape) passes, else ``lin`` itself. It runs inside the MLP either way."""
        if isinstance(match, NoMatch):
            return lin
        if id(lin) in self.done:
            return self.done[id(lin)]
        rep = build(lin, match, {})
        return rep if self._check(match, lin, rep, {}).ok else lin

    def _inner_row(self, path: str, lin: nn.Module, rep: nn.Module, match: DenseMatch | NoMatch) -> None:
        """The row of a fused MLP's last linear at ``path``, once the MLP is replaced."""
        if isinstance(rep, AutooptLinear):
            self.done.setdefault(id(lin), rep)
            self._row(path, "linear", "replaced", lin, shape=match.shape, kernels=_kernels(rep))
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
        match = recognize(m, context=Context(path=path, ops=self.ops, skip=self.skip, replaced=self.done))
        if isinstance(match, NoMatch):
            return self.keep(m, path, match)
        if isinstance(match, QKVMatch):  # the attention stays the model's; its q/k/v become one GEMM under it
            self._row(path, "attention", "kept", m, match.attention)
            self.replace(parent, name, m, path, match)
            return False
        # a fused MLP that is kept is descended into (its linears are tried one by one); anything else is done
        return self.replace(parent, name, m, path, match) or match.kind not in ONE_BY_ONE

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
        rep = build(m, match, inner)
        verdict = self._check(match, m, rep, inner)
        where, dtype = (f"{path}.qkv" if isinstance(match, QKVMatch) else path), _weight(rep).dtype
        if not verdict.ok:
            if isinstance(rep, FusedRows):
                rep.untie()  # drops the stacked copy
            self._row(where, match.kind, "kept", m, verdict.reason + ONE_BY_ONE.get(match.kind, ""),
                      shape=match.shape, dtype=dtype, verdict=verdict)
            return False
        if isinstance(rep, FusedRows) and not self.keep_original:
            rep.tie()
        self._place(parent, name, m, rep)
        self._row(where, match.kind, "replaced", m, shape=_replaced_shape(match), dtype=dtype, verdict=verdict,
                  kernels=_kernels(rep))
        for child, lin in fused.items():
            self._row(f"{path}.{child}", "linear", "fused", lin, _fused_reason(path, match, rep),
                      shape=f"{lin.in_features}->{lin.out_features}")
        for child, sub in match.inner:
            self._inner_row(f"{path}.{child}", m.get_submodule(child), inner[child], sub)
        return True


def _weight(rep: nn.Module) -> torch.Tensor:
    """A replacement's first weight: the check's sample takes its dtype and device (its weights share them)."""
    return next(rep.parameters())


def _replaced_shape(match: Replacing) -> str:
    return f"{match.shape} {match.activation}" if isinstance(match, PlainMLPMatch) else match.shape


def _fused_reason(path: str, match: Replacing, rep: nn.Module) -> str:
    """Why a linear inside the replacement at ``path`` has no replacement of its own: the GEMM that runs it."""
    if isinstance(match, PlainMLPMatch):
        bias = "its bias and " if match.fc1_bias else ""
        return f"runs in {path}'s fc1 GEMM, {bias}the {match.activation} in the epilogue"
    tied = isinstance(rep, FusedRows) and rep.tied
    if isinstance(match, QKVMatch):
        return f"runs in {path}'s qkv GEMM ({'a slice of qkv_weight' if tied else 'qkv_weight is a copy'})"
    return f"runs in {path}'s gate_up GEMM ({'halves of gate_up' if tied else 'gate_up is a copy'})"


class _Stacked(nn.Module):
    """Three projections as one function of x (their outputs side by side), for the q/k/v check: called in
    the order attention calls them, so the fused replacement answers k and v from its stash."""

    def __init__(self, q: nn.Module, k: nn.Module, v: nn.Module) -> None:
        super().__init__()
        self.__dict__["mods"] = (q, k, v)  # not children: this wrapper lives only for the check

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([m.forward(x) for m in self.__dict__["mods"]], dim=-1)


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
