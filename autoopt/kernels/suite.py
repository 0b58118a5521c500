"""The standard LLM op suite: Llama-3-8B-class decode and prefill shapes.

Used by ``autoopt profile`` (recommended configs per op) and ``autoopt bench
--suite llm``. Projection shapes are Llama-3-8B's (hidden 4096, 32 query heads
and 8 KV heads of 128 -> qkv N = 6144, MLP intermediate 14336 -> gate_up N =
28672), from its public config.json.
"""

from __future__ import annotations

from autoopt.errors import OpError
from autoopt.kernels.ops import OpSpec

__all__ = ["LLAMA3_8B_PROJECTIONS", "SUITES", "suite"]

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


SUITES = {"llm": _llm, "quick": _quick}


def suite(name: str, dtype: str = "bf16") -> list[tuple[str, OpSpec]]:
    """Named op suite as (label, op) pairs; ``OpError`` for an unknown name."""
    try:
        return SUITES[name](dtype)
    except KeyError:
        raise OpError(f"unknown suite {name!r}; expected one of {', '.join(SUITES)}") from None
