"""Detection: capture raw facts, then merge them into a :class:`HardwareProfile`.

:func:`capture` reads the machine (CPU, NVML, optionally torch) into a JSON-able
dict; :func:`build_profile` is a pure function of such a dict, so tests feed
captures taken on real GPU hosts through exactly the code a live run uses.
:func:`detect` is both, plus optional measurements, and never raises.

Merge rules:
- GPUs are NVML's physical devices; torch's devices (numbered after
  ``CUDA_VISIBLE_DEVICES``) are matched to them by UUID or PCI bus id, never by index;
- values an API reports are ``detected``; the known-hardware library
  (:func:`autoopt.library.match_gpu`) fills what no API exposes (datasheet peak
  rates, memory bandwidth and type) and anything the APIs did not give (``library``);
  values computed from others (arch from CC, NVLink bandwidth) are ``derived``;
- datasheet peaks are stored as given: the H100 SXM's 989.4 bf16 TFLOP/s implies a
  lower clock than NVML's 1980 MHz max SM clock, so peaks are never recomputed from clocks;
- every field left ``None`` gets a reason in ``GPUProfile.missing``.
"""

from __future__ import annotations

import dataclasses
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from autoopt._log import get_logger
from autoopt.hardware.cpu import capture_cpu, cpu_from_raw
from autoopt.hardware.nvml import error_of
from autoopt.hardware.profile import CPUProfile, GPUProfile, HardwareProfile, Link

__all__ = [
    "NVLINK_GBS_PER_LINK",
    "PCIE_GBS_PER_LANE",
    "RAW_SCHEMA",
    "build_profile",
    "capture",
    "detect",
    "match_torch_devices",
    "measure_profile",
    "nvlink_version_from_nvml",
    "pcie_bandwidth_gbs",
]

log = get_logger(__name__)

#: version of the raw-capture dict layout (fixtures carry it).
RAW_SCHEMA = 1

# nvmlNvlinkVersion_t (nvml.h, pynvml NVML_NVLINK_VERSION_*): enum value -> NVLink generation.
# The H200 pair reported 6 = NVML_NVLINK_VERSION_4_0 (shared/hardware-captures/h200x2/probe2.txt).
_NVLINK_ENUM = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}

#: NVLink GB/s per link per direction, by generation, from NVIDIA datasheets (total
#: bidirectional / links / 2): P100 160 GB/s / 4 links -> 20; V100 300 / 6 -> 25;
#: A100 600 / 12 -> 25; H100/H200 900 / 18 -> 25; B200 1800 / 18 -> 50. (nvidia-smi
#: nvlink -s shows 26.562 GB/s per NVLink4 link: the raw signalling rate.)
NVLINK_GBS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}

#: PCIe GB/s per lane per direction (PCI-SIG): gen1/2 8b/10b at 2.5/5 GT/s; gen3-5
#: 128b/130b at 8/16/32 GT/s; gen6 64 GT/s FLIT (242/256). Gen5 x16 = 63.0, gen4 x16 = 31.5.
PCIE_GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8,
                     5: 32 * 128 / 130 / 8, 6: 64 * 242 / 256 / 8}

# GPU fields that describe one installed card: never taken from the library.
_NOT_FROM_LIBRARY = frozenset({"name", "vendor", "backend", "index", "uuid", "pci_bus_id", "profile",
                               "memory_free_bytes", "measured_bandwidth_gbs", "measured_tflops",
                               "mig_enabled", "driver_version", "sources", "missing", "arch",
                               "generation"})
# Fields no API reports: only the library (or a measurement) can give them.
_NO_API = ("mem_bandwidth_gbs", "memory_type", "peak_tflops", "max_regs_per_thread")
_BUS_RE = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-7])?$")


# --------------------------------------------------------------------------- capture

def _host_facts() -> dict[str, str]:
    """OS and Python facts (no host name: profiles get shared)."""
    return {"os": platform.system(), "os_release": platform.release(), "machine": platform.machine(),
            "python": platform.python_version(), "implementation": platform.python_implementation()}


def capture(*, use_torch: bool = True) -> dict[str, Any]:
    """Read this machine into a JSON-able dict of raw facts (the input of :func:`build_profile`)."""
    import importlib.util

    from autoopt.hardware.nvml import capture_nvml
    from autoopt.hardware.torch_cuda import capture_torch, package_version

    raw: dict[str, Any] = {"raw_schema": RAW_SCHEMA, "host": _host_facts(), "cpu": capture_cpu(),
                           "nvml": capture_nvml()}
    if not use_torch:
        raw["torch"] = {"available": False, "skipped": True, "error": "torch not used (use_torch=False)",
                        "triton_version": package_version("triton")}
    elif importlib.util.find_spec("torch") is None:
        raw["torch"] = {"available": False, "error": "torch not installed",
                        "triton_version": package_version("triton")}
    else:
        raw["torch"] = capture_torch()
    return raw


# --------------------------------------------------------------------------- helpers

def nvlink_version_from_nvml(value: Any) -> int | None:
    """NVLink generation from NVML's ``nvmlNvlinkVersion_t`` (6 -> 4); ``None`` if unknown."""
    return _NVLINK_ENUM.get(value) if isinstance(value, int) and not isinstance(value, bool) else None


def pcie_bandwidth_gbs(gen: int | None, width: int | None) -> float | None:
    """PCIe bandwidth per direction for a link of ``gen`` and ``width`` lanes (gen5 x16 -> 63.0)."""
    if gen is None or width is None or gen not in PCIE_GBS_PER_LANE:
        return None
    return round(PCIE_GBS_PER_LANE[gen] * width, 1)


def _norm_uuid(value: Any) -> str | None:
    """``GPU-1a2b...`` (NVML) and ``1a2b...`` (torch) to one form; ``None`` for errors/redactions."""
    if not isinstance(value, str) or error_of(value):
        return None
    text = value.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text or None


def _norm_bus(value: Any) -> tuple[int, int, int] | None:
    """``00000000:00:06.0`` -> (domain 0, bus 0, device 6)."""
    if not isinstance(value, str):
        return None
    m = _BUS_RE.match(value.strip())
    if not m:
        return None
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16))


def _torch_bus(props: Mapping[str, Any]) -> tuple[int, int, int] | None:
    # torch's pci_bus_id / pci_device_id are the bus and slot numbers (H100: 0 and 6 for
    # 00000000:00:06.0), not NVML's PCI device id 0x2330.
    parts = [_int(props.get(k)) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    domain, bus, device = parts
    if domain is not None and bus is not None and device is not None:
        return (domain, bus, device)
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _int_or(value: Any, default: int) -> int:
    """``value`` when it is an integer (not a bool), else ``default``."""
    got = _int(value)
    return default if got is None else got


def _mw_to_w(value: Any) -> float | None:
    mw = _int(value)
    return mw / 1000.0 if mw is not None else None


def _nvml_devices(nvml: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if not nvml.get("available"):
        return []
    return [d for d in (nvml.get("devices") or []) if isinstance(d, Mapping)]


def _torch_devices(torch: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if not torch.get("available"):
        return []
    return [d for d in (torch.get("devices") or []) if isinstance(d, Mapping) and "props" in d]


def match_torch_devices(raw: Mapping[str, Any]) -> dict[int, int]:
    """NVML physical index -> torch device index, matched by UUID, else PCI bus id.

    A UUID or bus id shared by several NVML devices (redacted captures) is not
    used. Indices are never compared: torch numbers devices after
    ``CUDA_VISIBLE_DEVICES``, NVML by physical slot.
    """
    nv = _nvml_devices(raw.get("nvml") or {})
    th = _torch_devices(raw.get("torch") or {})
    by_uuid: dict[str, list[int]] = {}
    by_bus: dict[tuple[int, int, int], list[int]] = {}
    for pos, dev in enumerate(nv):
        index = _int_or(dev.get("index"), pos)
        if (u := _norm_uuid(dev.get("uuid"))) is not None:
            by_uuid.setdefault(u, []).append(index)
        if (b := _norm_bus(dev.get("pci_bus_id"))) is not None:
            by_bus.setdefault(b, []).append(index)
    out: dict[int, int] = {}
    for pos, tdev in enumerate(th):
        tindex = _int_or(tdev.get("index"), pos)
        props = tdev["props"]
        hit = by_uuid.get(_norm_uuid(props.get("uuid")) or "", [])
        if len(hit) != 1:
            hit = by_bus.get(_torch_bus(props) or (-1, -1, -1), [])
        if len(hit) == 1 and hit[0] not in out:
            out[hit[0]] = tindex
    return out


# --------------------------------------------------------------------------- GPU merge

class _Merge:
    """Field values with where each came from, and why the missing ones are missing."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.reasons: dict[str, list[str]] = {}

    def offer(self, field: str, value: Any, source: str, reason: str | None) -> None:
        """Take ``value`` unless the field is already set; remember ``reason`` when it is ``None``."""
        if field in self.values:
            return
        if value is None or value == {}:
            if reason and reason not in self.reasons.setdefault(field, []):
                self.reasons[field].append(reason)
            return
        self.values[field] = value
        self.sources[field] = source

    def why(self, field: str, reason: str) -> None:
        if reason not in self.reasons.setdefault(field, []):
            self.reasons[field].append(reason)


def _nvml_getter(dev: Mapping[str, Any] | None, nvml: Mapping[str, Any]) -> Any:
    """``get(key, convert)`` -> (value, reason) for one NVML device's raw dict."""
    def get(key: str, convert: Any = _int) -> tuple[Any, str | None]:
        if dev is None:
            err = nvml.get("error") or "not captured"
            if nvml.get("available"):
                return None, "NVML: device not listed"
            return None, f"NVML unavailable: {err}"
        if key not in dev:
            return None, f"NVML: {key} not captured"
        value = dev[key]
        if (err := error_of(value)) is not None:
            return None, f"NVML: {err}"
        out = convert(value)
        return out, None if out is not None else f"NVML: unexpected value {value!r} for {key}"
    return get


def _torch_getter(props: Mapping[str, Any] | None, why_absent: str, version: str | None) -> Any:
    def get(key: str, convert: Any = _int) -> tuple[Any, str | None]:
        if props is None:
            return None, why_absent
        if key not in props:
            return None, f"torch{' ' + version if version else ''}: get_device_properties has no {key!r}"
        value = props[key]
        out = convert(value) if value is not None else None
        return out, None if out is not None else f"torch: {key} = {value!r}"
    return get


def _khz_to_mhz(value: Any) -> int | None:
    v = _int(value)
    return v // 1000 if v is not None else None


def _device_id(value: Any) -> int | None:
    # NVML packs device id (upper 16 bits) and vendor id: 0x233010DE -> 0x2330.
    v = _int(value)
    return v >> 16 if v is not None and v > 0xFFFF else v


def _mig(value: Any) -> bool | None:
    if isinstance(value, (list, tuple)) and value and _int(value[0]) is not None:
        return value[0] == 1  # NVML_DEVICE_MIG_ENABLE = 1; [current, pending]
    return None


def _active_links(dev: Mapping[str, Any] | None) -> tuple[int | None, str | None]:
    """Active NVLink count from per-link states (1 = active), or the reason it is unknown."""
    if dev is None:
        return None, "NVML unavailable"
    count = dev.get("nvlink_link_count")
    states = dev.get("nvlink_states")
    if isinstance(states, list) and states:
        ints = [s for s in states if _int(s) is not None]
        if ints:
            return sum(1 for s in ints if s == 1), None
        errs = sorted({e for s in states if (e := error_of(s))})
        return None, f"NVML: {', '.join(errs) or 'no link state'}"
    if (err := error_of(count)) is not None:
        return None, f"NVML: {err}"
    if _int(count) == 0:
        return 0, None
    return None, "NVML: nvlink_states not captured"


def _take_detected(m: _Merge, dev: Mapping[str, Any] | None, props: Mapping[str, Any] | None,
                   raw: Mapping[str, Any], torch_why: str) -> None:
    """Offer every value NVML (first) and torch report for one GPU."""
    nvml = raw.get("nvml") or {}
    nv = _nvml_getter(dev, nvml)
    th = _torch_getter(props, torch_why, (raw.get("torch") or {}).get("version"))

    def take(field: str, *cands: tuple[Any, str | None]) -> None:
        for value, reason in cands:
            m.offer(field, value, "detected", reason)

    take("name", nv("name", lambda v: v if isinstance(v, str) and v else None), th("name", str))
    take("uuid", nv("uuid", lambda v: v if isinstance(v, str) else None), th("uuid", str))
    take("pci_bus_id", nv("pci_bus_id", lambda v: v if isinstance(v, str) else None))
    take("pci_device_id", nv("pci_device_id", _device_id))
    cc_nv, why_cc = nv("cuda_compute_capability",
                       lambda v: list(v) if isinstance(v, list) and len(v) == 2 else None)
    take("cc_major", (cc_nv[0] if cc_nv else None, why_cc), th("major"))
    take("cc_minor", (cc_nv[1] if cc_nv else None, why_cc), th("minor"))
    take("sm_count", th("multi_processor_count"))
    take("max_threads_per_sm", th("max_threads_per_multi_processor"))
    take("max_threads_per_block", th("max_threads_per_block"))
    take("warp_size", th("warp_size"))
    take("regs_per_sm", th("regs_per_multiprocessor"))
    take("regs_per_block", th("regs_per_block"))
    take("smem_per_sm_bytes", th("shared_memory_per_multiprocessor"))
    take("smem_per_block_bytes", th("shared_memory_per_block"))
    take("smem_per_block_optin_bytes", th("shared_memory_per_block_optin"))
    take("l2_bytes", th("L2_cache_size"))
    # NVML's total (85520809984 B on the H100) is the whole framebuffer and does not
    # depend on torch; torch's total_memory (85017493504 B) is the fallback.
    take("memory_total_bytes", nv("memory_total_bytes"), th("total_memory"))
    take("memory_free_bytes", nv("memory_free_bytes"))
    take("memory_bus_width_bits", nv("memory_bus_width_bits"), th("memory_bus_width"))
    take("memory_clock_mhz", nv("max_mem_clock_mhz"), th("memory_clock_rate", _khz_to_mhz))
    take("sm_clock_max_mhz", nv("max_sm_clock_mhz"), th("clock_rate", _khz_to_mhz))
    take("pcie_gen", nv("pcie_max_gen"))
    take("pcie_width", nv("pcie_max_width"))
    take("mig_enabled", nv("mig_mode", _mig))
    take("power_limit_w", nv("power_limit_mw", _mw_to_w))
    links, why_links = _active_links(dev)
    take("nvlink_links", (links, why_links))
    if links:
        take("nvlink_version", nv("nvlink_version", nvlink_version_from_nvml))
    elif links == 0:
        m.why("nvlink_version", "no active NVLink")
    else:
        m.why("nvlink_version", why_links or "NVLink not reported")
    drv = nvml.get("driver_version")
    take("driver_version", (drv if isinstance(drv, str) and not error_of(drv) else None,
                            f"NVML: {drv}" if error_of(drv) else
                            (f"NVML unavailable: {nvml.get('error')}" if not nvml.get("available")
                             else "NVML: driver_version not captured")))
    for field in _NO_API:
        m.why(field, "no API reports it")


def _take_library(m: _Merge, index: int, dev: Mapping[str, Any] | None, extra_dirs: Iterable[Path | str],
                  notes: list[str]) -> str:
    """Fill what detection left empty from the matching known-hardware profile.

    Returns the phrase that explains, in ``missing``, why the library did not help.
    """
    name = m.values.get("name", f"GPU {index}")
    cc = (m.values["cc_major"], m.values["cc_minor"]) if "cc_major" in m.values and "cc_minor" in m.values \
        else None
    known = None
    try:
        from autoopt.hardware.library import match_gpu

        pid_raw = dev.get("pci_device_id") if dev is not None else None
        known = match_gpu(name=m.values.get("name"), pci_device_id=_int(pid_raw), cc=cc,
                          memory_total_bytes=m.values.get("memory_total_bytes"), extra_dirs=extra_dirs)
    except Exception as exc:  # a broken library file must not break detection
        log.debug("known-hardware lookup failed", exc_info=True)
        notes.append(f"GPU {index}: known-hardware lookup failed: {type(exc).__name__}: {exc}")
    if known is None:
        lib_why = f"no known-hardware profile matches {name!r}"
        if m.values.get("pci_device_id") is not None:
            lib_why += f" (PCI device id {m.values['pci_device_id']:#06x})"
        notes.append(f"GPU {index}: {lib_why}")
    else:
        lib_why = f"not in known-hardware profile {known.name!r}"
        m.values["profile"] = known.name
        m.sources["profile"] = "library"
        lib = known.gpu
        ic = known.interconnect
        for f in dataclasses.fields(GPUProfile):
            if f.name in _NOT_FROM_LIBRARY or f.name in m.values:
                continue
            value = getattr(lib, f.name)
            if f.name.startswith("nvlink_") and value is None and ic is not None and ic.kind == "nvlink":
                value = {"nvlink_links": ic.links, "nvlink_version": ic.version,
                         "nvlink_bandwidth_gbs": ic.bandwidth_gbs}[f.name]
            m.offer(f.name, dict(value) if isinstance(value, dict) else value, "library", None)
        for name in ("sm_count", "cc_major", "cc_minor", "smem_per_block_optin_bytes"):
            lv = getattr(lib, name)
            if m.sources.get(name) == "detected" and lv is not None and lv != m.values[name]:
                notes.append(f"GPU {index}: detected {name}={m.values[name]} differs from known-hardware profile "
                             f"{known.name!r} ({lv}); kept the detected value")
    return lib_why


def _derive_nvlink_bandwidth(m: _Merge) -> None:
    """NVLink bandwidth from the detected active links: links x per-link rate of the generation."""
    if m.sources.get("nvlink_links") == "detected":
        version = m.values.get("nvlink_version")
        rate = NVLINK_GBS_PER_LINK.get(version) if version is not None else None
        if rate is not None:
            m.values["nvlink_bandwidth_gbs"] = m.values["nvlink_links"] * rate
            m.sources["nvlink_bandwidth_gbs"] = "derived"
        elif m.values["nvlink_links"] == 0:
            m.values["nvlink_bandwidth_gbs"] = 0.0
            m.sources["nvlink_bandwidth_gbs"] = "derived"
        elif "nvlink_bandwidth_gbs" not in m.values:
            m.why("nvlink_bandwidth_gbs", f"no per-link rate known for NVLink version {version}")


def _build_gpu(index: int, dev: Mapping[str, Any] | None, props: Mapping[str, Any] | None,
               raw: Mapping[str, Any], torch_why: str, extra_dirs: Iterable[Path | str],
               notes: list[str]) -> GPUProfile:
    """One GPU: detected values, then the library, then derived values and missing reasons."""
    m = _Merge()
    _take_detected(m, dev, props, raw, torch_why)
    lib_why = _take_library(m, index, dev, extra_dirs, notes)
    _derive_nvlink_bandwidth(m)
    values = dict(m.values)
    values.setdefault("name", f"GPU {index}")
    values["index"] = index
    if "cc_major" in values and "cc_minor" in values:
        m.sources["arch"] = m.sources["generation"] = "derived"
    gpu = GPUProfile(**values)
    missing: dict[str, str] = {}
    skip = {"sources", "missing", "measured_tflops", "vendor", "backend", "index", "profile"}
    for f in dataclasses.fields(GPUProfile):
        if f.name in skip:
            continue
        value = getattr(gpu, f.name)
        if value is None or value == {} or value == "":
            if f.name == "measured_bandwidth_gbs":
                missing[f.name] = "not measured (detect(measure=True) measures it)"
                continue
            reasons = list(m.reasons.get(f.name) or ["not reported"])
            reasons.append(lib_why)
            missing[f.name] = "; ".join(reasons)
    if "profile" not in values:
        missing["profile"] = lib_why
    return dataclasses.replace(gpu, sources=dict(sorted(m.sources.items())), missing=missing)


def _pair_links(gpus: tuple[GPUProfile, ...], raw: Mapping[str, Any], notes: list[str]) -> tuple[Link, ...]:
    """One link per GPU pair: NVLink where NVML's P2P NVLink status is OK, else PCIe."""
    nvml = raw.get("nvml") or {}
    devs = {_int_or(d.get("index"), i): d for i, d in enumerate(_nvml_devices(nvml))}
    status: dict[tuple[int, int], Any] = {}
    for entry in nvml.get("p2p") or []:
        if not isinstance(entry, Mapping):
            continue
        a, b = _int(entry.get("a")), _int(entry.get("b"))
        if a is not None and b is not None:
            status[(min(a, b), max(a, b))] = entry.get("nvlink_status")
    by_index = {g.index: g for g in gpus}
    out: list[Link] = []
    for i, ga in enumerate(gpus):
        for gb in gpus[i + 1:]:
            a, b = sorted((ga.index, gb.index))
            st = status.get((a, b))
            if st == 0:  # NVML_P2P_STATUS_OK
                out.append(_nvlink(by_index[a], by_index[b], devs.get(a), devs.get(b)))
                continue
            if st is None or error_of(st):
                notes.append(f"GPUs {a}-{b}: NVLink P2P status {'not captured' if st is None else st}; "
                             "assuming PCIe")
            gens = [g.pcie_gen for g in (ga, gb)]
            widths = [g.pcie_width for g in (ga, gb)]
            bw = None
            if None not in gens and None not in widths:
                bw = pcie_bandwidth_gbs(min(gens), min(widths))  # type: ignore[type-var]
            out.append(Link(a=a, b=b, kind="pcie", links=1, bandwidth_gbs=bw))
    return tuple(out)


def _nvlink(ga: GPUProfile, gb: GPUProfile, da: Mapping[str, Any] | None,
            db: Mapping[str, Any] | None) -> Link:
    """An NVLink pair: links counted from the remote bus ids when they name the peer,
    else the smaller active-link count of the two (an NVSwitch gives every pair all links)."""
    links = None
    peer = _norm_bus(gb.pci_bus_id)
    remotes = (da or {}).get("nvlink_remote_bus_ids")
    if peer is not None and isinstance(remotes, list):
        direct = sum(1 for r in remotes if _norm_bus(r) == peer)
        links = direct or None
    if links is None:
        counts = [g.nvlink_links for g in (ga, gb) if g.nvlink_links]
        links = min(counts) if counts else None
    version = ga.nvlink_version or gb.nvlink_version
    rate = NVLINK_GBS_PER_LINK.get(version) if version is not None else None
    bw = links * rate if links and rate else None
    if bw is None and ga.nvlink_bandwidth_gbs and ga.nvlink_links and links:
        bw = ga.nvlink_bandwidth_gbs / ga.nvlink_links * links
    return Link(a=ga.index, b=gb.index, kind="nvlink", links=links or 1, bandwidth_gbs=bw)


def _host(raw: Mapping[str, Any]) -> dict[str, str]:
    host = {str(k): str(v) for k, v in (raw.get("host") or {}).items() if v is not None}
    nvml = raw.get("nvml") or {}
    torch = raw.get("torch") or {}
    if isinstance(nvml.get("driver_version"), str) and not error_of(nvml["driver_version"]):
        host["driver_version"] = nvml["driver_version"]
    cuda = _int(nvml.get("cuda_driver_version"))
    if cuda:  # 13000 -> "13.0" (nvmlSystemGetCudaDriverVersion: 1000 * major + 10 * minor)
        host["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    for key, label in (("version", "torch_version"), ("cuda_version", "torch_cuda_version"),
                       ("triton_version", "triton_version"),
                       ("cuda_visible_devices", "cuda_visible_devices")):
        if torch.get(key) is not None:
            host[label] = str(torch[key])
    return host


def build_profile(raw: Mapping[str, Any], *, extra_dirs: Iterable[Path | str] = ()) -> HardwareProfile:
    """Merge raw facts (from :func:`capture` or a fixture) into a :class:`HardwareProfile`.

    Pure: reads nothing but ``raw`` and the known-hardware library.
    """
    extra_dirs = tuple(extra_dirs) if not isinstance(extra_dirs, (str, Path)) else (extra_dirs,)
    notes: list[str] = []
    cpu_raw = raw.get("cpu")
    if isinstance(cpu_raw, Mapping):
        cpu, cpu_notes = cpu_from_raw(dict(cpu_raw))
    else:
        cpu, cpu_notes = CPUProfile(), ["CPU: not captured"]
    notes += cpu_notes
    nvml = raw.get("nvml") or {}
    torch = raw.get("torch") or {}
    nv_devs = _nvml_devices(nvml)
    th_devs = _torch_devices(torch)
    torch_why = str(torch.get("error") or "torch: not captured")
    if not nvml.get("available"):
        notes.append(f"NVML unavailable: {nvml.get('error') or 'not captured'}")
    elif nvml.get("error"):
        notes.append(f"NVML capture stopped early: {nvml['error']}")
    if not torch.get("available"):
        notes.append(f"torch: {torch_why}")
    gpus: list[GPUProfile] = []
    if nv_devs:
        mapping = match_torch_devices(raw)
        props_by_torch = {_int_or(d.get("index"), i): d["props"] for i, d in enumerate(th_devs)}
        for pos, dev in enumerate(nv_devs):
            index = _int_or(dev.get("index"), pos)
            if "error" in dev:
                notes.append(f"GPU {index}: NVML could not open it: {dev['error']}")
            props = None
            why = torch_why
            if index in mapping:
                props = props_by_torch[mapping[index]]
                if mapping[index] != index:
                    notes.append(f"GPU {index} (NVML) is torch device {mapping[index]} "
                                 f"(CUDA_VISIBLE_DEVICES={torch.get('cuda_visible_devices')!r})")
            elif torch.get("available"):
                why = ("torch: no visible device has this GPU's UUID or PCI bus id "
                       f"(CUDA_VISIBLE_DEVICES={torch.get('cuda_visible_devices')!r})")
                notes.append(f"GPU {index}: not visible to torch; SM/SMEM/L2 facts only from the library")
            gpus.append(_build_gpu(index, dev, props, raw, why, extra_dirs, notes))
        unmatched = sorted(set(props_by_torch) - set(mapping.values()))
        if unmatched:
            notes.append(f"torch devices {unmatched} match no NVML GPU by UUID or PCI bus id")
    elif th_devs:
        notes.append("GPUs enumerated from torch (NVML unavailable): indices follow CUDA_VISIBLE_DEVICES")
        for pos, tdev in enumerate(th_devs):
            gpus.append(_build_gpu(_int_or(tdev.get("index"), pos), None, tdev["props"], raw, torch_why,
                                   extra_dirs, notes))
    elif nvml.get("available"):
        notes.append("no GPU: NVML lists 0 devices")
    else:
        notes.append("no GPU detected (NVML unavailable and torch sees no CUDA device)")
    gpu_tuple = tuple(gpus)
    links = _pair_links(gpu_tuple, raw, notes) if len(gpu_tuple) > 1 else ()
    return HardwareProfile(name="detected", origin="detected", cpu=cpu, gpus=gpu_tuple, links=links,
                           host=_host(raw), notes=tuple(notes))


# --------------------------------------------------------------------------- detect

def measure_profile(profile: HardwareProfile, raw: Mapping[str, Any],
                    results: Mapping[int, Mapping[str, Any]] | None = None) -> HardwareProfile:
    """Fill ``measured_*`` by running the probes on every GPU torch can reach.

    ``results`` (NVML index -> :func:`autoopt.probes.measure_gpu` output) uses numbers
    already taken instead of measuring again. Failures become notes.
    """
    from autoopt.hardware.probes import measure_gpu

    mapping = match_torch_devices(raw)
    if not (raw.get("nvml") or {}).get("available"):  # GPUs came from torch: same indices
        mapping = {g.index: g.index for g in profile.gpus}
    notes = list(profile.notes)
    gpus = []
    for gpu in profile.gpus:
        tindex = mapping.get(gpu.index)
        if tindex is None:
            notes.append(f"GPU {gpu.index}: not measured (not visible to torch)")
            gpus.append(gpu)
            continue
        try:
            result = dict(results[gpu.index]) if results is not None and gpu.index in results \
                else measure_gpu(tindex)
            if "error" in result:
                raise RuntimeError(result["error"])
        except Exception as exc:
            notes.append(f"GPU {gpu.index}: measurement failed: {type(exc).__name__}: {exc}")
            gpus.append(gpu)
            continue
        sources = dict(gpu.sources, measured_bandwidth_gbs="measured", measured_tflops="measured")
        missing = {k: v for k, v in gpu.missing.items() if k != "measured_bandwidth_gbs"}
        gpus.append(dataclasses.replace(
            gpu, measured_bandwidth_gbs=result["copy_gbs"],
            measured_tflops={**gpu.measured_tflops, "bf16": result["bf16_tflops"]},
            sources=sources, missing=missing))
        notes.append(f"GPU {gpu.index}: measured with {result.get('method')}")
    return dataclasses.replace(profile, gpus=tuple(gpus), notes=tuple(notes))


def detect(*, measure: bool = False, use_torch: bool = True,
           extra_dirs: Iterable[Path | str] = ()) -> HardwareProfile:
    """Detect this machine; with ``measure`` also time copy bandwidth and bf16 matmul. Never raises."""
    try:
        raw = capture(use_torch=use_torch or measure)
    except Exception as exc:  # capture is already defensive; this is the last line
        log.debug("capture failed", exc_info=True)
        raw = {"raw_schema": RAW_SCHEMA, "host": {}, "cpu": capture_cpu(),
               "nvml": {"available": False, "error": f"capture failed: {type(exc).__name__}: {exc}"},
               "torch": {"available": False, "error": "capture failed"}}
    try:
        profile = build_profile(raw, extra_dirs=extra_dirs)
    except Exception as exc:
        log.debug("build_profile failed", exc_info=True)
        cpu, notes = cpu_from_raw(raw.get("cpu") or {})
        return HardwareProfile(name="detected", cpu=cpu, host=_host_facts(),
                               notes=(*notes, f"detection failed: {type(exc).__name__}: {exc}"))
    if measure:
        try:
            profile = measure_profile(profile, raw)
        except Exception as exc:
            profile = dataclasses.replace(profile, notes=(*profile.notes,
                                                          f"measurement failed: {type(exc).__name__}: {exc}"))
    return profile


if __name__ == "__main__":  # python -m autoopt.detection: print this machine's profile
    sys.stdout.write(detect().to_json(indent=2) + "\n")
