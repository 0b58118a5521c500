"""End to end on a real transformers model: eager, torch.compile, autoopt.optimize, and both, in one process.

The model is built from its published config (the catalog's ``models.yaml``) with random weights,
so nothing is downloaded. For each variant this measures prefill latency and decode time per token
(static KV cache, greedy; per token from the difference of two generation lengths, so prefill and
set-up cancel), the memory peak, and the optimized model's last-position logits against eager's on
``prompts`` random prompts (max abs / relative error, top-1 agreement). ``recommend()``'s predicted
prefill and decode step for the same model, batch and context sit next to the measured numbers.

On a CPU (CI) the same code runs on a tiny config of the same family, labelled as such: the
numbers then say only that the path works.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from autoopt._log import get_logger

log = get_logger(__name__)

__all__ = ["CACHE_SLACK", "COMPILED_TOL", "NOISE_CAP", "NOISE_FACTOR", "PARTS", "VARIANTS", "CapturedStep",
           "build_model", "capture_decode_step", "checked_prefill_ms", "compiled_vs_eager", "decode_step_ms",
           "eager_decode_step", "eager_noise", "run", "ulp_nudged"]

VARIANTS = ("eager", "compile", "optimize", "optimize+compile")
#: what run() measures per variant: prefill latency, decode through ``model.generate``, the kernel
#: profile of a generation, decode with the whole step in one CUDA graph, logits against eager's.
PARTS = ("prefill", "generate", "profile", "graphed", "agreement")
#: static-cache slots beyond the prompt and the timed decode steps (the decode timers allocate
#: ``prompt + steps + CACHE_SLACK``; transformers' SDPA reads every slot, which the regret harness prices)
CACHE_SLACK = 8
#: a tiny config of the same family for the CPU path (shapes only; the code path is the real one)
_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}


def build_model(name: str, *, dtype: str = "bf16", device: str = "cuda", tiny: bool = False,
                layers: int | None = None) -> Any:
    """A transformers causal LM with the catalog model's published architecture and random weights
    (``layers``: that many decoder layers instead of the published count)."""
    import torch
    import transformers

    from autoopt.planning.catalog import _entries

    entries = _entries()
    if name not in entries:
        from autoopt.errors import ModelError

        raise ModelError(f"unknown model {name!r}; e2e builds one of {', '.join(sorted(entries))}", field="model")
    cfg = {k: v for k, v in entries[name]["config"].items() if k not in ("architectures", "torch_dtype")}
    if tiny:
        cfg.update(_TINY)
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    config = transformers.AutoConfig.for_model(**cfg)
    config.head_dim = config.hidden_size // config.num_attention_heads
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    return model.eval()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _median_ms(fn: Callable[[], Any], device: str, reps: int) -> float:
    fn()  # warm-up (and compile, for compiled variants)
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


#: the largest relative error (last-position logits, Frobenius norm) a compiled forward may show against the same
#: model's eager forward before a benchmark reports its time. A graph that lost a kernel's output runs, faster, and
#: lands near 1 (2026-11-29, H200: a triton_op whose TMA-descriptor arguments torch 2.11's tracer could not map
#: to tensors had its GEMM dropped, and with it every attention branch feeding it: a Qwen3-30B-A3B prefill "took"
#: 7.1 ms against 10.5); rounding in another fusion order stays well below (H200: int4 Llama-3-8B, 32 layers of
#: random weights, 0.066; Qwen3-30B-A3B with 8 layers, 0.008: ``benchmarks/results/h200/compiled_check_int4.json``,
#: ``moe_e2e_qwen_checked.json``).
COMPILED_TOL = 0.25
#: past COMPILED_TOL a compiled forward still passes within this many times the model's own noise: how far eager's
#: logits move when every input embedding moves by one last bit (:func:`eager_noise`). W8A8 fp8 quantizes every
#: activation to 3 mantissa bits per token, so a last-bit difference anywhere (another kernel's rounding) moves
#: codes, and 32 random layers amplify it: on the H200 (2026-11-29, ``h200/quant_e2e_check_fp8_failed.json``) fp8
#: Llama-3-8B's compiled prefill differed from eager by 0.384 where bf16's did by 0.073, and the nudge alone moved
#: eager's fp8 logits by 0.531 (``h200/quant_e2e_fp8_noise.json``)
NOISE_FACTOR = 2.0
#: no noise lets a forward past this: one that lost its output lands at 1 (zero logits), however noisy the model
NOISE_CAP = 0.75


def compiled_vs_eager(model: Any, forward: Callable[..., Any], vocab: int, batch: int, seq: int, device: str, *,
                      use_cache: bool = False) -> dict[str, Any]:
    """The compiled ``forward``'s last-position logits against ``model``'s eager forward on one seeded
    ``batch x seq`` prompt (``use_cache`` as in :func:`_prefill_ms`; the first call compiles): :func:`_agreement`'s
    numbers and ``ok``: no NaN, and ``rel_err <= COMPILED_TOL`` or, past it, within ``NOISE_FACTOR`` times the
    model's own noise (``eager_noise_rel_err``, measured only then) and at most ``NOISE_CAP``."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    with torch.inference_mode():
        ref = model.forward(input_ids=ids, use_cache=use_cache, logits_to_keep=1).logits[:, -1].float()
        got = forward(input_ids=ids, use_cache=use_cache, logits_to_keep=1).logits[:, -1].float()
    return _judged(_agreement(ref, got), "eager_noise_rel_err", lambda: eager_noise(model, ids, ref,
                                                                                      use_cache=use_cache))


def _judged(check: dict[str, Any], noise_key: str, noise: Callable[[], float]) -> dict[str, Any]:
    """``check`` (:func:`_agreement`'s numbers) with ``ok``: no NaN, and ``rel_err <= COMPILED_TOL`` or, past it,
    within ``NOISE_FACTOR`` times the model's own ``noise()`` (measured only then, recorded under ``noise_key``)
    and at most ``NOISE_CAP``."""
    within = check["rel_err"] <= COMPILED_TOL
    if not within and not check["nan"]:
        check[noise_key] = own = noise()
        within = check["rel_err"] <= min(NOISE_FACTOR * own, NOISE_CAP)
    check["ok"] = within and not check["nan"]
    return check


def eager_noise(model: Any, ids: Any, ref: Any, *, use_cache: bool = False) -> float:
    """Relative error of eager's last-position logits when each input embedding of ``ids`` moves by one last bit
    (up or down, seeded) against ``ref``, eager's logits for ``ids``: how much this model amplifies rounding."""
    import torch

    with torch.inference_mode():
        emb = model.get_input_embeddings()(ids)
        out = model.forward(inputs_embeds=ulp_nudged(emb), use_cache=use_cache, logits_to_keep=1)
    return float(_agreement(ref, out.logits[:, -1].float())["rel_err"])


def ulp_nudged(t: Any, seed: int = 0) -> Any:
    """``t`` (a 16- or 32-bit float tensor) with every nonzero element moved to a neighbouring representable value,
    up or down in magnitude at random (its bit pattern plus or minus one)."""
    import torch

    ints = {2: torch.int16, 4: torch.int32}[t.element_size()]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    step = (torch.randint(0, 2, t.shape, generator=gen) * 2 - 1).to(device=t.device, dtype=ints)
    bits = t.contiguous().view(ints)
    return torch.where(t != 0, (bits + step).view(t.dtype), t)


def decode_layer_vs_unfused(model: Any, *, prompt: int = 16, seed: int = 0) -> dict[str, Any]:
    """One decode step's logits with ``optimize(ops=[..., "decode_layer"])``'s fused layers against the same
    model's unfused step (its layers uninstalled for the reference, then installed again), eager, after a seeded
    ``prompt``-token prefill: :func:`_agreement`'s numbers and ``ok`` by :func:`compiled_vs_eager`'s rule, the
    noise here being how far the unfused step's logits move when the new token's embedding moves by one last bit.
    A timing of the fused layers is reported only where this passed."""
    import torch

    from autoopt.nn import decode_layer

    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt + 1), generator=gen).to(device)

    def step(nudge: bool = False) -> Any:
        with torch.inference_mode():
            cache = model(ids[:, :prompt], use_cache=True).past_key_values
            emb = model.get_input_embeddings()(ids[:, prompt:])
            out = model(inputs_embeds=ulp_nudged(emb) if nudge else emb, past_key_values=cache, use_cache=True)
            return out.logits[:, -1].float()

    decode_layer.uninstall(model)
    try:
        ref = step()
    finally:
        layers = decode_layer.install(model)
    got = step()

    def unfused_noise() -> float:
        decode_layer.uninstall(model)
        try:
            return float(_agreement(ref, step(nudge=True))["rel_err"])
        finally:
            decode_layer.install(model)

    check = _judged({"fused_layers": layers, **_agreement(ref, got)}, "unfused_noise_rel_err", unfused_noise)
    check["ok"] = check["ok"] and layers > 0
    return check


def checked_prefill_ms(model: Any, forward: Callable[..., Any], batch: int, seq: int, device: str, reps: int, *,
                       use_cache: bool = False) -> tuple[float, dict[str, Any]]:
    """(the compiled ``forward``'s median prefill ms, its :func:`compiled_vs_eager` check), timed only when the
    check passed; else ``ValueError`` saying by how much the logits differ (a benchmark records it, no time)."""
    check = compiled_vs_eager(model, forward, model.config.vocab_size, batch, seq, device, use_cache=use_cache)
    if not check["ok"]:
        noise = check.get("eager_noise_rel_err")
        allowed = f"{COMPILED_TOL}" if noise is None else (f"{COMPILED_TOL}, and past it > {NOISE_FACTOR} x the "
                                                           f"model's own noise {noise:.4g} or > {NOISE_CAP}")
        raise ValueError(f"the compiled prefill's logits differ from eager's by {check['rel_err']:.4g} (> "
                         f"{allowed}; NaN: {check['nan']}): not timed")
    return _prefill_ms(forward, model.config.vocab_size, batch, seq, device, reps, use_cache=use_cache), check


def _prefill_ms(forward: Callable[..., Any], vocab: int, batch: int, seq: int, device: str, reps: int,
                use_cache: bool = False) -> float:
    """Median latency of one forward over ``batch x seq`` tokens (last-position logits only): no cache, or with
    ``use_cache`` into a fresh DynamicCache each call (a plain ``model(ids)``, as a generation's first step)."""
    import torch

    ids = torch.randint(0, vocab, (batch, seq), device=device)

    def step() -> Any:
        with torch.inference_mode():
            return forward(input_ids=ids, use_cache=use_cache, logits_to_keep=1).logits
    return _median_ms(step, device, reps)


class _Generation:
    """Greedy ``model.generate`` into one pre-built static KV cache (``prompt + new_tokens`` long).

    One cache for every length keeps the shapes fixed, so a compiled decode step (transformers
    compiles it itself for a static cache: fullgraph, CUDA graphs) is built once per batch size, not
    once per generation length. ``compiled=False`` passes ``disable_compile`` so the eager variants
    stay eager (transformers would otherwise compile them too).
    """

    def __init__(self, model: Any, batch: int, prompt: int, new_tokens: int, device: str, compiled: bool) -> None:
        import torch
        from transformers import StaticCache

        self.model, self.compiled = model, compiled
        gen = torch.Generator(device="cpu").manual_seed(2)
        self.ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=gen).to(device)
        self.cache = StaticCache(config=model.config, max_cache_len=prompt + new_tokens)

    def __call__(self, n: int) -> Any:
        import torch

        with torch.inference_mode():  # the cache's tensors were made in inference mode
            if self.cache.is_initialized:
                self.cache.reset()
            return self.model.generate(self.ids, past_key_values=self.cache, max_new_tokens=n, min_new_tokens=n,
                                       do_sample=False, pad_token_id=0, disable_compile=not self.compiled)


def _decode(model: Any, batch: int, prompt: int, new_tokens: int, device: str, reps: int, compiled: bool
            ) -> tuple[float, Any]:
    """Decode time per token, ``(t(new_tokens) - t(short)) / (new_tokens - short)`` so prefill and
    set-up cancel, and the ``new_tokens`` generated (greedy) for the agreement check."""
    gen = _Generation(model, batch, prompt, new_tokens, device, compiled)
    short = max(2, new_tokens // 8)
    last: list[Any] = []
    long_ms = _median_ms(lambda: last.append(gen(new_tokens)), device, reps)
    short_ms = _median_ms(lambda: gen(short), device, reps)
    return (long_ms - short_ms) / (new_tokens - short), last[-1][:, prompt:].cpu()


class CapturedStep:
    """A decode step captured in a CUDA graph, and what its kernels read and write (the static cache, the token
    and position buffers), kept alive with it: freed, their memory could be handed out again while the graph
    still writes there."""

    __slots__ = ("_keep", "graph")

    def __init__(self, graph: Any, keep: tuple[Any, ...]) -> None:
        self.graph, self._keep = graph, keep

    def replay(self) -> None:
        """Decode the next token."""
        self.graph.replay()


def capture_decode_step(model: Any, batch: int, prompt: int, max_cache_len: int, *,
                        compiled: bool = False) -> CapturedStep:
    """One decode step (forward over a static cache filled with a random ``prompt``-token batch, then greedy
    argmax) captured in a CUDA graph and uploaded by a first replay; each ``replay()`` decodes the next token.
    ``compiled``: the forward is ``torch.compile``d first (fullgraph, static shapes, Inductor's default mode:
    its kernels, no CUDA graphs of its own) and that is captured."""
    import torch
    from transformers import StaticCache

    from autoopt.backend.runner import captured

    forward = torch.compile(model.forward, fullgraph=True, dynamic=False) if compiled else model.forward
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    with torch.inference_mode():
        tok = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits.argmax(-1)
        pos = torch.tensor([prompt], device="cuda")

        def step() -> None:
            logits = forward(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
            tok.copy_(logits[:, -1:].argmax(-1))
            pos.add_(1)
        graph = captured(step, warmups=3)
    return CapturedStep(graph, (cache, tok, pos, forward))


def _graphed_decode_ms(model: Any, batch: int, prompt: int, steps: int, compiled: bool = False) -> float:
    """GPU time per decode step with the whole step captured in one CUDA graph (:func:`capture_decode_step`)
    and replayed ``steps`` times, as a serving runtime runs decode: no Python between steps. ``compiled``:
    the compiled forward captured, so the compiled variants are measured in the same harness as the eager
    ones."""
    import torch

    captured = capture_decode_step(model, batch, prompt, prompt + steps + CACHE_SLACK, compiled=compiled)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps - 1):
        captured.replay()
    end.record()
    torch.cuda.synchronize()
    del captured
    return start.elapsed_time(end) / (steps - 1)


#: eager decode steps are timed in this many blocks, this many seconds apart, and the least block reported: a
#: lent host's Python runs 1.3-1.9x slower in phases of a second or more (12-40 % of 20-step blocks on an H100
#: host, h100/eager_host_noise_p{1,2}.json; unchanged with the garbage collector off or the process pinned, so
#: the slowing comes from outside it), and a median of five still landed in one: on one H200 host, 2026-11-29,
#: the blocks of one option ran 9.6-18.6 ms and the median moved with them (h200/regret_*_run7.json, _run4):
#: as timeit's documentation argues, the least time is the code's own and the rest interference
EAGER_BLOCKS, EAGER_BLOCK_PAUSE_S = 5, 0.5


def decode_step_ms(model: Any, batch: int, prompt: int, steps: int, *, graphed: bool,
                   blocks: int | None = None, blocks_ms: list[float] | None = None) -> float:
    """Time of one decode step (forward over a static cache + greedy argmax) at ``batch``: replayed from one
    CUDA graph (``graphed``, CUDA only), else the least over ``blocks`` (default :data:`EAGER_BLOCKS` on a GPU,
    one on a CPU, whose run checks the path, not the timing) of :func:`_eager_block`, each block's time also
    appended to ``blocks_ms`` when given (the host's phases show in their spread)."""
    if blocks is not None and (type(blocks) is not int or blocks < 1):
        from autoopt.errors import AutooptError

        raise AutooptError(f"decode_step_ms: blocks={blocks!r}; give a whole number of blocks, 1 or more")
    if graphed:
        return _graphed_decode_ms(model, batch, prompt, steps)
    device = str(next(model.parameters()).device)
    on_gpu = device.startswith("cuda")
    times = []
    for i in range(blocks or (EAGER_BLOCKS if on_gpu else 1)):
        if i and on_gpu:
            time.sleep(EAGER_BLOCK_PAUSE_S)
        times.append(_eager_block(model, batch, prompt, steps, device))
    if blocks_ms is not None:
        blocks_ms.extend(times)
    return min(times)


def _eager_block(model: Any, batch: int, prompt: int, steps: int, device: str) -> float:
    """Median of ``steps`` synchronised eager decode steps (:func:`eager_decode_step`), into a static cache of its
    own (``prompt + steps + CACHE_SLACK`` long: the keys transformers' attention walks)."""
    return _median_ms(eager_decode_step(model, batch, prompt, steps + CACHE_SLACK), device, steps)


def eager_decode_step(model: Any, batch: int, prompt: int, room: int) -> Callable[[], None]:
    """One uncompiled decode step of ``model`` at ``batch`` (forward of the last token over a static cache +
    greedy argmax, advancing the position), after a prefill of ``prompt`` random tokens into a new static cache
    with ``room`` positions after them (transformers keeps its own write position: one cache serves at most
    ``room`` steps)."""
    import torch
    from transformers import StaticCache

    device = next(model.parameters()).device
    cache = StaticCache(config=model.config, max_cache_len=prompt + room)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device=device)
    with torch.inference_mode():
        tok = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits.argmax(-1)
        pos = torch.tensor([prompt], device=device)

    @torch.inference_mode()
    def step() -> None:
        logits = model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        tok.copy_(logits[:, -1:].argmax(-1))
        pos.add_(1)
    return step


def _last_logits(model: Any, prompts: Any) -> Any:
    """Last-position logits of each prompt run alone (batch 1: M = its length, so short prompts take
    the GEMV path and long ones the GEMM path)."""
    import torch

    with torch.inference_mode():
        return torch.cat([model(p[None], use_cache=False, logits_to_keep=1).logits[:, -1].float() for p in prompts])


def _agreement(ref: Any, got: Any) -> dict[str, float]:
    import torch

    diff = (got - ref).abs()
    return {"max_abs_err": float(diff.max()), "rel_err": float(diff.norm() / ref.norm()),
            "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
            "nan": bool(torch.isnan(got).any())}


def _token_agreement(ref: Any, got: Any) -> float:
    """Mean fraction of greedy tokens equal to the reference's before the first difference (after a
    difference the two generations continue from different text, so later tokens say nothing)."""
    same = (ref == got).int().cumprod(dim=1)
    return round(float(same.sum()) / ref.numel(), 4)


def _prefill_forward(model: Any, compiled: bool) -> Callable[..., Any]:
    import torch

    if not compiled:
        return model.forward
    # static shapes: one graph per prefill shape, as a runtime that pads to buckets would run it
    return torch.compile(model.forward, dynamic=False)


def _kernel_classes(model: Any, batch: int, prompt: int, device: str, compiled: bool, steps: int = 16
                    ) -> dict[str, float]:
    """GPU kernel time per decode token, by kernel class, from torch.profiler traces: a generation of
    ``steps + 1`` tokens minus one of 1 token (prefill and set-up cancel), divided by ``steps``."""
    gen = _Generation(model, batch, prompt, steps + 1, device, compiled)
    gen(steps + 1)  # warm
    _sync(device)
    long, short = _profiled(lambda: gen(steps + 1), device), _profiled(lambda: gen(1), device)
    per = {k: (long.get(k, 0.0) - short.get(k, 0.0)) / steps for k in long}
    per["total"] = sum(per.values())
    return {k: round(v, 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}


def _profiled(fn: Callable[[], Any], device: str) -> dict[str, float]:
    """Microseconds of CUDA kernel time by kernel class while ``fn`` runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(device)
    totals: dict[str, float] = {}
    for evt in prof.key_averages():
        us = float(getattr(evt, "device_time_total", 0.0) or getattr(evt, "cuda_time_total", 0.0))
        if us <= 0 or getattr(evt, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        cls = _kernel_class(evt.key)
        totals[cls] = totals.get(cls, 0.0) + us
    return totals


#: kernel-name fragments -> class, first match wins (autoopt's kernels are named in backend/kernels/).
_CLASSES = (("autoopt gemv", ("gemv_kernel", "_gemv")), ("autoopt gemm", ("gemm_kernel", "gemm_tma", "_gemm")),
            ("autoopt norm", ("rms_norm", "rmsnorm", "layer_norm", "layernorm")),
            ("autoopt elementwise", ("silu_mul", "gelu_tanh_mul", "_add_kernel", "swiglu")),
            ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
            ("cuBLAS gemm/gemv", ("gemv", "gemm", "nvjet", "cutlass", "xmma", "sm90_")),
            ("inductor fused", ("triton_",)), ("copy/memset", ("memcpy", "memset", "copy")))


def _kernel_class(name: str) -> str:
    low = name.lower()
    for cls, keys in _CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


def _measure(model: Any, *, device: str, compiled: bool, prefill: Sequence[tuple[int, int]],
             decode_batches: Sequence[int], new_tokens: int, reps: int, parts: Sequence[str] = PARTS
             ) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    out: dict[str, Any] = {"prefill_ms": {}, "decode_ms_per_token": {}, "tokens": {}}
    forward = _prefill_forward(model, compiled)  # torch.compile only wraps here; it compiles on the first call
    for batch, seq in prefill if "prefill" in parts else ():
        t0 = time.perf_counter()
        ms = _prefill_ms(forward, model.config.vocab_size, batch, seq, device, reps)
        out["prefill_ms"][f"{batch}x{seq}"] = round(ms, 3)
        log.info("prefill %dx%d: %.3f ms (%.0f s with warm-up)", batch, seq, ms, time.perf_counter() - t0)
    for batch in decode_batches if "generate" in parts else ():
        t0 = time.perf_counter()
        ms, tokens = _decode(model, batch, 128, new_tokens, device, max(1, reps // 2), compiled)
        out["decode_ms_per_token"][str(batch)] = round(ms, 4)
        out["tokens"][str(batch)] = tokens
        log.info("decode batch %d: %.4f ms/token (%.0f s with warm-up)", batch, ms, time.perf_counter() - t0)
    if device.startswith("cuda"):
        out["memory_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        if "profile" in parts:
            out["kernel_us_per_token_batch1"] = _kernel_classes(model, 1, 128, device, compiled)
        if "graphed" in parts:
            out["graphed_decode_ms_per_step"] = _graphed(model, decode_batches, new_tokens, compiled)
    return out


def _graphed(model: Any, batches: Sequence[int], steps: int, compiled: bool) -> dict[str, Any]:
    """:func:`_graphed_decode_ms` per batch; a model whose step cannot be captured says why."""
    out: dict[str, Any] = {}
    for batch in batches:
        try:
            out[str(batch)] = round(_graphed_decode_ms(model, batch, 128, steps, compiled), 4)
        except Exception as exc:  # capture failures are data here, not a crash
            out[str(batch)] = f"not capturable: {type(exc).__name__}: {str(exc)[:200]}"
        log.info("graphed decode batch %d: %s", batch, out[str(batch)])
    return out


def _predicted(name: str, profile: Any, prefill: Sequence[tuple[int, int]], decode_batches: Sequence[int]
               ) -> dict[str, Any]:
    from autoopt.planning.recommendation import recommend

    out: dict[str, Any] = {"prefill_ms": {}, "decode_ms_per_token": {}}
    for batch, seq in prefill:
        rec = recommend(profile, name, batch=batch, prompt_len=seq, gen_len=1, phase="prefill", weight_dtype="bf16",
                        max_devices=1)
        out["prefill_ms"][f"{batch}x{seq}"] = round(rec.predicted["prefill_us"] / 1e3, 3)
    out["decode_ms_per_token_graphed"] = {}
    for batch in decode_batches:
        for key, graphs in (("decode_ms_per_token", False), ("decode_ms_per_token_graphed", True)):
            rec = recommend(profile, name, batch=batch, prompt_len=128, gen_len=128, phase="decode",
                            weight_dtype="bf16", max_devices=1, cuda_graphs=graphs)
            out[key][str(batch)] = round(rec.predicted["decode_step_us"] / 1e3, 4)
    return out


def run(name: str = "llama-3-8b", *, device: str = "cuda", tiny: bool = False, variants: Sequence[str] = VARIANTS,
        prefill: Sequence[tuple[int, int]] = ((1, 2048), (8, 512)), decode_batches: Sequence[int] = (1, 16),
        new_tokens: int = 128, prompts: int = 64, reps: int = 5, profile: Any = None,
        parts: Sequence[str] = PARTS, on_variant: Callable[[dict[str, Any]], None] | None = None,
        weights: str | None = None) -> dict[str, Any]:
    """Measure every variant of ``name`` in this process; returns a JSON-ready dict (see module docstring).

    ``parts`` (a subset of :data:`PARTS`) says what to measure; ``on_variant`` is called with the
    result so far after each variant (a long GPU run saves as it goes). ``weights``: the optimize variants
    quantize the linears (``optimize(weights=...)``, the 16-bit weights kept so the next variant gets them
    back; the model is then bf16 on the CPU too, as quantizing takes 16-bit weights).
    """
    import torch

    from autoopt.errors import AutooptError
    from autoopt.nn.optimize import optimize, restore

    bad = [v for v in variants if v not in VARIANTS] + [p for p in parts if p not in PARTS]
    if bad:
        raise AutooptError(f"unknown e2e variants or parts {bad}; variants: {', '.join(VARIANTS)}; "
                           f"parts: {', '.join(PARTS)}")
    model = build_model(name, device=device, tiny=tiny,
                        dtype="bf16" if device.startswith("cuda") or weights else "fp32")
    result: dict[str, Any] = {"model": name, "tiny": tiny, "device": device, "parts": list(parts), "variants": {},
                              "config": {k: getattr(model.config, k) for k in _TINY}, "weights": weights}
    if profile is not None:
        result["predicted"] = _predicted(name, profile, prefill, decode_batches)
    checks = _Agreement(model, prompts, device, result) if "agreement" in parts else None
    for variant in variants:
        t0 = time.perf_counter()
        report = (optimize(model, weights=weights, keep_original=weights is not None)
                  if variant.startswith("optimize") else None)
        compiled = variant.endswith("compile")
        row = _measure(model, device=device, compiled=compiled, prefill=prefill, decode_batches=decode_batches,
                       new_tokens=new_tokens, reps=reps, parts=parts)
        tokens = row.pop("tokens")
        if checks is not None:
            checks.add(row, tokens, compiled)
        if report is not None:
            row["optimize_report"] = report.to_dict()
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        result["variants"][variant] = row
        log.info("%s %s done in %.0f s: prefill %s decode %s graphed %s", name, variant, row["wall_s"],
                 row["prefill_ms"], row["decode_ms_per_token"], row.get("graphed_decode_ms_per_step"))
        if compiled:
            torch._dynamo.reset()
        if report is not None:
            restore(model)
        if on_variant is not None:
            on_variant(result)
    return result


class _Agreement:
    """The eager model's logits (and their noise floor, and the fp32 truth) taken once; each variant's
    logits and greedy tokens compared with them."""

    def __init__(self, model: Any, prompts: int, device: str, result: dict[str, Any]) -> None:
        import torch

        gen = torch.Generator(device="cpu").manual_seed(1)
        # long prompts reach the linears as M = 64 (GEMM), short ones as M = 8 (GEMV)
        self.model = model
        self.samples = {f"prompt_{n}": torch.randint(0, model.config.vocab_size, (prompts, n), generator=gen).to(device)
                        for n in (64, 8)}
        self.reference = {k: _last_logits(model, p) for k, p in self.samples.items()}
        noise = _noise_reference(model, self.samples, self.reference)
        result["noise_reference"] = noise
        # a top-1 flips only if the top two logits move by their gap together: where eager's gap exceeds
        # twice the largest logit difference between two valid eager executions, eager's own choice is
        # fixed, so a kernel within that noise must agree there
        self.margin = 2.0 * noise["max_abs_err"]
        result["decisive_margin"] = round(self.margin, 4)
        self.truth = _fp32_truth(model, self.samples)
        self.ref_tokens: dict[str, Any] = {}

    def add(self, row: dict[str, Any], tokens: dict[str, Any], compiled: bool) -> None:
        if tokens:
            self.ref_tokens = self.ref_tokens or tokens
            row["decode_token_agreement_vs_eager"] = {b: _token_agreement(self.ref_tokens[b], t)
                                                      for b, t in tokens.items()}
        if compiled:  # the compiled variants run the same modules, so the eager logits are theirs too
            return
        logits = {k: _last_logits(self.model, p) for k, p in self.samples.items()}
        row["agreement_vs_eager"] = _logit_agreement(self.reference, logits)
        row["agreement_vs_eager_decisive"] = _decisive_agreement(self.reference, logits, self.margin)
        if self.truth is not None:
            row["agreement_vs_fp32"] = _logit_agreement(self.truth, logits)


def _logit_agreement(reference: dict[str, Any], logits: dict[str, Any]) -> dict[str, Any]:
    """Per prompt length, the last-position logits against the reference's; the headline numbers are the worst."""
    per = {k: _agreement(reference[k], logits[k]) for k in reference}
    worst = {"max_abs_err": max(a["max_abs_err"] for a in per.values()),
             "rel_err": max(a["rel_err"] for a in per.values()),
             "top1_agreement": min(a["top1_agreement"] for a in per.values()),
             "nan": any(a["nan"] for a in per.values())}
    return {**worst, **per}


def _decisive_agreement(reference: dict[str, Any], logits: dict[str, Any], margin: float) -> dict[str, Any]:
    """Top-1 agreement over the prompts whose reference top-1 leads the runner-up by more than ``margin``
    logits (the ones no execution within the noise may flip), and how many prompts that is."""
    import torch

    ref = torch.cat([reference[k] for k in reference])
    got = torch.cat([logits[k] for k in reference])
    top2 = ref.topk(2, dim=-1).values
    decisive = (top2[:, 0] - top2[:, 1]) > margin
    n = int(decisive.sum())
    same = (got.argmax(-1) == ref.argmax(-1))[decisive]
    return {"margin": round(margin, 4), "prompts": n, "of": int(ref.shape[0]),
            "top1_agreement": float(same.float().mean()) if n else None}


def _noise_reference(model: Any, samples: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """The eager model against itself: every prompt in one batch vs each prompt alone. Both are torch's
    own bf16 answer (only the cuBLAS algorithms differ with M), so this is how far two equally valid
    bf16 executions of a random-weight model drift apart: the floor for the agreement numbers."""
    import torch

    with torch.inference_mode():
        batched = {k: model(p, use_cache=False, logits_to_keep=1).logits[:, -1].float() for k, p in samples.items()}
    return _logit_agreement(reference, batched)


def _fp32_truth(model: Any, samples: dict[str, Any]) -> dict[str, Any] | None:
    """Last-position logits of the same weights run in fp32; None when the model is fp32 already.

    Only the parameters are cast (bf16 -> fp32 -> bf16 is exact); ``model.float()`` would also cast
    the buffers, and casting them back would turn RoPE's fp32 ``inv_freq`` into bf16: a different
    model from then on.
    """
    import torch

    params = list(model.parameters())
    dtype = params[0].dtype
    if dtype == torch.float32:
        return None
    for p in params:
        p.data = p.data.float()
    try:
        return {k: _last_logits(model, p) for k, p in samples.items()}
    finally:
        for p in params:
            p.data = p.data.to(dtype)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
