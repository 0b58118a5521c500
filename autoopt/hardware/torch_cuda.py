"""Raw GPU facts through PyTorch: what NVML does not expose (SMs, SMEM, L2, registers).

:func:`capture_torch` imports torch, so callers decide whether that is wanted
(``detect(use_torch=False)`` never calls it). Torch's device indices follow
``CUDA_VISIBLE_DEVICES``; the merge in :mod:`autoopt.detection` matches them to
NVML's physical devices by UUID or PCI bus id, never by index.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any

from autoopt._log import get_logger

__all__ = ["capture_torch", "package_version"]

log = get_logger(__name__)


def package_version(dist: str) -> str | None:
    """Installed version of a distribution without importing it (``None`` if absent)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken installation's metadata: treat as absent
        return None


def _plain(value: Any) -> Any:
    """A JSON-able form of one device property (``_CUuuid`` becomes its string)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _properties(props: Any) -> dict[str, Any]:
    """Every public attribute of ``torch.cuda.get_device_properties`` (varies by version)."""
    out: dict[str, Any] = {}
    for name in dir(props):
        if name.startswith("_"):
            continue
        try:
            value = getattr(props, name)
        except Exception as exc:
            out[name] = type(exc).__name__
            continue
        if callable(value):
            continue
        out[name] = _plain(value)
    return out


def capture_torch() -> dict[str, Any]:
    """Torch/CUDA facts per visible device, plus the Triton version; never raises."""
    raw: dict[str, Any] = {"triton_version": package_version("triton"),
                           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if importlib.util.find_spec("torch") is None:
        raw.update(available=False, error="torch not installed")
        return raw
    try:
        import torch
    except Exception as exc:  # a broken torch install must not break detection
        raw.update(available=False, error=f"import torch failed: {type(exc).__name__}: {exc}")
        return raw
    raw["version"] = str(torch.__version__)
    raw["cuda_version"] = torch.version.cuda
    try:
        if not torch.cuda.is_available():
            why = "built without CUDA" if torch.version.cuda is None else "no CUDA device visible"
            raw.update(available=False, error=f"torch {torch.__version__}: torch.cuda.is_available() "
                                              f"is False ({why})")
            return raw
        count = torch.cuda.device_count()
        devices = []
        for index in range(count):
            try:
                props = torch.cuda.get_device_properties(index)
                devices.append({"index": index, "props": _properties(props)})
            except Exception as exc:
                devices.append({"index": index, "error": f"{type(exc).__name__}: {exc}"})
        raw.update(available=True, device_count=count, devices=devices)
    except Exception as exc:
        log.debug("torch capture failed", exc_info=True)
        raw.update(available=False, error=f"torch CUDA query failed: {type(exc).__name__}: {exc}")
    return raw
