"""Replicas vs sharding: the same GPUs as one big model instance or as several data-parallel copies.

For a serving workload of ``batch`` concurrent sequences on ``n`` GPUs, each option runs ``r``
replicas (``r`` divides ``n``), each on ``n / r`` GPUs with its own best split, serving
``ceil(batch / r)`` sequences. All replicas run at once, so a request takes the replica's predicted
request time and the fleet produces ``batch x gen_len`` tokens in that time. Fewer GPUs per replica
means less tensor-parallel communication and more weight copies (each replica reads its own
weights); more GPUs per replica means a smaller share of the weights per GPU and more all-reduces.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from autoopt.hardware.profile import HardwareProfile
from autoopt.planning.model import ModelSpec
from autoopt.planning.quant import QuantFormat
from autoopt.planning.split import NO_RESERVE, SplitPlan, Workload, candidate_splits

__all__ = ["ReplicaOption", "compare_replicas"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaOption:
    """``replicas`` copies of ``split`` (each on ``split.num_devices`` GPUs), with predicted rates."""

    replicas: int
    split: SplitPlan
    batch_per_replica: int
    request_us: float
    tokens_per_s: float
    devices: int

    @property
    def tokens_per_s_per_device(self) -> float:
        return self.tokens_per_s / self.devices

    def describe(self) -> str:
        return (f"{self.replicas} x (tp={self.split.tp}, pp={self.split.pp}) at batch {self.batch_per_replica}: "
                f"request {self.request_us / 1e3:.1f} ms, {self.tokens_per_s:.0f} tokens/s "
                f"({self.tokens_per_s_per_device:.0f} per GPU), communication "
                f"{100 * self.split.comm_us / self.split.predicted_us:.0f} %")

    def to_dict(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "tp": self.split.tp, "pp": self.split.pp,
                "devices_per_replica": self.split.num_devices, "batch_per_replica": self.batch_per_replica,
                "request_us": round(self.request_us, 3), "tokens_per_s": round(self.tokens_per_s, 2),
                "tokens_per_s_per_device": round(self.tokens_per_s_per_device, 2),
                "comm_us": round(self.split.comm_us, 3), "label": "predicted"}


def compare_replicas(profile: HardwareProfile, model: ModelSpec, fmt: QuantFormat, wl: Workload, *,
                     gpus: int, allowed: Any = None, reserve: tuple[float, int] = NO_RESERVE
                     ) -> tuple[ReplicaOption, ...]:
    """Every replica count that fits, best throughput first. ``allowed(split)`` filters splits a
    runtime cannot run (None: all)."""
    out = []
    for r in range(1, gpus + 1):
        if gpus % r or r > wl.batch:
            continue
        sub = dataclasses.replace(wl, batch=math.ceil(wl.batch / r))
        plans = [p for p in candidate_splits(profile, model, fmt, sub, max_devices=gpus // r, reserve=reserve)
                 if p.fits and (allowed is None or allowed(p))]
        if not plans:
            continue
        best = plans[0]
        tokens = wl.batch * (wl.gen_len if wl.phase != "prefill" else wl.prompt_len)
        out.append(ReplicaOption(replicas=r, split=best, batch_per_replica=sub.batch, request_us=best.predicted_us,
                                 tokens_per_s=tokens * 1e6 / best.predicted_us, devices=r * best.num_devices))
    return tuple(sorted(out, key=lambda o: -o.tokens_per_s))
