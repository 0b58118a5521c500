"""GPU kernel name -> op class, across vendors and libraries, as data.

Rules are ``(class, regex)`` pairs tried in order (first match wins): the built-ins below and what
plugins add through the ``autoopt_trace_rules`` hook (tried first, so a plugin can refine a class).
Inductor's kernels are named for what they fused (``triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3``
is an RMSNorm with its residual add and casts): :func:`inductor_ops` reads the op list out of the
name, and such a kernel is classed by the heaviest op it holds (a matmul over a reduction over an
elementwise op). Names come from: cuBLAS/cuBLASLt (``sm90_xmma_gemm_*``, ``nvjet_*``, ``cutlass*``,
``gemv*``), FlashAttention / FlashInfer / cuDNN SDPA (``flash_fwd*``, ``fmha*``, ``cudnn*sdpa``),
PyTorch's ATen kernels (``at::native::*``), NCCL/RCCL (``ncclDevKernel*``), autoopt's Triton kernels
(``autoopt/backend/kernels/``), AMD hipBLASLt/rocBLAS (``Cijk_*``), Composable Kernel (``ck_*``) and
MIOpen (``MIOpen*``, ``naive_conv*``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

__all__ = ["CLASSES", "KNOWN_FUSED", "RULES", "classify", "inductor_ops"]

CLASSES = ("gemm", "moe_gemm", "attention", "norm", "activation", "elementwise", "reduction", "embedding",
           "rotary", "quantize", "memcpy", "memset", "communication", "other")

#: (class, pattern) tried in order on the kernel name, case-insensitive
RULES: tuple[tuple[str, str], ...] = (
    ("communication", r"^nccl|rccl|allreduce|all_gather|reduce_scatter|cross_device_reduce|custom_ar"),
    ("memcpy", r"^memcpy|^\[memcpy|cudamemcpy|copy_kernel.*dtoh|htod|dtod"),
    ("memset", r"^memset|^\[memset"),
    ("attention", r"flash|fmha|sdpa|attention|attn_fwd|paged_attention|mha_|flashinfer|_fwd_kernel_stage|"
                  r"cudnn.*(sdpa|attn)|unified_attention"),
    ("moe_gemm", r"fused_moe|moe_|grouped_gemm|group_gemm|marlin_moe|expert"),
    # a matmul over a quantized weight is a GEMM (autoopt's _quant_gemv_kernel / _quant_gemm_kernel), before
    # the quantize rule below would take it for the activations' quantizer
    ("gemm", r"quant_gem[mv]"),
    ("quantize", r"quant|dequant|scaled_fp8|fp8_quant|per_token_group|cvt_fp8|mxfp4|nvfp4"),
    ("gemm", r"gemm|gemv|xmma|nvjet|cutlass|cublas|sm\d+_.*_tn|wgmma|^cijk_|hipblaslt|rocblas|"
             r"_mm_kernel|matmul|marlin|splitk|^ck_.*(gemm|gemv)|autoopt.*(gemm|gemv)"),
    ("norm", r"rms_?norm|layer_?norm|group_?norm|batch_?norm|_norm_|norm_kernel|miopen.*norm"),
    ("rotary", r"rotary|rope"),
    ("embedding", r"embedding|index_select|gather_kernel|indexing_backward|index_elementwise"),
    ("activation", r"silu|gelu|swiglu|geglu|relu|sigmoid|tanh|act_and_mul|silu_mul|softplus"),
    ("reduction", r"softmax|reduce_kernel|reduction|argmax|topk|sort|cumsum|scan|amax|logsumexp|"
                  r"sampling|radix"),
    ("elementwise", r"elementwise|vectorized|unrolled_elementwise|add_kernel|mul_kernel|fill|copy|"
                    r"_to_copy|cat_|where|clamp|arange|neg|pow|exp"),
)

#: Inductor's fused op names -> class, heaviest first (a fused kernel is classed by the first that occurs)
_INDUCTOR_WEIGHT = (
    ("gemm", ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution")),
    ("attention", ("_scaled_dot_product", "sdpa", "flash")),
    ("norm", ("rsqrt", "native_layer_norm", "native_group_norm", "var_mean")),
    ("reduction", ("_softmax", "softmax", "amax", "logsumexp", "argmax", "sum", "mean", "max", "min", "sort",
                   "topk", "cumsum")),
    ("embedding", ("embedding", "index_select")),
    ("rotary", ("cos", "sin")),
    ("activation", ("silu", "gelu", "sigmoid", "tanh", "relu", "erf", "softplus")),
)
_INDUCTOR = re.compile(r"^triton_(?:poi|per|red|tem|for)_fused_(?P<ops>.*?)(?:_\d+)?$")
#: Inductor name tokens that are ops (the rest are argument fragments such as ``to``, ``copy``)
_OP_WORDS = {w for _, words in _INDUCTOR_WEIGHT for w in words} | {
    "add", "sub", "mul", "div", "pow", "exp", "log", "neg", "where", "clamp", "cat", "_to_copy", "copy", "view",
    "clone", "expand", "slice", "select", "index", "full", "arange", "transpose", "permute", "unsqueeze",
    "squeeze", "bitwise_and", "eq", "ne", "lt", "gt", "le", "ge", "logical_not", "abs", "sqrt", "rsqrt"}


#: hand-written fused kernels of the serving libraries (vLLM, SGLang, FlashInfer, Liger, autoopt) and the
#: op classes they fuse, as (pattern, ops); Inductor's names are read instead (see _INDUCTOR)
KNOWN_FUSED: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"fused_add_rms_?norm", ("add", "rsqrt")),
    (r"rms_?norm.*(quant|fp8)", ("rsqrt", "quant")),
    (r"(silu|gelu)_and_mul|act_and_mul|silu_mul|gelu_tanh_mul|swiglu|geglu", ("silu", "mul")),
    (r"rotary.*(cache|kv)|reshape_and_cache", ("cos", "index")),
    (r"fused_moe", ("mm", "silu", "mul")),
)


@lru_cache(maxsize=65536)
def inductor_ops(name: str) -> tuple[str, ...]:
    """The ops a fused kernel holds: read from an Inductor-generated kernel's name, or from the table of
    known hand-written fused kernels (:data:`KNOWN_FUSED`); empty for any other kernel."""
    m = _INDUCTOR.match(name)
    if m is None:
        short = _short(name)
        return next((ops for pattern, ops in KNOWN_FUSED if re.search(pattern, short, re.IGNORECASE)), ())
    text = "_" + m.group("ops") + "_"
    found = []
    for word in sorted(_OP_WORDS, key=len, reverse=True):
        token = f"_{word}_"
        while token in text:
            found.append(word)
            text = text.replace(token, "_", 1)
    order = {w: m.group("ops").find(w) for w in found}
    return tuple(sorted(found, key=lambda w: order[w]))


#: classes an Inductor kernel of each kind can be: a pointwise (``poi``) kernel neither reduces nor
#: multiplies matrices, and a reduction (``red``/``per``) one does no MMA, so only templates (``tem``)
#: are GEMM or attention. Real Llama-3-8B compile traces (H100, H200) hold pointwise kernels named
#: ``triton_poi_fused__scaled_dot_product_cudnn_attention_..._bmm_cat_cos_...``: RoPE computed for
#: cuDNN attention's inputs, with the tiny inv_freq matmul folded in, not attention and not a GEMM.
_INDUCTOR_KIND_CLASSES = {
    "poi": frozenset({"norm", "embedding", "rotary", "activation"}),
    "red": frozenset({"norm", "reduction", "embedding", "rotary", "activation"}),
    "per": frozenset({"norm", "reduction", "embedding", "rotary", "activation"}),
}


def _inductor_class(ops: tuple[str, ...], kind: str = "tem") -> str:
    allowed = _INDUCTOR_KIND_CLASSES.get(kind)
    for cls, words in _INDUCTOR_WEIGHT:
        if (allowed is None or cls in allowed) and any(op in words for op in ops):
            return cls
    return "elementwise"


@lru_cache(maxsize=8)
def _compiled(rules: tuple[tuple[str, str], ...]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((cls, re.compile(pattern, re.IGNORECASE)) for cls, pattern in rules)


def classify(name: str, category: str = "kernel", rules: Iterable[tuple[str, str]] | None = None) -> str:
    """The op class of one GPU activity (see :data:`CLASSES`)."""
    if category == "gpu_memcpy":
        return "memcpy"
    if category == "gpu_memset":
        return "memset"
    if _INDUCTOR.match(name):
        return _inductor_class(inductor_ops(name), name.split("_", 2)[1])
    short = _short(name)
    compiled = _compiled(tuple(rules) if rules is not None else RULES)
    if "at::native::" in short and ("elementwise_kernel" in short or "reduce_kernel" in short):
        # ATen's generic kernels name their op in the template arguments (the functor): silu_kernel,
        # CUDAFunctor_add, MeanOps; a specific class found there wins over "elementwise"/"reduction"
        for cls, pattern in compiled:
            if cls in _FUNCTOR_CLASSES and pattern.search(name):
                return cls
    for cls, pattern in compiled:
        if pattern.search(short):
            return cls
    return "other"


_FUNCTOR_CLASSES = frozenset({"activation", "norm", "rotary", "embedding", "quantize"})


def _short(name: str) -> str:
    """A demangled-enough name: C++ template arguments and parameter lists dropped (``void
    at::native::vectorized_elementwise_kernel<4, ...>(...)`` -> ``at::native::vectorized_elementwise_kernel``)."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip()
    return text.removeprefix("void ").strip() or name


def rules_with_plugins(extra: Iterable[Mapping[str, Any]] = ()) -> tuple[tuple[str, str], ...]:
    """Plugin rules (``{"class": ..., "pattern": ...}``, checked) first, then the built-ins."""
    added = []
    for rule in extra:
        cls, pattern = rule.get("class"), rule.get("pattern")
        if cls not in CLASSES or not isinstance(pattern, str):
            raise ValueError(f"a trace rule is {{'class': one of {', '.join(CLASSES)}, 'pattern': regex}}, "
                             f"got {dict(rule)!r}")
        re.compile(pattern)
        added.append((cls, pattern))
    return (*added, *RULES)
