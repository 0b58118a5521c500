"""CPU offload: what runs from host memory when the GPUs cannot hold the model, and what it costs.

Two kinds, as runtimes do it (:data:`autoopt.runtimes.spec.OFFLOAD_KINDS`):

- ``cpu-compute`` (llama.cpp ``-ngl``): the split planner already puts a pipeline stage on the CPU
  (its layers priced by the CPU profile's memory bandwidth and FLOP rate, the hidden state crossing
  PCIe at the boundary); :func:`from_split` reads the ``-ngl`` count and tokens/s out of that plan.
- ``weight-stream`` (vLLM / SGLang ``--cpu-offload-gb``, accelerate's ``"cpu"`` device-map entries):
  every layer computes on the GPU, and the weights that do not fit cross PCIe on every forward pass:
  ``step = GPU step + offloaded bytes / PCIe bandwidth`` (no overlap assumed: vLLM's UVA offload
  reads the host copy inside the kernels, at PCIe rate). :func:`weight_stream` prices it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoopt.planning.memory import MemoryEstimate
from autoopt.planning.split import CPU, SplitPlan, pcie_gbs

__all__ = ["OffloadPlan", "from_split", "weight_stream"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadPlan:
    """Layers on the GPU(s) and on the host, and the predicted decode speed with that placement."""

    kind: str
    gpu_layers: int
    cpu_layers: int
    offload_bytes: float
    decode_step_us: float
    batch: int
    link_gbs: float | None = None
    reason: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.batch * 1e6 / self.decode_step_us if self.decode_step_us else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "gpu_layers": self.gpu_layers, "cpu_layers": self.cpu_layers,
                "offload_bytes": round(self.offload_bytes), "decode_step_us": round(self.decode_step_us, 3),
                "tokens_per_s": round(self.tokens_per_s, 3), "label": "predicted", "batch": self.batch,
                "link_gbs": self.link_gbs, "reason": self.reason}

    def describe(self) -> str:
        return (f"{self.kind} offload: {self.gpu_layers} layers on the GPU(s), {self.cpu_layers} from host memory "
                f"({self.offload_bytes / 1e9:.1f} GB); predicted {self.tokens_per_s:.2f} tokens/s at batch "
                f"{self.batch} - {self.reason}")


def from_split(split: SplitPlan, decode_step_us: float, batch: int) -> OffloadPlan | None:
    """The ``cpu-compute`` reading of a split with a CPU stage (None when every layer is on a GPU)."""
    cpu = [s for s in split.stages if CPU in s.devices]
    if not cpu:
        return None
    cpu_layers = sum(s.layers[1] - s.layers[0] for s in cpu)
    total = sum(s.layers[1] - s.layers[0] for s in split.stages)
    return OffloadPlan(kind="cpu-compute", gpu_layers=total - cpu_layers, cpu_layers=cpu_layers,
                       offload_bytes=sum(s.memory.weights_bytes for s in cpu), decode_step_us=decode_step_us,
                       batch=batch, reason="the CPU runs its layers from RAM at the CPU profile's bandwidth")


def weight_stream(memory: MemoryEstimate, gpu: Any, *, num_layers: int, ram_bytes: int, decode_step_us: float,
                  batch: int) -> OffloadPlan | None:
    """Stream what does not fit on one GPU from host RAM (None: not even that fits, or no PCIe figures)."""
    over = memory.total_bytes - memory.capacity_bytes
    if over <= 0 or over >= memory.weights_bytes or (ram_bytes and over > ram_bytes):
        return None
    link = pcie_gbs(gpu) if gpu is not None else None
    if not link:
        return None
    per_layer = memory.weights_bytes / max(1, num_layers)
    cpu_layers = min(num_layers, int(-(-over // per_layer)))
    stream_us = over / (link * 1e3)
    return OffloadPlan(kind="weight-stream", gpu_layers=num_layers - cpu_layers, cpu_layers=cpu_layers,
                       offload_bytes=over, decode_step_us=decode_step_us + stream_us, batch=batch, link_gbs=link,
                       reason=f"{over / 1e9:.1f} GB of weights cross PCIe ({link:.0f} GB/s) every forward pass: "
                              f"+{stream_us / 1e3:.1f} ms per step")
