"""Probe: autoopt's decode attention kernel against the cuDNN SDPA kernel transformers runs at decode.

Issue 27's graphed int4 step on an H200 spent ~0.22 ms a step in attention (cuDNN's SDPA flash kernel, 6.7 us a
layer over ~190 keys) and ~0.21 ms in the rotary and layout kernels Inductor builds around it, the K/V copies to
every query head among them (``h200/quant_trace_int4_words_ingraph.json``). This times the kernel optimize() now
runs (``autoopt/backend/kernels/decode_attention.py``: split-key flash decoding, one program a batch row, KV head
and key split, masked keys hidden) over its config grid beside torch's SDPA on the same tensors, in one process;
the grid's timings are what ``autoopt.kernels.attention`` fits its price to. Keys at or past a row's ``lengths``
entry are masked (what the static cache's causal mask does at decode).

Per shape (batch, keys) it records: torch SDPA with the boolean mask transformers passes (the repeated K/V it
builds for grouped heads first, as transformers <= 5.23 does under a mask) and SDPA with ``enable_gqa``; and each
config of autoopt's ``decode_attention`` (``BLOCK_N`` x splits x warps, each with the mask's pass first and
without; ``choice``: the one optimize() picks,
with its predicted time), all checked against a float64 reference first (relative error under 1e-2). Only checked
outputs get a time: each replayed from one CUDA graph that calls it over as many copies of K/V as pass three L2s (a
decode step reads each layer's cache from DRAM, and runs in a graph; ``do_bench`` on the 2026-11-28 H200 timed the
host: 28-190 us for every config and SDPA alike).

    PYTHONPATH=. python benchmarks/probes/decode_attention_probe.py --out $OUT/decode_attention_probe.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: Llama-3-8B: 32 query heads over 8 KV heads of 128
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
#: (batch, keys): the decode steps the benchmarks run (192 keys: a 128-token prompt + 64) and longer contexts
SHAPES = ((1, 192), (1, 1024), (1, 4096), (8, 192), (32, 192), (8, 4096))
CONFIGS = tuple((bn, splits, warps) for bn in (32, 64, 128) for splits in (1, 2, 4, 8, 16) for warps in (4,))


def decode_attention(q: Any, k: Any, v: Any, lengths: Any, *, block_n: int = 64, splits: int = 4,
                     num_warps: int = 4) -> Any:
    """autoopt's kernel (``autoopt/backend/kernels/decode_attention.py``, what optimize() runs) over each row's
    first ``lengths`` keys: ``q`` [B, H, D], ``k``/``v`` [B, Hkv, L, D]; [B, H, D]."""
    import torch

    from autoopt.backend.kernels.decode_attention import decode_attention as launch

    mask = torch.arange(k.shape[2], device=k.device)[None, :] < lengths[:, None]
    return launch(q, k, v, mask, scale=1.0 / math.sqrt(q.shape[-1]), block_n=block_n, splits=splits,
                  num_warps=num_warps)[:, 0]


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

    q, k, v, lengths = inputs(batch, keys, torch.bfloat16, "cuda")
    ref = reference(q, k, v, lengths)
    live = torch.arange(keys, device="cuda")[None, :] < lengths[:, None]
    mask = live[:, None, None, :]  # [B, 1, 1, L], True = attend: transformers' boolean SDPA mask
    group = HEADS // KV_HEADS
    q4 = q[:, :, None, :]
    caches = kv_copies(k, v, torch.cuda.get_device_properties(0).L2_cache_size)
    rows: list[dict[str, Any]] = []

    def record(name: str, make: Any, **extra: Any) -> None:
        row: dict[str, Any] = {"batch": batch, "keys": keys, "impl": name, "kv_copies": len(caches), **extra}
        rows.append(row)
        try:
            out = make(k, v)()
            torch.cuda.synchronize()
        except Exception as exc:  # a variant this torch/triton cannot run is data
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            return
        row["rel_err"] = err = _rel_err(out.reshape(ref.shape), ref)
        if err < 1e-2:
            row["us"] = round(graph_us([make(kc, vc) for kc, vc in caches]), 2)
        else:
            row["error"] = f"wrong output: relative error {err:.3g}"

    record("sdpa_repeat_kv_mask", lambda k, v: lambda: F.scaled_dot_product_attention(
        q4, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=mask))
    record("sdpa_gqa_mask", lambda k, v: lambda: F.scaled_dot_product_attention(
        q4, k, v, attn_mask=mask, enable_gqa=True))
    for bn, splits, warps in CONFIGS:
        record("decode_attention", lambda k, v, bn=bn, s=splits, w=warps: lambda: decode_attention(
            q, k, v, lengths, block_n=bn, splits=s, num_warps=w), BLOCK_N=bn, splits=splits, num_warps=warps)
    c = choice(batch, keys)
    record("choice", lambda k, v: lambda: decode_attention(q, k, v, lengths, block_n=c.BLOCK_N, splits=c.splits,
                                                           num_warps=c.num_warps),
           BLOCK_N=c.BLOCK_N, splits=c.splits, num_warps=c.num_warps, predicted_us=c.predicted_us)
    return rows


def choice(batch: int, keys: int) -> Any:
    """optimize()'s config for this shape on the detected GPU (:mod:`autoopt.kernels.attention`)."""
    import torch

    from autoopt.nn.attention import choice as pick

    return pick(torch.device("cuda"), batch=batch, heads=HEADS, kv_heads=KV_HEADS, keys=keys, head_dim=HEAD_DIM)


def kv_copies(k: Any, v: Any, l2_bytes: int, most: int = 256) -> list[tuple[Any, Any]]:
    """(K, V) and copies of them, as many as pass three L2s (at least 2, at most ``most``): cycled through,
    each call reads its cache from DRAM, as each layer's attention in a decode step does."""
    per = k.numel() * k.element_size() + v.numel() * v.element_size()
    n = min(most, max(2, -(-3 * l2_bytes // per)))
    return [(k, v)] + [(k.clone(), v.clone()) for _ in range(n - 1)]


def graph_us(runs: list[Any], samples: int = 5) -> float:
    """Median us a call, the calls of ``runs`` (one a KV copy) captured in order in one CUDA graph and replayed
    between events: the GPU's time with no host enqueue in it."""
    import itertools

    from autoopt.backend.runner import captured, replayed_us

    cycle = itertools.cycle(runs)
    return replayed_us(captured(lambda: next(cycle)(), calls=len(runs)), len(runs), samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from benchmarks.probes.model_kit import no_cuda

    if no_cuda("decode_attention_probe", "attention kernels"):
        return 2
    from benchmarks.hw_limit import environment

    label = "measured (CUDA-graph replay over KV copies, median of 5; checked outputs only)"
    report: dict[str, Any] = {"env": environment(), "label": label,
                              "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "rows": []}
    for batch, keys in SHAPES:
        report["rows"] += timed_rows(batch, keys)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        best = min((r for r in report["rows"] if r["keys"] == keys and r["batch"] == batch and "us" in r
                    and r["impl"] == "decode_attention"), key=lambda r: r["us"], default=None)
        base = [r.get("us") for r in report["rows"] if r["keys"] == keys and r["batch"] == batch
                and r["impl"].startswith("sdpa")]
        print(f"b{batch} keys {keys}: sdpa {base} us, best decode_attention {best and best['us']} us "
              f"({best and (best['BLOCK_N'], best['splits'])})",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
