"""transformers' compiled decode step, replayed from autoopt's own CUDA graph: one per input signature.

Why: ``generate()`` with a static cache on a GPU compiles the model's ``__call__``
(``torch.compile(mode="reduce-overhead")``) and calls it once a token, then waits for the GPU every token (its
stopping check reads a device flag). So the host time of that call, spent before its CUDA graph starts, adds to
every token. On the H100 (``benchmarks/results/h100/generate_host.json``; transformers 5.17, torch 2.11) the call
costs 1.15 ms of host time for transformers' own bf16 Llama-3-8B, 1.82 ms once optimize() has put in int4
linears and 2.60 ms with fp8: Dynamo's guard check over the parameters and module attributes (0.57-1.15 ms a
call), the compiled wrapper and the CUDA-graph tree's bookkeeping. The int4 step's kernels take 3.4 ms.

:func:`install` (``optimize()`` calls it for a transformers model on a GPU) hands ``generate()`` a
:class:`DecodeGraphs` in place of that compiled call. A call's *signature* is each tensor argument's shape,
stride, dtype and device, the other arguments' values, the grad and inference modes, and the static cache's
identity and buffer addresses. For a signature seen before, the call copies its tensor arguments into the
captured graph's static inputs and replays the graph: tens of microseconds of Python. A new signature is
captured: the forward compiled by Inductor (static shapes, no CUDA graphs of its own), run twice on a side
stream with the cache's step counters put back afterwards (each forward advances them in place), then captured.

:func:`install` also hands ``generate()`` the 2D padding mask, zero-padded to the static cache's length, where
transformers would build the 4D attention mask on the host every token (``create_masks_for_generate``, a model's
own version kept): the forward then builds it inside the captured step. On an H100 (int4 Llama-3-8B, batch 1, same
run: ``benchmarks/results/h100/generate_host_masks.json``) the time between compiled calls (the rest of the loop,
its wait for the GPU included) went from 4.06 to 3.74 ms and the median step from 4.48 to 4.22 ms.

What it cannot capture goes to transformers' own compiled call, as before, with the reason logged once: a cache
other than transformers' full-attention static layers (a sliding-window layer keeps a Python counter a replay would
not advance), an argument of another type, positional arguments, per-step attentions or hidden states asked for
(``generate()`` keeps them without a copy), a capture that fails, or more than :data:`MAX_GRAPHS` signatures. The
outputs of a replay are the graph's own tensors, overwritten by the next replay, as with ``reduce-overhead``'s
graphs (``generate()`` copies the logits it keeps). A graph holds the weights as they were captured:
:func:`uninstall` (``restore()`` calls it) drops the graphs.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from autoopt._log import get_logger

log = get_logger(__name__)

#: Signatures captured per model before the rest go to transformers' compiled call: one per batch size (and per
#: cache) a server decodes at; each graph keeps its own activation pool.
MAX_GRAPHS = 8

_ATTR = "_autoopt_decode_graphs"
_SCALARS = (bool, int, float, str, type(None))
#: per-step outputs ``generate()`` keeps without copying them (``output_attentions=True`` ...)
_KEPT_OUTPUTS = ("output_attentions", "output_hidden_states", "output_router_logits")


class Uncapturable(Exception):
    """A call :class:`DecodeGraphs` leaves to the compiled fallback (internal: never escapes a call)."""


def _static_layers(cache: Any) -> list[Any]:
    """The cache's layers when every one is transformers' full-attention ``StaticLayer``, initialised."""
    layers = getattr(cache, "layers", None)
    if not layers:
        raise Uncapturable(f"a {type(cache).__name__} without layers")
    for layer in layers:
        if type(layer).__name__ != "StaticLayer":
            raise Uncapturable(f"a cache layer of type {type(layer).__name__} (only full-attention StaticLayer)")
        if not getattr(layer, "is_initialized", False):
            raise Uncapturable("a static cache not yet filled by a prefill")
    return list(layers)


def _counters(layers: list[Any]) -> list[Any]:
    """The per-layer step counters a forward advances in place (``cumulative_length``)."""
    return [c for layer in layers if (c := getattr(layer, "cumulative_length", None)) is not None]


def _cache_key(cache: Any) -> tuple[Any, ...]:
    """The static cache's part of a call's signature: its identity and every buffer a replay writes. Derived once
    per cache and kept while each layer and each of its buffers is the same object (transformers reassigns them on
    a beam reorder, an offload or a first fill): a decode step's check is identity, not a walk of 32 layers'
    buffer addresses (3.7 against 16.4 us of host time a token for 32 layers, this repository's 2-core CPU; with
    :func:`_seen` the whole call of a replay that does nothing took 18.0-18.2 us against 30.4-30.9 there; the
    signature took 65 us inside generate() on an H200 host, ``h200/replay_host.json``)."""
    memo = _KEYS.get(cache)
    if memo is not None and _unchanged(cache, memo[0]):
        return memo[1]
    layers = _static_layers(cache)
    ptrs = tuple(t.data_ptr() for layer in layers for t in (layer.keys, layer.values))
    key = (type(cache).__name__, id(cache), ptrs, tuple(c.data_ptr() for c in _counters(layers)))
    _KEYS[cache] = (_snapshot(layers), key)
    return key


#: per live cache: (a weak snapshot of its layers' objects, the key derived from them)
_KEYS: weakref.WeakKeyDictionary[Any, tuple[list[tuple[Any, ...]], tuple[Any, ...]]] = weakref.WeakKeyDictionary()


def _seen(cache: Any) -> bool:
    """Whether ``cache`` has a kept key: it was a compileable cache then, and :func:`_cache_key` re-checks that its
    layers are the same objects (``is_compileable`` is a property walking every layer: 33 steps a call here)."""
    try:
        return cache in _KEYS
    except TypeError:  # neither weakly referenceable nor hashable: not a cache this module kept
        return False


def _snapshot(layers: list[Any]) -> list[tuple[Any, ...]]:
    """Each layer with weak references to its buffers and counter (weak: a reassigned buffer is not kept alive)."""
    return [(layer, weakref.ref(layer.keys), weakref.ref(layer.values),
             weakref.ref(c) if (c := getattr(layer, "cumulative_length", None)) is not None else None)
            for layer in layers]


def _unchanged(cache: Any, snapshot: list[tuple[Any, ...]]) -> bool:
    layers = getattr(cache, "layers", None)
    if layers is None or len(layers) != len(snapshot):
        return False
    for layer, (was, keys, values, counter) in zip(layers, snapshot, strict=True):
        if (layer is not was or not layer.is_initialized or layer.keys is not keys() or layer.values is not values()
                or getattr(layer, "cumulative_length", None) is not (counter() if counter is not None else None)):
            return False
    return True


class _Signature:
    """A call's key, its tensor arguments in order, and the static caches it passes."""

    __slots__ = ("caches", "key", "tensors")

    def __init__(self, kwargs: dict[str, Any], modes: tuple[bool, bool]) -> None:
        self.key: list[Any] = [modes]
        self.tensors: list[Any] = []
        self.caches: list[Any] = []
        for name in sorted(kwargs):
            self._add(name, kwargs[name])

    def _add(self, path: str, value: Any) -> None:
        import torch

        if isinstance(value, torch.Tensor):
            self.key.append((path, tuple(value.shape), value.stride(), value.dtype, value.device))
            self.tensors.append(value)
        elif isinstance(value, _SCALARS):
            self.key.append((path, value))
        elif isinstance(value, dict):
            self.key.append((path, "dict", len(value)))
            for k in sorted(value):
                self._add(f"{path}.{k}", value[k])
        elif isinstance(value, (tuple, list)):
            self.key.append((path, type(value).__name__, len(value)))
            for i, v in enumerate(value):
                self._add(f"{path}[{i}]", v)
        elif hasattr(value, "layers") and (_seen(value) or getattr(value, "is_compileable", False)):
            self.key.append((path, _cache_key(value)))
            self.caches.append(value)
        else:
            raise Uncapturable(f"argument {path!r} of type {type(value).__name__}")


def _rebuild(value: Any, tensors: Iterator[Any]) -> Any:
    """``value`` with its tensors taken from ``tensors`` in :class:`_Signature`'s order (dict keys sorted)."""
    import torch

    if isinstance(value, torch.Tensor):
        return next(tensors)
    if isinstance(value, dict):
        return {k: _rebuild(value[k], tensors) for k in sorted(value)}
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, tensors) for v in value)
    return value


class _Entry:
    """One captured signature: its static inputs, the replay, the output object it fills, the caches it writes."""

    __slots__ = ("caches", "output", "replay", "statics")

    def __init__(self, statics: list[Any], replay: Callable[[], None], output: Any,
                 caches: list[weakref.ref[Any]]) -> None:
        self.statics, self.replay, self.output, self.caches = statics, replay, output, caches

    def alive(self, caches: list[Any]) -> bool:
        return all(ref() is c for ref, c in zip(self.caches, caches, strict=True))


Capture = Callable[[Callable[[], Any]], tuple[Callable[[], None], Any]]


def cuda_capture(run: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
    """``run`` captured in a CUDA graph with its own memory pool: (replay, the output the graph fills)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = run()
    return graph.replay, output


class DecodeGraphs:
    """transformers' compiled decode call, replayed from one captured graph per signature (module docstring).

    ``fallback()`` returns transformers' own compiled call, built on first need; ``compile`` turns the model's
    ``__call__`` into the function captured (Inductor without CUDA graphs); ``capture`` captures a run
    (:func:`cuda_capture`; a test passes a stand-in that re-runs it)."""

    def __init__(self, model: Any, fallback: Callable[[], Callable[..., Any]], *,
                 compile: Callable[[Callable[..., Any]], Callable[..., Any]],
                 capture: Capture = cuda_capture, max_graphs: int = MAX_GRAPHS) -> None:
        self._model = weakref.ref(model)
        self._fallback_factory = fallback
        self._fallback: Callable[..., Any] | None = None
        self._compile = compile
        self._step: Callable[..., Any] | None = None
        self._capture, self._max = capture, max_graphs
        self.graphs: dict[tuple[Any, ...], _Entry] = {}
        self.failed: dict[tuple[Any, ...], str] = {}  # signature -> why its capture failed (not tried again)
        self.refused: dict[str, int] = {}  # reason -> calls sent to the fallback for it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            if args:
                raise Uncapturable("positional arguments")
            kept = [k for k in _KEPT_OUTPUTS if kwargs.get(k)]
            if kept:  # generate() keeps these per step without a copy: a replay would overwrite them
                raise Uncapturable(f"{' and '.join(kept)}=True")
            return self._replay(kwargs)
        except Uncapturable as why:
            return self._refuse(str(why), args, kwargs)

    def _replay(self, kwargs: dict[str, Any]) -> Any:
        import torch

        sig = _Signature(kwargs, (torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        key = tuple(sig.key)
        entry = self.graphs.get(key)
        if entry is not None and not entry.alive(sig.caches):
            del self.graphs[key]
            entry = None
        if entry is None:
            if key in self.failed:
                raise Uncapturable(self.failed[key])
            entry = self._capture_new(kwargs, sig, key)
        _copy_into(entry.statics, sig.tensors)
        entry.replay()
        return entry.output

    def _capture_new(self, kwargs: dict[str, Any], sig: _Signature, key: tuple[Any, ...]) -> _Entry:
        if len(self.graphs) >= self._max:
            raise Uncapturable(f"more than {self._max} signatures (MAX_GRAPHS)")
        model = self._model()
        if model is None:
            raise Uncapturable("the model is gone")
        if self._step is None:
            self._step = self._compile(model.__call__)
        step = self._step
        refs = _weak(sig.caches)
        statics = [t.clone() for t in sig.tensors]
        static_kwargs = _rebuild(kwargs, iter(statics))
        try:
            with _counters_kept(sig.caches):
                _warm_up(lambda: step(**static_kwargs))
                replay, output = self._capture(lambda: step(**static_kwargs))
        except Exception as exc:  # a step that cannot be captured runs as transformers would run it
            why = f"capture failed: {type(exc).__name__}: {str(exc)[:200]}"
            self.failed[key] = why  # every later step of this signature would fail the same way
            raise Uncapturable(why) from exc
        entry = _Entry(statics, replay, output, refs)
        self.graphs[key] = entry
        log.info("autoopt decode graphs: captured signature %d of at most %d", len(self.graphs), self._max)
        return entry

    def _refuse(self, why: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if why not in self.refused:
            log.warning("autoopt decode graphs: transformers' compiled call runs this step (%s)", why)
        self.refused[why] = self.refused.get(why, 0) + 1
        if self._fallback is None:
            self._fallback = self._fallback_factory()
        return self._fallback(*args, **kwargs)


def _copy_into(statics: list[Any], given: list[Any]) -> None:
    """The call's tensors into the graph's static inputs (those not already them), in one ``_foreach_copy_``: one
    launch where a copy each took three (inside generate() on an H200 the call's copies and bookkeeping took 54 us
    of host time a token; ``benchmarks/results/h200/replay_host.json``)."""
    import torch

    pairs = [(s, g) for s, g in zip(statics, given, strict=True) if s.data_ptr() != g.data_ptr()]
    if pairs:
        torch._foreach_copy_([s for s, _ in pairs], [g for _, g in pairs])


def _weak(caches: list[Any]) -> list[weakref.ref[Any]]:
    """Weak references to the caches: a dead cache's ``id`` may come back on a new one, which must not replay
    a graph that writes the old one's buffers."""
    try:
        return [weakref.ref(c) for c in caches]
    except TypeError as exc:
        raise Uncapturable(f"a cache that takes no weak reference ({exc})") from exc


@contextlib.contextmanager
def _counters_kept(caches: list[Any]) -> Iterator[None]:
    """Put the caches' step counters back as they were on entry: the warm-up runs (and a capture that runs the
    step) advance them in place, and the real step, replayed next, must write where the caller's step would. The
    KV they wrote lies beyond the real step's position, which the mask hides and later steps overwrite."""
    counters = [c for cache in caches for c in _counters(_static_layers(cache))]
    saved = [c.clone() for c in counters]
    try:
        yield
    finally:
        for counter, value in zip(counters, saved, strict=True):
            counter.copy_(value)


def _warm_up(run: Callable[[], Any]) -> None:
    """Run the step twice, on a side stream on a GPU (as ``torch.cuda.graph`` asks): Inductor's and Triton's
    first-call work stays out of the capture."""
    import torch

    side = torch.cuda.Stream() if torch.cuda.is_available() else None
    if side is None:
        run()
        run()
        return
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
        run()
    torch.cuda.current_stream().wait_stream(side)


def _inductor_without_graphs(config: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """torch.compile as ``config`` asks, minus its CUDA graphs (the capture is autoopt's)."""
    import torch

    asked = getattr(config, "mode", None)
    mode = {"reduce-overhead": None, "default": None, "max-autotune": "max-autotune-no-cudagraphs"}.get(
        asked, asked) if isinstance(asked, str) else None
    options = getattr(config, "options", None)
    kwargs: dict[str, Any] = {"dynamic": False, "fullgraph": bool(getattr(config, "fullgraph", False))}
    if options:
        kwargs["options"] = options
    elif mode:
        kwargs["mode"] = mode
    return lambda fn: torch.compile(fn, **kwargs)


def install(model: Any, *, capture: Capture | None = None,
            compile: Callable[[Any], Callable[[Callable[..., Any]], Callable[..., Any]]] | None = None) -> bool:
    """Give ``model.generate()`` :class:`DecodeGraphs` for its compiled decode step; False (nothing changed)
    where the model has no ``get_compiled_call`` (not a transformers generation model). A compile config with
    a backend other than Inductor keeps transformers' own call. ``capture`` and ``compile`` are for tests."""
    original = getattr(type(model), "get_compiled_call", None)
    if original is None:
        return False
    uninstall(model)
    runners: dict[Any, DecodeGraphs] = {}

    def get_compiled_call(compile_config: Any = None) -> Callable[..., Any]:
        config = compile_config
        if config is None and hasattr(model, "_default_compile_config"):
            config = model._default_compile_config()
        if getattr(config, "backend", "inductor") != "inductor":
            return original(model, compile_config)
        key = repr(getattr(config, "to_dict", lambda: config)())
        if key not in runners:
            runners[key] = DecodeGraphs(model, lambda: original(model, compile_config),
                                        compile=(compile or _inductor_without_graphs)(config),
                                        capture=capture or cuda_capture)
        return runners[key]

    model.__dict__["get_compiled_call"] = get_compiled_call
    model.__dict__[_ATTR] = runners
    if not hasattr(type(model), "create_masks_for_generate"):  # a model with its own masks keeps them
        model.__dict__["create_masks_for_generate"] = _padding_mask_only
    return True


def _padding_mask_only(*args: Any, **kwargs: Any) -> Any:
    """What ``generate()`` passes the forward as its mask over a full-attention static cache: the 2D padding mask,
    zero-padded to the cache's length (a fixed shape, so one signature serves every step), from which the forward
    builds its 4D mask itself, inside the captured step. transformers' own ``create_masks_for_generate`` builds
    that 4D mask on the host every token (a dozen small ops: part of the loop's per-token host time). Anything
    else (positional arguments, no 2D mask, mask functions, another cache) goes to transformers' function, with
    the arguments as given (transformers 5.17 names the cache ``past_key_values``, later versions ``cache``)."""
    mask: Any = kwargs.get("attention_mask")
    length = None if args else _padded_length(mask, kwargs)
    if length is None:
        from transformers import masking_utils

        return masking_utils.create_masks_for_generate(*args, **kwargs)
    import torch.nn.functional as F

    return F.pad(mask, (0, length - mask.shape[1]))


def _padded_length(mask: Any, kwargs: dict[str, Any]) -> int | None:
    """The static cache's length when ``mask`` is a 2D padding mask that fits it and no mask function is asked
    for; None otherwise."""
    extra = ("or_mask_function", "and_mask_function", "block_sequence_ids")
    if mask is None or mask.ndim != 2 or any(kwargs.get(k) is not None for k in extra):
        return None
    try:
        layers = _static_layers(kwargs.get("past_key_values", kwargs.get("cache")))
    except Uncapturable:
        return None
    length = getattr(layers[0], "max_cache_len", None)
    return length if isinstance(length, int) and length >= mask.shape[1] else None


def installed(model: Any) -> list[DecodeGraphs]:
    """The runners :func:`install` made for ``model`` (one per compile config ``generate()`` asked for)."""
    return list(getattr(model, "__dict__", {}).get(_ATTR, {}).values())


def uninstall(model: Any) -> bool:
    """Give ``model`` back transformers' own compiled call and drop the captured graphs; True if any were set."""
    found = _ATTR in getattr(model, "__dict__", {})
    model.__dict__.pop(_ATTR, None)
    model.__dict__.pop("get_compiled_call", None)
    if model.__dict__.get("create_masks_for_generate") is _padding_mask_only:
        del model.__dict__["create_masks_for_generate"]
    return found
