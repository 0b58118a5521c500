"""The quantized replacements :func:`autoopt.optimize` swaps in for ``weights="fp8"|"int8"|"int4"|...``.

Each runs its matmul through :func:`autoopt.nn.ops.quant_linear` on a weight packed by
:func:`autoopt.backend.quant.quantize` (or, for a checkpoint's block-FP8 linear, on that linear's own
e4m3 weight and ``weight_scale_inv``, untouched):

- :class:`AutooptQuantLinear`: one linear (``qweight``, ``scales``, ``offsets`` buffers; the original's bias
  Parameter);
- :class:`AutooptQuantGatedMLP`: a gated MLP whose gate and up weights are quantized as one fused
  ``[2I, H]`` weight (its ``gate_up`` child), with the fused activation and its ``down_proj``
  (quantized or not, checked on its own);
- :class:`AutooptQuantQKV` at an attention's ``q_proj`` (its parts at ``k_proj`` / ``v_proj``): q/k/v as
  one quantized ``[Nq + Nk + Nv, H]`` weight;
- :class:`AutooptQuantMoEExperts`: a MoE block's experts, each expert's ``[2N, K]`` and ``[K, N]`` packed on its
  own and stacked (:func:`pack_experts`), run in one call of :func:`autoopt.nn._moe.fused_moe_quant`.

**Memory.** A replacement is built beside the original (the original's 16-bit weights still there, the
check compares the two), then swapped in; with ``keep_original=False`` (the default) the walk then calls
:meth:`QuantReplacement.release`: the original's 16-bit weight Parameters are emptied (their storage
freed even if something else still holds the Parameter) and the original module is dropped, so the
model's linear weights end at the format's bytes plus scales, one module at a time (the peak is the
16-bit model plus one layer's packed weights). :func:`autoopt.restore` then cannot bring the original
back and says so (:class:`~autoopt.errors.RestoreError`). ``keep_original=True`` keeps the originals (and
their memory) for a restore that gives back identical modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from autoopt.errors import RestoreError
from autoopt.nn import _moe
from autoopt.nn import ops as _ops
from autoopt.nn.modules import AutooptRMSNorm, QKVOwner, Replacement, _param, gated_activation

__all__ = ["AutooptQuantGatedMLP", "AutooptQuantLinear", "AutooptQuantMoEExperts", "AutooptQuantQKV",
           "AutooptQuantQKVPart", "QuantLinear", "QuantReplacement", "pack_experts", "pack_rows"]


#: elements of a weight quantized at once: the quantizer works in fp32 with a few temporaries of the
#: slice's size, so a whole 14336 x 4096 gate (Llama-3-8B) would add ~1.7 GB at once (seen on an H100: int4's
#: build peak 1.7 GB over the bf16 model's); 2^22 elements (16 MB in fp32) a slice keeps that near 100 MB
_CHUNK_ELEMENTS = 1 << 22


def pack_rows(weights: Sequence[torch.Tensor], fmt: Any) -> Any:
    """The :class:`~autoopt.backend.quant.QuantizedWeight` of ``weights`` stacked along rows, in ``fmt``.

    Every format quantizes rows independently (fp8, int8, int4: a scale per row or per row-group;
    fp8_block: per 128-row block), so each weight is quantized a slice of rows at a time (whole 128-row
    blocks for fp8_block, where the stack's block boundaries must fall between the weights: else the stack
    is quantized whole) and the packed slices are stacked: the same result as quantizing the 16-bit stack,
    which is never built, with the quantizer's fp32 temporaries bounded by :data:`_CHUNK_ELEMENTS`."""
    from autoopt.backend.quant import QuantizedWeight, quantize

    k = weights[0].shape[1]
    step = max(128, _CHUNK_ELEMENTS // max(k, 1) // 128 * 128)
    with torch.no_grad():
        if fmt.name == "fp8_block" and any(w.shape[0] % 128 for w in weights[:-1]):
            return quantize(torch.cat([w.detach() for w in weights]), fmt)
        parts = [quantize(w.detach()[lo:lo + step], fmt) for w in weights for lo in range(0, w.shape[0], step)]
        if len(parts) == 1:
            return parts[0]
        tensors = {name: torch.cat([p.tensors()[name] for p in parts]) for name in parts[0].tensors()}
        del parts[1:]
    return QuantizedWeight.of(fmt, sum(w.shape[0] for w in weights), k, tensors)


class QuantLinear(nn.Module):
    """``x @ dequant(W)^T + bias`` over a packed weight, through :func:`autoopt.nn.ops.quant_linear`.

    The packed tensors are buffers (``qweight``, ``scales``, ``offsets``: they move with ``.to()`` and are in
    the state_dict), or, for a checkpoint's own FP8 linear, its Parameters under their own names
    (``weight``, ``weight_scale_inv``: the same objects, so the state_dict is the checkpoint's)."""

    #: the attribute names of (packed weight, scales, offsets)
    names: tuple[str, str, str]
    bias: torch.Tensor | None

    def __init__(self, qw: Any, bias: nn.Parameter | None, *, names: tuple[str, str, str] | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = qw.k, qw.n
        self.weight_format: str = qw.fmt.spec
        self.names = names or ("qweight", "scales", "offsets")
        for name, t in zip(self.names, (qw.qweight, qw.scales, qw.offsets), strict=True):
            if isinstance(t, nn.Parameter):
                self.register_parameter(name, t)
            else:
                self.register_buffer(name, t)
        self.register_parameter("bias", bias)

    def packed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        w, s, z = (getattr(self, n) for n in self.names)
        return w, s, z

    def quantized(self) -> Any:
        """The packed weight as a :class:`~autoopt.backend.quant.QuantizedWeight` (the same tensors)."""
        from autoopt.backend.quant import QuantizedWeight
        from autoopt.kernels.quant import parse_weight

        w, s, z = self.packed()
        return QuantizedWeight(fmt=parse_weight(self.weight_format), qweight=w, scales=s, offsets=z,
                               n=self.out_features, k=self.in_features)

    def packed_bytes(self) -> int:
        """Bytes of the packed weight, scales and offsets (the bias not counted)."""
        return sum(t.numel() * t.element_size() for t in self.packed() if t is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, s, z = self.packed()
        return _ops.quant_linear(x, w, s, z, self.bias, weight=self.weight_format, k=self.in_features)

    def fused(self, x: torch.Tensor, *, norm: AutooptRMSNorm | None = None, gated: bool = False,
              residual: torch.Tensor | None = None) -> torch.Tensor:
        """This linear with a decode layer's neighbours in one kernel (:func:`autoopt.nn.fused_linear.
        quant_linear_fused`): ``norm`` (an :class:`~autoopt.nn.modules.AutooptRMSNorm` whose input x is),
        ``gated`` (SwiGLU over ``[gate; up]``), ``residual`` (added)."""
        from autoopt.nn.fused_linear import quant_linear_fused

        w, s, z = self.packed()
        return quant_linear_fused(x, w, s, z, self.bias, weight=self.weight_format, k=self.in_features,
                                  norm_weight=None if norm is None else norm.weight,
                                  eps=1e-6 if norm is None else norm.eps_for(x.dtype), gated=gated, residual=residual)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, {self.weight_format}, bias={self.bias is not None}"


#: the list through which a fused decode layer (:mod:`autoopt.nn.decode_layer`) hands an armable part what its next
#: call takes (a norm, a residual): a plain list attribute, since list append / pop / clear trace under every
#: torch.compile this runs on, while ``module.__dict__.pop`` does not under torch 2.11's Dynamo (H200, 2026-11-29:
#: "Unsupported method call ... pop")
ARMED = "_autoopt_armed"


class QuantReplacement(Replacement):
    """What the quantized replacements add to :class:`~autoopt.nn.modules.Replacement`: the 16-bit weights they
    free (:meth:`release`), and a :meth:`restore_original` that says what was freed instead of failing."""

    def sixteen_bit(self) -> tuple[nn.Parameter, ...]:
        """The original's 16-bit weight (and bias) Parameters this replacement no longer reads."""
        raise NotImplementedError

    def release(self, path: str) -> None:
        """Free the original's 16-bit weights (emptied in place: their storage goes even where something else
        holds the Parameter) and drop the original; :attr:`freed` then names them for :func:`autoopt.restore`."""
        assert isinstance(self, nn.Module)
        kept = {id(p) for p in self.parameters()}
        params = [p for p in self.sixteen_bit() if id(p) not in kept]  # not a bias the replacement still adds
        if not params:
            return  # nothing 16-bit (a checkpoint's FP8 linear): the original stays restorable
        shapes = []
        with torch.no_grad():
            for p in params:
                shapes.append(f"{str(p.dtype).removeprefix('torch.')} {list(p.shape)}")
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.__dict__["_autoopt_freed"] = f"{path} ({', '.join(shapes)})"
        self.__dict__["_autoopt_original"] = None

    @property
    def freed(self) -> str | None:
        """What :meth:`release` freed (the module's path and its weights' dtypes and shapes), None if nothing."""
        freed: str | None = self.__dict__.get("_autoopt_freed")
        return freed

    def restore_original(self) -> nn.Module:
        if self.freed is not None:
            raise RestoreError(f"cannot restore {self.freed}: optimize() freed its 16-bit weights when it "
                               "quantized it; optimize(..., keep_original=True) keeps them for restore()",
                               freed=(self.freed,))
        return super().restore_original()


class AutooptQuantLinear(QuantReplacement, QuantLinear):
    """An ``nn.Linear`` (or a checkpoint's FP8 linear) running on its packed weight."""

    kind = "linear"

    def __init__(self, original: nn.Module, qw: Any, *, names: tuple[str, str, str] | None = None) -> None:
        QuantLinear.__init__(self, qw, _param(original, "bias", optional=True), names=names)
        self._adopt(original)

    def sixteen_bit(self) -> tuple[nn.Parameter, ...]:
        original = self.original
        w = original._parameters.get("weight")
        return (w,) if isinstance(w, nn.Parameter) and w.dtype.itemsize > 1 else ()

    def extra_bytes(self) -> int:
        """The packed weight, while the original 16-bit one is kept beside it (``keep_original=True``)."""
        return self.packed_bytes() if self.freed is None and self.sixteen_bit() else 0


class ArmableQuantLinear(AutooptQuantLinear):
    """An :class:`AutooptQuantLinear` under a fused decode layer (:mod:`autoopt.nn.decode_layer` sets the class on
    install and puts it back on uninstall): a residual handed to it for its next call is added in its epilogue.
    The default path's class has no such check, so nothing changes where no layer is fused."""

    _autoopt_armed: list[torch.Tensor]  # set by install: [the residual] for the next call, else []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        armed = self._autoopt_armed
        if armed:
            return self.fused(x, residual=armed.pop())
        return QuantLinear.forward(self, x)


class AutooptQuantGatedMLP(QuantReplacement, nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up as one quantized GEMM (the ``gate_up`` child, a
    :class:`QuantLinear` over ``[Wgate; Wup]``), the fused activation, then ``down_proj`` (its checked
    replacement, quantized or not, or the original). The original's ``act_fn`` is kept as a child."""

    kind = "gated_mlp"

    def __init__(self, original: nn.Module, *, activation: str, qw: Any, down_proj: nn.Module) -> None:
        super().__init__()
        gate, up = original.gate_proj, original.up_proj
        assert isinstance(gate, nn.Linear) and isinstance(up, nn.Linear)
        bias: nn.Parameter | None = None
        if gate.bias is not None and up.bias is not None:
            bias = nn.Parameter(torch.cat([gate.bias.detach(), up.bias.detach()]), requires_grad=False)
        self.gate_up = QuantLinear(qw, bias)
        self.down_proj = down_proj
        self.act_fn = original.act_fn
        self.activation = activation
        self.intermediate = gate.out_features
        self._adopt(original)

    def sixteen_bit(self) -> tuple[nn.Parameter, ...]:
        original = self.original
        return tuple(p for name in ("gate_proj", "up_proj") for p in original.get_submodule(name).parameters())

    def restore_original(self) -> nn.Module:
        original = QuantReplacement.restore_original(self)
        if isinstance(self.down_proj, Replacement):
            self.down_proj.restore_original()  # the original MLP's own down_proj, up to date
        return original

    def extra_bytes(self) -> int:
        return self.gate_up.packed_bytes() if self.freed is None else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(gated_activation(self.gate_up(x), self.activation))
        return out

    def fused_decode(self, x: torch.Tensor, norm: AutooptRMSNorm) -> torch.Tensor:
        """``x + mlp(norm(x))`` in two kernels: norm, gate_up and SwiGLU in one, down and the residual add in the
        other (a :class:`~autoopt.nn.decode_layer` step; down is a :class:`QuantLinear` there)."""
        down = self.down_proj
        assert isinstance(down, QuantLinear) and self.activation == "silu"
        return down.fused(self.gate_up.fused(x, norm=norm, gated=True), residual=x)

    def extra_repr(self) -> str:
        return (f"gate_up {self.gate_up.in_features}->2x{self.intermediate} {self.gate_up.weight_format}, "
                f"{self.activation}")


class AutooptQuantQKV(QKVOwner, QuantReplacement, nn.Module):
    """An attention's ``q_proj`` computing q, k and v in one quantized GEMM (its ``qkv`` child over
    ``[Wq; Wk; Wv]``); ``k_proj`` and ``v_proj`` become :class:`AutooptQuantQKVPart` modules that return their
    slice (as :class:`~autoopt.nn.modules.AutooptQKV` does at 16 bits)."""

    kind = "qkv"

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear, qw: Any) -> None:
        super().__init__()
        self.in_features, self.out_features = q.in_features, q.out_features
        bias: nn.Parameter | None = None
        if q.bias is not None and k.bias is not None and v.bias is not None:
            bias = nn.Parameter(torch.cat([t.detach() for t in (q.bias, k.bias, v.bias)]), requires_grad=False)
        self.qkv = QuantLinear(qw, bias)
        self._adopt(q)
        self.__dict__["_stash"] = None
        self.__dict__["k_part"] = AutooptQuantQKVPart(k, self, last=False)
        self.__dict__["v_part"] = AutooptQuantQKVPart(v, self, last=True)
        self.__dict__["_originals"] = (q, k, v)

    def sixteen_bit(self) -> tuple[nn.Parameter, ...]:
        return tuple(p for lin in self.__dict__["_originals"] for p in lin.parameters())

    def release(self, path: str) -> None:
        super().release(path)
        self.__dict__["_originals"] = ()
        for part in self.parts:
            part.__dict__["_autoopt_freed"] = self.freed
            part.__dict__["_autoopt_original"] = None

    def extra_bytes(self) -> int:
        return self.qkv.packed_bytes() if self.freed is None else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stash(x, self.qkv(x))

    def extra_repr(self) -> str:
        k, v = self.parts
        return (f"qkv {self.in_features}->{self.out_features}+{k.out_features}+{v.out_features}, "
                f"{self.qkv.weight_format}")


class ArmableQuantQKV(AutooptQuantQKV):
    """An :class:`AutooptQuantQKV` under a fused decode layer (as :class:`ArmableQuantLinear`): a norm handed to it
    for its next call means x is that norm's input, and the norm runs in the GEMV's prologue."""

    _autoopt_armed: list[AutooptRMSNorm]  # set by install: [the norm] for the next call, else []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        armed = self._autoopt_armed
        if armed:
            return self.stash(x, self.qkv.fused(x, norm=armed.pop()))
        return self.stash(x, self.qkv(x))


class AutooptQuantQKVPart(QuantReplacement, nn.Module):
    """``k_proj`` or ``v_proj`` of an :class:`AutooptQuantQKV`: its slice of the fused output when called on the
    tensor ``q_proj`` just saw, else its columns of the fused GEMM run again for this input."""

    kind = "qkv"

    def __init__(self, original: nn.Linear, owner: AutooptQuantQKV, *, last: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = original.in_features, original.out_features
        self.last = last
        self.__dict__["owner"] = owner  # not a child: the owner sits at q_proj
        self._adopt(original)

    def sixteen_bit(self) -> tuple[nn.Parameter, ...]:
        return ()  # the owner frees the three projections' weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        owner: AutooptQuantQKV = self.__dict__["owner"]
        out = owner.from_stash(self, x)
        if out is not None:
            return out
        lo, hi = owner.columns(self)
        full: torch.Tensor = owner.qkv(x)
        return full[..., lo:hi]

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, a slice of q_proj's fused quantized qkv GEMM"


def pack_experts(experts: torch.Tensor, fmt: Any, *, transposed: bool = False) -> dict[str, torch.Tensor]:
    """Experts ``[E, rows, cols]`` (``transposed``: stored ``[E, cols, rows]``) packed in ``fmt`` one expert at a
    time (:func:`pack_rows`: bounded fp32 temporaries) into stacked ``qweight``/``scales`` (/``offsets``) tensors
    ``[E, ...]`` allocated once: the 16-bit experts are never copied whole."""
    out: dict[str, torch.Tensor] = {}
    for e in range(experts.shape[0]):
        w = experts[e].t() if transposed else experts[e]
        packed = pack_rows([w], fmt).tensors()
        for name, t in packed.items():
            if name not in out:
                out[name] = torch.empty((experts.shape[0], *t.shape), dtype=t.dtype, device=t.device)
            out[name][e].copy_(t)
    return out


class AutooptQuantMoEExperts(QuantReplacement, nn.Module):
    """A MoE block's experts as one fused-MoE call over quantized experts (:func:`autoopt.nn._moe.fused_moe_quant`),
    called as the block calls its experts, ``experts(hidden [T, K], top_k_index [T, k], top_k_weights [T, k])``.

    Buffers ``w13_qweight``/``w13_scales`` (``[E, ...]`` of each expert's ``[2N, K]`` gate/up packed by
    :func:`autoopt.backend.quant.quantize`), ``w2_qweight``/``w2_scales`` (its ``[K, N]`` down), and
    ``*_offsets`` for asymmetric int4. Transposed experts (Aria) are packed from their transposes."""

    kind = "moe"

    def __init__(self, original: nn.Module, *, weight: str, activation: str, transposed: bool, top_k: int) -> None:
        super().__init__()
        from autoopt.kernels.quant import parse_weight

        fmt = parse_weight(weight)
        self.weight_format: str = fmt.spec
        gate_up, down = _param(original, "gate_up_proj"), _param(original, "down_proj")
        self.experts = int(gate_up.shape[0])
        self.hidden = int(down.shape[2] if transposed else down.shape[1])
        self.intermediate = int(down.shape[1] if transposed else down.shape[2])
        act = getattr(original, "act_fn", None)
        if isinstance(act, nn.Module):
            self.act_fn = act
        self.activation, self.transposed, self.top_k = activation, transposed, top_k
        for prefix, stacked in (("w13", gate_up), ("w2", down)):
            for name, t in pack_experts(stacked.detach(), fmt, transposed=transposed).items():
                self.register_buffer(f"{prefix}_{name}", t)
        self._adopt(original)

    def packed(self, prefix: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(qweight, scales, offsets or None)`` of ``w13`` or ``w2``."""
        return (getattr(self, f"{prefix}_qweight"), getattr(self, f"{prefix}_scales"),
                getattr(self, f"{prefix}_offsets", None))

    def packed_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for p in ("w13", "w2") for t in self.packed(p) if t is not None)

    def sixteen_bit(self) -> tuple[nn.Parameter, ...]:
        original = self.original
        return tuple(p for name in ("gate_up_proj", "down_proj")
                     if isinstance(p := original._parameters.get(name), nn.Parameter) and p.dtype.itemsize > 1)

    def extra_bytes(self) -> int:
        """The packed experts, while the original 16-bit ones are kept beside them (``keep_original=True``)."""
        return self.packed_bytes() if self.freed is None and self.sixteen_bit() else 0

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        (w13, s13, z13), (w2, s2, z2) = self.packed("w13"), self.packed("w2")
        k, topk = hidden_states.shape[-1], top_k_index.shape[-1]
        out = _moe.fused_moe_quant(hidden_states.reshape(-1, k), w13, w2, s13, s2, top_k_weights.reshape(-1, topk),
                                   top_k_index.reshape(-1, topk), self.weight_format, z13, z2, self.activation)
        return out.view(hidden_states.shape)

    def extra_repr(self) -> str:
        return (f"{self.experts} experts {self.hidden}->2x{self.intermediate}->{self.hidden}, {self.weight_format}, "
                f"{self.activation}")
