"""The fused-MoE kernel config for one token count, in the runtimes' own shape (vLLM/SGLang config files).

``moe_config`` is ``rank()`` of a ``fused_moe`` op reduced to the dict a runtime's config file holds per
M (``BLOCK_SIZE_M``, ``BLOCK_SIZE_N``, ``BLOCK_SIZE_K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``).
It lives in search/ (which ranks); runtimes/ cannot import it (runtimes | search are independent stages),
so a file writer there takes these dicts as data, and planning/, the API or the CLI make the calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoopt.errors import OpError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.ops import OpSpec
from autoopt.search.ranking import rank

__all__ = ["MOE_CONFIG_KEYS", "moe_config", "moe_op"]

#: the keys of one entry of a runtime's fused-MoE config file, in its order
MOE_CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def moe_op(m: int, e: int, topk: int, n: int, k: int, *, dtype: str = "bf16", weight: str | None = None,
           moe_gemm: str = "both") -> OpSpec:
    """The ``fused_moe`` op of M tokens over E experts, top-k, intermediate N per shard, hidden K."""
    return OpSpec(kind="fused_moe", shape=(m, e, topk, n, k), dtype=dtype, weight=weight, moe_gemm=moe_gemm)


def moe_config(op: OpSpec | Mapping[str, Any], gpu: GPUProfile | HardwareProfile, *,
               measured: bool = True) -> dict[str, int]:
    """The best config for ``op`` (kind ``fused_moe``) on ``gpu`` as a runtime config-file entry: the
    predicted best, or a checked measurement from the results store when ``measured`` and one exists."""
    spec = op if isinstance(op, OpSpec) else OpSpec.from_dict(op)
    if spec.kind != "fused_moe":
        raise OpError(f"moe_config takes a fused_moe op, got {spec.label()}")
    best = rank(gpu, spec, top=1, measured=measured).best
    return {key: int(best.config.params[key]) for key in MOE_CONFIG_KEYS}
