"""Probe: would a split-key decode attention kernel beat the cuDNN SDPA kernel transformers runs at decode?

Issue 27's graphed int4 step on an H200 spends ~0.22 ms a step in attention (cuDNN's SDPA flash kernel, 6.7 us a
layer over ~190 keys, against a ~0.4 us roofline; ``ATTENTION_DECODE_MIN_US``) and ~0.21 ms in the rotary and
layout kernels Inductor builds around it (``h200/quant_trace_int4_words_ingraph.json``). Before any of it goes
into optimize(), this times a flash-decoding kernel (one query token, grouped-query heads) beside torch's SDPA
on the same tensors, in one process.

``decode_attention``: one program a (batch, KV head, key split) loads the KV head's group of query heads
(padded to 16 rows for ``tl.dot``), walks its share of the keys in ``BLOCK_N`` blocks with an online softmax,
and writes a partial output and its log-sum-exp; a second kernel combines the splits. Keys at or past a row's
``lengths`` entry are masked (what the static cache's causal mask does at decode).

Per shape (batch, keys) it records: torch SDPA with the boolean mask transformers passes (the repeated K/V it
builds for grouped heads first, as transformers <= 5.23 does under a mask) and SDPA with ``enable_gqa``; and each
config of ``decode_attention`` (``BLOCK_N`` x splits x warps), all checked against a float64 reference first
(relative error under 1e-2) and timed with ``do_bench`` (median, us). Only checked outputs get a time.

    PYTHONPATH=. python benchmarks/probes/decode_attention_probe.py --out $OUT/decode_attention_probe.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: Llama-3-8B: 32 query heads over 8 KV heads of 128
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
#: (batch, keys): the decode steps the benchmarks run (192 keys: a 128-token prompt + 64) and longer contexts
SHAPES = ((1, 192), (1, 1024), (1, 4096), (8, 192), (32, 192), (8, 4096))
CONFIGS = tuple((bn, splits, warps) for bn in (32, 64, 128) for splits in (1, 2, 4, 8, 16) for warps in (4,))
GROUP_ROWS = 16  # tl.dot's smallest M: a KV head's query heads padded to it


@triton.jit
def _decode_attention_split(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, lse_ptr, scale, keys, kv_heads, splits,
                            sq_b, sq_h, sk_b, sk_h, sk_n, so_b, so_h, so_s,
                            GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // kv_heads
    h = pid % kv_heads
    length = tl.load(len_ptr + b)
    chunk = tl.cdiv(tl.cdiv(keys, splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    rows = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sq_b + (h * GROUP + rows)[:, None] * sq_h + d[None, :],
                mask=(rows < GROUP)[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    kv = k_ptr + b * sk_b + h * sk_h
    vv = v_ptr + b * sk_b + h * sk_h
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        live = n < end
        k = tl.load(kv + n[:, None] * sk_n + d[None, :], mask=live[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vv + n[:, None] * sk_n + d[None, :], mask=live[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    heads = h * GROUP + rows
    keep = rows < GROUP
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + b * so_b + heads[:, None] * so_h + split * so_s + d[None, :], out, mask=keep[:, None])
    lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))  # an empty split: -inf
    tl.store(lse_ptr + (b * (kv_heads * GROUP) + heads) * splits + split, lse, mask=keep)


@triton.jit
def _decode_attention_combine(o_ptr, lse_ptr, out_ptr, splits, so_b, so_h, so_s, sout_b, sout_h, heads,
                              SPLITS_PAD: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // heads
    h = pid % heads
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, D)
    lse = tl.load(lse_ptr + pid * splits + s, mask=s < splits, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))
    w = w / tl.sum(w, 0)
    part = tl.load(o_ptr + b * so_b + h * so_h + s[:, None] * so_s + d[None, :], mask=(s < splits)[:, None],
                   other=0.0)
    out = tl.sum(part * w[:, None], 0)
    tl.store(out_ptr + b * sout_b + h * sout_h + d, out.to(out_ptr.dtype.element_ty))


def decode_attention(q: Any, k: Any, v: Any, lengths: Any, *, block_n: int = 64, splits: int = 4,
                     num_warps: int = 4) -> Any:
    """Attention of one query token a row: ``q`` [B, H, D], ``k``/``v`` [B, Hkv, L, D] (unit stride on D),
    ``lengths`` [B] int32 (keys a row attends to); [B, H, D] in q's dtype."""
    import torch

    batch, heads, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    group = heads // kv_heads
    part = torch.empty((batch, heads, splits, dim), device=q.device, dtype=torch.float32)
    lse = torch.empty((batch, heads, splits), device=q.device, dtype=torch.float32)
    _decode_attention_split[(batch * kv_heads, splits)](
        q, k, v, lengths, part, lse, 1.0 / math.sqrt(dim), keys, kv_heads, splits,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        part.stride(0), part.stride(1), part.stride(2),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=dim, BLOCK_N=block_n, num_warps=num_warps)
    out = torch.empty_like(q)
    _decode_attention_combine[(batch * heads,)](
        part, lse, out, splits, part.stride(0), part.stride(1), part.stride(2), out.stride(0), out.stride(1), heads,
        SPLITS_PAD=max(2, triton.next_power_of_2(splits)), D=dim, num_warps=1)
    return out


def reference(q: Any, k: Any, v: Any, lengths: Any) -> Any:
    """float64 attention of one query token over each row's first ``lengths`` keys, heads grouped."""
    import torch

    group = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("bhd,bhnd->bhn", q.double(), kk) / math.sqrt(q.shape[-1])
    live = torch.arange(k.shape[2], device=k.device)[None, :] < lengths[:, None].to(k.device)
    s = s.masked_fill(~live[:, None, :], float("-inf"))
    return torch.einsum("bhn,bhnd->bhd", s.softmax(-1), vv)


def inputs(batch: int, keys: int, dtype: Any, device: str, seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """q [B, H, D], K and V [B, Hkv, keys, D] (a static cache's layout), every row attending to all but the
    cache's last 8 slots (a step inside a longer cache)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn((batch, HEADS, HEAD_DIM), generator=g).to(device, dtype)
    k = torch.randn((batch, KV_HEADS, keys, HEAD_DIM), generator=g).to(device, dtype)
    v = torch.randn((batch, KV_HEADS, keys, HEAD_DIM), generator=g).to(device, dtype)
    lengths = torch.full((batch,), max(1, keys - 8), dtype=torch.int32, device=device)
    return q, k, v, lengths


def _rel_err(got: Any, ref: Any) -> float:
    return float((got.double() - ref).norm() / ref.norm())


def timed_rows(batch: int, keys: int) -> list[dict[str, Any]]:
    """The SDPA baselines and every config on one shape, each checked before it is timed."""
    import torch
    import torch.nn.functional as F

    from benchmarks.probes.probe_kit import bench_us

    q, k, v, lengths = inputs(batch, keys, torch.bfloat16, "cuda")
    ref = reference(q, k, v, lengths)
    live = torch.arange(keys, device="cuda")[None, :] < lengths[:, None]
    mask = live[:, None, None, :]  # [B, 1, 1, L], True = attend: transformers' boolean SDPA mask
    group = HEADS // KV_HEADS
    q4 = q[:, :, None, :]
    rows: list[dict[str, Any]] = []

    def record(name: str, run: Any, **extra: Any) -> None:
        row: dict[str, Any] = {"batch": batch, "keys": keys, "impl": name, **extra}
        rows.append(row)
        try:
            out = run()
            torch.cuda.synchronize()
        except Exception as exc:  # a variant this torch/triton cannot run is data
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            return
        row["rel_err"] = err = _rel_err(out.reshape(ref.shape), ref)
        if err < 1e-2:
            row["us"] = round(bench_us(run), 2)
        else:
            row["error"] = f"wrong output: relative error {err:.3g}"

    record("sdpa_repeat_kv_mask", lambda: F.scaled_dot_product_attention(
        q4, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=mask))
    record("sdpa_gqa_mask", lambda: F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, enable_gqa=True))
    for bn, splits, warps in CONFIGS:
        record("decode_attention", lambda bn=bn, s=splits, w=warps: decode_attention(
            q, k, v, lengths, block_n=bn, splits=s, num_warps=w), BLOCK_N=bn, splits=splits, num_warps=warps)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from benchmarks.probes.model_kit import no_cuda

    if no_cuda("decode_attention_probe", "attention kernels"):
        return 2
    from benchmarks.hw_limit import environment

    report: dict[str, Any] = {"env": environment(), "label": "measured (do_bench median, checked outputs only)",
                              "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "rows": []}
    for batch, keys in SHAPES:
        report["rows"] += timed_rows(batch, keys)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        best = min((r for r in report["rows"] if r["keys"] == keys and r["batch"] == batch and "us" in r
                    and r["impl"] == "decode_attention"), key=lambda r: r["us"], default=None)
        base = [r.get("us") for r in report["rows"] if r["keys"] == keys and r["batch"] == batch
                and r["impl"].startswith("sdpa")]
        print(f"b{batch} keys {keys}: sdpa {base} us, best decode_attention {best and best['us']} us "
              f"({best and (best['BLOCK_N'], best['splits'])})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
