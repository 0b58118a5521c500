"""Evaluate one (op, config): validate, run on fresh inputs, check, then time.

The order is the contract: a config that fails ``validate`` never launches;
with no GPU the answer is the cost model's prediction, labelled ``predicted``
(never a CPU time); on a GPU the output is poisoned with NaN, the kernel runs
once, every element must have been written and match the float64 reference
within the dtype's tolerance, and only then is it timed with
``triton.testing.do_bench`` (median, L2 flushed between runs), or replayed from a
CUDA graph for a kernel whose call is many launches (``fused_moe``: the host's
enqueue would be timed instead of the GPU). A time below the
physical floor (FLOPs at peak, bytes at bandwidth) by more than 3% cannot be
real and is ``withheld``. Under Triton's interpreter (``TRITON_INTERPRET=1``,
CPU tensors) the same checks run and the label is ``checked`` with no time.
"""

from __future__ import annotations

import math
import platform
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from autoopt._log import get_logger
from autoopt.backend import registry
from autoopt.backend.accuracy import rel_error
from autoopt.backend.kernels import interpreter_active
from autoopt.errors import AutooptError, ConfigError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

log = get_logger(__name__)

__all__ = ["LABELS", "PHASES", "Result", "cycling", "evaluate", "floor_us", "interpreter_active", "phase_seconds",
           "rotation_copies"]

LABELS = ("measured", "predicted", "rejected", "withheld", "checked")
#: a measurement this far under the physical floor is an error, not a speed-up.
_FLOOR_SLACK = 0.03

#: where this process's evaluations spent their seconds, summed since it started: ``setup`` (inputs and the
#: float64 reference, paid when the op is not in the inputs cache; ``setups`` counts those), ``bind`` (the
#: output and the config bound to the inputs), ``first`` (its first run: a compile or a load of the compiled
#: kernel into this process, then the GPU's run), ``check``
#: (poison, finiteness and the reference comparison), ``copies`` (the rotated timing's input copies),
#: ``timing`` (the timed runs). A fleet worker reports each evaluation's share (``fleet.worker``), so a sweep's
#: per-trial seconds on one GPU and on several can be compared phase by phase.
PHASES = ("setup", "bind", "first", "check", "copies", "timing")
_phase_s: dict[str, float] = {}


def phase_seconds() -> dict[str, float]:
    """A copy of this process's running phase totals (seconds, and the ``setups`` count)."""
    return dict(_phase_s)


@contextmanager
def _phase(name: str) -> Iterator[None]:
    """``with _phase("timing"): ...`` adds the block's wall seconds to that phase's total."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _phase_s[name] = _phase_s.get(name, 0.0) + time.perf_counter() - t0


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """The outcome of evaluating one config on one op."""

    op: OpSpec
    config: KernelConfig
    label: str
    us: float | None = None
    tflops: float | None = None
    gbs: float | None = None
    roofline_pct: float | None = None
    rel_err: float | None = None
    reason: str = ""
    device: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def r(v: float | None, nd: int) -> float | None:
            return None if v is None else round(v, nd)
        return {"op": self.op.to_dict(), "config": self.config.to_dict(), "label": self.label,
                "us": r(self.us, 4), "tflops": r(self.tflops, 3), "gbs": r(self.gbs, 2),
                "roofline_pct": r(self.roofline_pct, 2),
                "rel_err": None if self.rel_err is None else float(f"{self.rel_err:.4g}"),
                "reason": self.reason, "device": self.device, "versions": dict(self.versions)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Result:
        label = data.get("label")
        if label not in LABELS:
            raise ConfigError(f"result label {label!r} is not one of {', '.join(LABELS)}")

        def f(key: str) -> float | None:
            v = data.get(key)
            return None if v is None else float(v)
        return cls(op=OpSpec.from_dict(data["op"]), config=KernelConfig.from_dict(data["config"]),
                   label=str(label), us=f("us"), tflops=f("tflops"), gbs=f("gbs"),
                   roofline_pct=f("roofline_pct"), rel_err=f("rel_err"), reason=str(data.get("reason", "")),
                   device=str(data.get("device", "")),
                   versions={str(k): str(v) for k, v in dict(data.get("versions", {})).items()})


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.version.cuda:
            out["cuda"] = str(torch.version.cuda)
    except ImportError:
        pass
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out


def _pick_device(device: str | None) -> str | None:
    """Where kernels can run: a CUDA device, ``cpu`` under the interpreter, or None (predict only)."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return None
    if interpreter_active():
        return "cpu" if device in (None, "cpu") else None
    if not torch.cuda.is_available():
        return None
    if device is None:
        return "cuda"
    return device if str(device).startswith("cuda") else None


def _peak_tflops(op: OpSpec, gpu: GPUProfile, *, measured: bool = True) -> float | None:
    # fp32 matmuls run as TF32 on tensor cores; elementwise/norm math in fp32 on the CUDA cores.
    dtype = ("tf32" if op.dtype == "fp32" else op.compute_dtype) if op.uses_tensor_cores else "fp32"
    return gpu.tflops(dtype, measured=measured)


def floor_us(op: OpSpec, gpu: GPUProfile | None, *, physical: bool = False) -> float | None:
    """Time at the ceilings, in µs: max(FLOPs at peak, bytes at bandwidth); None if neither is known.

    By default the attainable ceilings (measured copy bandwidth and matmul rate when the
    profile has them, else the datasheet), which % of roofline is taken against. With
    ``physical=True`` the higher of datasheet and measured: no correct kernel can beat that,
    so a time below it is withheld as a measurement error.
    """
    if gpu is None:
        return None
    terms = []
    rates = [_peak_tflops(op, gpu), _peak_tflops(op, gpu, measured=False)]
    bws = [gpu.bandwidth_gbs, gpu.mem_bandwidth_gbs]
    peak = max(filter(None, rates), default=None) if physical else rates[0]
    bw = max(filter(None, bws), default=None) if physical else bws[0]
    if peak:
        terms.append(op.flops / (peak * 1e12) * 1e6)
    if bw:
        terms.append(op.min_bytes / (bw * 1e9) * 1e6)
    return max(terms) if terms else None


def _rates(op: OpSpec, us: float | None, gpu: GPUProfile | None) -> dict[str, float | None]:
    if not us or us <= 0:
        return {"tflops": None, "gbs": None, "roofline_pct": None}
    floor = floor_us(op, gpu)
    return {"tflops": op.flops / (us * 1e-6) / 1e12, "gbs": op.min_bytes / (us * 1e-6) / 1e9,
            "roofline_pct": None if floor is None else 100.0 * floor / us}


#: the last few ops' inputs and float64 references, keyed by (op, seed, device), least recently used
#: first: a sweep draws identical seeded inputs for every config of a shape, so they are made once.
#: Making them is most of an evaluation's set-up: on an H200 a config of a new op took 1.1 s against
#: 0.35 s for another config of a cached one (benchmarks/results/h200x2/fleet_scaling_lpt.json). The
#: tuner interleaves several ops' searches on one GPU, hence more than one op.
_CACHE: OrderedDict[tuple[Any, ...], tuple[dict[str, Any], Any, int]] = OrderedDict()
#: at most this many ops, and this share of the device's memory (a 4096x28672 float64 reference
#: alone is 940 MB), capped at CACHE_MAX_BYTES
CACHE_OPS, CACHE_MEMORY_SHARE, CACHE_MAX_BYTES = 4, 0.05, 4 << 30


def _tensor_bytes(*values: Any) -> int:
    return sum(int(v.numel() * v.element_size()) for v in values if hasattr(v, "element_size"))


def _cache_budget(device: str) -> int:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        return min(CACHE_MAX_BYTES, int(CACHE_MEMORY_SHARE * total))
    return CACHE_MAX_BYTES


def inputs_key(op: OpSpec, device: str, seed: int) -> tuple[Any, ...]:
    """What makes two evaluations' inputs identical: the op's fields, the device and the seed."""
    return (op.kind, op.shape, op.dtype, op.layout, op.out_dtype, op.weight, op.moe_gemm, seed, device)


def _inputs_and_reference(op: OpSpec, device: str, seed: int) -> tuple[dict[str, Any], Any]:
    key = inputs_key(op, device, seed)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit[0], hit[1]
    while len(_CACHE) >= CACHE_OPS:
        _CACHE.popitem(last=False)
    _phase_s["setups"] = _phase_s.get("setups", 0.0) + 1
    inputs = registry.make_inputs(op, device, seed)
    ref = registry.reference(inputs, op)
    size, budget = _tensor_bytes(ref, *inputs.values()), _cache_budget(device)
    held = sum(e[2] for e in _CACHE.values())
    while _CACHE and held + size > budget:  # the newest op is always kept, as one op always was
        held -= _CACHE.popitem(last=False)[1][2]
    _CACHE[key] = (inputs, ref, size)
    return inputs, ref


def _reason(exc: BaseException) -> str:
    """One line naming the failure kind (compile, resources, runtime) and its message."""
    kind = "error"
    try:
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources

        if isinstance(exc, OutOfResources):
            kind = "out of resources"
        elif isinstance(exc, CompilationError):
            kind = "compile error"
    except ImportError:
        pass
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{kind}: {type(exc).__name__}: {text}"


#: the most copies of an op's inputs a rotated timing makes, and the most bytes they may take together
ROTATE_MAX_COPIES, ROTATE_MAX_BYTES = 64, 4 << 30


def rotation_copies(nbytes: int, l2_bytes: int | None) -> int:
    """Copies of ``nbytes`` of inputs that together pass three L2s (50 MB where the profile has none), so a
    call cycling over them reads from DRAM as the running model does: at least 1, at most
    :data:`ROTATE_MAX_COPIES` and :data:`ROTATE_MAX_BYTES` together."""
    nbytes = max(nbytes, 1)
    want = math.ceil(3 * (l2_bytes or 50 << 20) / nbytes)
    return max(1, min(want, ROTATE_MAX_COPIES, ROTATE_MAX_BYTES // nbytes))


def _launchers_on_copies(op: OpSpec, config: KernelConfig, inputs: dict[str, Any], dev: str,
                         gpu: GPUProfile | None) -> list[Callable[[], None]]:
    """The config bound to fresh copies of ``inputs`` (each with its own output), one fewer than
    :func:`rotation_copies` asks for: the caller's launcher is the first."""
    n = rotation_copies(_tensor_bytes(*inputs.values()), gpu.l2_bytes if gpu else None)
    out = []
    for _ in range(n - 1):
        copy = {k: v.clone() if hasattr(v, "clone") else v for k, v in inputs.items()}
        out.append(registry.prepare(copy, config, registry.alloc_out(op, dev), op))
    return out


def cycling(fns: list[Callable[[], Any]]) -> Callable[[], None]:
    """One launcher that calls ``fns`` in turn: captured many times into a graph, the calls cycle over them."""
    state = [0]

    def run() -> None:
        fns[state[0] % len(fns)]()
        state[0] += 1
    return run


def captured(run: Callable[[], Any], *, calls: int = 1, warmups: int = 2) -> Any:
    """``calls`` calls of ``run`` captured in one CUDA graph, after ``warmups`` calls on a side stream (as
    ``torch.cuda.graph`` asks: first-call work stays out of the capture); replayed once (the first replay
    uploads the graph) and synchronized."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            run()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replayed_us(graph: Any, calls: int, samples: int = 5) -> float:
    """Median microseconds a call of a graph :func:`captured` with ``calls`` calls: ``samples`` replays timed
    between CUDA events, each divided by ``calls``. The GPU's time with no host enqueue in it."""
    import statistics

    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(samples):
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) * 1e3 / calls)
    return statistics.median(out)


def _time_us(fn: Callable[[], Any], graph: bool, warmup_ms: int, rep_ms: int) -> float:
    """Median microseconds of ``fn`` on the GPU: per call with ``do_bench`` (L2 flushed between calls), or,
    for a kernel whose call is many launches (``graph``), replayed from a CUDA graph
    (``do_bench_cudagraph``), so the host's enqueue between launches is not counted."""
    import triton.testing

    if graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")) * 1e3
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1e3


def evaluate(op: OpSpec, config: KernelConfig, *, gpu: GPUProfile | None = None,
             validate: Callable[[OpSpec, KernelConfig], list[str]] | None = None,
             predict: Callable[[OpSpec, KernelConfig], float] | None = None,
             device: str | None = None, seed: int = 0, warmup_ms: int = 25, rep_ms: int = 100,
             check_only: bool = False, timeout_s: float = 120.0) -> Result:
    """Validate, run, check and time one config; never raises for a bad config (label ``rejected``).

    ``timeout_s`` bounds the first (compiling) run: a config slower than that is rejected
    instead of being timed (a GPU kernel cannot be interrupted; this stops the sweep paying twice).
    """
    versions = _versions()

    def result(label: str, **kw: Any) -> Result:
        return Result(op=op, config=config, label=label, versions=versions, **kw)

    try:
        registry.check_kernel(op, config)
    except ConfigError as exc:
        return result("rejected", reason=str(exc))
    if validate is not None:
        reasons = [str(r) for r in validate(op, config)]
        if reasons:
            return result("rejected", reason="; ".join(reasons))

    dev = _pick_device(device)
    if dev is None:
        us = float(predict(op, config)) if predict is not None else None
        why = "no GPU here: time from the cost model" if us is not None else \
            "no GPU here and no cost model given: nothing measured or predicted"
        return result("predicted", us=us, reason=why, device="none", **_rates(op, us, gpu))

    import torch

    dev_name = "cpu (triton interpreter)" if dev == "cpu" else torch.cuda.get_device_name(dev)
    try:
        with _phase("setup"):
            inputs, ref = _inputs_and_reference(op, dev, seed)
        with _phase("bind"):
            out = registry.alloc_out(op, dev)
            out.fill_(float("nan"))  # poison: an element the kernel skips stays NaN
            fn = registry.prepare(inputs, config, out, op)
        with _phase("first"):
            t0 = time.perf_counter()
            fn()
            if dev != "cpu":
                torch.cuda.synchronize(dev)
            first_s = time.perf_counter() - t0
    except (AutooptError, ValueError) as exc:
        return result("rejected", reason=f"cannot launch: {exc}", device=dev_name)
    except Exception as exc:  # compile errors, OutOfResources, CUDA faults: the sweep goes on
        log.info("config %s on %s rejected: %s", config.describe(), op.label(), exc)
        return result("rejected", reason=_reason(exc), device=dev_name)

    with _phase("check"):
        bad = int((~torch.isfinite(out)).sum().item())
        err = rel_error(out, ref) if not bad else math.nan
    if bad:
        return result("rejected", device=dev_name,
                      reason=f"{bad} of {out.numel()} output elements are NaN/inf after the run "
                             f"(the output was poisoned with NaN: unwritten or computed non-finite)")
    tol = registry.tolerance(op)
    if not math.isfinite(err) or err > tol:
        return result("rejected", rel_err=err, device=dev_name,
                      reason=f"wrong result: relative error {err:.3g} > {tol:g} allowed for {op.dtype}")
    if dev == "cpu" or check_only:
        return result("checked", rel_err=err, device=dev_name,
                      reason="correct under the Triton interpreter (no time taken on the CPU)"
                      if dev == "cpu" else "correct (timing skipped: check_only)")
    if first_s > timeout_s:
        return result("rejected", rel_err=err, device=dev_name,
                      reason=f"first run (with compile) took {first_s:.1f} s > limit {timeout_s:g} s")

    entry = registry.KERNELS[config.kernel]
    try:
        if entry.rotate_inputs:
            with _phase("copies"):
                fn = cycling([fn, *_launchers_on_copies(op, config, inputs, dev, gpu)])
        with _phase("timing"):
            us = _time_us(fn, entry.graph_timed, warmup_ms, rep_ms)
    except Exception as exc:
        return result("rejected", rel_err=err, device=dev_name, reason=_reason(exc))
    rates = _rates(op, us, gpu)
    floor = floor_us(op, gpu, physical=True)
    if floor is not None and us < floor * (1.0 - _FLOOR_SLACK):
        return result("withheld", us=us, rel_err=err, device=dev_name, **rates,
                      reason=f"measured {us:.3f} us is below the physical floor {floor:.3f} us "
                             f"(datasheet/measured ceilings of {gpu.name if gpu else None}): "
                             f"the measurement or the profile is wrong")
    return result("measured", us=us, rel_err=err, device=dev_name, **rates)
