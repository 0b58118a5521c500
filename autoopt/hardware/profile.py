"""HardwareProfile: the typed, frozen description of one machine.

This is the contract every template, cost model and plan reads. Units are fixed
and in the field names: sizes in bytes, bandwidth in GB/s (1e9 B/s, counting
bytes read plus bytes written for copies), compute in dense TFLOP/s, clocks in
MHz. ``None`` means "not known"; ``GPUProfile.sources`` says for each field
whether it was ``detected``, ``library`` (looked up in the known-hardware
profiles), ``measured`` or ``derived``, and ``GPUProfile.missing`` says why a
field could not be had.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from autoopt._hash import sha256_hex
from autoopt._serde import from_plain, to_plain
from autoopt.errors import ProfileError
from autoopt.hardware.features import Features, arch_variant, features_for, generation_for

__all__ = ["DTYPES", "SCHEMA_VERSION", "CPUProfile", "GPUProfile", "HardwareProfile", "Link"]

SCHEMA_VERSION = 1
#: dtypes a peak rate may be given for (dense, no sparsity).
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")


def _profile_error(source: str | None) -> Any:
    def make(message: str, where: str) -> ProfileError:
        return ProfileError(message, source=source, field=where)
    return make


@dataclass(frozen=True, slots=True, kw_only=True)
class CPUProfile:
    """The host CPU and its memory."""

    model: str = "unknown"
    vendor: str = "unknown"
    arch: str = "unknown"
    logical_cores: int = 0
    physical_cores: int = 0
    simd: tuple[str, ...] = ()
    l1d_bytes: int | None = None
    l2_bytes: int | None = None
    l3_bytes: int | None = None
    ram_total_bytes: int = 0
    ram_available_bytes: int | None = None
    numa_nodes: int = 1
    #: peak host memory bandwidth (GB/s) if known; used to place work on the CPU.
    mem_bandwidth_gbs: float | None = None
    #: peak fp32 GFLOP/s of the whole CPU if known (cores x SIMD width x FMA x clock).
    peak_gflops_fp32: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> CPUProfile:
        return from_plain(cls, data, _profile_error(source))


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUProfile:
    """One accelerator. Feature flags derive from ``arch`` (see :mod:`autoopt.features`)."""

    name: str
    vendor: str = "nvidia"
    backend: str = "cuda"
    index: int = 0
    uuid: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: int | None = None
    profile: str | None = None
    cc_major: int | None = None
    cc_minor: int | None = None
    arch: str = ""
    generation: str = ""
    sm_count: int | None = None
    max_threads_per_sm: int | None = None
    max_threads_per_block: int | None = None
    warp_size: int | None = None
    regs_per_sm: int | None = None
    regs_per_block: int | None = None
    max_regs_per_thread: int | None = None
    smem_per_sm_bytes: int | None = None
    smem_per_block_bytes: int | None = None
    smem_per_block_optin_bytes: int | None = None
    l2_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_type: str | None = None
    memory_bus_width_bits: int | None = None
    memory_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_bandwidth_gbs: float | None = None
    measured_bandwidth_gbs: float | None = None
    peak_tflops: dict[str, float] = field(default_factory=dict)
    measured_tflops: dict[str, float] = field(default_factory=dict)
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nvlink_links: int | None = None
    nvlink_version: int | None = None
    #: NVLink bandwidth per direction, all links together (GB/s).
    nvlink_bandwidth_gbs: float | None = None
    mig_enabled: bool | None = None
    power_limit_w: float | None = None
    driver_version: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Fill arch and generation from the capability when not given, so a
        # profile written with only cc_major/cc_minor still gets its flags.
        if not self.arch and self.cc_major is not None and self.cc_minor is not None \
                and self.vendor == "nvidia":
            object.__setattr__(self, "arch", arch_variant(self.cc_major, self.cc_minor))
        if not self.generation and self.arch:
            object.__setattr__(self, "generation", generation_for(self.arch))
        for key in self.peak_tflops:
            if key not in DTYPES:
                raise ValueError(f"peak_tflops: unknown dtype {key!r} (known: {', '.join(DTYPES)})")

    @property
    def features(self) -> Features:
        return features_for(self.arch)

    @property
    def cc(self) -> tuple[int, int] | None:
        if self.cc_major is None or self.cc_minor is None:
            return None
        return (self.cc_major, self.cc_minor)

    @property
    def bandwidth_gbs(self) -> float | None:
        """The memory bandwidth to plan with: measured when available, else spec."""
        return self.measured_bandwidth_gbs or self.mem_bandwidth_gbs

    def tflops(self, dtype: str, *, measured: bool = True) -> float | None:
        """Dense peak for ``dtype``: measured if present (unless ``measured=False``), else
        datasheet; fp16<->bf16 share a rate."""
        for table in ((self.measured_tflops, self.peak_tflops) if measured else (self.peak_tflops,)):
            for key in (dtype, {"fp16": "bf16", "bf16": "fp16"}.get(dtype, dtype)):
                if key in table:
                    return table[key]
        return None

    @property
    def device_fingerprint(self) -> str:
        """The GPU model without its software: name + CC + SM count + memory (16 hex chars).

        Two cards of one model, or one card under two drivers, share it; measurements are keyed by
        it (plus the driver and compiler versions, kept apart so a known profile without a driver
        can still find them)."""
        key = "|".join(str(v) for v in (self.name, self.cc_major, self.cc_minor, self.sm_count,
                                          self.memory_total_bytes))
        return sha256_hex(key.encode())[:16]

    @property
    def fingerprint(self) -> str:
        """Stable key: name + CC + SM count + memory + driver (16 hex chars)."""
        key = "|".join(str(v) for v in (self.name, self.cc_major, self.cc_minor, self.sm_count,
                                          self.memory_total_bytes, self.driver_version))
        return sha256_hex(key.encode())[:16]

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        out["features"] = self.features.to_dict()
        out["fingerprint"] = self.fingerprint
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> GPUProfile:
        data = {k: v for k, v in data.items() if k not in ("features", "fingerprint")}
        return from_plain(cls, data, _profile_error(source))

    def with_(self, **changes: Any) -> GPUProfile:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A direct GPU<->GPU (or GPU<->host) connection; ``bandwidth_gbs`` per direction."""

    a: int
    b: int
    kind: str
    links: int = 1
    bandwidth_gbs: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareProfile:
    """One machine: its CPU, every GPU, their links, and what could not be seen."""

    name: str
    origin: str = "detected"
    schema: int = SCHEMA_VERSION
    cpu: CPUProfile = field(default_factory=CPUProfile)
    gpus: tuple[GPUProfile, ...] = ()
    links: tuple[Link, ...] = ()
    host: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def gpu(self) -> GPUProfile | None:
        """The first GPU, or ``None`` on a CPU-only machine."""
        return self.gpus[0] if self.gpus else None

    @property
    def fingerprint(self) -> str:
        parts = [g.fingerprint for g in self.gpus] or [f"cpu:{self.cpu.model}:{self.cpu.logical_cores}"]
        return sha256_hex("|".join(parts).encode())[:16]

    def link_between(self, a: int, b: int) -> Link | None:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "name": self.name,
            "origin": self.origin,
            "fingerprint": self.fingerprint,
            "cpu": self.cpu.to_dict(),
            "gpus": [g.to_dict() for g in self.gpus],
            "links": [link.to_dict() for link in self.links],
            "host": dict(self.host),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> HardwareProfile:
        if not isinstance(data, Mapping):
            raise ProfileError(f"expected a mapping, got {type(data).__name__}", source=source)
        data = dict(data)
        data.pop("fingerprint", None)
        gpus = data.get("gpus", [])
        if isinstance(gpus, list):
            data["gpus"] = [
                {k: v for k, v in g.items() if k not in ("features", "fingerprint")}
                if isinstance(g, Mapping) else g for g in gpus
            ]
        prof = from_plain(cls, data, _profile_error(source))
        if prof.schema != SCHEMA_VERSION:
            raise ProfileError(f"schema {prof.schema} is not supported (expected {SCHEMA_VERSION})",
                               source=source, field="schema")
        return prof

    def to_json(self, **kwargs: Any) -> str:
        import json

        return json.dumps(self.to_dict(), **kwargs)

    def to_yaml(self) -> str:
        import yaml
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_json(cls, text: str, *, source: str | None = None) -> HardwareProfile:
        import json

        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"not valid JSON: {exc}", source=source) from None
        return cls.from_dict(data, source=source)
