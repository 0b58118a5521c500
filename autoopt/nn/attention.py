"""transformers' attention at decode on autoopt's decode-attention kernel; everything else stays SDPA.

Why: transformers' SDPA path over a static cache always passes a mask, and under a mask it copies K and V to every
query head (``repeat_kv``) before cuDNN's SDPA reads them, over the cache's whole length. On an H200 (Llama-3-8B
heads, each call replayed from a CUDA graph over KV copies, ``benchmarks/results/h200/
decode_attention_probe_loops.json``) that took 18 us at one row over 192 keys, 161 us at 32 rows, 696 us at 8 rows
over 4096 keys; this module's kernel, which reads each KV head once, 8.7, 17.5 and 47.5 us at the config it picks
(SDPA with ``enable_gqa``, which transformers does not call under a mask, 11.2, 16.9 and 48.6 us). The graphed eager
8-layer Llama-3-8B step at batch 32 measured 1.87 ms in bf16 with it and 2.84 without, on two H200 hosts the same
day (``h200/regret_1gpu_layers8_run4.json``, ``_run3.json``; not a same-run pair).

:func:`install` registers :data:`NAME` with transformers' ``AttentionInterface`` (this module's
:func:`attention_forward`) and its ``AttentionMaskInterface`` (:func:`causal_mask`: SDPA's boolean masks, but no
mask for an unpadded prompt under ``torch.compile`` too, see there), and points the model's config at it where the
config said ``"sdpa"``. :func:`attention_forward` runs the kernel for one query
token a row (decode) on a CUDA device (or in fp16 under Triton's interpreter) in fp16/bf16, heads a whole number
of groups, a power-of-two head size up to 256, a boolean mask or none, no dropout, softcap, sinks or position
bias, static shapes, no grad (under torch.compile through :func:`traced_decode_attention`); anything else goes
to transformers' own ``sdpa_attention_forward`` with the same arguments. :func:`uninstall` (``restore()``) puts
the config back.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from autoopt.backend.kernels import interpreter_active
from autoopt.kernels.attention import DecodeAttentionChoice, decode_attention_choice, supported_head_dim
from autoopt.nn import dispatch
from autoopt.nn.ops import _traced

__all__ = ["NAME", "attention_forward", "causal_mask", "decode_attention", "install", "installed", "runs_on",
           "traced_decode_attention", "uninstall", "why_not"]

#: the attention implementation name optimize() registers with transformers
NAME = "autoopt"
_ATTR = "_autoopt_attn_implementation"
_CHOICES: dict[tuple[Any, ...], DecodeAttentionChoice] = {}
_MAX_CHOICES = 4096


def install(model: Any) -> bool:
    """Point ``model``'s attention at :func:`attention_forward` where its config runs SDPA through transformers'
    ``AttentionInterface``; False (nothing changed) for a model without a transformers config, with another
    attention implementation, or whose attention code is its own."""
    config: Any = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or _ATTR in model.__dict__:
        return False
    # only models whose attention dispatches through AttentionInterface by name: others (Falcon, ...) branch on
    # the string "sdpa" in their own code, and another name would change their path
    if not getattr(type(model), "_supports_attention_backend", False):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, causal_mask)
    model.__dict__[_ATTR] = config._attn_implementation
    config._attn_implementation = NAME  # transformers' setter passes it on to the sub-configs
    return True


def causal_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """transformers' ``sdpa_mask``, except that a causal prompt attending only to itself with no padding mask
    (query length = key length > 1, static ``int`` lengths, no offset, window or custom mask function) gets no mask
    under ``torch.compile`` either, so SDPA runs with ``is_causal=True``.

    Why: transformers builds that mask whenever torch is tracing (with torch < 2.14 it cannot tell a compile from
    an export, where a baked-in ``is_causal`` would be wrong for other lengths), and under a full [q, k] mask
    SDPA cannot skip the masked half: on an H200 the 32 attention calls of Llama-3-8B's compiled 1 x 2048 prefill
    took 8.63 ms with the mask against 2.68 ms causal, uncompiled, the same process
    (``benchmarks/results/h200/prefill_profile_int4.json``). Only Python ``int`` lengths qualify: a compile with
    dynamic shapes (or an export) sees symbolic ones and gets transformers' mask, as before. A forward with
    ``use_cache=False`` keeps transformers' mask too: it then checks the positions for packed sequences, which it
    cannot read while tracing, and hands over a mask function this does not take for the plain causal one."""
    if not args and _plain_causal_prompt(kwargs):
        return None
    from transformers.masking_utils import sdpa_mask

    out: Tensor | None = sdpa_mask(*args, **kwargs)
    return out


def _plain_causal_prompt(kw: dict[str, Any]) -> bool:
    """Whether transformers' mask call ``kw`` is the causal mask of a whole unpadded prompt (see :func:`causal_mask`),
    for the signatures of transformers 5.17 (``cache_position``) and 5.24 (``q_length``, ``q_offset``)."""
    from transformers.masking_utils import causal_mask_function

    q_len = kw.get("q_length")
    if q_len is None and isinstance(kw.get("cache_position"), Tensor):
        q_len = kw["cache_position"].shape[0]
    kv_len, q_off, kv_off = kw.get("kv_length"), kw.get("q_offset", 0), kw.get("kv_offset", 0)
    return (type(q_len) is int and type(kv_len) is int and q_len == kv_len > 1
            and type(q_off) is int and q_off == 0 and type(kv_off) is int and kv_off == 0
            and kw.get("attention_mask") is None and kw.get("local_size") is None
            and kw.get("mask_function", causal_mask_function) is causal_mask_function
            and kw.get("allow_is_causal_skip", True) is True)


def runs_on(device: Any) -> bool:
    """Whether the kernel can run for a model on ``device``: a CUDA device, or Triton's interpreter on the CPU."""
    return getattr(device, "type", str(device)) == "cuda" or interpreter_active()


def installed(model: Any) -> bool:
    return _ATTR in getattr(model, "__dict__", {})


def uninstall(model: Any) -> bool:
    """Give ``model`` back the attention implementation :func:`install` replaced; True if it had."""
    previous = getattr(model, "__dict__", {}).pop(_ATTR, None)
    if previous is None:
        return False
    model.config._attn_implementation = previous
    return True


def attention_forward(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                      **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention-function signature: ``query`` [B, H, q, D], ``key``/``value`` [B, Hkv, L, D];
    returns ([B, q, H, D], None). Decode on autoopt's kernel where :func:`why_not` says None, else SDPA."""
    if why_not(module, query, key, value, attention_mask, dropout, kwargs) is None:
        mask = None if attention_mask is None else attention_mask[:, 0, 0, :].expand(query.shape[0], key.shape[2])
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        if torch.compiler.is_compiling():  # the launch as one node of the compiled graph
            masks = () if mask is None else (mask,)
            return traced_decode_attention(query[:, :, 0, :], key, value, scale, *masks), None
        return decode_attention(query[:, :, 0, :], key, value, mask, scale), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out: tuple[Tensor, None] = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                                      scaling=scaling, is_causal=is_causal, **kwargs)
    return out


def why_not(module: Any, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout: float,
            kwargs: dict[str, Any]) -> str | None:
    """Why this call stays SDPA (None: it runs autoopt's decode kernel)."""
    checks = (
        (query.dim() == 4 and key.dim() == 4 and value.dim() == 4, "not [B, H, q, D] tensors"),
        (all(type(s) is int for s in (*query.shape, *key.shape)), "symbolic shapes"),
        (query.shape[2] == 1, "more than one query token a row (prefill)"),
        # the interpreter's bf16 tl.dot is wrong (triton 3.9): on the CPU only fp16 runs the kernel
        (query.device.type == "cuda" or (interpreter_active() and query.dtype == torch.float16),
         "not on a CUDA device (nor fp16 under Triton's interpreter)"),
        (query.dtype in (torch.float16, torch.bfloat16) and key.dtype == value.dtype == query.dtype,
         "dtype other than fp16/bf16"),
        (supported_head_dim(query.shape[-1]) and key.shape[-1] == value.shape[-1] == query.shape[-1],
         "head size not a power of two 16-256"),
        (key.shape[1] > 0 and query.shape[1] % key.shape[1] == 0 and key.shape[:3] == value.shape[:3]
         and key.shape[0] == query.shape[0], "heads not whole groups of the KV heads"),
        (query.stride(-1) == key.stride(-1) == value.stride(-1) == 1, "head dim not contiguous"),
        (not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad)), "grad needed"),
        (dropout == 0.0 or not getattr(module, "training", False), "dropout"),
        (all(kwargs.get(k) is None for k in ("softcap", "s_aux", "sinks", "position_bias")),
         "softcap, sinks or position bias"),
        (mask is None or _bool_row_mask(mask, query.shape[0], key.shape[2]), "mask not a boolean [B|1, 1, 1, L]"),
    )
    return next((why for ok, why in checks if not ok), None)


def _bool_row_mask(mask: Tensor, batch: int, keys: int) -> bool:
    return (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[0] in (1, batch)
            and mask.shape[1] == mask.shape[2] == 1 and mask.shape[3] == keys)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """One query token a row: ``q`` [B, H, D], ``k``/``v`` [B, Hkv, L, D], ``mask`` None or [B, L] bool (or uint8);
    [B, 1, H, D], on the config :func:`choice` picks."""
    from autoopt.backend.kernels.decode_attention import decode_attention as launch

    c = choice(q.device, batch=q.shape[0], heads=q.shape[1], kv_heads=k.shape[1], keys=k.shape[2],
               head_dim=q.shape[2])
    out: Tensor = launch(q, k, v, mask, scale=scale, block_n=c.BLOCK_N, splits=c.splits, num_warps=c.num_warps)
    return out


@_traced
def traced_decode_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, *mask: Tensor) -> Tensor:
    """:func:`decode_attention` as ``torch.compile`` traces it (a non-strict trace of the launch; the mask as a
    ``uint8`` copy, which Inductor fuses into the mask's own computation: a ``uint8`` view of the bool tensor
    failed Inductor's lowering on the H200, ``h200/quant_e2e_attention_compile_failed.json``)."""
    return decode_attention(q, k, v, mask[0].to(torch.uint8).contiguous() if mask else None, scale)


def choice(device: Any, *, batch: int, heads: int, kv_heads: int, keys: int, head_dim: int) -> DecodeAttentionChoice:
    """:func:`~autoopt.kernels.attention.decode_attention_choice` for the GPU the dispatch ranks ``device``'s
    kernels for, cached per shape (a decode step asks once a layer; ~15 candidates priced, tens of us, on a miss)."""
    gpu = dispatch.gpu_for(device)
    key = (None if gpu is None else (gpu.name, gpu.sm_count, gpu.bandwidth_gbs), batch, heads, kv_heads, keys,
           head_dim)
    hit = _CHOICES.get(key)
    if hit is None:
        if len(_CHOICES) >= _MAX_CHOICES:  # a growing cache (a new key count every step) must not grow this
            _CHOICES.clear()
        hit = _CHOICES[key] = decode_attention_choice(gpu, batch=batch, heads=heads, kv_heads=kv_heads, keys=keys,
                                                      head_dim=head_dim)
    return hit
