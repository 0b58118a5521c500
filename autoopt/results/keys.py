"""The key of this machine and the identity of a kernel's source, computed without importing torch or triton.

A row is usable only in the environment it was measured in (:class:`EnvKey`: device fingerprint,
driver, torch and triton versions) and only while its kernel's source file still hashes to what it
hashed to then. The start-up lookup needs both for every op, so both are cheap and cached per
process: versions from :mod:`autoopt.results.versions` (the installed distributions' folder names,
one directory scan), hashes from one read of each kernel file.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

from autoopt._log import get_logger
from autoopt.errors import StoreError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.results import sources, versions
from autoopt.results.records import MAX_REASON, EnvKey, ResultKey, StoredResult
from autoopt.results.sources import MAX_SOURCE_BYTES, PACKAGE_DIR, hash_file, source_hash
from autoopt.results.versions import installed_version

log = get_logger(__name__)

__all__ = ["PACKAGE_DIR", "autoopt_version", "clear_caches", "current_key", "env_key", "installed_version",
           "is_stale", "kernel_source", "make_result", "source_changed", "source_hash"]


def autoopt_version() -> str:
    """This autoopt's ``__version__``.

    Read from the already-imported parent package: Python initialises ``autoopt`` before any of its
    submodules, so this is no import (the layer rules forbid one from here), and the installed
    metadata can lag behind the source (an editable install keeps its first version).
    """
    root = sys.modules.get("autoopt")
    return str(getattr(root, "__version__", "") or "")


#: env keys by the GPU's identity: rank() asks for one per call, and hashing the fingerprint and
#: building the key cost ~15 µs, as much as the rest of a warm rank() (12 µs on the 2-core CI VM)
_env_keys: dict[tuple[object, ...], EnvKey] = {}


def env_key(gpu: GPUProfile) -> EnvKey:
    """The environment a measurement on ``gpu`` belongs to, with this process's torch and triton."""
    torch, triton = installed_version("torch"), installed_version("triton")
    ident = (gpu.name, gpu.cc_major, gpu.cc_minor, gpu.sm_count, gpu.memory_total_bytes, gpu.driver_version,
             torch, triton)
    key = _env_keys.get(ident)
    if key is None:
        key = EnvKey(device=gpu.device_fingerprint, gpu=gpu.name, driver=gpu.driver_version or "",
                     torch=torch, triton=triton)
        _env_keys[ident] = key
    return key


def current_key(gpu: GPUProfile, op: OpSpec) -> ResultKey:
    """The key under which ``op`` on ``gpu`` is stored and looked up in this environment."""
    return ResultKey(env=env_key(gpu), op=op)


def kernel_source(module: str | os.PathLike[str]) -> tuple[str, str]:
    """``(kernel_file, sha256)`` for a kernel module: what the tuner stores with each row.

    ``module`` is a dotted module name (``"autoopt.backend.kernels.gemm_tma"``; one outside autoopt is
    located with ``importlib.util.find_spec``, which imports its parent packages) or a path to the
    ``.py`` file. Files inside the autoopt package are named relative to it
    (``"backend/kernels/gemm_tma.py"``), others by absolute path. StoreError when there is no such file.
    """
    text = os.fspath(module)
    if isinstance(text, bytes):
        raise StoreError(f"kernel module must be a str or a path, got bytes {text!r}")
    path: Path | None
    if text.endswith(".py") or os.sep in text or "/" in text:
        path = Path(text) if os.path.isabs(text) else (Path.cwd() / text)
        if not path.exists() and not os.path.isabs(text):
            path = PACKAGE_DIR / text
    elif text == "autoopt" or text.startswith("autoopt."):
        base = PACKAGE_DIR.joinpath(*text.split(".")[1:])
        path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    else:
        try:
            spec = importlib.util.find_spec(text)
        except (ImportError, ValueError) as exc:
            raise StoreError(f"kernel module {text!r} cannot be located: {exc}") from None
        path = Path(spec.origin) if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise StoreError(f"kernel module {text!r} has no source file (looked for {path})")
    path = path.resolve()
    try:
        name = path.relative_to(PACKAGE_DIR).as_posix()
    except ValueError:
        name = str(path)
    digest = hash_file(path)
    if digest is None:
        raise StoreError(f"kernel source {str(path)!r} is not a readable .py file of at most "
                         f"{MAX_SOURCE_BYTES >> 20} MiB")
    sources.remember(name, digest)
    return name, digest


def source_changed(row: StoredResult) -> bool:
    """Whether ``row``'s kernel file now hashes differently from when it was measured (or is gone)."""
    return source_hash(row.kernel_file) != row.kernel_hash


def is_stale(row: StoredResult, *, triton: str | None = None) -> bool:
    """Whether ``row`` can no longer be used here: its kernel file changed (or is gone), or it was
    compiled by another triton than the installed one (``triton``; default: the installed version).

    With no triton installed the version cannot be judged and only the source decides (so that a
    CPU-only machine managing a team's store does not call every row stale).
    """
    if source_changed(row):
        return True
    installed = installed_version("triton") if triton is None else triton
    return bool(installed) and row.env.triton != installed


def make_result(gpu: GPUProfile, op: OpSpec, config: KernelConfig, *, label: str, kernel_module: str,
                us: float | None = None, max_error: float | None = None, reason: str = "",
                measured_at: float | None = None) -> StoredResult:
    """A row for one evaluation in this environment: what the tuner hands to ``ResultStore.put``.

    ``kernel_module`` names the kernel's source (see :func:`kernel_source`); a reason longer than the
    store keeps is cut (compiler errors can run to pages).
    """
    file, digest = kernel_source(kernel_module)
    # compiler output carries ANSI colour codes and can run to pages: keep what a person can read
    reason = "".join(c if c.isprintable() or c in "\n\t" else "?" for c in reason)
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 1] + "…"
    return StoredResult(env=env_key(gpu), op=op, config=config, label=label, us=us, max_error=max_error,
                        reason=reason, kernel_file=file, kernel_hash=digest,
                        measured_at=time.time() if measured_at is None else measured_at,
                        autoopt_version=autoopt_version())


def clear_caches() -> None:
    """Forget the cached versions and source hashes (after installing a package or editing a kernel)."""
    _env_keys.clear()
    versions.clear()
    sources.clear()
