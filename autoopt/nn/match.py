"""What :func:`autoopt.nn.recognize.recognize` answers about one module: one match of a closed set.

A match holds what its builder (:mod:`autoopt.nn.build`) needs to make the replacement and what the
report says of it: child names, dims, eps, the activation, no modules or tensors. :class:`NoMatch` says
why not, as the report row shows it. The set is closed: :data:`Match` is the union, :data:`Replacing`
the matches a builder serves.

Equal matches compute the same function of the same shapes: the fields that only *name* things (a
plain MLP's child names, the attention's description) are left out of ``==`` and the hash, so
:func:`autoopt.optimize` checks one replacement per distinct match (with its dtype and device).

Quantized weights (``optimize(weights="fp8"|"int8"|"int4"|...)``): a linear whose weight runs packed is a
:class:`QuantLinearMatch` (an ``nn.Linear`` quantized in place, or a checkpoint's own block-FP8 linear run
on its tensors as they are); the fused kinds carry the format in ``weight`` (the fused gate_up / qkv
weight is quantized as one), None for 16-bit. Quantized matches are not equal-means-same: their weights,
hence their errors, differ, so :func:`autoopt.optimize` checks each one. :meth:`QuantLinearMatch.sixteen_bit`
and the fused kinds' ``sixteen_bit()`` give the 16-bit match the walk falls back to where a quantized
replacement's error is over its format's bound.

A MoE block (:class:`MoEMatch`) is matched as a block, like an attention's q/k/v: its experts are replaced
under it and checked through the block's own forward, whose router (and shared expert) stay the model's.

Adding a kind: a frozen, slotted, keyword-only dataclass here with ``kind`` (its op name, added to
:data:`OPS`), ``shape``, ``in_features``, ``fused`` and ``inner``, joined to :data:`Replacing`; its branch
in ``recognize()``; its builder in :data:`autoopt.nn.build.BUILDERS`; its check sample in
``optimize._SAMPLES``.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field, replace
from typing import ClassVar, TypeAlias

__all__ = ["ONE_BY_ONE", "OPS", "QKV", "Context", "DenseMatch", "GatedMLPMatch", "Inner", "Match", "MoEMatch",
           "NoMatch", "NormMatch", "PlainMLPMatch", "QKVMatch", "QuantLinearMatch", "Replacing"]

#: what ``ops=`` can name: the kinds of module optimize() replaces (quantized linears are ``linear``s),
#: ``attention``: a transformers model's SDPA at decode on autoopt's kernel (:mod:`autoopt.nn.attention`), and
#: ``decode_layer``: a quantized decoder layer's one-token step as five fused kernels (:mod:`autoopt.nn.decode_layer`).
OPS = ("linear", "rms_norm", "layer_norm", "gated_mlp", "plain_mlp", "qkv", "moe", "attention", "decode_layer")
#: what optimize() replaces when ``ops=`` is not given: all but ``moe``. On an H100 the fused-MoE path decodes
#: faster than transformers' own grouped_mm experts under torch.compile but prefills slower (Qwen3-30B-A3B, 8
#: layers: decode step 1.026 vs 1.260 ms, prefill 1 x 2048 13.6 vs 10.0 ms; Mixtral-8x7B, 4 layers: 1.408 vs
#: 1.691 ms and 15.6 vs 14.2 ms; benchmarks/results/h100/moe_e2e_prefill_trace_tritonop.json, after the
#: triton_op; moe_e2e.json before it), so it is asked for by name until its prefill measures faster too.
#: ``decode_layer`` is asked for by name too: its kernels alone, an H200 chain of them, ran 1.13x the separate ones
#: (benchmarks/results/h200/fused_chain_int4*.json), but the compiled int4 Llama-3-8B step ran 2.859 ms with it
#: against 2.691 without (h200/quant_trace_decode_layer_sk1.json).
DEFAULT_OPS = tuple(op for op in OPS if op not in ("moe", "decode_layer"))
MOE_OFF = ("moe is not in the default ops: on an H100 the fused-MoE path decodes faster than transformers' "
           "grouped_mm experts but prefills slower (benchmarks/results/h100/moe_e2e.json); ops=[..., 'moe'] runs it")
#: the child names of the projections one fused GEMM can serve, in the order attention code calls them.
QKV = ("q_proj", "k_proj", "v_proj")
#: the tail of the reason when a fused replacement of this kind is not made: the walk visits its parts.
ONE_BY_ONE = {"gated_mlp": "; its linears are tried one by one", "plain_mlp": "; its linears are tried one by one",
              "qkv": "; q/k/v are tried one by one"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What :func:`~autoopt.nn.recognize.recognize` knows besides the module: its dotted ``path``, optimize()'s
    ``ops`` and ``skip`` patterns, and ``replaced``: ids of the modules the walk has replaced already (a q/k/v
    projection one of them shares is not fused again). ``replaced`` is only read."""

    path: str = ""
    ops: tuple[str, ...] = OPS
    skip: tuple[str, ...] = ()
    replaced: Container[int] = frozenset()
    #: the weight format linears are quantized into (a parse_weight spec), None: 16-bit weights
    weights: str | None = None
    #: ids of linears kept 16-bit under ``weights`` (the LM head, weights shared with another tensor)
    keep_16bit: Container[int] = frozenset()
    #: whether the GPU has FP8 tensor cores: a checkpoint's FP8 linears run W8A8 there, weight-only elsewhere
    w8a8: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class NoMatch:
    """Why a module is not replaced, as its report row says it.

    ``kind``: what it looked like (``linear``, ``norm``, ``gated_mlp``, ``attention``, ``other``,
    ``module``); ``reason`` empty for a container with nothing to report; ``status`` ``kept`` or
    ``skipped`` (``skip=``, already optimised); ``descend``: the walk goes on into its children (a kept
    MLP's linears, an attention's projections); ``qkv``: for an attention, why its q/k/v were not
    fused (the ``<path>.qkv`` row), None when there is nothing to say."""

    kind: str
    reason: str
    shape: str = ""
    status: str = "kept"
    descend: bool = False
    qkv: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class _LinearShape:
    """What every linear's match holds: its features and whether it has a bias (one GEMM, nothing inside it)."""

    kind: ClassVar[str] = "linear"
    fused: ClassVar[tuple[str, ...]] = ()
    inner: ClassVar[tuple[tuple[str, DenseMatch | NoMatch], ...]] = ()
    in_features: int
    out_features: int
    has_bias: bool

    @property
    def shape(self) -> str:
        return f"{self.in_features}->{self.out_features}"


@dataclass(frozen=True, slots=True, kw_only=True)
class DenseMatch(_LinearShape):
    """An ``nn.Linear``, or a Linear subclass holding only weight and bias whose forward computes
    ``x @ W^T + b`` (Falcon's ``FalconLinear``): an ``AutooptLinear``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantLinearMatch(_LinearShape):
    """A linear whose weight runs packed in the format ``weight`` (a :func:`~autoopt.kernels.quant.parse_weight`
    spec, ``group_size`` its K-group): ``source`` ``quantize`` for an ``nn.Linear`` quantized in place from its
    16-bit weight, ``checkpoint`` for a checkpoint's block-FP8 linear (transformers' ``FP8Linear``: e4m3
    ``weight`` and ``weight_scale_inv`` per 128 x 128 block), whose own tensors the kernels read."""

    weight: str
    group_size: int | None = None
    source: str = "quantize"

    def sixteen_bit(self) -> DenseMatch | None:
        """The same linear at its 16-bit weight (None for a checkpoint's FP8 linear: it has none)."""
        if self.source != "quantize":
            return None
        return DenseMatch(in_features=self.in_features, out_features=self.out_features, has_bias=self.has_bias)


#: a linear a fused replacement runs one by one inside it (a gated MLP's down_proj, a plain MLP's fc2), by
#: child name: replaced where its match is a DenseMatch or QuantLinearMatch and its own check passes.
Inner: TypeAlias = tuple[tuple[str, DenseMatch | QuantLinearMatch | NoMatch], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NormMatch:
    """A norm over the last dimension: ``kind`` ``rms_norm`` (``unit_offset``: scaled by ``1 + weight``, Gemma)
    or ``layer_norm`` (``has_bias`` or not); ``eps`` None means ``torch.finfo(dtype).eps``."""

    fused: ClassVar[tuple[str, ...]] = ()
    inner: ClassVar[Inner] = ()
    kind: str
    features: int
    eps: float | None
    unit_offset: bool
    has_bias: bool

    @property
    def in_features(self) -> int:
        return self.features

    @property
    def shape(self) -> str:
        return f"{self.features}{' (1 + weight)' if self.unit_offset else ''}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatedMLPMatch:
    """``down(act(gate(x)) * up(x))``, ``activation`` ``silu`` or ``gelu_tanh``: gate/up as one GEMM
    (through autoopt's linear op when ``linear_op``, else torch's; over the fused weight quantized in the
    format ``weight`` when set), ``down`` replaced inside it or not."""

    kind: ClassVar[str] = "gated_mlp"
    fused: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj")
    activation: str
    hidden: int
    intermediate: int
    has_bias: bool
    linear_op: bool
    down: DenseMatch | QuantLinearMatch | NoMatch
    weight: str | None = None

    @property
    def in_features(self) -> int:
        return self.hidden

    @property
    def shape(self) -> str:
        return f"{self.hidden}->2x{self.intermediate}->{self.hidden}"

    def sixteen_bit(self) -> GatedMLPMatch:
        """gate_up at its 16-bit weight (down keeps its own match: it is checked on its own)."""
        return replace(self, weight=None)

    @property
    def inner(self) -> Inner:
        return (("down_proj", self.down),)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlainMLPMatch:
    """``fc2(act(fc1(x)))`` with ``activation`` exact GELU, tanh-GELU or ReLU, fc1 and fc2 under their own
    child names (``c_fc``/``c_proj``, ``dense_h_to_4h``/``dense_4h_to_h``, ``fc1``/``fc2``): fc1's bias and
    the activation in its GEMM's epilogue, ``fc2`` replaced inside it or not."""

    kind: ClassVar[str] = "plain_mlp"
    activation: str
    fc1_name: str = field(compare=False)
    fc2_name: str = field(compare=False)
    hidden: int
    intermediate: int
    out_features: int
    fc1_bias: bool
    fc2_bias: bool
    fc2: DenseMatch | NoMatch

    @property
    def in_features(self) -> int:
        return self.hidden

    @property
    def shape(self) -> str:
        return f"{self.hidden}->{self.intermediate}->{self.out_features}"

    @property
    def fused(self) -> tuple[str, ...]:
        return (self.fc1_name,)

    @property
    def inner(self) -> Inner:
        return ((self.fc2_name, self.fc2),)


@dataclass(frozen=True, slots=True, kw_only=True)
class QKVMatch:
    """An attention whose ``q_proj``/``k_proj``/``v_proj`` one GEMM serves; the attention itself stays the
    model's own (``attention``: what its report row says)."""

    kind: ClassVar[str] = "qkv"
    fused: ClassVar[tuple[str, ...]] = QKV
    inner: ClassVar[Inner] = ()
    attention: str = field(compare=False)
    in_features: int
    out_features: tuple[int, int, int]
    has_bias: bool
    #: the format the fused [Wq; Wk; Wv] is quantized into (None: 16-bit)
    weight: str | None = None

    @property
    def shape(self) -> str:
        q, k, v = self.out_features
        return f"{self.in_features}->{q}+{k}+{v}"

    def sixteen_bit(self) -> QKVMatch:
        return replace(self, weight=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoEMatch:
    """A MoE block whose ``experts`` (``E`` experts, each ``down(silu(gate(x)) * up(x))`` of ``hidden`` ->
    ``intermediate`` -> ``hidden``, no biases) run in one fused-MoE call on what its router answers (its
    ``top_k`` experts per token and their weights). The block's forward stays the model's own, and with it the
    router (its softmax, top-k and renormalisation as the config says) and whatever else the block adds
    (``others``: its other children with weights, a shared expert and its gate); only its ``experts_name``
    child is replaced. ``transposed``: the experts hold ``[E, hidden, 2 * intermediate]`` / ``[E, intermediate,
    hidden]`` (Aria), copied once into the kernel's ``[E, 2N, K]`` / ``[E, K, N]``; else their own tensors run."""

    kind: ClassVar[str] = "moe"
    fused: ClassVar[tuple[str, ...]] = ()
    inner: ClassVar[Inner] = ()
    experts_name: str = field(compare=False)
    router_name: str = field(compare=False)
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    activation: str
    transposed: bool
    others: tuple[str, ...] = ()
    #: the format each expert is quantized into (None: the experts' own 16-bit tensors run)
    weight: str | None = None

    @property
    def in_features(self) -> int:
        return self.hidden

    @property
    def shape(self) -> str:
        return f"{self.experts}x({self.hidden}->2x{self.intermediate}->{self.hidden}) top-{self.top_k}"

    def sixteen_bit(self) -> MoEMatch:
        return replace(self, weight=None)


#: the matches a builder serves (:data:`autoopt.nn.build.BUILDERS`).
Replacing: TypeAlias = DenseMatch | NormMatch | GatedMLPMatch | PlainMLPMatch | QKVMatch | QuantLinearMatch | MoEMatch
#: everything recognize() can answer.
Match: TypeAlias = Replacing | NoMatch
