"""One inventory of the fleet's hardware: every host and GPU, each detected where it runs.

Locally the host's own detection (NVML + torch, every GPU) is the inventory. With Ray, one task is
pinned to each alive node (``NodeAffinitySchedulingStrategy``) and runs the same detection there, so
every row comes from the machine it describes. A row: host, GPU index, name, device fingerprint (the
results store's key), the known profile it matched, driver, total and free memory, and the measured
copy bandwidth when ``measure`` is set.
"""

from __future__ import annotations

from typing import Any

__all__ = ["detect_rows", "inventory"]


def detect_rows(measure: bool = False) -> list[dict[str, Any]]:
    """This host's rows (a row with ``gpu: None`` for a host without GPUs)."""
    import socket

    from autoopt.hardware.detection import detect

    hw = detect(measure=measure)
    host = socket.gethostname()
    base = {"host": host, "cpu": hw.cpu.model, "ram_bytes": hw.cpu.ram_total_bytes}
    if not hw.gpus:
        return [{**base, "gpu": None, "note": "; ".join(hw.notes)[:200]}]
    return [{**base, "index": g.index, "gpu": g.name, "fingerprint": g.device_fingerprint,
             "profile": g.profile,
             "driver": g.driver_version, "memory_total_bytes": g.memory_total_bytes,
             "memory_free_bytes": g.memory_free_bytes, "measured_bandwidth_gbs": g.measured_bandwidth_gbs}
            for g in hw.gpus]


def inventory(*, ray_address: str | None = None, use_ray: bool = False, measure: bool = False
              ) -> list[dict[str, Any]]:
    """Rows for this host, or (``use_ray``) for every alive node of the Ray cluster at ``ray_address``."""
    if not use_ray:
        return detect_rows(measure)
    from autoopt.fleet.ray_backend import _ray

    ray = _ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0)(detect_rows)
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                .remote(measure) for node in ray.nodes() if node.get("Alive")]
        return [row for rows in ray.get(refs) for row in rows]
    finally:
        if started:
            ray.shutdown()
