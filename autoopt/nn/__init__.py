"""Torch-facing ops: ``autoopt.nn.linear`` & co. run autoopt's ranked Triton kernels.

Each op is a ``torch.library.custom_op`` (namespace ``autoopt``, with a fake implementation), so it
works in eager mode, under ``torch.compile(fullgraph=True)`` and inside CUDA-graph capture; where no
Triton kernel applies it runs the torch op and says why once through ``logging``::

    import autoopt.nn as ann
    y = ann.linear(x, weight, bias)           # GEMM for M > 16, GEMV for M <= 16
    h = ann.rms_norm(x, weight, eps=1e-6)
    a = ann.swiglu(gate_up)                   # silu(gate_up[..., :I]) * gate_up[..., I:]
    y = ann.quant_linear(x, q.qweight, q.scales, q.offsets, b, weight="int4-g128", k=K)  # a packed weight

``autoopt.nn.ops`` holds the ops, ``autoopt.nn.dispatch`` the per-shape config choice. The names
below load lazily: ``import autoopt.nn`` imports neither torch nor triton, the first op does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoopt._lazy import lazy_attributes

_LAZY = {
    "linear": "autoopt.nn.ops",
    "quant_linear": "autoopt.nn.ops",
    "rms_norm": "autoopt.nn.ops",
    "layer_norm": "autoopt.nn.ops",
    "silu_mul": "autoopt.nn.ops",
    "gelu_tanh_mul": "autoopt.nn.ops",
    "swiglu": "autoopt.nn.ops",
    "add": "autoopt.nn.ops",
    "Choice": "autoopt.nn.dispatch",
    "choices": "autoopt.nn.dispatch",
    "set_profile": "autoopt.nn.dispatch",
}

__all__ = [*_LAZY]

if TYPE_CHECKING:  # pragma: no cover
    from autoopt.nn.dispatch import Choice as Choice
    from autoopt.nn.dispatch import choices as choices
    from autoopt.nn.dispatch import set_profile as set_profile
    from autoopt.nn.ops import add as add
    from autoopt.nn.ops import gelu_tanh_mul as gelu_tanh_mul
    from autoopt.nn.ops import layer_norm as layer_norm
    from autoopt.nn.ops import linear as linear
    from autoopt.nn.ops import quant_linear as quant_linear
    from autoopt.nn.ops import rms_norm as rms_norm
    from autoopt.nn.ops import silu_mul as silu_mul
    from autoopt.nn.ops import swiglu as swiglu


__getattr__, __dir__ = lazy_attributes("autoopt.nn", _LAZY, globals(), __all__)
