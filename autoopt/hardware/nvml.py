"""Raw NVIDIA GPU facts through NVML (the official ``nvidia-ml-py`` binding).

:func:`capture_nvml` returns a JSON-able dict; it never raises. Each NVML call
is wrapped: when it fails, the key holds the error's class name (for example
``"NVMLError_NotSupported"``) instead of a value, so a capture taken on one
machine says exactly what that machine's driver refused. Devices are listed by
NVML's physical index, which ignores ``CUDA_VISIBLE_DEVICES``.

Facts from the H200 pair (shared/hardware-captures/h200x2/probe2.txt):
- ``NVML_FI_DEV_NVLINK_LINK_COUNT`` reads 18; asking the state of a link past
  the count raises ``NVMLError_InvalidArgument``, so only links below it are read;
- ``nvmlDeviceGetTopologyCommonAncestor`` said 30 (host bridge) for two GPUs
  joined by 18 NVLinks: it describes only the PCIe path and is not used here;
  ``nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK)`` == 0 (OK) is.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

from autoopt._log import get_logger

__all__ = ["ERROR_RE", "capture_nvml", "error_of"]

log = get_logger(__name__)

#: a raw value that is an error marker: an exception's class name.
ERROR_RE = re.compile(r"^\w*(Error|Exception)\w*$")

# NVML clock types (nvml.h nvmlClockType_t): NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2.
_CLOCK_SM = 1
_CLOCK_MEM = 2
# nvml.h NVML_FI_DEV_NVLINK_LINK_COUNT; also pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT.
_FI_NVLINK_LINK_COUNT = 91
# nvml.h NVML_P2P_CAPS_INDEX_NVLINK.
_P2P_CAPS_INDEX_NVLINK = 2


def error_of(value: Any) -> str | None:
    """The error marker a raw value holds, or ``None`` when it is a real value."""
    if isinstance(value, str) and ERROR_RE.match(value):
        return value
    return None


def _err_name(exc: BaseException) -> str:
    return type(exc).__name__


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run one NVML call; on any exception return the exception's class name."""
    try:
        return fn(*args)
    except Exception as exc:  # NVMLError_* and ctypes errors alike: recorded, not raised
        return _err_name(exc)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _field_value(pynvml: Any, handle: Any, field_id: int) -> Any:
    """One NVML field value as a number, or an error marker."""
    try:
        values = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])
    except Exception as exc:
        return _err_name(exc)
    fv = values[0]
    if fv.nvmlReturn != 0:
        cls = pynvml.NVMLError._valClassMapping.get(fv.nvmlReturn)
        return cls.__name__ if cls else f"NVMLError_{fv.nvmlReturn}"
    # nvmlValueType_t: 0 double, 1 uint, 2 ulong, 3 ulonglong, 4 slonglong, 5 sint, 6 ushort
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return getattr(fv.value, attr.get(fv.valueType, "ullVal"))


def _device(pynvml: Any, index: int) -> tuple[dict[str, Any], Any]:
    dev: dict[str, Any] = {"index": index}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        dev["error"] = _err_name(exc)
        return dev, None
    dev["name"] = _text(_call(pynvml.nvmlDeviceGetName, handle))
    dev["uuid"] = _text(_call(pynvml.nvmlDeviceGetUUID, handle))
    pci = _call(pynvml.nvmlDeviceGetPciInfo, handle)
    if error_of(pci):
        dev["pci_bus_id"] = dev["pci_device_id"] = pci
    else:
        dev["pci_bus_id"] = _text(pci.busId)
        # pciDeviceId packs device id (upper 16 bits) and vendor id (lower 16):
        # 0x233010DE = device 0x2330 (H100 SXM5 80GB), vendor 0x10DE (NVIDIA).
        dev["pci_device_id"] = int(pci.pciDeviceId)
        dev["pci_subsystem_id"] = int(pci.pciSubSystemId)
    cc = _call(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    dev["cuda_compute_capability"] = cc if error_of(cc) else [int(cc[0]), int(cc[1])]
    mem = _call(pynvml.nvmlDeviceGetMemoryInfo, handle)
    if error_of(mem):
        dev["memory_total_bytes"] = dev["memory_free_bytes"] = mem
    else:
        dev["memory_total_bytes"] = int(mem.total)
        dev["memory_free_bytes"] = int(mem.free)
    dev["memory_bus_width_bits"] = _call(pynvml.nvmlDeviceGetMemoryBusWidth, handle)
    dev["max_sm_clock_mhz"] = _call(pynvml.nvmlDeviceGetMaxClockInfo, handle, _CLOCK_SM)
    dev["max_mem_clock_mhz"] = _call(pynvml.nvmlDeviceGetMaxClockInfo, handle, _CLOCK_MEM)
    dev["pcie_max_gen"] = _call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
    dev["pcie_max_width"] = _call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
    dev["pcie_curr_gen"] = _call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
    dev["pcie_curr_width"] = _call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle)
    mig = _call(pynvml.nvmlDeviceGetMigMode, handle)
    dev["mig_mode"] = mig if error_of(mig) else [int(m) for m in mig]  # [current, pending]
    dev["power_limit_mw"] = _call(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    dev["numa_node"] = _call(pynvml.nvmlDeviceGetNumaNodeId, handle)
    count = _field_value(pynvml, handle, _FI_NVLINK_LINK_COUNT)
    dev["nvlink_link_count"] = count
    if isinstance(count, int) and count > 0:
        dev["nvlink_states"] = [_call(pynvml.nvmlDeviceGetNvLinkState, handle, link) for link in range(count)]
        # nvmlNvlinkVersion_t enum (6 = NVML_NVLINK_VERSION_4_0 on the H200), from the first active link.
        active = [i for i, s in enumerate(dev["nvlink_states"]) if s == 1]
        dev["nvlink_version"] = (_call(pynvml.nvmlDeviceGetNvLinkVersion, handle, active[0])
                                 if active else "no active link")
        remotes = []
        for link in active:
            info = _call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            remotes.append(info if error_of(info) else _text(info.busId))
        dev["nvlink_remote_bus_ids"] = remotes
    return dev, handle


def capture_nvml() -> dict[str, Any]:
    """Every NVML fact autoopt uses, per physical GPU; never raises."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "error": "nvidia-ml-py (pynvml) not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded / ...
        return {"available": False, "error": f"{_err_name(exc)}: {exc}"}
    raw: dict[str, Any] = {"available": True}
    try:
        raw["driver_version"] = _text(_call(pynvml.nvmlSystemGetDriverVersion))
        raw["cuda_driver_version"] = _call(pynvml.nvmlSystemGetCudaDriverVersion)  # 13000 = CUDA 13.0
        raw["nvml_version"] = _text(_call(pynvml.nvmlSystemGetNVMLVersion))
        count = _call(pynvml.nvmlDeviceGetCount)
        raw["device_count"] = count
        devices: list[dict[str, Any]] = []
        handles: list[Any] = []
        for index in range(count if isinstance(count, int) else 0):
            dev, handle = _device(pynvml, index)
            devices.append(dev)
            handles.append(handle)
        raw["devices"] = devices
        pairs = []
        for a in range(len(handles)):
            for b in range(a + 1, len(handles)):
                if handles[a] is None or handles[b] is None:
                    continue
                status = _call(pynvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], _P2P_CAPS_INDEX_NVLINK)
                pairs.append({"a": a, "b": b, "nvlink_status": status})
        raw["p2p"] = pairs
    except Exception as exc:  # anything unforeseen: keep what was read, say what broke
        log.debug("NVML capture failed", exc_info=True)
        raw["error"] = f"{_err_name(exc)}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return raw
