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
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from autoopt.nn import _moe
from autoopt.nn import ops as _ops

__all__ = ["AutooptGatedMLP", "AutooptLayerNorm", "AutooptLinear", "AutooptMoEExperts", "AutooptPlainMLP", "AutooptQKV",
           "AutooptQKVPart", "AutooptRMSNorm", "FusedRows", "QKVOwner", "Replacement", "gated_activation"]

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


# -- weights concatenated along rows, the originals re-pointed at their slices ------------------------------

def _concat(linears: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linears' weights stacked along rows (and their biases, where every one has one)."""
    with torch.no_grad():
        w = torch.cat([lin.weight.detach() for lin in linears], dim=0)
        biases = [lin.bias for lin in linears]
        b = torch.cat([t.detach() for t in biases]) if all(t is not None for t in biases) else None
    return w, b


def _row_offsets(linears: tuple[Any, ...]) -> list[int]:
    offsets = [0]
    for lin in linears:
        offsets.append(offsets[-1] + lin.weight.shape[0])
    return offsets


def _is_tied(linears: tuple[Any, ...], w: torch.Tensor | None) -> bool:
    """Whether each linear's weight is its row slice of ``w`` right now."""
    if not isinstance(w, torch.Tensor):
        return False
    offsets = _row_offsets(linears)
    return all(lin.weight.data_ptr() == w[lo:].data_ptr() and lin.weight.shape[0] == hi - lo
               for lin, lo, hi in zip(linears, offsets, offsets[1:], strict=False))


def _tie(linears: tuple[Any, ...], w: torch.Tensor, b: torch.Tensor | None) -> None:
    """Re-point each linear's weight (and bias) at its row slice of ``w`` (``b``)."""
    offsets = _row_offsets(linears)
    with torch.no_grad():
        for lin, lo, hi in zip(linears, offsets, offsets[1:], strict=False):
            lin.weight.data = w[lo:hi]
            if b is not None and lin.bias is not None:
                lin.bias.data = b[lo:hi]


def _bytes_of(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _untie(linears: tuple[Any, ...]) -> None:
    """Give each linear its own storage again (a copy of its slice)."""
    with torch.no_grad():
        for lin in linears:
            lin.weight.data = lin.weight.data.clone()
            if lin.bias is not None:
                lin.bias.data = lin.bias.data.clone()


class FusedRows:
    """What a replacement holding several linears' weights stacked along rows does with them: build the
    stack, re-point the linears at their slices (``tie``), give them their storage back (``untie``) and
    rebuild after ``load_state_dict``. Subclasses name the two buffers and list the linears."""

    _WEIGHT = ""
    _BIAS = ""
    tied: bool

    def _linears(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def _build(self) -> None:
        w, b = _concat(self._linears())
        setattr(self, self._WEIGHT, w)
        setattr(self, self._BIAS, b)

    def is_tied(self) -> bool:
        """Whether each linear's weight is its row slice of the stacked weight right now."""
        return _is_tied(self._linears(), getattr(self, self._WEIGHT))

    def tie(self) -> None:
        """Re-point each linear's weight (and bias) at its row slice of the stack."""
        w = getattr(self, self._WEIGHT)
        assert w is not None, "tie() after untie(): nothing to tie to"
        _tie(self._linears(), w, getattr(self, self._BIAS))
        self.tied = True

    def untie(self) -> None:
        """Give each linear its own storage again (a copy of its slice) and drop the stack."""
        if self.tied:
            _untie(self._linears())
        self.tied = False
        setattr(self, self._WEIGHT, None)
        setattr(self, self._BIAS, None)

    def _refresh(self) -> None:
        # load_state_dict copies in place (the slices stay tied and the stack follows); with assign=True
        # or untied, rebuild the stack from the loaded weights.
        if not (self.tied and self.is_tied()):
            self._build()
            if self.tied:
                self.tie()

    def extra_bytes(self) -> int:
        return 0 if self.tied else _bytes_of(getattr(self, self._WEIGHT), getattr(self, self._BIAS))

    def _sync(self) -> None:
        """Tie again once the linears are converted alike (after ``.to()``; q/k/v convert one module at
        a time, in the attention's child order, so the last of them does it)."""
        ws = [lin.weight for lin in self._linears()]
        if self.tied and not self.is_tied() and all(w.dtype == ws[0].dtype and w.device == ws[0].device for w in ws):
            self._build()
            self.tie()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        # .to()/.half()/.cuda(): convert the (viewed) Parameters once, then rebuild the stack from them and
        # tie again, rather than converting the stack too and ending with two copies.
        if not self.tied:
            return super()._apply(fn, recurse)  # type: ignore[misc]
        saved = getattr(self, self._WEIGHT), getattr(self, self._BIAS)
        setattr(self, self._WEIGHT, None)
        setattr(self, self._BIAS, None)
        super()._apply(fn, recurse)  # type: ignore[misc]
        setattr(self, self._WEIGHT, saved[0])
        setattr(self, self._BIAS, saved[1])
        self._sync()
        return self


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` of a fused gate/up output ``[..., 2I]`` (gate first): ``silu`` or ``gelu_tanh``."""
    if activation == "silu":
        return _ops.swiglu(gate_up)
    i = gate_up.shape[-1] // 2
    return _ops.gelu_tanh_mul(gate_up[..., :i], gate_up[..., i:])


class QKVOwner:
    """What a fused q/k/v module at ``q_proj`` does for its k/v parts (16-bit :class:`AutooptQKV`, quantized
    :class:`~autoopt.nn.quant_modules.AutooptQuantQKV`): it stashes ``(x, qkv)`` in :meth:`stash` and each part
    takes its columns with :meth:`from_stash` when called on that same ``x``."""

    out_features: int

    @property
    def parts(self) -> tuple[Any, Any]:
        """The k and v modules (they sit at the attention's ``k_proj`` / ``v_proj``)."""
        return self.__dict__["k_part"], self.__dict__["v_part"]

    def columns(self, part: Any) -> tuple[int, int]:
        """``part``'s columns of the fused output."""
        k, _ = self.parts
        lo = self.out_features + (0 if part is k else k.out_features)
        return lo, lo + part.out_features

    def stash(self, x: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """Keep ``(x, qkv)`` for the parts; q's columns."""
        self.__dict__["_stash"] = (x, qkv)
        return qkv[..., :self.out_features]

    def from_stash(self, part: Any, x: torch.Tensor) -> torch.Tensor | None:
        """``part``'s slice of the stashed output when ``x`` is the stashed input (the v part clears it),
        else None."""
        stash = self.__dict__.get("_stash")
        if stash is None or stash[0] is not x:
            return None
        if part.last:
            self.__dict__["_stash"] = None
        lo, hi = self.columns(part)
        out: torch.Tensor = stash[1][..., lo:hi]
        return out


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

    def eps_for(self, dtype: torch.dtype) -> float:
        """The epsilon this norm adds for inputs of ``dtype``: the original's, else the dtype's machine epsilon (as
        the original computes it)."""
        return float(self._eps) if self._eps is not None else float(torch.finfo(dtype).eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_plus_one if self.unit_offset else self.weight
        return _ops.rms_norm(x, w, self.eps_for(x.dtype))

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


class AutooptGatedMLP(FusedRows, Replacement, nn.Module):
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
    _WEIGHT, _BIAS = "gate_up_weight", "gate_up_bias"
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

    def _linears(self) -> tuple[Any, ...]:
        return (self.gate_proj, self.up_proj)

    def restore_original(self) -> nn.Module:
        self.untie()
        if isinstance(self.down_proj, Replacement):
            self.down_proj.restore_original()  # the original MLP's own down_proj, up to date
        return super().restore_original()

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.gate_up_weight, self.gate_up_bias
        assert w is not None, "this replacement was restored (autoopt.restore): call the original module"
        gate_up = _ops.linear(x, w, b) if self.use_linear_op else F.linear(x, w, b)
        out: torch.Tensor = self.down_proj(gated_activation(gate_up, self.activation))
        return out

    def extra_repr(self) -> str:
        return (f"gate_up {self.gate_proj.in_features}->2x{self.intermediate}, {self.activation}, "
                f"{'tied' if self.tied else 'copied'}")


class AutooptPlainMLP(Replacement, nn.Module):
    """A plain MLP ``fc2(act(fc1(x)))`` (StarCoder2, GPT-NeoX/Pythia, Phi, Falcon) as one GEMM with fc1's
    bias and the activation in its epilogue (:func:`autoopt.nn.ops.linear` with ``activation=``), then fc2.

    The children are the original's, under their own names (``c_fc``/``c_proj``, ``dense_h_to_4h``/
    ``dense_4h_to_h``, ``fc1``/``fc2``, the activation module), with fc2 an :class:`AutooptLinear` where
    its own check passed: nothing is copied and the state_dict is unchanged. ``fused_activation`` names
    what the epilogue computes (``gelu``, ``gelu_tanh`` or ``relu``; not ``activation``, which may be the
    original's child). An inference replacement, like the others: dropout that the original applies in
    training mode (StarCoder2's ``residual_dropout``) is not applied.
    """

    kind = "plain_mlp"

    def __init__(self, original: nn.Module, *, fc1: str, fc2: str, activation: str, fc2_module: nn.Module) -> None:
        super().__init__()
        for name, child in original.named_children():
            self.add_module(name, fc2_module if name == fc2 else child)
        self.fc1_name, self.fc2_name, self.fused_activation = fc1, fc2, activation
        self._adopt(original)

    @property
    def fc1(self) -> nn.Linear:
        lin: nn.Linear = self._modules[self.fc1_name]  # type: ignore[assignment]
        return lin

    @property
    def fc2(self) -> nn.Module:
        mod: nn.Module = self._modules[self.fc2_name]  # type: ignore[assignment]
        return mod

    def restore_original(self) -> nn.Module:
        if isinstance(self.fc2, Replacement):
            self.fc2.restore_original()  # the original MLP's own fc2, up to date
        return super().restore_original()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1 = self.fc1
        h = _ops.linear(x, fc1.weight, fc1.bias, activation=self.fused_activation)
        out: torch.Tensor = self.fc2(h)
        return out

    def extra_repr(self) -> str:
        fc1 = self.fc1
        return (f"{self.fc1_name} {fc1.in_features}->{fc1.out_features} + {self.fused_activation} in its epilogue, "
                f"then {self.fc2_name}")


class AutooptQKV(QKVOwner, FusedRows, Replacement, nn.Module):
    """An attention's ``q_proj`` computing q, k and v in one GEMM over ``[Wq; Wk; Wv]``; the attention's
    ``k_proj`` and ``v_proj`` become :class:`AutooptQKVPart` modules that return their slice of it.

    Attention code calls ``q_proj(h)``, ``k_proj(h)``, ``v_proj(h)`` on the same ``h`` (Hugging Face
    Llama, Qwen2, Mistral, Gemma). This module runs the fused GEMM, returns q (a view of its first
    columns) and keeps ``(h, qkv)`` until ``v_proj`` takes its slice. A part called on any other
    tensor, or after the stash was taken, computes its own GEMM: the answer is right in any call
    order, and fast in the usual one. At decode one GEMV reads the three weights at once: on the H100
    1x6144x4096 ran 25.1 us against 19.5 + 2 x ~12 us for q, k and v apart (hw_limit rows), and two
    launches fewer per layer.

    The attention keeps its own forward (SDPA, FlashAttention); the state_dict keeps ``q_proj.weight``,
    ``k_proj.weight``, ``v_proj.weight``. Memory as :class:`AutooptGatedMLP`: with ``tie()`` (the default
    in :func:`autoopt.optimize`) the three Parameters are re-pointed at their row slices of
    ``qkv_weight``, so the weights exist once; ``.to()`` and ``load_state_dict`` keep them tied.
    """

    kind = "qkv"
    _WEIGHT, _BIAS = "qkv_weight", "qkv_bias"
    weight: nn.Parameter
    bias: nn.Parameter | None
    qkv_weight: torch.Tensor | None
    qkv_bias: torch.Tensor | None

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = q.in_features, q.out_features
        self.weight = _param(q, "weight")
        self.register_parameter("bias", _param(q, "bias", optional=True))
        self._adopt(q)
        self.tied = False
        self.__dict__["_stash"] = None
        self.__dict__["k_part"] = AutooptQKVPart(k, self, last=False)
        self.__dict__["v_part"] = AutooptQKVPart(v, self, last=True)
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)
        self._build()
        self.register_load_state_dict_post_hook(_after_load)

    def _linears(self) -> tuple[Any, ...]:
        return (self, *self.parts)

    def restore_original(self) -> nn.Module:
        self.untie()
        return super().restore_original()

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qkv_weight
        assert w is not None, "this replacement was restored (autoopt.restore): call the original module"
        return self.stash(x, _ops.linear(x, w, self.qkv_bias))

    def extra_repr(self) -> str:
        k, v = self.parts
        return (f"qkv {self.in_features}->{self.out_features}+{k.out_features}+{v.out_features}, "
                f"{'tied' if self.tied else 'copied'}")


class AutooptQKVPart(Replacement, nn.Module):
    """``k_proj`` or ``v_proj`` of an :class:`AutooptQKV`: its slice of the fused output when called on
    the tensor ``q_proj`` just saw, else its own GEMM (:func:`autoopt.nn.ops.linear`)."""

    kind = "qkv"
    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, original: nn.Linear, owner: AutooptQKV, *, last: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = original.in_features, original.out_features
        self.weight = _param(original, "weight")
        self.register_parameter("bias", _param(original, "bias", optional=True))
        self.last = last
        self.__dict__["owner"] = owner  # not a child: the owner sits at q_proj
        self._adopt(original)
        if last:
            self.register_load_state_dict_post_hook(_after_load)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        owner: AutooptQKV = self.__dict__["owner"]
        out = owner.from_stash(self, x)
        return out if out is not None else _ops.linear(x, self.weight, self.bias)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> AutooptQKVPart:
        super()._apply(fn, recurse)
        self.__dict__["owner"]._sync()
        return self

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, a slice of q_proj's fused qkv GEMM"


class AutooptMoEExperts(Replacement, nn.Module):
    """A MoE block's experts as one fused-MoE call (:func:`autoopt.nn._moe.fused_moe`: the Triton kernel, or
    torch where it cannot run) on the router's answer. The block's own forward calls it as it called the
    original, ``experts(hidden [T, K], top_k_index [T, k], top_k_weights [T, k])``, so the router, its top-k,
    softmax and renormalisation, and a shared expert stay the model's.

    It holds the original's ``gate_up_proj`` and ``down_proj`` Parameters (the state_dict is unchanged). In the
    kernel's layout, ``[E, 2N, K]`` and ``[E, K, N]`` (Mixtral, Qwen2/3-MoE, OLMoE), the kernel reads them as
    they are: nothing is copied. Transposed (``[E, K, 2N]`` / ``[E, N, K]``, Aria) it reads contiguous
    transposed copies, the non-persistent buffers ``w13`` and ``w2`` (refreshed after ``.to()`` and
    ``load_state_dict``; :meth:`extra_bytes` counts them); the originals are untouched for :func:`autoopt.restore`.
    """

    kind = "moe"
    gate_up_proj: nn.Parameter
    down_proj: nn.Parameter
    w13: torch.Tensor | None
    w2: torch.Tensor | None

    def __init__(self, original: nn.Module, *, activation: str, transposed: bool, top_k: int) -> None:
        super().__init__()
        self.gate_up_proj = _param(original, "gate_up_proj")
        self.down_proj = _param(original, "down_proj")
        act = getattr(original, "act_fn", None)
        if isinstance(act, nn.Module):
            self.act_fn = act  # the original's child, kept for code that reads it (it holds no weights)
        self.activation = activation
        self.transposed = transposed
        self.top_k = top_k  # what the block's router answers per token (its report's kernel choice reads it)
        self.register_buffer("w13", None, persistent=False)
        self.register_buffer("w2", None, persistent=False)
        self._adopt(original)
        self._refresh()
        self.register_load_state_dict_post_hook(_after_load)

    def _refresh(self) -> None:
        if self.transposed:
            with torch.no_grad():
                self.w13 = self.gate_up_proj.detach().transpose(1, 2).contiguous()
                self.w2 = self.down_proj.detach().transpose(1, 2).contiguous()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> AutooptMoEExperts:
        # convert the Parameters only, then transpose again: converting the copies too would hold both at once
        self.w13 = self.w2 = None
        super()._apply(fn, recurse)
        self._refresh()
        return self

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w13 [E, 2N, K], w2 [E, K, N])`` as the kernel reads them."""
        if self.transposed:
            assert self.w13 is not None and self.w2 is not None, \
                "this replacement was restored (autoopt.restore): call the original module"
            return self.w13, self.w2
        return self.gate_up_proj, self.down_proj

    @property
    def experts(self) -> int:
        return int(self.gate_up_proj.shape[0])

    @property
    def intermediate(self) -> int:
        return int(self.weights()[1].shape[2])

    @property
    def hidden(self) -> int:
        return int(self.weights()[1].shape[1])

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        w13, w2 = self.weights()
        k, topk = hidden_states.shape[-1], top_k_index.shape[-1]
        out = _moe.fused_moe(hidden_states.reshape(-1, k), w13, w2, top_k_weights.reshape(-1, topk),
                             top_k_index.reshape(-1, topk), self.activation)
        return out.view(hidden_states.shape)

    def restore_original(self) -> nn.Module:
        self.w13 = self.w2 = None
        return super().restore_original()

    def extra_bytes(self) -> int:
        return _bytes_of(self.w13, self.w2)

    def extra_repr(self) -> str:
        return (f"{self.experts} experts {self.hidden}->2x{self.intermediate}->{self.hidden}, {self.activation}, "
                f"{'transposed copies' if self.transposed else 'own tensors'}")


def _after_load(module: nn.Module, _keys: object) -> None:
    """load_state_dict post-hook: refresh what a replacement derives from its weights."""
    if isinstance(module, (AutooptRMSNorm, AutooptGatedMLP, AutooptQKV, AutooptMoEExperts)):
        module._refresh()
    elif isinstance(module, AutooptQKVPart):  # v_proj loads after q_proj: its hook refreshes the fused weight
        module.__dict__["owner"]._refresh()
