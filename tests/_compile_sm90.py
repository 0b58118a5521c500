"""Compile every kernel launch of a set of ops for sm_90, on a machine with no GPU (run as a script).

Triton's CPU interpreter runs kernels without compiling them, so it never type-checks them: a ``tl.dot`` of
bf16 activations and uint8 codes in a branch the constexprs make dead passed every interpreter test and failed
to compile on the H100 (the int4 fused-MoE kernel). Triton's compiler needs no driver for a named target, so
this compiles what the GPU would: each op is ranked for the H100 profile, its best ``--top`` configs bound
through the backend registry (the path the tuner and ``optimize()`` take) on CPU tensors, every
``JITFunction`` launch recorded instead of run, and each distinct launch compiled to a cubin for
``cuda:90``.

Prints one JSON object: ``{"compiled": [...], "failed": [...], "kernels": [...]}``. Must run without
``TRITON_INTERPRET`` (the interpreter replaces ``JITFunction``s).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: the ops whose best configs are compiled (``kernel``: that kernel's best, where rank() ranks it lower)
OPS: list[dict[str, Any]] = [
    # dense matmuls: decode (GEMV, split-K) and prefill (Hopper TMA) shapes, both layouts
    dict(kind="gemv", shape=(1, 4096, 4096)), dict(kind="gemv", shape=(16, 14336, 4096)),
    dict(kind="gemm", shape=(16, 14336, 4096)),
    dict(kind="gemm", shape=(2048, 4096, 4096)), dict(kind="gemm", shape=(2048, 6144, 4096), dtype="fp16"),
    dict(kind="gemm", shape=(128, 4096, 4096), layout="kn"),
    # elementwise and norms
    dict(kind="silu_mul", shape=(16, 14336)), dict(kind="add", shape=(16, 4096)),
    dict(kind="gelu_tanh_mul", shape=(16, 14336)),
    dict(kind="rmsnorm", shape=(1, 4096)), dict(kind="rmsnorm", shape=(2048, 4096)),
    dict(kind="rmsnorm", shape=(4, 65536)), dict(kind="rmsnorm", shape=(1, 1048576), kernel="rmsnorm_split"),
    dict(kind="rmsnorm", shape=(4, 65536), kernel="rmsnorm_looped"),
    dict(kind="layernorm", shape=(64, 4096)),
    dict(kind="layernorm", shape=(8, 65536)), dict(kind="softmax", shape=(64, 4096)),
    dict(kind="softmax", shape=(8, 65536)),
    # quantized linears: every weight format at decode and prefill
    *[dict(kind="gemv" if m <= 16 else "gemm", shape=(m, 4096, 4096), weight=w)
      for w in ("fp8", "fp8-wo", "fp8_block", "fp8_block-wo", "int8", "int4", "int4-asym") for m in (1, 16, 2048)],
    # fused MoE: every expert format, decode and prefill, both GEMMs and each alone
    *[dict(kind="fused_moe", shape=(m, 8, 2, 1792, 4096), weight=w, moe_gemm=g)
      for w in (None, "fp8", "fp8_block", "int8", "int4", "int4-asym") for m in (1, 1024)
      for g in ("both", "gate_up", "down")],
    dict(kind="fused_moe", shape=(64, 128, 8, 768, 2048), dtype="fp16"),
]


class _Recorder:
    """Stands in for ``JITFunction.run``: keeps each launch (the op it served, kernel, arguments, options)."""

    def __init__(self) -> None:
        self.op: dict[str, Any] = {}
        self.launches: list[tuple[dict[str, Any], Any, tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        self.launches.append((self.op, fn, args, kwargs))


def _signature(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict, dict, dict]:
    """The (signature, constexprs, options) ``ASTSource`` and ``triton.compile`` take for one launch."""
    from triton.runtime.jit import mangle_type

    bound = dict(zip((p.name for p in fn.params), args, strict=False))  # the rest come by keyword
    sig, const = {}, {}
    for i, p in enumerate(fn.params):
        value = bound[p.name] if p.name in bound else kwargs.get(p.name, p.default)
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            const[(i,)] = value
        else:
            sig[p.name] = mangle_type(value)
            if sig[p.name] == "constexpr":  # None passed to a plain argument
                const[(i,)] = value
    names = {p.name for p in fn.params}
    options = {k: v for k, v in kwargs.items() if k not in names}
    return sig, const, options


def _compile(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """``None`` when the launch compiles to a cubin for sm_90, else the compiler's complaint."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, const, options = _signature(fn, args, kwargs)
    try:
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                       options=options)
    except Exception as exc:  # the compiler's error is the finding
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
    return None


def _launches(spec: dict[str, Any], top: int) -> set[str]:
    """Bind the op's best ``top`` configs on CPU tensors and launch them (recorded, not run); their kernels."""
    from autoopt.backend import registry
    from autoopt.hardware.library import load_profile
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.ranking import rank

    spec = dict(spec)
    kernel = spec.pop("kernel", None)  # a kernel rank() puts below the top: its best configs
    op = OpSpec(**spec)
    gpu = load_profile("h100-sxm").gpus[0]
    configs = [c.config for c in rank(gpu, op, top=32 if kernel else top).candidates
               if kernel in (None, c.config.kernel)][:top]
    for cfg in configs:
        inputs = registry.make_inputs(op, "cpu", empty=True)
        registry.prepare(inputs, cfg, registry.alloc_out(op, "cpu"), op)()
    return {cfg.kernel for cfg in configs}


def _align_launch() -> None:
    """The one-program align step, which ``moe_align`` takes on CUDA tensors only (a decode step's)."""
    import torch

    from autoopt.backend.kernels.fused_moe import _align_one_program

    _align_one_program(torch.zeros((4, 2), dtype=torch.int32), 16, 8)


def main(top: int) -> dict[str, Any]:
    from triton.runtime.jit import JITFunction

    recorder = _Recorder()
    JITFunction.run = lambda self, *a, **kw: recorder(self, *a, **kw)  # type: ignore[method-assign]
    recorder.op = {"kind": "moe_align"}
    _align_launch()
    kernels: set[str] = set()
    for spec in OPS:
        recorder.op = spec
        kernels |= _launches(spec, top)
    compiled, failed, seen = [], [], set()
    for op, fn, args, kwargs in recorder.launches:
        sig, const, options = _signature(fn, args, kwargs)
        key = (fn.__name__, tuple(sorted(sig.items())), repr(sorted(const.items())), repr(sorted(options.items())))
        if key in seen:
            continue
        seen.add(key)
        row = {"op": op, "kernel": fn.__name__, "constexprs": {str(k[0]): repr(v) for k, v in const.items()},
               "options": {k: repr(v) for k, v in options.items()}}
        error = _compile(fn, args, kwargs)
        if error:
            failed.append({**row, "error": error})
        else:
            compiled.append(row)
    return {"compiled": compiled, "failed": failed, "kernels": sorted(kernels)}


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on"):
        sys.exit("run without TRITON_INTERPRET: the interpreter replaces JITFunctions")
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)))
