"""What ``autoopt.optimize(model, weights=...)`` quantizes into: the format asked, checked against the GPU, or
``recommend()``'s choice for ``"auto"``.

``weights`` takes:

- ``None`` (the default), ``"bf16"``, ``"fp16"``: the weights stay as loaded (16-bit kernels);
- a format spec :func:`autoopt.kernels.quant.parse_weight` reads: ``"fp8"`` (e4m3 weights with a scale per
  output channel, W8A8: activations quantized per token on FP8 tensor cores, sm_89+), ``"fp8-wo"`` (the
  same weights, bf16/fp16 activations: any NVIDIA GPU from Ampere), ``"int8"`` (weight-only, a scale per
  channel), ``"int4"`` (weight-only, a bf16 scale per 128 weights of a row; ``"int4-asym"`` adds an offset
  per group, ``"int4-g64"`` another group), ``"fp8_block"`` (DeepSeek-V3's 128 x 128 blocks); the
  planning names ``"fp8-weight-only"`` and ``"w4a16"``/``"w8a16"``/``"w8a8"`` are aliases;
- ``"auto"``: the format :func:`autoopt.recommend` chooses for this model on this GPU and workload
  (``batch``, ``context``) under the ``autoopt`` runtime's rules (the formats autoopt's kernels run), the
  call a serving runtime makes; the report says which and why.

A W8A8 format on a GPU without FP8 tensor cores is a :class:`~autoopt.errors.WeightFormatError` naming the
format, the GPU and the weight-only format that would run; an unknown spec one listing the accepted ones.
Both are raised before the model is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoopt.errors import AutooptError, WeightFormatError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.quant import INT4_GROUPS, WeightFormat, parse_weight

__all__ = ["ACCEPTED", "SIXTEEN_BIT", "WeightChoice", "auto_weights", "parse_weights", "resolve_weights"]

#: what ``weights=`` keeps at the model's own 16-bit weights
SIXTEEN_BIT = ("bf16", "fp16")
#: the accepted values, for messages
ACCEPTED = ("auto", *SIXTEEN_BIT, "fp8", "fp8-wo", "fp8_block", "fp8_block-wo", "int8", "int4", "int4-asym",
            *(f"int4-g{g}[-asym]" for g in INT4_GROUPS if g != 128))
#: recommend()'s format names (autoopt.planning.quant) -> the spec optimize() quantizes into (None: 16-bit)
_FROM_PLAN = {"fp8": "fp8", "fp8-weight-only": "fp8-wo", "int8": "int8", "int4": "int4",
              "bf16": None, "fp16": None, "fp32": None}


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightChoice:
    """What ``weights=`` resolved to: ``spec`` the format linears are quantized into (None: they keep their
    16-bit weights), ``asked`` what was passed, ``reason`` why (recommend()'s reason for ``"auto"``), ``gpu`` the
    GPU it was checked against, ``predicted`` recommend()'s predicted times (``"auto"`` only)."""

    asked: str | None
    spec: str | None
    reason: str
    gpu: str = ""
    predicted: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"asked": self.asked, "format": self.spec, "reason": self.reason, "gpu": self.gpu,
                "predicted": dict(self.predicted) if self.predicted else None}


def parse_weights(weights: str) -> WeightFormat:
    """The format an explicit ``weights=`` names; WeightFormatError listing the accepted values otherwise."""
    try:
        return parse_weight(weights)
    except AutooptError as exc:
        raise WeightFormatError(f"autoopt.optimize(): unknown weights={weights!r} ({exc}); accepted: "
                                f"{', '.join(ACCEPTED)}", format=weights) from None


def check_supported(fmt: WeightFormat, gpu: GPUProfile | None) -> None:
    """WeightFormatError where ``fmt`` cannot run on ``gpu`` (W8A8 without FP8 tensor cores), naming what would."""
    if not fmt.quantizes_activations or gpu is None or gpu.features.fp8:
        return
    instead = f"{fmt.name}-wo"
    raise WeightFormatError(
        f"autoopt.optimize(): weights={fmt.spec!r} is W8A8 (e4m3 activations on FP8 tensor cores, sm_89+), which "
        f"{gpu.name} ({gpu.arch or 'compute capability ' + str(gpu.cc)}) does not have; weights={instead!r} (the same "
        f"FP8 weights with {'bf16' if gpu.features.bf16 else 'fp16'} activations) runs there. The model is "
        "unchanged.", format=fmt.spec, gpu=gpu.name, instead=instead)


def resolve_weights(weights: str | None, *, gpu: GPUProfile | None, model: Any = None,
                    hardware: HardwareProfile | None = None, batch: int = 1, context: int | None = None
                    ) -> WeightChoice:
    """The :class:`WeightChoice` for ``weights=`` on ``gpu`` (see the module docstring); ``"auto"`` asks
    :func:`auto_weights` with ``model``, ``hardware``, ``batch`` and ``context``."""
    if weights is not None and not isinstance(weights, str):
        raise TypeError(f"autoopt.optimize(): weights= takes a format name (str) or None, got "
                        f"{type(weights).__name__}")
    name = gpu.name if gpu is not None else ""
    if weights is None or weights.strip().lower() in SIXTEEN_BIT:
        return WeightChoice(asked=weights, spec=None, reason="the model's own 16-bit weights", gpu=name)
    if weights.strip().lower() == "auto":
        if hardware is None:
            raise WeightFormatError("autoopt.optimize(weights='auto') needs a hardware profile to ask recommend() "
                                    "(pass profile=)", format="auto")
        return auto_weights(model, hardware, batch=batch, context=context)
    fmt = parse_weights(weights)
    check_supported(fmt, gpu)
    return WeightChoice(asked=weights, spec=fmt.spec, reason=f"{fmt.spec} as asked", gpu=name)


def auto_weights(model: Any, hardware: HardwareProfile, *, batch: int = 1, context: int | None = None
                 ) -> WeightChoice:
    """recommend()'s weight format for ``model`` on ``hardware`` at ``batch`` and ``context`` under the ``autoopt``
    runtime's rules (one device: the model is optimised where it is), as a :class:`WeightChoice`."""
    from autoopt.planning.recommendation import recommend

    prompt = min(1024, context) if context is not None else 1024
    rec = recommend(hardware, model, batch=batch, prompt_len=prompt, context=context, runtime="autoopt",
                    max_devices=1, top=1)
    name = rec.quant.format.name
    if name not in _FROM_PLAN:
        raise WeightFormatError(f"autoopt.optimize(weights='auto'): recommend() chose {name!r}, which autoopt's "
                                f"kernels do not run; pass one of {', '.join(ACCEPTED[1:])}", format=name,
                                gpu=hardware.gpu.name if hardware.gpu else None)
    spec = _FROM_PLAN[name]
    gpu = hardware.gpu
    if spec is not None:
        check_supported(parse_weight(spec), gpu)
    ctx = f", context {context}" if context is not None else ""
    reason = (f"recommend(): {name} - {rec.quant.reason} (batch {batch}{ctx} on {rec.profile}, runtime autoopt; "
              f"predicted decode step {rec.predicted.get('decode_step_us', 0.0) / 1e3:.3f} ms)")
    return WeightChoice(asked="auto", spec=spec, reason=reason, gpu=gpu.name if gpu else "",
                        predicted=dict(rec.predicted))


def hardware_of(gpu: GPUProfile | None, given: Any = None) -> HardwareProfile | None:
    """A :class:`HardwareProfile` for recommend(): ``given`` when it is one (or names one), else one holding
    ``gpu`` alone."""
    if isinstance(given, HardwareProfile):
        return given
    if isinstance(given, str):
        from autoopt.hardware.library import load_profile

        return load_profile(given)
    if gpu is None:
        return None
    return HardwareProfile(name=gpu.name, origin="autoopt.nn", gpus=(gpu,))
