"""Builders: one per match kind, each making the replacement module its match describes.

:func:`build` looks the builder up by the match's type in :data:`BUILDERS`. A builder gets the
original module, its match (:mod:`autoopt.nn.match`) and ``inner``: by child name, what runs each
linear the new module calls one by one inside it (a gated MLP's ``down_proj``, a plain MLP's fc2),
its checked replacement or the original. It only builds: checking the replacement against the
original, swapping it in and the report are :func:`autoopt.optimize`'s walk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from autoopt.kernels.quant import parse_weight
from autoopt.nn.match import (
    QKV,
    DenseMatch,
    GatedMLPMatch,
    MoEMatch,
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
)
from autoopt.nn.quant_modules import (
    AutooptQuantGatedMLP,
    AutooptQuantLinear,
    AutooptQuantMoEExperts,
    AutooptQuantQKV,
    pack_rows,
)

__all__ = ["BUILDERS", "Builder", "build"]

#: ``(original, match, inner) -> replacement`` (a :class:`~autoopt.nn.modules.Replacement` module); the match is of
#: the type the builder is registered for.
Builder = Callable[[nn.Module, Any, Mapping[str, nn.Module]], nn.Module]


def _linear(m: nn.Module, match: DenseMatch, inner: Mapping[str, nn.Module]) -> AutooptLinear:
    assert isinstance(m, nn.Linear)
    return AutooptLinear(m)


def _norm(m: nn.Module, match: NormMatch, inner: Mapping[str, nn.Module]) -> AutooptRMSNorm | AutooptLayerNorm:
    if match.kind == "rms_norm":
        return AutooptRMSNorm(m, eps=match.eps, unit_offset=match.unit_offset)
    return AutooptLayerNorm(m, eps=match.eps)


def _gated_mlp(m: nn.Module, match: GatedMLPMatch, inner: Mapping[str, nn.Module]
               ) -> AutooptGatedMLP | AutooptQuantGatedMLP:
    if match.weight is not None:
        gate, up = m.get_submodule("gate_proj"), m.get_submodule("up_proj")
        assert isinstance(gate, nn.Linear) and isinstance(up, nn.Linear)
        qw = pack_rows([gate.weight, up.weight], parse_weight(match.weight))
        return AutooptQuantGatedMLP(m, activation=match.activation, qw=qw, down_proj=inner["down_proj"])
    return AutooptGatedMLP(m, activation=match.activation, down_proj=inner["down_proj"],
                           use_linear_op=match.linear_op)


def _plain_mlp(m: nn.Module, match: PlainMLPMatch, inner: Mapping[str, nn.Module]) -> AutooptPlainMLP:
    return AutooptPlainMLP(m, fc1=match.fc1_name, fc2=match.fc2_name, activation=match.activation,
                           fc2_module=inner[match.fc2_name])


def _qkv(attention: nn.Module, match: QKVMatch, inner: Mapping[str, nn.Module]) -> AutooptQKV | AutooptQuantQKV:
    """The fused q_proj (its k/v parts in ``.parts``); the attention itself is not replaced."""
    q, k, v = (attention._modules[name] for name in QKV)
    assert isinstance(q, nn.Linear) and isinstance(k, nn.Linear) and isinstance(v, nn.Linear)
    if match.weight is not None:
        return AutooptQuantQKV(q, k, v, pack_rows([q.weight, k.weight, v.weight], parse_weight(match.weight)))
    return AutooptQKV(q, k, v)


#: the names under which a checkpoint's block-FP8 linear (transformers' FP8Linear) holds its packed tensors
CHECKPOINT_FP8 = ("weight", "weight_scale_inv", "offsets")


def _quant_linear(m: nn.Module, match: QuantLinearMatch, inner: Mapping[str, nn.Module]) -> AutooptQuantLinear:
    """A linear quantized from its 16-bit weight, or a checkpoint's FP8 linear on its own tensors (not copied)."""
    fmt = parse_weight(match.weight)
    if match.source == "checkpoint":
        from autoopt.backend.quant import QuantizedWeight

        qw = QuantizedWeight.of(fmt, match.out_features, match.in_features,
                                {"qweight": m.weight, "scales": m.weight_scale_inv})
        return AutooptQuantLinear(m, qw, names=CHECKPOINT_FP8)
    assert isinstance(m.weight, torch.Tensor)
    return AutooptQuantLinear(m, pack_rows([m.weight], fmt))


def _moe(block: nn.Module, match: MoEMatch, inner: Mapping[str, nn.Module]
         ) -> AutooptMoEExperts | AutooptQuantMoEExperts:
    """The block's experts child as one fused-MoE call (over its experts packed in ``match.weight``, where that
    is set); the block itself (its router, a shared expert) is not replaced."""
    experts = block.get_submodule(match.experts_name)
    if match.weight is not None:
        return AutooptQuantMoEExperts(experts, weight=match.weight, activation=match.activation,
                                      transposed=match.transposed, top_k=match.top_k)
    return AutooptMoEExperts(experts, activation=match.activation, transposed=match.transposed, top_k=match.top_k)


#: the builder of each match kind.
BUILDERS: dict[type, Builder] = {
    DenseMatch: _linear,
    NormMatch: _norm,
    GatedMLPMatch: _gated_mlp,
    PlainMLPMatch: _plain_mlp,
    QKVMatch: _qkv,
    QuantLinearMatch: _quant_linear,
    MoEMatch: _moe,
}


def build(m: nn.Module, match: Replacing, inner: Mapping[str, nn.Module]) -> nn.Module:
    """The replacement of ``m`` that ``match`` describes, a :class:`~autoopt.nn.modules.Replacement` (not checked,
    not swapped in)."""
    return BUILDERS[type(match)](m, match, inner)
