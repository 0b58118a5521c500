"""What a serving runtime can run, as data: formats per GPU architecture, parallelism, KV-cache dtypes,
memory overheads.

A :class:`RuntimeSpec` is declarative: the built-ins (:mod:`autoopt.runtimes.builtin`) and a plugin's
``autoopt_runtimes`` hook give plain dicts in the same schema, read by :meth:`RuntimeSpec.from_dict`,
which checks every field. The planner asks a spec three questions: which weight formats it has
kernels for on this GPU (:meth:`RuntimeSpec.formats_for`), which splits it can run
(:meth:`RuntimeSpec.check_split`), and how much of each GPU it leaves to weights and KV cache
(:attr:`RuntimeSpec.reserve`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoopt.errors import RuntimeRuleError
from autoopt.hardware.profile import GPUProfile

__all__ = ["OFFLOAD_KINDS", "FormatRule", "KvRule", "RuntimeSpec"]

#: how a runtime uses host memory for weights that do not fit on the GPUs:
#: ``none``; ``cpu-compute`` (the CPU runs those layers from RAM: llama.cpp ``-ngl``);
#: ``weight-stream`` (the weights live in RAM and cross PCIe to the GPU on every forward:
#: vLLM/SGLang ``--cpu-offload-gb``, accelerate's CPU entries in a ``device_map``).
OFFLOAD_KINDS = ("none", "cpu-compute", "weight-stream")


def _cc(gpu: GPUProfile | None) -> float | None:
    if gpu is None or gpu.cc_major is None:
        return None
    return gpu.cc_major + (gpu.cc_minor or 0) / 10


def _need(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise RuntimeRuleError(f"{where}: field '{key}' is missing", rule="schema")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise RuntimeRuleError(f"{where}: field '{key}' must be {getattr(kind, '__name__', kind)}, got {value!r}",
                               rule="schema")
    return value


def _min_cc(data: Mapping[str, Any], where: str) -> float | None:
    min_cc = data.get("min_cc")
    if min_cc is not None and (isinstance(min_cc, bool) or not isinstance(min_cc, (int, float))):
        raise RuntimeRuleError(f"{where}: min_cc must be a number like 8.9, got {min_cc!r}", rule="schema")
    return None if min_cc is None else float(min_cc)


@dataclass(frozen=True, slots=True, kw_only=True)
class FormatRule:
    """One weight format a runtime has kernels for, from compute capability ``min_cc`` (None: any GPU).

    ``arg`` is the runtime's own name for it (vLLM's ``--quantization`` value, the GGUF type, the
    transformers quantization config); ``cpu`` says whether its CPU backend runs it too.
    """

    format: str
    arg: str | None = None
    min_cc: float | None = None
    cpu: bool = False
    note: str = ""

    def runs_on(self, gpu: GPUProfile | None) -> bool:
        if gpu is None:
            return self.cpu
        cc = _cc(gpu)
        return self.min_cc is None or (cc is not None and cc >= self.min_cc)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "arg": self.arg, "min_cc": self.min_cc, "cpu": self.cpu, "note": self.note}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> FormatRule:
        return cls(format=_need(data, "format", str, where), arg=data.get("arg"), min_cc=_min_cc(data, where),
                   cpu=bool(data.get("cpu", False)), note=str(data.get("note", "")))


@dataclass(frozen=True, slots=True, kw_only=True)
class KvRule:
    """A KV-cache dtype (autoopt's name) and the runtime's argument for it."""

    dtype: str
    arg: str
    min_cc: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "arg": self.arg, "min_cc": self.min_cc}


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeSpec:
    """One serving runtime's rules (see the module docstring)."""

    name: str
    display: str
    formats: tuple[FormatRule, ...]
    kv_dtypes: tuple[KvRule, ...]
    tensor_parallel: bool = False
    #: runs tensor parallelism at a degree the caller gives, but the planner never chooses it unasked
    #: (transformers' ``tp_plan="auto"`` needs one process a GPU under torchrun: not what a plain
    #: ``from_pretrained`` call gets)
    tensor_parallel_on_request: bool = False
    pipeline_parallel: bool = False
    expert_parallel: bool = False
    data_parallel: bool = False
    offload: str = "none"
    #: share of each GPU's memory the runtime takes for itself (vLLM's --gpu-memory-utilization default)
    memory_utilization: float = 1.0
    #: bytes per GPU outside weights and KV cache: CUDA context, CUDA graphs, the activation peak of
    #: its profiling run at its default max batch tokens
    reserved_gib: float = 0.0
    max_batch_tokens: int = 8192
    sources: tuple[str, ...] = ()
    note: str = ""

    # -- questions the planner asks ------------------------------------------------------
    def formats_for(self, gpu: GPUProfile | None) -> dict[str, FormatRule]:
        """Format name -> rule for every format this runtime runs on ``gpu`` (None: on the CPU)."""
        out: dict[str, FormatRule] = {}
        for rule in self.formats:
            if rule.runs_on(gpu) and rule.format not in out:
                out[rule.format] = rule
        return out

    def why_not(self, fmt: str, gpu: GPUProfile | None) -> str:
        """Why ``fmt`` is not offered on ``gpu`` (for error messages)."""
        rules = [r for r in self.formats if r.format == fmt]
        where = gpu.name if gpu is not None else "the CPU"
        if not rules:
            return (f"{self.display} has no kernels for {fmt}; it runs "
                    f"{', '.join(sorted({r.format for r in self.formats}))}")
        need = min((r.min_cc for r in rules if r.min_cc is not None), default=None)
        return f"{self.display} runs {fmt} from compute capability {need} on; {where} is {_cc(gpu)}"

    def kv_arg(self, dtype: str, gpu: GPUProfile | None) -> str:
        """The runtime's argument for KV-cache ``dtype``; a typed error naming the accepted ones."""
        cc = _cc(gpu)
        for rule in self.kv_dtypes:
            if rule.dtype == dtype and (rule.min_cc is None or (cc is not None and cc >= rule.min_cc)):
                return rule.arg
        ok = ", ".join(r.dtype for r in self.kv_dtypes)
        raise RuntimeRuleError(f"no {dtype} KV cache here; it takes {ok}", runtime=self.name, rule="kv_dtype")

    def check_split(self, *, tp: int | None, pp: int | None) -> None:
        """Refuse degrees the runtime cannot run (typed error saying what it can)."""
        if tp and tp > 1 and not (self.tensor_parallel or self.tensor_parallel_on_request):
            raise RuntimeRuleError(f"runs no tensor parallelism (asked for {tp}); it splits layers over GPUs "
                                   "instead: leave the tensor-parallel degree out, or choose vllm or sglang",
                                   runtime=self.name, rule="tensor_parallel")
        if pp and pp > 1 and not self.pipeline_parallel:
            raise RuntimeRuleError(f"runs no pipeline parallelism (asked for {pp}); leave it out",
                                   runtime=self.name, rule="pipeline_parallel")

    @property
    def reserve(self) -> tuple[float, int]:
        """(share of each GPU's memory, bytes held back): what the planner leaves to weights, KV cache
        and its own estimates is ``share x memory - held back``."""
        return self.memory_utilization, int(self.reserved_gib * 2**30)

    # -- serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "display": self.display, "formats": [f.to_dict() for f in self.formats],
                "kv_dtypes": [k.to_dict() for k in self.kv_dtypes], "tensor_parallel": self.tensor_parallel,
                "tensor_parallel_on_request": self.tensor_parallel_on_request,
                "pipeline_parallel": self.pipeline_parallel, "expert_parallel": self.expert_parallel,
                "data_parallel": self.data_parallel, "offload": self.offload,
                "memory_utilization": self.memory_utilization, "reserved_gib": self.reserved_gib,
                "max_batch_tokens": self.max_batch_tokens, "sources": list(self.sources), "note": self.note}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuntimeSpec:
        """A spec from plain data, every field checked (a plugin's dict goes through here)."""
        if not isinstance(data, Mapping):
            raise RuntimeRuleError(f"a runtime description is a mapping, got {type(data).__name__}", rule="schema")
        name = _need(data, "name", str, "runtime")
        where = f"runtime {name!r}"
        formats = tuple(FormatRule.from_dict(f, f"{where} format {i}")
                        for i, f in enumerate(_need(data, "formats", (list, tuple), where)))
        kv = tuple(KvRule(dtype=_need(k, "dtype", str, where), arg=_need(k, "arg", str, where),
                          min_cc=_min_cc(k, where)) for k in _need(data, "kv_dtypes", (list, tuple), where))
        offload = data.get("offload", "none")
        if offload not in OFFLOAD_KINDS:
            raise RuntimeRuleError(f"{where}: offload must be one of {', '.join(OFFLOAD_KINDS)}, got {offload!r}",
                                   rule="schema")
        util = data.get("memory_utilization", 1.0)
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.1 <= util <= 1.0:
            raise RuntimeRuleError(f"{where}: memory_utilization must be in 0.1..1.0, got {util!r}", rule="schema")
        if not formats:
            raise RuntimeRuleError(f"{where}: lists no weight formats", rule="schema")
        return cls(name=name, display=str(data.get("display", name)), formats=formats, kv_dtypes=kv,
                   tensor_parallel=bool(data.get("tensor_parallel", False)),
                   tensor_parallel_on_request=bool(data.get("tensor_parallel_on_request", False)),
                   pipeline_parallel=bool(data.get("pipeline_parallel", False)),
                   expert_parallel=bool(data.get("expert_parallel", False)),
                   data_parallel=bool(data.get("data_parallel", False)), offload=offload,
                   memory_utilization=float(util), reserved_gib=float(data.get("reserved_gib", 0.0)),
                   max_batch_tokens=int(data.get("max_batch_tokens", 8192)),
                   sources=tuple(data.get("sources", ())), note=str(data.get("note", "")))
