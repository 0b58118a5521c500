"""A Llama-shaped model in plain torch, and its placement over devices, for checking predictions on silicon.

Llama-3-8B's shapes with only a few layers (hidden 4096, 32 heads, 8 KV heads, head_dim 128, MLP 14336,
vocab 128256; RMSNorm, SwiGLU, RoPE, GQA through ``scaled_dot_product_attention``), random bf16 weights
made directly on the device, and a preallocated KV cache. The layer is written as transformers'
``LlamaDecoderLayer``, so the same tensors are live at the same time as in a real serving stack.

This module imports torch at load: only the check functions import it, inside themselves, so
``import autoopt.validation`` stays torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autoopt.planning.model import ModelSpec
from autoopt.validation.device import resolve_device
from autoopt.validation.workload import check_buildable

__all__ = ["RMS_EPS", "ROPE_THETA", "LlamaLike", "Stages", "build_model", "place", "rotate_half"]

#: Meta-Llama-3-8B config.json: rope_theta 500000, rms_norm_eps 1e-5 (not held by ModelSpec).
ROPE_THETA = 500000.0
RMS_EPS = 1e-5

#: pipeline stages in order: the layers of each and the device that runs them.
Stages = Sequence[tuple[range, torch.device]]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """GQA attention; on CUDA pinned to the flash backend (supports enable_gqa; the math fallback would
    materialise the [B, heads, q, k] score matrix and change both memory and time)."""
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, *, device: Any, dtype: torch.dtype, eps: float = RMS_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    """Q/K/V/O projections without bias, RoPE, a preallocated [batch, kv_heads, context, head_dim] cache."""

    k_cache: torch.Tensor | None
    v_cache: torch.Tensor | None

    def __init__(self, spec: ModelSpec, *, device: Any, dtype: torch.dtype) -> None:
        super().__init__()
        h, n, kv, d = spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = n, kv, d  # read by autoopt.model.from_module
        self.q_proj = nn.Linear(h, n * d, bias=False, device=device, dtype=dtype)
        self.k_proj = nn.Linear(h, kv * d, bias=False, device=device, dtype=dtype)
        self.v_proj = nn.Linear(h, kv * d, bias=False, device=device, dtype=dtype)
        self.o_proj = nn.Linear(n * d, h, bias=False, device=device, dtype=dtype)
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: int) -> torch.Tensor:
        b, t, _ = x.shape
        if t > 1 and pos != 0:
            raise ValueError(f"a multi-token step must start at position 0 (got {t} tokens at {pos}): "
                             "chunked prefill is not implemented here")
        if self.k_cache is None or self.v_cache is None:
            raise ValueError("no KV cache: call LlamaLike.allocate_kv first")
        n, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(b, t, n, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, kv, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, kv, d).transpose(1, 2)
        c, s = cos[pos:pos + t], sin[pos:pos + t]
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        self.k_cache[:, :, pos:pos + t] = k
        self.v_cache[:, :, pos:pos + t] = v
        o = _sdpa(q, self.k_cache[:, :, :pos + t], self.v_cache[:, :, :pos + t], causal=t > 1)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, n * d))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), as transformers' LlamaMLP."""

    def __init__(self, spec: ModelSpec, *, device: Any, dtype: torch.dtype) -> None:
        super().__init__()
        h, i = spec.hidden_size, spec.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False, device=device, dtype=dtype)
        self.up_proj = nn.Linear(h, i, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(i, h, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block written as transformers' LlamaDecoderLayer (same tensors live at the same time)."""

    def __init__(self, spec: ModelSpec, *, device: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, device=device, dtype=dtype)
        self.self_attn = Attention(spec, device=device, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, device=device, dtype=dtype)
        self.mlp = MLP(spec, device=device, dtype=dtype)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: int) -> torch.Tensor:
        residual = h
        x = self.input_layernorm(h)
        x = self.self_attn(x, cos, sin, pos)
        h = residual + x
        residual = h
        x = self.post_attention_layernorm(h)
        x = self.mlp(x)
        return residual + x


class LlamaLike(nn.Module):
    """Embedding, decoder layers, final norm, untied LM head on the last token of each sequence (fp32 logits)."""

    def __init__(self, spec: ModelSpec, *, device: Any, dtype: torch.dtype, max_context: int,
                 rope_theta: float = ROPE_THETA) -> None:
        super().__init__()
        check_buildable(spec)
        device = resolve_device(device)
        self.spec, self.dtype, self.max_context, self.rope_theta = spec, dtype, max_context, rope_theta
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(spec, device=device, dtype=dtype)
                                    for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, device=device, dtype=dtype)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device, dtype=dtype)
        self._rope: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.rope(device)

    def _layer(self, i: int) -> DecoderLayer:
        layer = self.layers[i]
        assert isinstance(layer, DecoderLayer)
        return layer

    def rope(self, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables [max_context, head_dim] in the model dtype, one pair per device."""
        device = resolve_device(device)
        key = str(device)
        if key not in self._rope:
            d = self.spec.head_dim
            inv = 1.0 / self.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
            freqs = torch.outer(torch.arange(self.max_context, device=device, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            self._rope[key] = (emb.cos().to(self.dtype), emb.sin().to(self.dtype))
        return self._rope[key]

    def rope_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self._rope.values() for t in pair)

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def allocate_kv(self, batch: int, context: int) -> int:
        """Preallocate each layer's K and V cache on the layer's device; returns their bytes."""
        if context > self.max_context:
            raise ValueError(f"context {context} exceeds the RoPE table ({self.max_context} positions)")
        s = self.spec
        for i in range(len(self.layers)):
            attn = self._layer(i).self_attn
            dev = attn.q_proj.weight.device
            shape = (batch, s.num_kv_heads, context, s.head_dim)
            attn.k_cache = torch.zeros(shape, device=dev, dtype=self.dtype)
            attn.v_cache = torch.zeros(shape, device=dev, dtype=self.dtype)
        return self.kv_bytes()

    def kv_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for i in range(len(self.layers))
                   for t in (self._layer(i).self_attn.k_cache, self._layer(i).self_attn.v_cache) if t is not None)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)

    def run_layers(self, h: torch.Tensor, layers: range, pos: int) -> torch.Tensor:
        # As transformers' LlamaModel: the caller's reference keeps each layer's input alive during the layer.
        cos, sin = self.rope(h.device)
        for i in layers:
            h = self.layers[i](h, cos, sin, pos)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h[:, -1])).float()

    def forward(self, ids: torch.Tensor, pos: int = 0) -> torch.Tensor:
        return self.head(self.run_layers(self.embed(ids), range(len(self.layers)), pos))


def build_model(spec: ModelSpec, *, device: Any, dtype: torch.dtype = torch.bfloat16, max_context: int,
                seed: int = 0) -> LlamaLike:
    """Random-weight model of ``spec`` made directly on ``device`` (weights initialised in place)."""
    torch.manual_seed(seed)
    return LlamaLike(spec, device=device, dtype=dtype, max_context=max_context).eval()


def place(model: LlamaLike, stages: Stages) -> None:
    """Move layers to their stage's device (KV caches follow); embedding first, norm + head last."""
    n = len(model.layers)
    flat = [i for rng, _ in stages for i in rng]
    if flat != list(range(n)):
        got = [(r.start, r.stop) for r, _ in stages]
        raise ValueError(f"stages must cover layers 0..{n - 1} in order once, got {got}")
    model.embed_tokens.to(stages[0][1])
    for rng, dev in stages:
        for i in rng:
            model.layers[i].to(dev)
        model.rope(dev)
    model.norm.to(stages[-1][1])
    model.lm_head.to(stages[-1][1])
