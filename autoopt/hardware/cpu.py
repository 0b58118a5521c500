"""Host CPU detection: cores, RAM, SIMD flags, caches and NUMA nodes.

Detection is split in two so tests can feed captured data through the same
logic: :func:`capture_cpu` reads the machine into a JSON-able dict of raw facts,
:func:`cpu_from_raw` turns such a dict into a :class:`CPUProfile` plus notes.

Linux is read directly (``/proc/cpuinfo``, ``/sys``): a few milliseconds.
py-cpuinfo is only a fallback for systems without ``/proc/cpuinfo`` (macOS,
Windows) because ``cpuinfo.get_cpu_info()`` sleeps to time the clock: measured
1.22 s on the H100 host (shared/hardware-captures/h100/probe.txt); its result is
cached. Nothing here raises: what cannot be read is recorded with the reason.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from pathlib import Path
from typing import Any

from autoopt._log import get_logger
from autoopt.hardware.profile import CPUProfile

__all__ = ["SIMD_NAMES", "capture_cpu", "cpu_from_raw", "detect_cpu", "normalise_simd"]

log = get_logger(__name__)

_PROC_CPUINFO = Path("/proc/cpuinfo")
_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_NODE_DIR = Path("/sys/devices/system/node")

#: canonical SIMD names, in the order a profile lists them.
SIMD_NAMES = (
    "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "neon", "sve", "sve2",
)
# Spellings seen for the same feature: Linux /proc/cpuinfo uses the canonical
# x86 names and "asimd" for Arm NEON; py-cpuinfo drops the underscores
# ("avx512vnni") and macOS/py-cpuinfo may say "neon".
_SIMD_ALIASES = {
    **{name: name for name in SIMD_NAMES},
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "amx-tile": "amx_tile", "amxtile": "amx_tile",
    "amx-bf16": "amx_bf16", "amxbf16": "amx_bf16",
    "amx-int8": "amx_int8", "amxint8": "amx_int8",
    "asimd": "neon",
}

# Arm MIDR_EL1 implementer codes (Arm Architecture Reference Manual, "MIDR_EL1").
_ARM_IMPLEMENTERS = {
    0x41: "Arm", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
    0x4E: "NVIDIA", 0x50: "Applied Micro", 0x51: "Qualcomm", 0x61: "Apple", 0xC0: "Ampere",
}


def normalise_simd(flags: list[str] | tuple[str, ...], arch: str = "") -> tuple[str, ...]:
    """Map raw CPU flags to the canonical SIMD names autoopt plans with."""
    found = {_SIMD_ALIASES[f.lower()] for f in flags if f.lower() in _SIMD_ALIASES}
    # AArch64 makes Advanced SIMD (NEON) mandatory (Armv8-A), so a 64-bit Arm
    # CPU has it even where the flag list (macOS) does not say so.
    if arch.lower() in ("aarch64", "arm64"):
        found.add("neon")
    return tuple(name for name in SIMD_NAMES if name in found)


def _parse_size(text: str) -> int | None:
    """Parse a sysfs cache size such as ``32K`` or ``2M`` into bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, flags=re.IGNORECASE)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def _read_proc_cpuinfo(raw: dict[str, Any], errors: dict[str, str]) -> bool:
    """Fill model, vendor, flags (and a physical-core count) from /proc/cpuinfo."""
    try:
        text = _PROC_CPUINFO.read_text(errors="replace")
    except OSError as exc:
        errors["cpuinfo"] = f"{_PROC_CPUINFO}: {exc.strerror or exc}"
        return False
    first: dict[str, str] = {}
    cores: set[tuple[str, str]] = set()
    block: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if block:
                if not first:
                    first = block
                if "physical id" in block and "core id" in block:
                    cores.add((block["physical id"], block["core id"]))
            block = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            block[key.strip().lower()] = value.strip()
    raw["source"] = str(_PROC_CPUINFO)
    if "model name" in first:
        raw["model"] = first["model name"]
    if "vendor_id" in first:
        raw["vendor"] = first["vendor_id"]
    if "cpu implementer" in first:  # Arm: no vendor_id, often no model name
        try:
            impl = int(first["cpu implementer"], 0)
            raw.setdefault("vendor", _ARM_IMPLEMENTERS.get(impl, f"Arm implementer {impl:#x}"))
            raw.setdefault("model", f"{raw['vendor']} part {first.get('cpu part', '?')}")
        except ValueError:
            pass
    flags = first.get("flags") or first.get("features")
    if flags is not None:
        raw["flags"] = flags.split()
    else:
        errors["flags"] = f"{_PROC_CPUINFO} has no 'flags' or 'Features' line"
    if cores:
        raw["physical_cores_cpuinfo"] = len(cores)
    return True


@functools.lru_cache(maxsize=1)
def _py_cpuinfo() -> dict[str, Any]:
    """py-cpuinfo's answer, once per process (it sleeps ~1.2 s to time the clock)."""
    import cpuinfo  # py-cpuinfo; lazy: only where /proc/cpuinfo is missing

    return dict(cpuinfo.get_cpu_info())


def _read_py_cpuinfo(raw: dict[str, Any], errors: dict[str, str]) -> None:
    try:
        info = _py_cpuinfo()
    except Exception as exc:  # py-cpuinfo missing or failing: record, carry on
        errors["cpuinfo"] = f"py-cpuinfo failed: {type(exc).__name__}: {exc}"
        return
    raw["source"] = "py-cpuinfo"
    if info.get("brand_raw"):
        raw["model"] = info["brand_raw"]
    if info.get("vendor_id_raw"):
        raw["vendor"] = info["vendor_id_raw"]
    if info.get("flags"):
        raw["flags"] = list(info["flags"])
    # py-cpuinfo reports L2 as the whole chip's (33554432 B = 16 x 2 MiB on the
    # H100 host's Xeon), not cpu0's share as sysfs does; kept, with a note.
    caches = {}
    for key, level in (("l1_data_cache_size", "L1d"), ("l2_cache_size", "L2"), ("l3_cache_size", "L3")):
        value = info.get(key)
        if isinstance(value, int) and value > 0:
            caches[level] = value
    if caches:
        raw["caches"] = caches
        raw["cache_source"] = "py-cpuinfo (L2 may be the total of all cores)"


def _read_caches(raw: dict[str, Any], errors: dict[str, str]) -> None:
    """Cache sizes as seen by cpu0: L1d and L2 per core, L3 per shared instance."""
    try:
        entries = sorted(_CACHE_DIR.glob("index*"))
    except OSError as exc:
        errors["caches"] = f"{_CACHE_DIR}: {exc}"
        return
    caches: dict[str, int] = {}
    for entry in entries:
        try:
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            size = _parse_size((entry / "size").read_text())
        except OSError:
            continue
        if size is None:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        caches[f"L{level}{suffix}"] = size
    if caches:
        raw["caches"] = caches
        raw["cache_source"] = str(_CACHE_DIR)
    else:
        errors["caches"] = f"{_CACHE_DIR} lists no caches"


def _read_numa(raw: dict[str, Any], errors: dict[str, str]) -> None:
    if not _NODE_DIR.is_dir():
        errors["numa_nodes"] = f"{_NODE_DIR} does not exist"
        return
    nodes = [p for p in _NODE_DIR.iterdir() if re.fullmatch(r"node\d+", p.name)]
    if nodes:
        raw["numa_nodes"] = len(nodes)
    else:
        errors["numa_nodes"] = f"{_NODE_DIR} lists no node* entries"


def capture_cpu() -> dict[str, Any]:
    """Read this machine's CPU facts into a JSON-able dict (never raises)."""
    raw: dict[str, Any] = {"arch": platform.machine() or "unknown", "logical_cores": os.cpu_count()}
    errors: dict[str, str] = {}
    try:
        import psutil

        try:
            raw["physical_cores"] = psutil.cpu_count(logical=False)
        except Exception as exc:
            errors["physical_cores"] = f"psutil.cpu_count: {type(exc).__name__}: {exc}"
        try:
            vm = psutil.virtual_memory()
            raw["ram_total_bytes"] = int(vm.total)
            raw["ram_available_bytes"] = int(vm.available)
        except Exception as exc:
            errors["ram_total_bytes"] = f"psutil.virtual_memory: {type(exc).__name__}: {exc}"
    except ImportError:
        errors["ram_total_bytes"] = "psutil not installed"
    try:
        if _PROC_CPUINFO.exists():
            _read_proc_cpuinfo(raw, errors)
        else:
            _read_py_cpuinfo(raw, errors)
        if "caches" not in raw and _CACHE_DIR.is_dir():
            _read_caches(raw, errors)
        elif "caches" not in raw:
            errors.setdefault("caches", f"{_CACHE_DIR} does not exist and py-cpuinfo gave no sizes")
        _read_numa(raw, errors)
    except Exception as exc:  # never raise from detection
        log.debug("CPU capture failed", exc_info=True)
        errors["capture"] = f"{type(exc).__name__}: {exc}"
    raw["errors"] = errors
    return raw


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def cpu_from_raw(raw: dict[str, Any]) -> tuple[CPUProfile, list[str]]:
    """Turn raw CPU facts (from :func:`capture_cpu` or a fixture) into a profile and notes."""
    notes: list[str] = []
    errors = dict(raw.get("errors") or {})
    if raw.get("error") and "logical_cores" not in raw:  # nothing captured: one note says why
        return CPUProfile(arch=str(raw.get("arch") or "unknown")), [f"CPU: {raw['error']}"]
    logical = _int_or_none(raw.get("logical_cores"))
    physical = _int_or_none(raw.get("physical_cores")) or _int_or_none(raw.get("physical_cores_cpuinfo"))
    if logical is None:
        notes.append("CPU: logical core count unknown (os.cpu_count() returned None)")
    if physical is None:
        notes.append("CPU: physical core count unknown" +
                      (f" ({errors['physical_cores']})" if "physical_cores" in errors else ""))
    arch = str(raw.get("arch") or "unknown")
    flags = raw.get("flags")
    if not isinstance(flags, list):
        why = errors.get("flags") or errors.get("cpuinfo") or "not captured"
        notes.append(f"CPU: SIMD flags unknown ({why})")
        flags = []
    caches = raw.get("caches") or {}
    for level in ("L1d", "L2", "L3"):
        if level not in caches:
            notes.append(f"CPU: {level} size unknown ({errors.get('caches', 'not reported')})")
    ram_total = _int_or_none(raw.get("ram_total_bytes"))
    if ram_total is None:
        notes.append(f"CPU: RAM size unknown ({errors.get('ram_total_bytes', 'not captured')})")
    numa = _int_or_none(raw.get("numa_nodes"))
    if numa is None and "numa_nodes" in errors:
        notes.append(f"CPU: NUMA node count unknown, assuming 1 ({errors['numa_nodes']})")
    for key in ("cpuinfo", "capture"):
        if key in errors:
            notes.append(f"CPU: {errors[key]}")
    profile = CPUProfile(
        model=str(raw.get("model") or "unknown"),
        vendor=str(raw.get("vendor") or "unknown"),
        arch=arch,
        logical_cores=logical or 0,
        physical_cores=physical or 0,
        simd=normalise_simd(flags, arch),
        l1d_bytes=_int_or_none(caches.get("L1d")),
        l2_bytes=_int_or_none(caches.get("L2")),
        l3_bytes=_int_or_none(caches.get("L3")),
        ram_total_bytes=ram_total or 0,
        ram_available_bytes=_int_or_none(raw.get("ram_available_bytes")),
        numa_nodes=numa or 1,
    )
    return profile, notes


def detect_cpu() -> tuple[CPUProfile, list[str]]:
    """Detect this machine's CPU: ``(profile, notes)``; never raises."""
    try:
        return cpu_from_raw(capture_cpu())
    except Exception as exc:  # last resort: an empty profile that says why
        log.debug("CPU detection failed", exc_info=True)
        return CPUProfile(arch=platform.machine() or "unknown", logical_cores=os.cpu_count() or 0), [
            f"CPU: detection failed: {type(exc).__name__}: {exc}"]
