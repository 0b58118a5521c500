"""What each backend kernel needs around it: inputs, launch, reference, tolerance, torch baseline.

Kernel names (``KernelConfig.kernel``) and the op kinds they serve:
``gemm``, ``gemm_tma`` (gemm, gemv), ``gemv`` (gemv), ``silu_mul``, ``add``, ``gelu_tanh_mul``,
``{rmsnorm,layernorm,softmax}_{single,looped}``, ``rmsnorm_split``, ``rmsnorm_coop``. The matmul
kernels also run with a fused bias + activation epilogue (a ``"bias"`` input, ``prepare(...,
activation=)``): the same config on the variant kernels of ``kernels/epilogue.py``, not ranked or
measured apart. Inputs are fresh random tensors (never zeros: zeros hide unwritten outputs and can
run faster). The reference is float64 on the same inputs. For a ``kn`` GEMM the weight is stored
under ``"w_kn"`` (``[K, N]``) instead of ``"w"`` (``[N, K]``), so the input dict alone says the layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import BackendError, ConfigError
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

log = get_logger(__name__)

__all__ = [
    "EPS",
    "KERNELS",
    "alloc_out",
    "check_kernel",
    "launch",
    "make_inputs",
    "prepare",
    "reference",
    "tolerance",
    "torch_baseline",
    "torch_dtype",
]

#: eps by op kind: RMSNorm 1e-6 (Llama's rms_norm_eps), LayerNorm 1e-5 (torch's default).
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}

#: relative Frobenius error ||out - ref|| / ||ref|| allowed, by input dtype.
#: fp32 matmuls run as TF32 on tensor cores (10-bit mantissa, ~3e-4 measured
#: relative error at K=4096), hence their own looser bound.
_TOL = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 1.5e-2, "fp8": 6e-2}
_TOL_TF32 = 5e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelEntry:
    """One backend kernel: the op kinds it serves and the module holding its Triton source.

    ``module`` is what a stored measurement is tied to: when that file changes, the results store
    treats the kernel's old timings as stale.
    """

    name: str
    kinds: tuple[str, ...]
    module: str


_KERNELS = "autoopt.backend.kernels"
KERNELS: dict[str, KernelEntry] = {
    "gemm": KernelEntry(name="gemm", kinds=("gemm", "gemv"), module=f"{_KERNELS}.gemm"),
    "gemm_tma": KernelEntry(name="gemm_tma", kinds=("gemm", "gemv"), module=f"{_KERNELS}.gemm_tma"),
    "gemv": KernelEntry(name="gemv", kinds=("gemv",), module=f"{_KERNELS}.gemv"),
    "silu_mul": KernelEntry(name="silu_mul", kinds=("silu_mul",), module=f"{_KERNELS}.elementwise"),
    "add": KernelEntry(name="add", kinds=("add",), module=f"{_KERNELS}.elementwise"),
    "gelu_tanh_mul": KernelEntry(name="gelu_tanh_mul", kinds=("gelu_tanh_mul",), module=f"{_KERNELS}.gated"),
    **{f"{k}_{v}": KernelEntry(name=f"{k}_{v}", kinds=(k,), module=f"{_KERNELS}.norm")
       for k in ("rmsnorm", "layernorm", "softmax") for v in ("single", "looped")},
    "rmsnorm_split": KernelEntry(name="rmsnorm_split", kinds=("rmsnorm",), module=f"{_KERNELS}.norm"),
    "rmsnorm_coop": KernelEntry(name="rmsnorm_coop", kinds=("rmsnorm",), module=f"{_KERNELS}.norm_coop"),
}


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
            "fp8": torch.float8_e4m3fn, "fp64": torch.float64}[name]


def check_kernel(op: OpSpec, config: KernelConfig) -> None:
    """``ConfigError`` when the config's kernel is unknown or does not serve ``op.kind``."""
    entry = KERNELS.get(config.kernel)
    if entry is None:
        raise ConfigError(f"unknown backend kernel {config.kernel!r}; expected one of {', '.join(KERNELS)}",
                          reasons=(f"unknown kernel {config.kernel!r}",))
    if op.kind not in entry.kinds:
        raise ConfigError(f"kernel {config.kernel!r} serves {', '.join(entry.kinds)}, not {op.kind!r}",
                          reasons=(f"kernel {config.kernel!r} cannot run op kind {op.kind!r}",))


def _randn(shape: tuple[int, ...], dtype: str, device: Any, gen: Any, scale: float = 1.0) -> Any:
    import torch

    if str(device) == "meta":  # shapes and dtypes only (see make_inputs(empty=True))
        return torch.empty(shape, dtype=torch_dtype(dtype), device="meta")

    t = torch.randn(shape, generator=gen, dtype=torch.float32, device="cpu") * scale
    return t.to(device=device).to(torch_dtype(dtype))


def make_inputs(op: OpSpec, device: Any, seed: int = 0, *, empty: bool = False) -> dict[str, Any]:
    """Fresh random inputs for ``op`` on ``device`` (drawn on the CPU from ``seed``, then moved).

    ``empty=True`` allocates the same tensors uninitialised: enough to compile a kernel for them
    (Triton specialises on dtypes, alignment and sizes, never on values), with no launch and no copy.
    """
    import torch

    if empty:
        return {k: torch.empty(v.shape, dtype=v.dtype, device=device)
                for k, v in make_inputs(op, "meta", seed).items()}

    gen = torch.Generator(device="cpu").manual_seed(seed)
    if op.is_matmul:
        m, n, k = op.shape
        # W ~ N(0, 1/K) keeps outputs O(1) like a trained layer; fp8 keeps |x| far under e4m3's 448.
        a = _randn((m, k), op.dtype, device, gen)
        if op.layout == "kn":
            return {"a": a, "w_kn": _randn((k, n), op.dtype, device, gen, k ** -0.5)}
        return {"a": a, "w": _randn((n, k), op.dtype, device, gen, k ** -0.5)}
    rows, n = op.shape
    x = _randn((rows, n), op.dtype, device, gen)
    if op.kind in ("silu_mul", "add", "gelu_tanh_mul"):
        return {"x": x, "y": _randn((rows, n), op.dtype, device, gen)}
    if op.kind == "softmax":
        return {"x": x}
    # weights near 1 (as trained norms are), never all-equal, never zero
    w = (1.0 + 0.1 * torch.randn((n,), generator=gen)).to(device=device, dtype=torch_dtype(op.dtype))
    if op.kind == "rmsnorm":
        return {"x": x, "weight": w}
    b = (0.1 * torch.randn((n,), generator=gen)).to(device=device, dtype=torch_dtype(op.dtype))
    return {"x": x, "weight": w, "bias": b}


def alloc_out(op: OpSpec, device: Any) -> Any:
    """An uninitialised output of the op's shape and output dtype."""
    import torch

    shape = (op.shape[0], op.shape[1]) if op.is_matmul else tuple(op.shape)
    return torch.empty(shape, dtype=torch_dtype(op.out_dtype or op.dtype), device=device)


def tolerance(op: OpSpec) -> float:
    """Largest relative Frobenius error accepted for ``op`` (TF32 bound for fp32 matmuls)."""
    if op.is_matmul and op.dtype == "fp32":
        return _TOL_TF32
    return _TOL[op.dtype]


def _weight(inputs: dict[str, Any]) -> tuple[Any, str]:
    return (inputs["w_kn"], "kn") if "w_kn" in inputs else (inputs["w"], "nk")


def prepare(inputs: dict[str, Any], config: KernelConfig, out: Any,
            op: OpSpec | None = None, *, eps: float | None = None, activation: str | None = None
            ) -> Callable[[], None]:
    """Bind ``config`` to the tensors; returns a no-argument launcher (compiles on first call).

    Allocations (split-K workspace, descriptors) happen here, outside any timed region.
    ``op``, when given, is checked against the kernel's kinds. ``eps`` (norms only) overrides
    :data:`EPS` (a model's own ``rms_norm_eps``, say). A matmul given a ``"bias"`` input or an
    ``activation`` (``gelu``, ``gelu_tanh``, ``relu``) runs the same config with the epilogue
    ``act(a @ W^T + bias)`` fused (:mod:`autoopt.backend.kernels.epilogue`).
    """
    if op is not None:
        check_kernel(op, config)
    elif config.kernel not in KERNELS:
        raise ConfigError(f"unknown backend kernel {config.kernel!r}; expected one of {', '.join(KERNELS)}")
    params = dict(config.params)
    name = config.kernel
    if name in ("gemm", "gemm_tma", "gemv"):
        w, layout = _weight(inputs)
        if inputs.get("bias") is not None or activation not in (None, "none"):
            from autoopt.backend.kernels.epilogue import epilogue_prepare
            return epilogue_prepare(name, inputs["a"], w, out, params, bias=inputs.get("bias"),
                                    activation=activation or "none", layout=layout)
        if name == "gemm":
            from autoopt.backend.kernels.gemm import gemm_prepare
            return gemm_prepare(inputs["a"], w, out, params, layout=layout)
        if name == "gemm_tma":
            from autoopt.backend.kernels.gemm_tma import gemm_tma_prepare
            return gemm_tma_prepare(inputs["a"], w, out, params, layout=layout)
        from autoopt.backend.kernels.gemv import gemv_prepare
        return gemv_prepare(inputs["a"], w, out, params, layout=layout)
    if name == "silu_mul":
        from autoopt.backend.kernels.elementwise import silu_mul_prepare
        return silu_mul_prepare(inputs["x"], inputs["y"], out, params)
    if name == "add":
        from autoopt.backend.kernels.elementwise import add_prepare
        return add_prepare(inputs["x"], inputs["y"], out, params)
    if name == "gelu_tanh_mul":
        from autoopt.backend.kernels.gated import gelu_tanh_mul_prepare
        return gelu_tanh_mul_prepare(inputs["x"], inputs["y"], out, params)
    if name == "rmsnorm_coop":
        from autoopt.backend.kernels.norm_coop import rmsnorm_coop_prepare
        return rmsnorm_coop_prepare(inputs["x"], inputs["weight"], out, params,
                                    eps=EPS["rmsnorm"] if eps is None else eps)
    from autoopt.backend.kernels.norm import norm_prepare
    return norm_prepare(name, inputs["x"], inputs.get("weight"), inputs.get("bias"), out, params,
                        eps=EPS.get(name.rsplit("_", 1)[0], 0.0) if eps is None else eps)


def launch(inputs: dict[str, Any], config: KernelConfig, out: Any, op: OpSpec | None = None) -> None:
    """Run ``config`` once on ``inputs`` writing ``out`` (prepare + launch)."""
    prepare(inputs, config, out, op)()


def reference(inputs: dict[str, Any], op: OpSpec) -> Any:
    """The op computed in float64 on the same inputs and device."""
    import torch

    def d(t: Any) -> Any:
        return t.to(torch.float64)

    if op.is_matmul:
        w, layout = _weight(inputs)
        return d(inputs["a"]) @ (d(w) if layout == "kn" else d(w).t())
    x = d(inputs["x"])
    if op.kind == "silu_mul":
        return torch.nn.functional.silu(x) * d(inputs["y"])
    if op.kind == "gelu_tanh_mul":
        return torch.nn.functional.gelu(x, approximate="tanh") * d(inputs["y"])
    if op.kind == "add":
        return x + d(inputs["y"])
    if op.kind == "softmax":
        return torch.softmax(x, dim=-1)
    if op.kind == "rmsnorm":
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + EPS["rmsnorm"]) * d(inputs["weight"])
    if op.kind == "layernorm":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), d(inputs["weight"]), d(inputs["bias"]),
                                              EPS["layernorm"])
    raise BackendError(f"no reference for op kind {op.kind!r}")


def torch_baseline(inputs: dict[str, Any], op: OpSpec) -> Callable[[], Any] | None:
    """The plain-PyTorch way to compute ``op`` (cuBLAS, ATen kernels), for the ratio column.

    None where torch has no direct equivalent on this device (fp8 GEMM off sm_89+).
    """
    import torch
    import torch.nn.functional as F

    if op.is_matmul:
        a = inputs["a"]
        w, layout = _weight(inputs)
        if op.dtype == "fp8":
            if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device) < (8, 9):
                return None
            one = torch.ones((), device=a.device, dtype=torch.float32)
            # _scaled_mm wants B column-major: W[N,K] row-major transposed is exactly that.
            b = w.t() if layout == "nk" else w.t().contiguous().t()
            return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        if layout == "kn":
            return lambda: torch.matmul(a, w)
        return lambda: F.linear(a, w)
    x = inputs["x"]
    if op.kind == "silu_mul":
        y = inputs["y"]
        return lambda: F.silu(x) * y
    if op.kind == "gelu_tanh_mul":
        y = inputs["y"]
        return lambda: F.gelu(x, approximate="tanh") * y
    if op.kind == "add":
        y = inputs["y"]
        return lambda: x + y
    if op.kind == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if op.kind == "rmsnorm":
        w = inputs["weight"]
        return lambda: F.rms_norm(x, (x.shape[-1],), w, EPS["rmsnorm"])
    w, b = inputs["weight"], inputs["bias"]
    return lambda: F.layer_norm(x, (x.shape[-1],), w, b, EPS["layernorm"])
