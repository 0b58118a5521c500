"""What a model check runs: its options (model, batch, prompt, decode steps, repetitions) and the model's spec.

Torch-free, so the command line can refuse a bad option in one line before anything imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autoopt.errors import AutooptError, ModelError
from autoopt.planning.catalog import get_model
from autoopt.planning.memory import PREFILL_CHUNK
from autoopt.planning.model import ModelSpec

__all__ = ["CheckOptions", "OptionError", "check_buildable", "llama_spec", "spec_summary"]


class OptionError(AutooptError, ValueError):
    """A check option is out of range (names the option and what would be right)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckOptions:
    """The workload and the repetitions of the memory and pipeline checks (defaults: the committed runs).

    Memory model ``layers`` layers, pipeline model ``pipeline_layers`` layers of ``model`` (a catalog name;
    everything but the layer count unchanged), ``batch`` x ``prompt_len`` prompt tokens (4096 by default,
    inside autoopt's 8192-token prefill chunk), ``gen_len`` decode steps in the memory check, the pipeline's
    decode step at ``prompt_len + 1`` keys.
    """

    model: str = "llama-3-8b"
    layers: int = 4
    pipeline_layers: int = 8
    batch: int = 4
    prompt_len: int = 1024
    gen_len: int = 16
    warmup: int = 3
    reps_prefill: int = 10
    reps_decode: int = 50
    cuda_graphs: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "pipeline_layers", "batch", "prompt_len", "gen_len", "reps_prefill", "reps_decode"):
            if getattr(self, name) <= 0:
                raise OptionError(f"{name} must be positive (got {getattr(self, name)})")
        if self.warmup < 0:
            raise OptionError(f"warmup must be 0 or more (got {self.warmup})")
        if self.pipeline_layers < 2:
            raise OptionError("pipeline_layers must be at least 2 (one per stage)")
        if self.batch * self.prompt_len > PREFILL_CHUNK:
            raise OptionError(f"batch x prompt_len = {self.batch * self.prompt_len} tokens exceeds autoopt's "
                              f"prefill chunk ({PREFILL_CHUNK}): autoopt would size activations for chunked "
                              "prefill, which this model does not do; keep batch x prompt_len <= the chunk")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_buildable(spec: ModelSpec) -> None:
    """Raise :class:`ModelError` unless the plain-torch model of :mod:`autoopt.validation.llama` can build ``spec``."""
    if spec.architecture != "llama" or spec.is_moe or spec.is_mla or spec.tied_embeddings or spec.qkv_bias \
            or spec.sliding_window is not None or spec.activation != "silu" or spec.norm != "rmsnorm" \
            or spec.mlp != "gated" or spec.mlp_bias or spec.o_bias or spec.parallel_block or spec.lm_head_bias:
        raise ModelError(f"{spec.name}: only dense Llama-style models (untied head, no bias, no window) "
                         "are built", field="model")


def llama_spec(num_layers: int, base: str = "llama-3-8b") -> ModelSpec:
    """The catalog model ``base`` with ``num_layers`` layers (everything else unchanged)."""
    spec = get_model(base)
    return ModelSpec.from_dict({**spec.to_dict(), "num_layers": num_layers,
                                "name": f"{spec.name}-{num_layers}l"})


def spec_summary(spec: ModelSpec) -> dict[str, Any]:
    """The shape numbers a result file records for the model it ran."""
    keys = ("name", "num_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_kv_heads",
            "head_dim", "vocab_size")
    return {**{k: getattr(spec, k) for k in keys}, "num_params": spec.num_params}
