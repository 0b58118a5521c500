"""Fused-MoE kernel configs for a model under a serving runtime: its layer shards, one config per M
from a chooser, and the zero-shot chooser (``rank()``'s best for the ``fused_moe`` op).

The files themselves (names, folders, JSON, writing) are :mod:`autoopt.runtimes.moe_configs`; this
module joins them to a :class:`~autoopt.planning.model.ModelSpec` and to the search. A chooser is
any callable ``(shard, m) -> MoeEntry``, so the writer and the CLI are testable without the op kind,
and ``--tune`` swaps in measured entries (:mod:`autoopt.tuning.moe_configs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from autoopt.errors import ModelError, OpError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.ops import OP_KINDS, OpSpec
from autoopt.planning.model import ModelSpec
from autoopt.runtimes.moe_configs import M_VALUES, MoeEntry, MoeShard, Written, moe_shards, write_configs

if TYPE_CHECKING:
    from autoopt.kernels.config import Candidate

__all__ = ["MoeChooser", "choose_all", "export_configs", "fused_moe_op", "model_shards", "moe_entry",
           "rank_chooser"]

#: the export's format names -> (autoopt weight spec, what it means); None: a 16-bit weight.
#: fp8_w8a8 is per-tensor in vLLM and per-channel in autoopt's fp8: the same bytes and MMAs.
_WEIGHTS: dict[str, str | None] = {"bf16": None, "fp16": None, "fp8_w8a8": "fp8", "fp8_w8a16": "fp8-wo",
                                   "int8_w8a16": "int8", "int4_w4a16": "int4"}


class MoeChooser(Protocol):
    """Picks the config (and says where it came from) for ``shard`` at ``m`` tokens."""

    def __call__(self, shard: MoeShard, m: int) -> MoeEntry: ...


def model_shards(model: ModelSpec, runtime: str, *, tp: int = 1, ep: int = 1, dtype: str | None = None,
                 block_shape: tuple[int, int] | None = None, per_channel: bool = False) -> tuple[MoeShard, ...]:
    """The routed-expert shards ``model`` becomes under ``runtime`` with ``tp``/``ep`` (see
    :func:`~autoopt.runtimes.moe_configs.moe_shards` for each runtime's rule). ``dtype``: the export's
    format (default: the checkpoint's 16-bit dtype). Shared experts run as a dense MLP in both runtimes
    by default and have no file (SGLang's optional shared-expert fusion, E + 1, is not modelled)."""
    if not model.is_moe:
        raise ModelError(f"{model.name} has no routed experts: it runs no fused-MoE kernel", field="num_experts")
    act = model.dtype if model.dtype in ("bf16", "fp16") else "bf16"
    return moe_shards(runtime, experts=model.num_experts, intermediate=int(model.moe_intermediate_size or 0),
                      hidden=model.hidden_size, topk=model.experts_per_token, tp=tp, ep=ep, dtype=dtype or act,
                      block_shape=block_shape, per_channel=per_channel, act_dtype=act)


def fused_moe_op(shard: MoeShard, m: int) -> OpSpec:
    """The ``fused_moe`` op of ``shard`` at ``m`` tokens: shape (M, E, top-k, N, K), the activations'
    dtype and the weight format. Both runtimes launch both GEMMs of a layer (gate_up, down) with one
    config, so the op means both (the op kind's default GEMM selector must say so).
    :class:`OpError` when this autoopt has no ``fused_moe`` op kind, or no format for the shard's."""
    if "fused_moe" not in OP_KINDS:
        raise OpError("this autoopt has no 'fused_moe' op kind to rank or tune fused-MoE configs with; "
                      f"known kinds: {', '.join(OP_KINDS)}")
    if shard.dtype not in _WEIGHTS or (shard.block_shape and tuple(shard.block_shape) != (128, 128)):
        raise OpError(f"no autoopt weight format for {shard.dtype}"
                      f"{' with block_shape ' + str(list(shard.block_shape)) if shard.block_shape else ''}; "
                      f"formats: {', '.join(_WEIGHTS)} (fp8_w8a8 also with block_shape [128,128])")
    weight = _WEIGHTS[shard.dtype]
    if weight == "fp8" and shard.block_shape:
        weight = "fp8_block"
    return OpSpec(kind="fused_moe", shape=(m, shard.experts, shard.topk, shard.intermediate, shard.hidden),
                  dtype=shard.act_dtype, weight=weight)


def rank_chooser(gpu: GPUProfile | HardwareProfile) -> MoeChooser:
    """The zero-shot chooser: ``rank()``'s best config for the shard's ``fused_moe`` op on ``gpu`` (a
    winner measured before on this device and stack comes first, labelled measured, as rank() does)."""
    from autoopt.search.ranking import rank

    def choose(shard: MoeShard, m: int) -> MoeEntry:
        return moe_entry(rank(gpu, fused_moe_op(shard, m), top=1).best)

    return choose


def moe_entry(best: Candidate) -> MoeEntry:
    """rank()'s best candidate for a fused_moe op as a config-file entry, labelled as rank() labels it."""
    return MoeEntry(params=best.config.params, label=best.label, predicted_us=best.predicted_us,
                    measured_us=best.measured_us, source=best.source if best.measured_us is not None
                    else f"rank(): {best.config.kernel} ({best.bound}-bound)")


def choose_all(chooser: MoeChooser, shard: MoeShard, ms: Iterable[int] = M_VALUES) -> dict[int, MoeEntry]:
    """One entry per M, ascending."""
    return {m: chooser(shard, m) for m in sorted(set(ms))}



def export_configs(runtime: str, shards: Iterable[MoeShard], gpu_name: str, out: str | Path, *,
                   entries_for: Callable[[MoeShard], Mapping[int, MoeEntry]], triton_version: str | None = None,
                   force: bool = False, provenance: Mapping[str, Any] | None = None) -> list[Written]:
    """Write ``runtime``'s config file for each shard on the GPU called ``gpu_name`` into ``out``, with
    the entries ``entries_for`` gives (``lambda s: choose_all(rank_chooser(profile), s)`` zero-shot)."""
    return [write_configs(runtime, s, gpu_name, entries_for(s), out, triton_version=triton_version, force=force,
                          provenance=provenance) for s in shards]
