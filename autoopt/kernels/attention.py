"""Decode attention (one query token a row over a KV cache, grouped-query heads): its config and its price.

The kernel (``autoopt/backend/kernels/decode_attention.py``) is split-key flash decoding: one program a (row, KV
head, key split) walks its share of the keys ``BLOCK_N`` at a time with an online softmax over the KV head's group
of query heads, and a second kernel combines the splits. :func:`decode_attention_choice` is what ``optimize()``
launches and what ``recommend()`` prices, so the two cannot disagree.

The price is measured, not derived from the datasheet alone: the kernel's 90-config grid, each config timed
replayed from a CUDA graph over KV copies that pass three L2s, on an H200
(``benchmarks/results/h200/decode_attention_probe_loops.json``: Llama-3-8B heads, batches 1/8/32, 192-4096 keys
under a mask; torch 2.11, Triton 3.6), fit by least squares in log space (``benchmarks/fit_decode_attention.py``):

    us = FIXED_US + max(serial blocks x (BLOCK_US + KEY_US x BLOCK_N), K/V bytes / (bandwidth x KV_EFFICIENCY))
         + programs x BLOCK_N x PROGRAM_KEY_US

- a program's blocks run one after another: at one row and 4096 keys one split took 116 us at BLOCK_N 32 (128
  blocks), 79 at 64, 63 at 128: 0.9, 1.2 and 2.0 us a block (the loop reads K/V up to the split's last kept key
  without a branch on each block's mask; with that branch the same splits took 263, 181 and 132 us);
- enough programs in flight reach the bandwidth, at 0.7 of its sustained rate;
- the two launches in a graph, the combine and a program's first tile: ~8 us;
- each program pays for its tile whatever keys are left to it.
All 90 configs are priced 0.80-1.22 of their measured time (median 0.99). On the six shapes the choice measured
8.7, 11.2, 15.6, 12.1, 47.5 and 17.5 us, 0.94-1.00 of the fastest config's speed (0.94 at 8 rows over 4096 keys:
47.5 us against 44.5), priced 0.90-1.08 of its own time. cuDNN's SDPA as transformers calls it under a mask (K/V
repeated to every query head) took 18-696 us on the same tensors; with ``enable_gqa`` (no copy, which transformers
does not call under a mask) 11-49 us: the choice takes 0.78-0.88 of its time at one row, level with it (0.98-1.03)
at 8 and 32 rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoopt._serde import from_plain, to_plain
from autoopt.errors import OpError
from autoopt.hardware.profile import GPUProfile

__all__ = ["BLOCK_NS", "IN_STEP_SAVES_US", "SPLITS", "DecodeAttentionChoice", "decode_attention_choice",
           "decode_attention_us", "in_step_us", "supported_head_dim"]

#: the key block sizes and split counts searched (the probe's grid)
BLOCK_NS = (32, 64, 128)
SPLITS = (1, 2, 4, 8, 16)
#: us of a graphed step's two launches, the combine and a program's first tile (fit, H200: see the module doc)
FIXED_US = 8.38
#: us a key block costs a program, and per key in it (0.86 us at 32 keys, 1.16 at 64, 1.77 at 128)
BLOCK_US = 0.553
KEY_US = 0.0095
#: fraction of the sustained bandwidth the K/V reads reach with enough programs in flight (batch 8, 4096 keys)
KV_EFFICIENCY = 0.706
#: us a program costs per key of its tile beyond its keys' work (batch 32, 192 keys, splits 1 -> 16)
PROGRAM_KEY_US = 8.45e-5
#: the bandwidth priced when no GPU profile says more: an H100's sustained rate
_DEFAULT_GBS = 3000.0
#: us a call takes less inside a model's decode step than the probe's fit prices it over cold K/V copies: the
#: compiled Llama-3-8B step replayed from a CUDA graph on the H200, split + combine kernels plus a 0.36 us gap each
#: (the step's launches' mean), against the fit at the keys the traced steps had filled (~138): batch 1 5.5 against
#: 9.4 us (3.9 less; the whole step's cache, 25 MB, stays in L2 under the weights' evict-first streams), batch 8
#: 7.5 against 10.8 (3.3), batch 32 12.5 against 14.4 (2.0; 2026-11-29, h200/quant_trace_b1_int4_fp8.json,
#: _b8_layers8.json, _b32_int4_layers8.json): the median of the three
IN_STEP_SAVES_US = 3.3


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeAttentionChoice:
    """The launch config of one decode-attention call (Triton's key names) and its predicted time."""

    BLOCK_N: int
    splits: int
    num_warps: int
    predicted_us: float
    bound: str

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Any) -> DecodeAttentionChoice:
        return from_plain(cls, data, lambda msg, where: OpError(f"decode attention choice: {where}: {msg}"))


def supported_head_dim(d: int) -> bool:
    """Head sizes the kernel takes: a power of two from 16 to 256 (``tl.arange`` over D)."""
    return 16 <= d <= 256 and d & (d - 1) == 0


def decode_attention_us(gpu: GPUProfile | None, *, batch: int, kv_heads: int, keys: int, head_dim: int,
                        block_n: int, splits: int) -> tuple[float, str]:
    """Predicted us of one call (in a CUDA graph) and what bounds it: ``latency`` (the blocks a program walks in
    turn) or ``memory`` (the K/V bytes)."""
    gbs = (gpu.bandwidth_gbs if gpu is not None else None) or _DEFAULT_GBS
    chunk = math.ceil(math.ceil(keys / splits) / block_n) * block_n
    serial = math.ceil(min(chunk, keys) / block_n)
    programs = batch * kv_heads * splits
    kv_bytes = 2.0 * batch * kv_heads * keys * head_dim * 2  # 16-bit K and V
    walk = serial * (BLOCK_US + KEY_US * block_n)
    stream = kv_bytes / (gbs * 1e3 * KV_EFFICIENCY)
    us = FIXED_US + max(walk, stream) + programs * block_n * PROGRAM_KEY_US
    return us, "latency" if walk >= stream else "memory"


def in_step_us(choice: DecodeAttentionChoice, gpu: GPUProfile | None, *, batch: int, kv_heads: int, keys: int,
               head_dim: int) -> float:
    """What ``choice`` costs inside a decode step (:data:`IN_STEP_SAVES_US` under its fitted price), never under
    its K/V bytes at the full bandwidth."""
    gbs = (gpu.bandwidth_gbs if gpu is not None else None) or _DEFAULT_GBS
    floor = 2.0 * batch * kv_heads * keys * head_dim * 2 / (gbs * 1e3)
    return max(floor, choice.predicted_us - IN_STEP_SAVES_US)


def decode_attention_choice(gpu: GPUProfile | None, *, batch: int, heads: int, kv_heads: int, keys: int,
                            head_dim: int) -> DecodeAttentionChoice:
    """The fastest predicted (BLOCK_N, splits) for this call; fewer splits on a tie (less to combine).
    :class:`~autoopt.errors.OpError` for heads that are not a whole number of groups or a head size the kernel
    does not take."""
    if kv_heads <= 0 or heads % kv_heads or not supported_head_dim(head_dim) or min(batch, keys) <= 0:
        raise OpError(f"decode attention needs heads a multiple of kv_heads and a power-of-two head size "
                         f"16-256; got heads={heads}, kv_heads={kv_heads}, head_dim={head_dim}, batch={batch}, "
                         f"keys={keys}")
    best: DecodeAttentionChoice | None = None
    for block_n in BLOCK_NS:
        for splits in SPLITS:
            us, bound = decode_attention_us(gpu, batch=batch, kv_heads=kv_heads, keys=keys, head_dim=head_dim,
                                            block_n=block_n, splits=splits)
            if best is None or us < best.predicted_us - 1e-9:
                best = DecodeAttentionChoice(BLOCK_N=block_n, splits=splits, num_warps=4,
                                             predicted_us=round(us, 3), bound=bound)
    assert best is not None
    return best
