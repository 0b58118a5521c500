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

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["VARIANTS", "build_model", "run"]

VARIANTS = ("eager", "compile", "optimize", "optimize+compile")
#: a tiny config of the same family for the CPU path (shapes only; the code path is the real one)
_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}


def build_model(name: str, *, dtype: str = "bf16", device: str = "cuda", tiny: bool = False) -> Any:
    """A transformers causal LM with the catalog model's published architecture and random weights."""
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


def _prefill_ms(model: Any, batch: int, seq: int, device: str, reps: int) -> float:
    import torch

    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)

    def step() -> Any:
        with torch.inference_mode():
            return model(ids, use_cache=False).logits[:, -1]
    return _median_ms(step, device, reps)


def _decode_ms_per_token(model: Any, batch: int, prompt: int, new_tokens: int, device: str, reps: int) -> float:
    """(time for ``new_tokens`` - time for ``short``) / the difference, static cache, greedy."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device=device)
    short = max(2, new_tokens // 8)

    def gen(n: int) -> Callable[[], Any]:
        def call() -> Any:
            with torch.inference_mode():
                return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      cache_implementation="static", pad_token_id=0)
        return call
    long_ms = _median_ms(gen(new_tokens), device, reps)
    short_ms = _median_ms(gen(short), device, reps)
    return (long_ms - short_ms) / (new_tokens - short)


def _last_logits(model: Any, prompts: Any) -> Any:
    import torch

    with torch.inference_mode():
        return torch.cat([model(p[None], use_cache=False).logits[:, -1].float() for p in prompts])


def _agreement(ref: Any, got: Any) -> dict[str, float]:
    import torch

    diff = (got - ref).abs()
    return {"max_abs_err": float(diff.max()), "rel_err": float(diff.norm() / ref.norm()),
            "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
            "nan": bool(torch.isnan(got).any())}


def _compile(model: Any) -> None:
    import torch

    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)


def _uncompile(model: Any) -> None:
    import torch

    model.__dict__.pop("forward", None)  # the instance attribute set by _compile
    torch._dynamo.reset()


def _measure(model: Any, *, device: str, prefill: Sequence[tuple[int, int]], decode_batches: Sequence[int],
             new_tokens: int, reps: int) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    out: dict[str, Any] = {"prefill_ms": {}, "decode_ms_per_token": {}}
    for batch, seq in prefill:
        out["prefill_ms"][f"{batch}x{seq}"] = round(_prefill_ms(model, batch, seq, device, reps), 3)
    for batch in decode_batches:
        ms = _decode_ms_per_token(model, batch, 128, new_tokens, device, max(1, reps // 2))
        out["decode_ms_per_token"][str(batch)] = round(ms, 4)
    if device.startswith("cuda"):
        out["memory_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def _predicted(name: str, profile: Any, prefill: Sequence[tuple[int, int]], decode_batches: Sequence[int]
               ) -> dict[str, Any]:
    from autoopt.planning.recommendation import recommend

    out: dict[str, Any] = {"prefill_ms": {}, "decode_ms_per_token": {}}
    for batch, seq in prefill:
        rec = recommend(profile, name, batch=batch, prompt_len=seq, gen_len=1, phase="prefill", weight_dtype="bf16",
                        max_devices=1)
        out["prefill_ms"][f"{batch}x{seq}"] = round(rec.predicted["prefill_us"] / 1e3, 3)
    for batch in decode_batches:
        rec = recommend(profile, name, batch=batch, prompt_len=128, gen_len=128, phase="decode", weight_dtype="bf16",
                        max_devices=1)
        out["decode_ms_per_token"][str(batch)] = round(rec.predicted["decode_step_us"] / 1e3, 4)
    return out


def run(name: str = "llama-3-8b", *, device: str = "cuda", tiny: bool = False, variants: Sequence[str] = VARIANTS,
        prefill: Sequence[tuple[int, int]] = ((1, 2048), (8, 512)), decode_batches: Sequence[int] = (1, 16),
        new_tokens: int = 128, prompts: int = 64, reps: int = 5, profile: Any = None) -> dict[str, Any]:
    """Measure every variant of ``name`` in this process; returns a JSON-ready dict (see module docstring)."""
    import torch

    from autoopt.errors import AutooptError
    from autoopt.nn.optimize import optimize, restore

    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise AutooptError(f"unknown e2e variants {bad}; choose from {', '.join(VARIANTS)}")
    model = build_model(name, device=device, tiny=tiny, dtype="bf16" if device.startswith("cuda") else "fp32")
    gen = torch.Generator(device="cpu").manual_seed(1)
    sample = torch.randint(0, model.config.vocab_size, (prompts, 64), generator=gen).to(device)
    result: dict[str, Any] = {"model": name, "tiny": tiny, "device": device, "variants": {},
                              "config": {k: getattr(model.config, k) for k in _TINY}}
    reference = _last_logits(model, sample)
    for variant in variants:
        t0 = time.perf_counter()
        report = None
        if variant.startswith("optimize"):
            report = optimize(model)
        if variant.endswith("compile"):
            _compile(model)
        row = _measure(model, device=device, prefill=prefill, decode_batches=decode_batches, new_tokens=new_tokens,
                       reps=reps)
        row["agreement_vs_eager"] = _agreement(reference, _last_logits(model, sample))
        if report is not None:
            row["optimize_report"] = report.to_dict()
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        result["variants"][variant] = row
        log.info("%s %s: %s", name, variant, row["prefill_ms"])
        if variant.endswith("compile"):
            _uncompile(model)
        if report is not None:
            restore(model)
    if profile is not None:
        result["predicted"] = _predicted(name, profile, prefill, decode_batches)
    return result
