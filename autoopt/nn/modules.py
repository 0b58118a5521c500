"""The modules :func:`autoopt.optimize` swaps in: same Parameters, forward through the autoopt ops.

Each replacement holds the *same* Parameter objects as the module it replaces (no copies: the
state_dict keys, values and tying are unchanged) and keeps the attributes model code reads
(``weight``, ``in_features``, ``variance_epsilon``, ``config``, ...). It remembers the original in
``original`` (outside the module tree: it is neither a child nor in the state_dict) for
:func:`autoopt.restore`, and shares the original's forward hooks.

The gated MLP's concatenated ``gate_up`` weight is the one thing built. By default (``tied``) the
original ``gate_proj.weight`` and ``up_proj.weight`` Parameters are re-pointed at the two halves of
it, so the weights exist once, as before; see :class:`AutooptGatedMLP`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from autoopt.nn import ops as _ops

__all__ = ["AutooptGatedMLP", "AutooptLayerNorm", "AutooptLinear", "AutooptRMSNorm", "Replacement"]

# the original's forward (pre-)hook tables: the replacement shares them, so hooks keep firing.
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")


def _param(m: nn.Module, name: str, *, optional: bool = False) -> nn.Parameter:
    """``m``'s Parameter ``name`` (None allowed when ``optional``); TypeError for anything else."""
    p = getattr(m, name, None)
    if isinstance(p, nn.Parameter) or (p is None and optional):
        return p  # type: ignore[return-value]
    raise TypeError(f"{type(m).__name__}.{name} is a {type(p).__name__}, not an nn.Parameter")


class Replacement:
    """Mixin of every autoopt replacement module: ``kind``, the ``original`` module, ``restore_original()``."""

    kind: str = ""

    def _adopt(self, original: nn.Module) -> None:
        """Remember ``original`` (out of the module tree) and take over its plain attributes and hooks."""
        self.__dict__["_autoopt_original"] = original  # not a child: not in modules() nor the state_dict
        self.__dict__["training"] = original.training
        for key, value in original.__dict__.items():
            if key.startswith("_") or key in self.__dict__ or key == "forward":
                continue
            if isinstance(value, (nn.Module, torch.Tensor)):
                continue
            self.__dict__[key] = value  # in_features, variance_epsilon, config, hidden_size, ...
        for name in _HOOK_DICTS:
            if hasattr(original, name):
                self.__dict__[name] = getattr(original, name)  # shared: hooks keep firing, and restore keeps them

    @property
    def original(self) -> nn.Module:
        """The module this one replaced (what :func:`autoopt.restore` puts back)."""
        original: nn.Module = self.__dict__["_autoopt_original"]
        return original

    def restore_original(self) -> nn.Module:
        """The original, brought up to date (the Parameters this replacement holds now, e.g. after
        ``load_state_dict(assign=True)``, and its train/eval mode); undoes what building the
        replacement changed in the original's tensors."""
        original = self.original
        assert isinstance(self, nn.Module)
        for name, p in self._parameters.items():
            if name in original._parameters and original._parameters[name] is not p:
                original._parameters[name] = p
        original.__dict__["training"] = self.training
        return original

    def extra_bytes(self) -> int:
        """Bytes this replacement holds beyond the original's tensors (derived weights)."""
        return 0


class AutooptLinear(Replacement, nn.Linear):
    """``nn.Linear`` through :func:`autoopt.nn.ops.linear` (still an ``nn.Linear`` to ``isinstance``)."""

    kind = "linear"

    def __init__(self, original: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features = original.in_features
        self.out_features = original.out_features
        self.weight = original.weight
        self.register_parameter("bias", original.bias)
        self._adopt(original)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ops.linear(x, self.weight, self.bias)


class AutooptRMSNorm(Replacement, nn.Module):
    """RMSNorm through :func:`autoopt.nn.ops.rms_norm`. ``unit_offset`` (Gemma) scales by ``1 + weight``:
    that vector is computed once into the non-persistent buffer ``weight_plus_one``, in float32 as
    Gemma computes it (the op reads any weight dtype as fp32), and refreshed after
    ``load_state_dict`` and ``.to()``."""

    kind = "rms_norm"
    weight: torch.Tensor
    weight_plus_one: torch.Tensor | None

    def __init__(self, original: nn.Module, *, eps: float | None, unit_offset: bool) -> None:
        super().__init__()
        self.weight = _param(original, "weight")
        self._eps = eps
        self.unit_offset = unit_offset
        self.register_buffer("weight_plus_one", None, persistent=False)
        self._adopt(original)
        self._refresh()
        self.register_load_state_dict_post_hook(_after_load)

    def _refresh(self) -> None:
        if self.unit_offset:
            with torch.no_grad():
                self.weight_plus_one = 1.0 + self.weight.detach().float()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> AutooptRMSNorm:
        super()._apply(fn, recurse)
        self._refresh()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self._eps if self._eps is not None else torch.finfo(x.dtype).eps
        w = self.weight_plus_one if self.unit_offset else self.weight
        return _ops.rms_norm(x, w, eps)

    def extra_bytes(self) -> int:
        b = self.weight_plus_one
        return b.numel() * b.element_size() if isinstance(b, torch.Tensor) else 0

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self._eps}{', 1 + weight' if self.unit_offset else ''}"


class AutooptLayerNorm(Replacement, nn.Module):
    """LayerNorm over the last dimension through :func:`autoopt.nn.ops.layer_norm`."""

    kind = "layer_norm"
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, original: nn.Module, *, eps: float | None) -> None:
        super().__init__()
        self.weight = _param(original, "weight")
        self.register_parameter("bias", _param(original, "bias", optional=True))
        self._eps = eps
        self._adopt(original)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self._eps if self._eps is not None else torch.finfo(x.dtype).eps
        return _ops.layer_norm(x, self.weight, self.bias, eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self._eps}"


class AutooptGatedMLP(Replacement, nn.Module):
    """``down(act(gate(x)) * up(x))`` as one ``gate_up`` GEMM, a fused ``act * mul`` and the down GEMM.

    ``gate_up_weight`` (``[2I, H]``, rows ``[gate; up]``) is a non-persistent buffer: the state_dict
    still has ``gate_proj.weight`` and ``up_proj.weight`` (the children stay, as the originals).

    Memory (``tied``, the default, ``keep_original=False`` in :func:`autoopt.optimize`): building it
    copies one layer's gate and up weights into ``gate_up`` (a transient ``+2*I*H`` elements), then the
    original Parameters' data are re-pointed at its two halves and their old storage is released,
    so the weights exist once, as in eager. The Parameter objects, their values and the state_dict
    are unchanged; they share one storage until :func:`autoopt.restore` copies them apart again (the
    same transient). ``.to()``/``.half()`` and ``load_state_dict`` keep the halves tied.
    Untied (``keep_original=True``): the originals are not touched and ``gate_up`` is a copy, ``+2*I*H``
    elements per layer for as long as the model is optimised (refreshed after ``load_state_dict``).
    """

    kind = "gated_mlp"
    gate_up_weight: torch.Tensor | None
    gate_up_bias: torch.Tensor | None

    def __init__(self, original: nn.Module, *, activation: str, down_proj: nn.Module, use_linear_op: bool) -> None:
        super().__init__()
        self.gate_proj: nn.Linear = original.gate_proj  # type: ignore[assignment]
        self.up_proj: nn.Linear = original.up_proj  # type: ignore[assignment]
        self.down_proj = down_proj
        self.act_fn = original.act_fn
        self.activation = activation
        self.use_linear_op = use_linear_op
        self.tied = False
        self._adopt(original)
        self.register_buffer("gate_up_weight", None, persistent=False)
        self.register_buffer("gate_up_bias", None, persistent=False)
        self._build()
        self.register_load_state_dict_post_hook(_after_load)

    # -- the concatenated weight ------------------------------------------------------------------

    @property
    def intermediate(self) -> int:
        return self.gate_proj.out_features

    def _build(self) -> None:
        g, u = self.gate_proj, self.up_proj
        with torch.no_grad():
            self.gate_up_weight = torch.cat([g.weight.detach(), u.weight.detach()], dim=0)
            self.gate_up_bias = (torch.cat([g.bias.detach(), u.bias.detach()]) if g.bias is not None
                                 and u.bias is not None else None)

    def is_tied(self) -> bool:
        """Whether gate_proj.weight / up_proj.weight are the two halves of ``gate_up_weight`` right now."""
        w = self.gate_up_weight
        if not isinstance(w, torch.Tensor):
            return False
        i = self.intermediate
        return (self.gate_proj.weight.data_ptr() == w.data_ptr()
                and self.up_proj.weight.data_ptr() == w[i:].data_ptr())

    def tie(self) -> None:
        """Re-point gate_proj.weight / up_proj.weight (and biases) at the halves of ``gate_up``."""
        i, w, b = self.intermediate, self.gate_up_weight, self.gate_up_bias
        assert w is not None, "tie() after untie(): nothing to tie to"
        with torch.no_grad():
            self.gate_proj.weight.data = w[:i]
            self.up_proj.weight.data = w[i:]
            if b is not None and self.gate_proj.bias is not None and self.up_proj.bias is not None:
                self.gate_proj.bias.data = b[:i]
                self.up_proj.bias.data = b[i:]
        self.tied = True

    def untie(self) -> None:
        """Give gate_proj / up_proj their own storage again (a copy of each half) and drop ``gate_up``."""
        if self.tied:
            with torch.no_grad():
                for lin in (self.gate_proj, self.up_proj):
                    lin.weight.data = lin.weight.data.clone()
                    if lin.bias is not None:
                        lin.bias.data = lin.bias.data.clone()
        self.tied = False
        self.gate_up_weight = None
        self.gate_up_bias = None

    def _refresh(self) -> None:
        # load_state_dict copies in place (the halves stay tied and gate_up follows); with assign=True
        # or untied, rebuild gate_up from the loaded weights.
        if not (self.tied and self.is_tied()):
            self._build()
            if self.tied:
                self.tie()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> AutooptGatedMLP:
        if not self.tied:
            super()._apply(fn, recurse)
            return self
        # .to()/.half()/.cuda(): convert the (viewed) Parameters once, then rebuild gate_up from them
        # and tie again, rather than converting gate_up too and ending with two copies.
        old_w, old_b = self.gate_up_weight, self.gate_up_bias
        self.gate_up_weight = None
        self.gate_up_bias = None
        super()._apply(fn, recurse)
        self.gate_up_weight, self.gate_up_bias = old_w, old_b
        if not self.is_tied():  # fn moved or converted them: build anew
            self._build()
            self.tie()
        return self

    def restore_original(self) -> nn.Module:
        self.untie()
        if isinstance(self.down_proj, Replacement):
            self.down_proj.restore_original()  # the original MLP's own down_proj, up to date
        return super().restore_original()

    def extra_bytes(self) -> int:
        if self.tied:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.gate_up_weight, self.gate_up_bias)
                   if isinstance(t, torch.Tensor))

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.gate_up_weight, self.gate_up_bias
        assert w is not None, "this replacement was restored (autoopt.restore): call the original module"
        gate_up = _ops.linear(x, w, b) if self.use_linear_op else F.linear(x, w, b)
        if self.activation == "silu":
            h = _ops.swiglu(gate_up)
        else:
            i = self.intermediate
            h = _ops.gelu_tanh_mul(gate_up[..., :i], gate_up[..., i:])
        out: torch.Tensor = self.down_proj(h)
        return out

    def extra_repr(self) -> str:
        return (f"gate_up {self.gate_proj.in_features}->2x{self.intermediate}, {self.activation}, "
                f"{'tied' if self.tied else 'copied'}")


def _after_load(module: nn.Module, _keys: object) -> None:
    """load_state_dict post-hook: refresh what a replacement derives from its weights."""
    if isinstance(module, (AutooptRMSNorm, AutooptGatedMLP)):
        module._refresh()
