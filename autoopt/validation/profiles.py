"""The hardware profiles a check predicts with, and what a result file records of each.

By default the detected profile (datasheet rates: what autoopt plans with by default) and, as a second
reference, the same profile with measured copy bandwidth and bf16 matmul rate (autoopt prefers measured
rates when a profile has them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoopt._log import get_logger
from autoopt.hardware.profile import HardwareProfile

__all__ = ["add_measured_profile", "detected_profiles", "profile_info"]

log = get_logger(__name__)


def detected_profiles() -> tuple[dict[str, HardwareProfile], Mapping[str, Any]]:
    """``{"detected": profile}`` of this machine and the raw capture it was built from (torch included)."""
    from autoopt.hardware.detection import build_profile, capture

    raw = capture(use_torch=True)
    return {"detected": build_profile(raw)}, raw


def add_measured_profile(profiles: dict[str, HardwareProfile], raw: Mapping[str, Any] | None) -> None:
    """Add ``detected+measured``: the detected profile with measured copy bandwidth and bf16 matmul rate.

    Nothing is added without a raw capture (a named profile is not this machine) or when measuring fails.
    """
    from autoopt.hardware.detection import measure_profile

    if raw is None or "detected" not in profiles:
        return
    try:
        profiles["detected+measured"] = measure_profile(profiles["detected"], raw)
    except Exception as exc:
        log.warning("measuring the profile failed: %s", exc)


def profile_info(p: HardwareProfile) -> dict[str, Any]:
    """The rates and links of ``p`` that the predictions depend on, and where measured ones came from."""
    return {"name": p.name, "links": [lk.to_dict() for lk in p.links],
            "gpus": [{"index": g.index, "name": g.name, "driver": g.driver_version,
                      "bandwidth_gbs": g.bandwidth_gbs,
                      "bf16_tflops": g.tflops("bf16"), "memory_total_bytes": g.memory_total_bytes,
                      "sources": {k: g.sources.get(k) for k in ("measured_bandwidth_gbs", "measured_tflops")
                                  if g.sources.get(k)}} for g in p.gpus]}
