"""Decode attention: one query token a row over a KV cache with grouped-query heads (split-key flash decoding).

``_decode_attention_split``: one program a (row, KV head, key split) loads the KV head's group of query heads
(padded to 16 rows for ``tl.dot``), walks its share of the keys ``BLOCK_N`` at a time with an online softmax, and
writes a partial output and its log-sum-exp; ``_decode_attention_combine`` weighs the splits together. K and V are
read once per KV head, not once per query head: transformers' SDPA path under a mask first copies them to every
query head (``repeat_kv``). A boolean mask row (True: attend; transformers' SDPA mask) hides keys; a first pass
over a split's mask bytes finds its last kept key, and the loop reads K/V only up to it (a static cache's slots past
the current position are not read) without a branch on each block's mask. On the H200 each shape's fastest config
took 0.80-0.99 of the time of the fastest with a branch on each block (``benchmarks/results/h200/
decode_attention_probe_loops.json``, same process; config by config 0.43-2.0, median 0.84: the pass costs most
where many programs each have few keys). Config (``BLOCK_N``, splits, warps) and price:
:mod:`autoopt.kernels.attention`.
"""

from __future__ import annotations

import math
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import traceable

__all__ = ["decode_attention"]


# The @triton.jit kernels carry no annotations on purpose (Triton would read them as types); each
# is exempt from mypy's no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _decode_attention_split(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, lse_ptr,  # type: ignore[no-untyped-def]
                            scale, keys, kv_heads, splits, chunk,
                            sq_b, sq_h, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sm_b, sm_n, so_b, so_h, so_s,
                            GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                            HAS_MASK: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // kv_heads
    h = pid % kv_heads
    start = split * chunk
    end = tl.minimum(start + chunk, keys)
    rows = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sq_b + (h * GROUP + rows)[:, None] * sq_h + d[None, :],
                mask=(rows < GROUP)[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    kp = k_ptr + b * sk_b + h * sk_h
    vp = v_ptr + b * sv_b + h * sv_h
    last = end - 1
    if HAS_MASK:
        # one pass over the split's mask bytes finds its last kept key; the loop then reads K/V without a branch
        # on each block's mask, so its loads need not wait on one (H200: 0.62-0.99 of the branching loop's time,
        # benchmarks/results/h200/decode_attention_probe_loops.json); a static cache's slots past the current
        # position are not read
        last = start - 1
        for m0 in range(start, end, 1024):
            nm = m0 + tl.arange(0, 1024)
            kept = tl.load(mask_ptr + b * sm_b + nm * sm_n, mask=nm < end, other=0) != 0
            last = tl.maximum(last, tl.max(tl.where(kept, nm, start - 1), 0))
    for n0 in range(start, last + 1, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        live = n <= last
        k = tl.load(kp + n[:, None] * sk_n + d[None, :], mask=live[:, None], other=0.0)
        v = tl.load(vp + n[:, None] * sv_n + d[None, :], mask=live[:, None], other=0.0)
        if HAS_MASK:
            live = live & (tl.load(mask_ptr + b * sm_b + n * sm_n, mask=live, other=0) != 0)
        # .to: under torch.compile Inductor passes the Python float `scale` as fp64 (H200, torch 2.11), and the
        # loop's state must stay fp32
        s = tl.where(live[None, :], (tl.dot(q, tl.trans(k)) * scale).to(tl.float32), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row the mask has hidden so far: no NaN
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    heads = h * GROUP + rows
    keep = rows < GROUP
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + b * so_b + heads[:, None] * so_h + split * so_s + d[None, :], out, mask=keep[:, None])
    lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))  # an empty split: -inf
    tl.store(lse_ptr + (b * (kv_heads * GROUP) + heads) * splits + split, lse, mask=keep)


@triton.jit
def _decode_attention_combine(o_ptr, lse_ptr, out_ptr, splits, so_b, so_h, so_s,  # type: ignore[no-untyped-def]
                              sout_b, sout_h, heads, SPLITS_PAD: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // heads
    h = pid % heads
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, D)
    lse = tl.load(lse_ptr + pid * splits + s, mask=s < splits, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.where(lse > float("-inf"), tl.exp(lse - top), 0.0)  # a row no key reaches: zeros, not NaN
    w = w / tl.maximum(tl.sum(w, 0), 1e-30)
    part = tl.load(o_ptr + b * so_b + h * so_h + s[:, None] * so_s + d[None, :], mask=(s < splits)[:, None],
                   other=0.0)
    out = tl.sum(part * w[:, None], 0)
    tl.store(out_ptr + b * sout_b + h * sout_h + d, out.to(out_ptr.dtype.element_ty))


def decode_attention(q: Any, k: Any, v: Any, mask: Any, *, scale: float, block_n: int, splits: int,
                     num_warps: int = 4) -> Any:
    """Attention of one query token a row: ``q`` [B, H, D], ``k``/``v`` [B, Hkv, L, D] (unit stride on D; any
    other strides), ``mask`` None or [B, L] bool (True: attend; stride 0 along B broadcasts one row); returns
    [B, 1, H, D] in q's dtype, the layout transformers' attention functions return. Launched through
    :func:`~autoopt.backend.kernels.traceable`, so ``torch.compile`` puts both kernels into its graph (a ``uint8``
    mask there: Inductor cannot lower a bool tensor viewed as one)."""
    import torch

    batch, heads, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    group = heads // kv_heads
    chunk = triton.cdiv(triton.cdiv(keys, splits), block_n) * block_n
    part = torch.empty((batch, heads, splits, dim), device=q.device, dtype=torch.float32)
    lse = torch.empty((batch, heads, splits), device=q.device, dtype=torch.float32)
    out = torch.empty((batch, 1, heads, dim), device=q.device, dtype=q.dtype)
    m = q  # any pointer: HAS_MASK=False never reads it
    if mask is not None:
        m = mask if mask.dtype == torch.uint8 else mask.view(torch.uint8)
    sm_b, sm_n = (mask.stride(0), mask.stride(1)) if mask is not None else (0, 0)
    traceable(_decode_attention_split)[(batch * kv_heads, splits)](
        q, k, v, m, part, lse, scale, keys, kv_heads, splits, chunk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        sm_b, sm_n, part.stride(0), part.stride(1), part.stride(2),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=dim, BLOCK_N=block_n,
        HAS_MASK=mask is not None, num_warps=num_warps)
    traceable(_decode_attention_combine)[(batch * heads,)](
        part, lse, out, splits, part.stride(0), part.stride(1), part.stride(2), out.stride(0), out.stride(2), heads,
        SPLITS_PAD=max(2, triton.next_power_of_2(splits)), D=dim, num_warps=1)
    return out


def reference(q: Any, k: Any, v: Any, mask: Any, scale: float | None = None) -> Any:
    """float64 attention of one query token over the keys ``mask`` keeps (all when None), heads grouped: [B, H, D]."""
    import torch

    group = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("bhd,bhnd->bhn", q.double(), kk) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s.masked_fill(~mask.to(k.device)[:, None, :], float("-inf"))
    return torch.nan_to_num(torch.einsum("bhn,bhnd->bhd", s.softmax(-1), vv))
