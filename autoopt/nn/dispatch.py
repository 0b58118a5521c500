"""Which kernel config serves a torch-facing op: chosen once per (op, kind, bucketed shape, dtype, device).

The first call of an op for a new key ranks its configs with :func:`autoopt.search.ranking.rank`
(``top=1``; a winner measured before on this device, from the results store, comes first) on the
GPU profile of the tensors' device, and caches the answer as a :class:`Choice`; every later call
with the same key is one dict lookup. A key with no Triton kernel (CPU tensors, fp64, a shape no
config is valid for, ...) caches a fallback ``Choice`` instead: the op then runs the torch op, and
the reason is logged once (see :func:`note_fallback`).

**M bucketing.** The leading dimension (M of a matmul, rows of a norm or an elementwise op) is
bucketed before the lookup, so a decode loop whose batch grows by one each step does not re-rank
on every call:

- ``M <= 16`` (:data:`~autoopt.kernels.ops.GEMV_MAX_M`) is kept exact. These are the decode GEMV
  shapes; the GEMV kernel needs ``BLOCK_M >= M`` and its best ``BLOCK_M``/split-K change with every
  M, and 16 keys are cheap;
- ``M > 16`` goes to the next power of two (17 -> 32, 33 -> 64, 3000 -> 4096). A config ranked for
  the bucket is valid for every M inside it: no kernel's validity depends on M (the tiled GEMM
  masks ragged rows, TMA clips them, norms and elementwise kernels mask), and the predicted best
  changes little within a factor of two of M. The other dimensions (N, K, row width) are exact:
  they come from the weights and do not change between calls.

The dispatch never touches the GPU: ranking is pure Python, so a cached choice is safe inside
CUDA-graph capture. A *first* call for a new key inside capture still ranks correctly, but it would
also compile the Triton kernel there; warm every shape bucket up eagerly before capturing (a
warning says so once if it happens).

**cuBLAS where it is faster.** For a 16-bit matmul on a CUDA device whose GPU has a fitted
cuBLAS model (:mod:`autoopt.kernels.vendor`: the H100 and H200), the ranked config's time (measured
if the store has it, else predicted) is compared with cuBLAS's predicted time, and the faster one
runs: a :data:`VENDOR` choice runs ``F.linear``, keeps the config it beat, and is logged once at INFO
(it is a decision, not a problem). On the committed timings this picks the measured-faster of the two
in 34 (H100) and 36 (H200) of 41 shapes, within 1.005x and 1.029x of the faster geomean, where
always taking autoopt's kernel costs 1.14x and 1.18x (``benchmarks/results/vendor_matmul_fit.json``).
:func:`set_vendor` turns the comparison off (autoopt's kernels everywhere). Under Triton's
interpreter there is no cuBLAS to compare with: the kernels run, so CI proves them.

**Quantized weights.** ``quant_linear`` (:func:`autoopt.nn.ops.quant_linear`) asks with ``weight=`` its
format: the op ranked is ``OpSpec(kind, shape, dtype, weight=...)``, which only the quantized templates
serve (``quant_gemv`` for M <= 16, ``quant_gemm`` above), so the config that runs is the one ``rank()``
and ``recommend()`` price. Their dots run in fp16 under the interpreter, so bf16 activations are not a
fallback there. For a W8A8 ``fp8`` GEMM on a GPU with a cuBLAS fit the comparison above prices
``torch._scaled_mm`` after autoopt's activation quantization (``predict_vendor_matmul``); the other formats
have no vendor path. A key with no kernel (a CPU without the interpreter, a GPU no template serves) falls
back: the op then runs torch on the dequantized weight.

The GPU profile is detected once per process (:func:`autoopt.hardware.detection.detect`) for CUDA
tensors; under Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors) the stand-in
:data:`INTERPRETER_PROFILE` is ranked for. :func:`set_profile` overrides both (and clears the cache).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from autoopt._log import get_logger
from autoopt.backend.kernels import interpreter_active
from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import GEMV_MAX_M, OpSpec
from autoopt.kernels.vendor import predict_vendor_matmul
from autoopt.search.ranking import rank

log = get_logger(__name__)

__all__ = [
    "AUTOGRAD", "BROADCAST", "DTYPE", "EMPTY", "FALLBACK_REASONS", "INDEX", "INTERPRETER_BF16", "INTERPRETER_PROFILE",
    "NO_CONFIG", "NO_CUDA", "NO_GPU", "STRIDES", "TF32", "UNAVAILABLE", "VENDOR",
    "Choice", "bucket_m", "choices", "choose", "clear_cache", "fallback_counts", "gpu_for", "interpreter_active",
    "matmul_kind", "note_fallback", "profile", "reset", "set_profile", "set_vendor", "tf32_problem",
]

#: the profile ranked for under Triton's interpreter when none is set (the CPU has no GPU to model).
INTERPRETER_PROFILE = "h100-sxm"

# Fallback reasons: every fallback Choice's ``fallback`` (and every logged line) starts with one of these.
NO_CUDA = "no CUDA device: torch fallback"
DTYPE = "dtype without a template: torch fallback"
NO_CONFIG = "no valid config: torch fallback"
NO_GPU = "no GPU profile: torch fallback"
INTERPRETER_BF16 = "bf16 matmul under the Triton interpreter: torch fallback"
TF32 = "fp32 matmul at float32_matmul_precision 'highest': torch fallback"
STRIDES = "unsupported strides: torch fallback"
AUTOGRAD = "autograd needed: torch fallback"
EMPTY = "empty tensor: torch fallback"
BROADCAST = "broadcast or type promotion: torch fallback"
INDEX = "too large for 32-bit indexing: torch fallback"
VENDOR = "cuBLAS predicted faster: torch"
#: a kernel this build of autoopt lacks (the fused-MoE kernel's module cannot be imported)
UNAVAILABLE = "kernel not available: torch fallback"
#: every reason, for reports and tests.
FALLBACK_REASONS = (NO_CUDA, DTYPE, NO_CONFIG, NO_GPU, INTERPRETER_BF16, TF32, STRIDES, AUTOGRAD, EMPTY,
                    BROADCAST, INDEX, VENDOR, UNAVAILABLE)

#: torch dtype (as ``str(dtype)``) -> autoopt dtype name: the dtypes the templates cover.
_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}
_MATMUL = ("gemm", "gemv")


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """What runs one op for one key: a ranked kernel config, or the torch op and why.

    ``shape`` is the bucketed shape that was ranked (see the module docstring), ``kind`` the op kind
    ranked (``gemv`` for a linear with M <= 16, ``gemm`` above; ``silu_mul`` for ``swiglu``).
    ``weight``: the quantized weight format of a matmul (an :func:`~autoopt.kernels.quant.parse_weight`
    spec: the op ranked is ``OpSpec(weight=...)``, served by ``quant_gemv``/``quant_gemm``), None for a
    16-bit weight. ``fallback`` is None when a Triton kernel runs; otherwise the reason, starting with one of
    :data:`FALLBACK_REASONS`. ``elapsed_us`` is the Python time the choice took (ranking included).
    """

    op: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    config: KernelConfig | None = None
    gpu: str = ""
    predicted_us: float | None = None
    measured_us: float | None = None
    #: ``predicted`` (cost model) or ``measured:<layer>`` (results store); empty for a fallback.
    source: str = ""
    #: the cost model's reason for the config.
    reason: str = ""
    #: cuBLAS's predicted time for a matmul (None: not compared, see the module docstring).
    vendor_us: float | None = None
    fallback: str | None = None
    elapsed_us: float = 0.0
    weight: str | None = None

    @property
    def kernel(self) -> str:
        """The backend kernel that runs (``torch`` for a fallback)."""
        return "torch" if self.fallback is not None or self.config is None else self.config.kernel

    def with_fallback(self, reason: str) -> Choice:
        """This choice, falling back to torch for ``reason`` (a per-call reason: strides, autograd)."""
        return replace(self, fallback=reason)

    def describe(self) -> str:
        w = f" w={self.weight}" if self.weight else ""
        where = f"{self.op} {self.kind} {'x'.join(map(str, self.shape))} {self.dtype}{w} on {self.device}"
        if self.fallback is not None:
            return f"{where}: torch ({self.fallback})"
        assert self.config is not None
        us = self.measured_us if self.measured_us is not None else self.predicted_us
        return f"{where}: {self.config.kernel} {self.config.describe()} [{self.source}, {us:.2f} us on {self.gpu}]"

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "kind": self.kind, "shape": list(self.shape), "dtype": self.dtype,
                "device": self.device, "kernel": self.kernel,
                "config": self.config.to_dict() if self.config is not None else None, "gpu": self.gpu,
                "predicted_us": self.predicted_us, "measured_us": self.measured_us, "source": self.source,
                "reason": self.reason, "vendor_us": None if self.vendor_us is None else round(self.vendor_us, 2),
                "fallback": self.fallback, "elapsed_us": round(self.elapsed_us, 1), "weight": self.weight}


# -- process-wide state ------------------------------------------------------------------------------

_CACHE: dict[tuple[Any, ...], Choice] = {}
_LOCK = threading.Lock()
_SEEN: set[tuple[str, str]] = set()
_COUNTS: Counter[tuple[str, str]] = Counter()
_OVERRIDE: list[GPUProfile | HardwareProfile] = []
_DETECTED: list[HardwareProfile] = []
_STAND_IN: list[GPUProfile] = []
_VENDOR: list[bool] = [True]


def bucket_m(m: int) -> int:
    """The M (rows) a choice is ranked and cached for: exact up to 16, else the next power of two."""
    return m if m <= GEMV_MAX_M else 1 << (m - 1).bit_length()


def matmul_kind(m: int) -> str:
    """``gemv`` for M <= 16 (decode), ``gemm`` above."""
    return "gemv" if m <= GEMV_MAX_M else "gemm"


def set_profile(profile: GPUProfile | HardwareProfile | str | None) -> None:
    """Rank for ``profile`` (a profile, or a known profile name or file) instead of the detected GPU;
    None goes back to detection. Clears the cached choices."""
    if isinstance(profile, str):
        from autoopt.hardware.library import load_profile

        profile = load_profile(profile)
    if profile is not None and not isinstance(profile, (GPUProfile, HardwareProfile)):
        raise TypeError(f"set_profile takes a GPUProfile, a HardwareProfile, a profile name or None, "
                        f"got {type(profile).__name__}")
    with _LOCK:
        _OVERRIDE.clear()
        if profile is not None:
            _OVERRIDE.append(profile)
        _CACHE.clear()


def set_vendor(enabled: bool) -> None:
    """Compare matmuls with cuBLAS and run the faster (True, the default), or always run autoopt's
    kernel (False). Clears the cached choices. TypeError for anything but a bool."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_vendor takes True or False, got {type(enabled).__name__} {enabled!r}")
    with _LOCK:
        _VENDOR[0] = enabled
        _CACHE.clear()


def profile() -> GPUProfile | HardwareProfile | None:
    """The profile set by :func:`set_profile`, else this machine's if it was detected already."""
    if _OVERRIDE:
        return _OVERRIDE[0]
    return _DETECTED[0] if _DETECTED else None


def clear_cache() -> None:
    """Forget the cached choices (the next call of each key ranks again)."""
    with _LOCK:
        _CACHE.clear()


def reset() -> None:
    """Forget choices, logged reasons, fallback counts, the profile override and :func:`set_vendor` (tests)."""
    with _LOCK:
        _VENDOR[0] = True
        _CACHE.clear()
        _SEEN.clear()
        _COUNTS.clear()
        _OVERRIDE.clear()


def choices() -> list[Choice]:
    """Every cached choice, in the order they were made (for reports)."""
    return list(_CACHE.values())


def fallback_counts() -> dict[tuple[str, str], int]:
    """``(op, reason) -> calls`` that ran the torch op since the last :func:`reset` (eager calls only:
    inside a ``torch.compile``d graph a fallback chosen at trace time is not counted per call)."""
    return dict(_COUNTS)


def note_fallback(op: str, reason: str) -> None:
    """Count a call of ``op`` that runs the torch op for ``reason``; log the reason the first time."""
    _COUNTS[(op, reason)] += 1
    _log_once(op, reason)


def _log_once(op: str, message: str) -> None:
    key = (op, message)
    if key not in _SEEN:
        _SEEN.add(key)
        # choosing cuBLAS because it is faster is a decision, not a problem: INFO, not WARNING
        log.log(logging.INFO if message.startswith(VENDOR) else logging.WARNING, "autoopt.nn.%s: %s", op, message)


def tf32_problem(dtype: Any, device: Any, precision: str) -> str | None:
    """Why an fp32 matmul must not run the Triton kernels (None: it may).

    The kernels' fp32 ``tl.dot`` runs as TF32 on tensor cores (~1e-3 relative error); torch runs
    fp32 matmuls in full fp32 unless ``torch.set_float32_matmul_precision("high")`` (or
    ``"medium"``) allows TF32, so a Triton fp32 GEMM is only a faithful stand-in when torch's own
    setting allows it. The interpreter computes ``tl.dot`` in fp32, so it is exempt.
    """
    if str(dtype) != "torch.float32" or precision != "highest" or getattr(device, "type", "") != "cuda":
        return None
    return (f"{TF32} (the Triton kernels' fp32 dot is TF32; torch.set_float32_matmul_precision('high') "
            "allows it)")


# -- choosing --------------------------------------------------------------------------------------------

#: how deep into the ranking a choice with ``require`` looks for a config that meets it
REQUIRE_DEPTH = 256


def choose(op: str, kind: str, shape: tuple[int, ...], dtype: Any, device: Any, weight: str | None = None, *,
           require: tuple[tuple[str, int], ...] = ()) -> Choice:
    """The cached :class:`Choice` for ``op`` (computing ``kind`` of ``shape``, M first, unbucketed) on
    tensors of ``dtype`` (a torch dtype) on ``device`` (a torch device), over a ``weight`` quantized in that
    format (None: a 16-bit weight); ranks on the first call. ``require``: (key, value) pairs the config must hold
    (a fused epilogue needs ``SPLIT_K`` 1): the best ranked config that does, never the vendor library."""
    key = (op, kind, bucket_m(shape[0]), shape[1:], dtype, device, weight, require)
    choice = _CACHE.get(key)
    if choice is None:
        with _LOCK:
            choice = _CACHE.get(key)
            if choice is None:
                choice = _choose(op, kind, (bucket_m(shape[0]), *shape[1:]), dtype, device, weight, require)
                _CACHE[key] = choice
    return choice


def _meets(candidate: Any, require: tuple[tuple[str, int], ...]) -> bool:
    params = candidate.config.params
    return all(params.get(k, 1) == v for k, v in require)


def _choose(op: str, kind: str, shape: tuple[int, ...], dtype: Any, device: Any, weight: str | None,
            require: tuple[tuple[str, int], ...] = ()) -> Choice:
    t0 = time.perf_counter()
    dev = str(device)
    dev_type = getattr(device, "type", dev.split(":")[0])
    name = _DTYPES.get(str(dtype))
    base = Choice(op=op, kind=kind, shape=shape, dtype=name or str(dtype).removeprefix("torch."), device=dev,
                  weight=weight)

    def fallback(reason: str) -> Choice:
        return replace(base, fallback=reason, elapsed_us=(time.perf_counter() - t0) * 1e6)

    interpreting = interpreter_active()
    if not (dev_type == "cuda" or (dev_type == "cpu" and interpreting)):
        return fallback(f"{NO_CUDA} (tensors on {dev}; Triton kernels run on CUDA devices, or on the CPU "
                        "only under TRITON_INTERPRET=1)")
    if name is None:
        return fallback(f"{DTYPE} ({base.dtype}; the templates cover float16, bfloat16 and float32)")
    # the quantized kernels route their dots through fp16 under the interpreter: bf16 activations are fine there
    if interpreting and name == "bf16" and kind in _MATMUL and weight is None:
        return fallback(f"{INTERPRETER_BF16} (the interpreter's bf16 tl.dot gives wrong results in "
                        "triton 3.9 with torch 2.13)")
    if dev_type == "cuda":
        _warn_if_capturing(op, device)
    gpu = _gpu_for(device, dev_type)
    if gpu is None:
        return fallback(f"{NO_GPU} (detection found no GPU for {dev}; autoopt.nn.dispatch.set_profile() "
                        "names one)")
    try:
        spec = OpSpec(kind=kind, shape=shape, dtype=name, weight=weight)
        ranking = rank(gpu, spec, top=1)
        if not _meets(ranking.best, require):  # deeper only where the pick does not hold it
            ranking = rank(gpu, spec, top=REQUIRE_DEPTH)
    except AutooptError as exc:
        return fallback(f"{NO_CONFIG} ({exc})")
    meeting = [c for c in ranking.candidates if _meets(c, require)]
    if not meeting:
        wanted = ", ".join(f"{k}={v}" for k, v in require)
        return fallback(f"{NO_CONFIG} (none of the top {len(ranking.candidates)} configs has {wanted})")
    best = meeting[0]
    chosen = replace(base, config=best.config, gpu=gpu.name, predicted_us=best.predicted_us,
                     measured_us=best.measured_us, source=best.source, reason=best.reason)
    if dev_type == "cuda" and kind in _MATMUL and _VENDOR[0] and not require:
        chosen = _against_vendor(chosen, gpu, spec)
    return replace(chosen, elapsed_us=(time.perf_counter() - t0) * 1e6)


def gpu_for(device: Any) -> GPUProfile | None:
    """The GPU profile choices on ``device`` (a torch device) are ranked for: :func:`set_profile`'s, else the
    detected GPU (CUDA), else the interpreter's stand-in (:data:`INTERPRETER_PROFILE`, any other device)."""
    dev = str(device)
    return _gpu_for(device, getattr(device, "type", dev.split(":")[0]))


def _against_vendor(chosen: Choice, gpu: GPUProfile, op: OpSpec) -> Choice:
    """``chosen`` with cuBLAS's predicted time, falling back to it (:data:`VENDOR`) where that is lower
    than the config's time (measured when the store has it, else predicted)."""
    vendor_us = predict_vendor_matmul(gpu, op)
    if vendor_us is None:
        return chosen
    ours = chosen.measured_us if chosen.measured_us is not None else chosen.predicted_us
    chosen = replace(chosen, vendor_us=vendor_us)
    if ours is None or vendor_us >= ours:
        return chosen
    assert chosen.config is not None
    label = "measured" if chosen.measured_us is not None else "predicted"
    return chosen.with_fallback(f"{VENDOR} ({vendor_us:.1f} us predicted for cuBLAS against {ours:.1f} us "
                                f"{label} for {chosen.config.kernel} {chosen.config.describe()})")


def _warn_if_capturing(op: str, device: Any) -> None:
    import torch

    if torch.cuda.is_current_stream_capturing():
        _log_once(op, "first call for a new shape inside CUDA-graph capture: ranked there (pure Python), "
                      "but its Triton kernel may compile inside the capture; warm every shape bucket up "
                      "eagerly before capturing")


def _gpu_for(device: Any, dev_type: str) -> GPUProfile | None:
    """The GPU profile to rank for on ``device``: the override, else (CUDA) the detected GPU of that
    name, else (interpreter) the stand-in."""
    hw: HardwareProfile | None = None
    if _OVERRIDE:
        if isinstance(_OVERRIDE[0], GPUProfile):
            return _OVERRIDE[0]
        hw = _OVERRIDE[0]
    elif dev_type != "cuda":
        if not _STAND_IN:
            from autoopt.hardware.library import load_profile

            _STAND_IN.append(load_profile(INTERPRETER_PROFILE).gpu)  # type: ignore[arg-type]
        return _STAND_IN[0]
    else:
        if not _DETECTED:
            from autoopt.hardware.detection import detect

            _DETECTED.append(detect())
        hw = _DETECTED[0]
    gpus = hw.gpus
    if not gpus:
        return None
    if len({g.name for g in gpus}) == 1 or dev_type != "cuda":
        return gpus[0]
    import torch

    name = torch.cuda.get_device_name(device)
    return next((g for g in gpus if g.name == name), gpus[0])
