"""A quantized decoder layer's decode step in five kernels: ``optimize(..., ops=[..., "decode_layer"])``.

transformers runs a Llama-family layer as ``h = x + attn(norm1(x)); out = h + mlp(norm2(h))``, its norms, SwiGLU and
residual adds each a kernel of their own between the GEMVs. At one token this module's forward, installed on the
layer instance (the class and every attribute stay), hands the layer's ``x`` to ``q_proj`` un-normalized and the
residual to ``o_proj`` (each for that one call), so the qkv GEMV applies ``norm1`` in its prologue and o's adds the
residual in its epilogue; then ``mlp.fused_decode`` runs norm2 + gate_up + SwiGLU and down + the residual as two
GEMVs (:func:`autoopt.nn.fused_linear.quant_linear_fused`). Attention (rope, the cache, the kernel) is the layer's
own. Other calls (a prompt, a batch, autograd, positional arguments) run the layer's own forward.

A layer is fused only where its forward is known to be that pattern (:data:`LAYERS`, by class name: the forward is
code, not structure) and its parts are optimize()'s quantized replacements: RMSNorms without Gemma's unit offset,
the fused quantized q/k/v, a quantized o_proj, a quantized gated MLP with SiLU and a quantized down projection.

Measured (H200, Llama-3-8B int4, 2026-11-29): a graphed 32-layer chain of these kernels alone ran 1.13x the
separate ones (``benchmarks/results/h200/fused_chain_int4*.json``), but in the model, where the compiled default
already fuses Inductor's add + norm, the compiled step replayed from a CUDA graph took 2.859 ms against the
default's 2.691 (``h200/quant_trace_decode_layer_sk1.json``): the fused GEMVs cost more than the launches they save
(the norm prologue re-reads x per program; down runs at split-K 1). So not in the default ops.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from autoopt.backend.kernels import interpreter_active
from autoopt.nn.modules import AutooptRMSNorm
from autoopt.nn.quant_modules import (
    ARMED,
    ArmableQuantLinear,
    ArmableQuantQKV,
    AutooptQuantGatedMLP,
    AutooptQuantLinear,
    AutooptQuantQKV,
)

__all__ = ["LAYERS", "install", "installed", "uninstall", "why_not"]

#: decoder-layer classes whose forward is ``h = x + self_attn(input_layernorm(x)); h + mlp(post_attention_layernorm
#: (h))`` with every keyword passed on to ``self_attn`` (read in transformers 5.17 and 5.24)
LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")
_MARK = "_autoopt_decode_layer"


def why_not(layer: nn.Module) -> str | None:
    """Why ``layer`` cannot run the fused decode step (None: it can)."""
    name = type(layer).__name__
    if name not in LAYERS:
        return f"{name}: not a decoder layer whose forward is known ({', '.join(LAYERS)})"
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None))
    if not all(isinstance(n, AutooptRMSNorm) and not n.unit_offset for n in norms):
        return f"{name}: its norms are not autoopt RMSNorms (without a unit offset)"
    if not isinstance(getattr(attn, "q_proj", None), AutooptQuantQKV):
        return f"{name}: q/k/v are not one quantized GEMM"
    if not isinstance(getattr(attn, "o_proj", None), AutooptQuantLinear):
        return f"{name}: o_proj is not quantized"
    if not (isinstance(mlp, AutooptQuantGatedMLP) and mlp.activation == "silu"
            and isinstance(mlp.down_proj, AutooptQuantLinear)):
        return f"{name}: the MLP is not a quantized SwiGLU with a quantized down projection"
    return None


def _one_token(norm: AutooptRMSNorm, x: torch.Tensor) -> bool:
    """Whether this call is a fused decode step: one token, no autograd, where the kernels run."""
    if x.numel() != x.shape[-1] or (torch.is_grad_enabled() and x.requires_grad):
        return False
    if x.device.type != "cuda" and not (x.device.type == "cpu" and interpreter_active()):
        return False
    return bool(x.dtype == norm.weight.dtype)


def _fused_forward(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    # self: an eligible decoder layer (why_not said so), its children typed by that check
    if args or not _one_token(self.input_layernorm, hidden_states):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    attn = self.self_attn
    q_proj, o_proj = attn.q_proj, attn.o_proj
    q_proj._autoopt_armed.append(self.input_layernorm)
    o_proj._autoopt_armed.append(hidden_states)
    try:
        out = attn(hidden_states=hidden_states, **kwargs)
    finally:  # each is taken by its one call; a failed call leaves nothing for the next
        q_proj._autoopt_armed.clear()
        o_proj._autoopt_armed.clear()
    h = out[0] if isinstance(out, tuple) else out
    return self.mlp.fused_decode(h, self.post_attention_layernorm)


#: the class each armed part takes while its layer is fused, and the class it goes back to
_ARMABLE = {AutooptQuantQKV: ArmableQuantQKV, AutooptQuantLinear: ArmableQuantLinear}
_PLAIN = {v: k for k, v in _ARMABLE.items()}


def install(root: nn.Module) -> int:
    """Give every eligible decoder layer under ``root`` the fused decode forward (its q_proj and o_proj the classes
    that take what the forward hands them); returns how many."""
    count = 0
    for module in list(root.modules()):
        if why_not(module) is None and _MARK not in module.__dict__:
            attn: Any = module.self_attn
            for part in (attn.q_proj, attn.o_proj):
                part.__class__ = _ARMABLE.get(type(part), type(part))
                part.__dict__[ARMED] = []
            module.__dict__["forward"] = types.MethodType(_fused_forward, module)
            module.__dict__[_MARK] = True
            count += 1
    return count


def installed(root: nn.Module) -> int:
    """How many layers under ``root`` run the fused decode forward."""
    return sum(1 for m in root.modules() if _MARK in m.__dict__)


def uninstall(root: nn.Module) -> int:
    """Give the layers back their class's forward (and their q_proj and o_proj their classes); returns how many."""
    count = 0
    for module in list(root.modules()):
        if type(module) in _PLAIN:
            module.__class__ = _PLAIN[type(module)]
            module.__dict__.pop(ARMED, None)
        if module.__dict__.pop(_MARK, None):
            module.__dict__.pop("forward", None)
            count += 1
    return count
