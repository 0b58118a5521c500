"""Kernel configs and ranked candidates: what templates emit and the cost model scores.

Config keys are Triton's own names (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``,
``GROUP_M``, ``SPLIT_K``, ``num_warps``, ``num_stages``, ...), so
``KernelConfig.triton_config()`` drops straight into ``triton.Config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoopt.errors import ConfigError

__all__ = ["BOUNDS", "PATHS", "Candidate", "KernelConfig"]

#: execution paths a config can take (see templates' path choice).
PATHS = ("standard", "tma", "wgmma", "tma_wgmma", "fp4_cluster", "mfma")
BOUNDS = ("compute", "memory", "latency")
_LAUNCH_KEYS = ("num_warps", "num_stages", "num_ctas")


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelConfig:
    """One concrete kernel configuration, ready for a backend to compile."""

    kernel: str
    params: Mapping[str, int]
    path: str = "standard"
    template: str = ""

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ConfigError(f"unknown execution path {self.path!r}; expected one of {', '.join(PATHS)}")
        for k, v in self.params.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"config param {k!r}={v!r} must be a string key with an integer value")
        object.__setattr__(self, "params", dict(self.params))

    def __getitem__(self, key: str) -> int:
        return self.params[key]

    def get(self, key: str, default: int | None = None) -> int | None:
        return self.params.get(key, default)

    @property
    def num_warps(self) -> int:
        return int(self.params.get("num_warps", 4))

    @property
    def num_stages(self) -> int:
        return int(self.params.get("num_stages", 2))

    def meta(self) -> dict[str, int]:
        """The constexpr meta-parameters (everything but the launch options)."""
        return {k: v for k, v in self.params.items() if k not in _LAUNCH_KEYS}

    def key(self) -> tuple[Any, ...]:
        return (self.kernel, self.path, tuple(sorted(self.params.items())))

    def triton_config(self) -> Any:
        """A ``triton.Config`` with the same values (imports triton lazily)."""
        import triton

        launch = {k: self.params[k] for k in _LAUNCH_KEYS if k in self.params}
        return triton.Config(self.meta(), **launch)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items())

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "path": self.path, "template": self.template,
                "config": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KernelConfig:
        try:
            return cls(kernel=str(data["kernel"]), params=dict(data["config"]),
                       path=str(data.get("path", "standard")), template=str(data.get("template", "")))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"kernel config is malformed: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A valid config with its cost-model prediction and, when one was found, a measured time.

    ``measured_us`` comes from the results store (a timing whose output matched the reference);
    ``source`` then says where (``measured:memory``, ``measured:store``, ``measured:shipped``).
    """

    config: KernelConfig
    predicted_us: float
    bound: str
    roofline_pct: float
    reason: str = ""
    breakdown: Mapping[str, float] = field(default_factory=dict)
    measured_us: float | None = None
    source: str = "predicted"

    @property
    def label(self) -> str:
        """``measured`` when a checked timing backs this config, else ``predicted``."""
        return "measured" if self.measured_us is not None else "predicted"

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": dict(self.config.params),
            "kernel": self.config.kernel,
            "path": self.config.path,
            "template": self.config.template,
            "predicted_us": round(self.predicted_us, 4),
            "measured_us": None if self.measured_us is None else round(self.measured_us, 4),
            "label": self.label,
            "source": self.source,
            "bound": self.bound,
            "roofline_pct": round(self.roofline_pct, 2),
            "reason": self.reason,
            "breakdown": {k: round(v, 4) for k, v in self.breakdown.items()},
        }
