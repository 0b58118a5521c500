"""The standard LLM op suite: Llama-3-8B-class decode and prefill shapes.

Used by ``autoopt profile`` (recommended configs per op) and ``autoopt bench
--suite llm``; ``--suite broad`` adds 28 prefill GEMMs of other families.
Projection shapes are Llama-3-8B's (hidden 4096, 32 query heads and 8 KV heads
of 128 -> qkv N = 6144, MLP intermediate 14336 -> gate_up N = 28672), from its
public config.json.
"""

from __future__ import annotations

from autoopt.errors import OpError
from autoopt.kernels.ops import OpSpec

__all__ = ["BROAD_FAMILIES", "BROAD_VOCAB", "LLAMA3_8B_PROJECTIONS", "SUITES", "suite"]

#: name -> (N, K) of ``y = x @ W^T`` with W [N, K]
LLAMA3_8B_PROJECTIONS: dict[str, tuple[int, int]] = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}


def _llm(dtype: str = "bf16") -> list[tuple[str, OpSpec]]:
    ops: list[tuple[str, OpSpec]] = []
    for m in (4096, 256):
        for name, (n, k) in LLAMA3_8B_PROJECTIONS.items():
            ops.append((f"prefill {name} M={m}", OpSpec(kind="gemm", shape=(m, n, k), dtype=dtype)))
    # decode: gemv ops (M <= 16) are ranked over both the GEMV and the GEMM templates
    for m in (16, 1):
        for name, (n, k) in LLAMA3_8B_PROJECTIONS.items():
            ops.append((f"decode {name} M={m}", OpSpec(kind="gemv", shape=(m, n, k), dtype=dtype)))
    ops += [
        ("silu_mul prefill", OpSpec(kind="silu_mul", shape=(4096, 14336), dtype=dtype)),
        ("silu_mul 64M", OpSpec(kind="silu_mul", shape=(4096, 16384), dtype=dtype)),
        ("rmsnorm prefill", OpSpec(kind="rmsnorm", shape=(4096, 4096), dtype=dtype)),
        ("rmsnorm wide", OpSpec(kind="rmsnorm", shape=(16384, 8192), dtype=dtype)),
    ]
    return ops


def _quick(dtype: str = "bf16") -> list[tuple[str, OpSpec]]:
    """The few ops ``autoopt profile`` shows: one of each kernel class."""
    return [
        ("prefill qkv M=4096", OpSpec(kind="gemm", shape=(4096, 6144, 4096), dtype=dtype)),
        ("prefill down M=4096", OpSpec(kind="gemm", shape=(4096, 4096, 14336), dtype=dtype)),
        ("decode gate_up M=16", OpSpec(kind="gemv", shape=(16, 28672, 4096), dtype=dtype)),
        ("decode qkv M=1", OpSpec(kind="gemv", shape=(1, 6144, 4096), dtype=dtype)),
        ("silu_mul", OpSpec(kind="silu_mul", shape=(4096, 14336), dtype=dtype)),
        ("rmsnorm", OpSpec(kind="rmsnorm", shape=(4096, 4096), dtype=dtype)),
    ]


#: family -> (token count M, {projection: (N, K)}) from each model's public config.json. Shard shapes
#: are one GPU's slice under tensor parallelism (column-parallel qkv/gate_up split N, row-parallel
#: o/down split K). The token counts are deliberately not multiples of any tile (77, 333, 1000, 2047,
#: 4095) or are small (512), so the last wave of tiles is ragged.
BROAD_FAMILIES: dict[str, tuple[int, dict[str, tuple[int, int]]]] = {
    # Llama-3-70B: hidden 8192, 64 q / 8 kv heads of 128, intermediate 28672; TP=8 and TP=4 shards
    "llama-3-70b tp8": (512, {"qkv": (1280, 8192), "o": (8192, 1024), "gate_up": (7168, 8192),
                              "down": (8192, 3584)}),
    "llama-3-70b tp8 M=333": (333, {"qkv": (1280, 8192), "o": (8192, 1024), "gate_up": (7168, 8192),
                                    "down": (8192, 3584)}),
    "llama-3-70b tp4": (4095, {"qkv": (2560, 8192), "o": (8192, 2048), "gate_up": (14336, 8192),
                               "down": (8192, 7168)}),
    # Qwen2.5-7B: hidden 3584, 28 q / 4 kv heads of 128, intermediate 18944
    "qwen2.5-7b": (1000, {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584),
                          "down": (3584, 18944)}),
    # Gemma-2-9B: hidden 3584, 16 q / 8 kv heads of 256, intermediate 14336
    "gemma-2-9b": (2047, {"qkv": (8192, 3584), "o": (3584, 4096), "gate_up": (28672, 3584),
                          "down": (3584, 14336)}),
    # Phi-3-mini: hidden 3072, 32 heads of 96 (no GQA), intermediate 8192
    "phi-3-mini": (77, {"qkv": (9216, 3072), "o": (3072, 3072), "gate_up": (16384, 3072),
                        "down": (3072, 8192)}),
}
#: vocabulary projections (lm_head): (family, M, vocab, hidden)
BROAD_VOCAB: tuple[tuple[str, int, int, int], ...] = (
    ("llama-3", 333, 128256, 4096), ("qwen2.5", 1000, 152064, 3584),
    ("gemma-2", 77, 256000, 3584), ("phi-3", 2047, 32064, 3072),
)


def _broad(dtype: str = "bf16") -> list[tuple[str, OpSpec]]:
    """Prefill GEMMs beyond Llama-3-8B: 28 shapes from 5 families, TP shards, ragged M, lm_heads."""
    ops: list[tuple[str, OpSpec]] = []
    for family, (m, projections) in BROAD_FAMILIES.items():
        tag = family if "M=" in family else f"{family} M={m}"
        for name, (n, k) in projections.items():
            ops.append((f"{tag} {name}", OpSpec(kind="gemm", shape=(m, n, k), dtype=dtype)))
    for family, m, vocab, hidden in BROAD_VOCAB:
        ops.append((f"{family} lm_head M={m}", OpSpec(kind="gemm", shape=(m, vocab, hidden), dtype=dtype)))
    return ops


SUITES = {"llm": _llm, "quick": _quick, "broad": _broad}


def suite(name: str, dtype: str = "bf16") -> list[tuple[str, OpSpec]]:
    """Named op suite as (label, op) pairs; ``OpError`` for an unknown name."""
    try:
        return SUITES[name](dtype)
    except KeyError:
        raise OpError(f"unknown suite {name!r}; expected one of {', '.join(SUITES)}") from None
