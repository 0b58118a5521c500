"""Decode attention on autoopt's kernel: the kernel against float64 attention (Triton's interpreter, fp16: its bf16
``tl.dot`` is wrong with triton 3.9), the config and price rank() and recommend() share, and optimize()'s
transformers attention function: which calls it takes, what stays SDPA, generate() and restore()."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")

import autoopt  # noqa: E402
from autoopt.backend.kernels.decode_attention import decode_attention, reference  # noqa: E402
from autoopt.errors import OpError  # noqa: E402
from autoopt.kernels.attention import (  # noqa: E402
    DecodeAttentionChoice,
    decode_attention_choice,
    decode_attention_us,
)
from autoopt.nn import attention, dispatch  # noqa: E402
from autoopt.nn.ops import _traced  # noqa: E402
from autoopt.nn.optimize import optimize, restore  # noqa: E402

H200 = autoopt.load_profile("h200").gpus[0]
interpreted = pytest.mark.skipif(not dispatch.interpreter_active(), reason="Triton's interpreter is off")


def qkv(batch=2, heads=8, kv_heads=2, keys=70, dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, dim, generator=g).half()
    k = torch.randn(batch, kv_heads, keys, dim, generator=g).half()
    v = torch.randn(batch, kv_heads, keys, dim, generator=g).half()
    return q, k, v


def err(out, ref) -> float:
    return float((out[:, 0].double() - ref).norm() / ref.norm())


# -- the kernel -----------------------------------------------------------------------------------------------------

@interpreted
@pytest.mark.parametrize(("block_n", "splits"), [(16, 1), (16, 3), (32, 8)])
def test_the_kernel_matches_float64_attention_under_a_mask(block_n, splits):
    q, k, v = qkv()
    mask = torch.ones(2, 70, dtype=torch.bool)
    mask[0, 40:] = False  # a static cache's unfilled slots
    mask[1, :5] = False  # left padding
    mask[1, 20:36] = False  # a hole wider than a block
    out = decode_attention(q, k, v, mask, scale=1 / 8, block_n=block_n, splits=splits)
    assert out.shape == (2, 1, 8, 64) and out.dtype == torch.float16
    assert err(out, reference(q, k, v, mask)) < 2e-3


@interpreted
def test_a_uint8_mask_reads_as_the_bool_one():
    q, k, v = qkv(batch=1, keys=40)
    mask = torch.arange(40)[None, :] < 25
    out = decode_attention(q, k, v, mask.to(torch.uint8), scale=1 / 8, block_n=16, splits=2)
    assert err(out, reference(q, k, v, mask)) < 2e-3


@interpreted
def test_without_a_mask_every_key_is_attended():
    q, k, v = qkv(batch=1, keys=33)
    out = decode_attention(q, k, v, None, scale=1 / 8, block_n=16, splits=2)
    assert err(out, reference(q, k, v, None)) < 2e-3


@interpreted
def test_keys_past_the_last_one_the_mask_keeps_are_never_read():
    q, k, v = qkv(batch=1, keys=64)
    mask = torch.zeros(1, 64, dtype=torch.bool)
    mask[0, :20] = True
    k[:, :, 32:] = float("nan")  # blocks 32-63 wholly masked: loading them would poison the output
    v[:, :, 32:] = float("nan")
    out = decode_attention(q, k, v, mask, scale=1 / 8, block_n=16, splits=1)
    assert torch.isfinite(out).all() and err(out, reference(q, k[:, :, :32], v[:, :, :32], mask[:, :32])) < 2e-3


@interpreted
def test_one_mask_row_broadcast_over_the_batch():
    q, k, v = qkv(batch=3, keys=40)
    row = torch.arange(40) < 25
    out = decode_attention(q, k, v, row[None, :].expand(3, 40), scale=1 / 8, block_n=16, splits=2)
    assert err(out, reference(q, k, v, row[None, :].expand(3, 40))) < 2e-3


# -- config and price -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("batch", "keys", "block_n", "splits"), [(1, 192, 32, 8), (1, 1024, 64, 16),
                                                                 (1, 4096, 64, 16)])
def test_the_choice_is_the_config_that_measured_fastest_on_the_h200(batch, keys, block_n, splits):
    # h200/decode_attention_probe_loops.json: 8.70 us at (32, 8) over 192 keys, 11.17 us at (64, 16) over 1024,
    # 15.63 us at (64, 16) over 4096
    c = decode_attention_choice(H200, batch=batch, heads=32, kv_heads=8, keys=keys, head_dim=128)
    assert (c.BLOCK_N, c.splits, c.num_warps) == (block_n, splits, 4)


def test_the_price_is_within_the_measured_range_and_never_below_the_kv_read():
    c = decode_attention_choice(H200, batch=8, heads=32, kv_heads=8, keys=4096, head_dim=128)
    floor_us = 2 * 8 * 8 * 4096 * 128 * 2 / (H200.bandwidth_gbs * 1e3)  # 134 MB of K/V at 4.8 TB/s: 28 us
    # h200/decode_attention_probe_loops.json: (32, 4) measured 47.47 us (the grid's fastest: 44.45 at (64, 4))
    assert (c.BLOCK_N, c.splits) == (32, 4) and c.bound == "memory"
    assert floor_us < c.predicted_us and 0.95 <= c.predicted_us / 47.47 <= 1.05
    us, bound = decode_attention_us(H200, batch=1, kv_heads=8, keys=4096, head_dim=128, block_n=64, splits=1)
    assert bound == "latency" and 0.95 <= us / 79.27 <= 1.1  # one split walks 64 blocks in turn


def test_inside_a_decode_step_a_call_is_priced_its_measured_saving_under_the_probes_fit():
    # the compiled H200 step's traces: 5.5 / 7.5 / 12.5 us at batch 1 / 8 / 32 against the fit's 9.4 / 10.8 / 14.4
    from autoopt.kernels.attention import IN_STEP_SAVES_US, in_step_us

    gpu = H200
    c = decode_attention_choice(gpu, batch=1, heads=32, kv_heads=8, keys=138, head_dim=128)
    assert IN_STEP_SAVES_US == 3.3
    assert in_step_us(c, gpu, batch=1, kv_heads=8, keys=138, head_dim=128) == pytest.approx(c.predicted_us - 3.3)


def test_inside_a_decode_step_a_call_is_never_priced_under_its_kv_read():
    from autoopt.kernels.attention import in_step_us

    gpu = H200
    c = decode_attention_choice(gpu, batch=64, heads=32, kv_heads=8, keys=32768, head_dim=128)
    read_us = 2 * 64 * 8 * 32768 * 128 * 2 / (gpu.bandwidth_gbs * 1e3)
    assert in_step_us(c, gpu, batch=64, kv_heads=8, keys=32768, head_dim=128) >= read_us


def test_the_choice_round_trips_through_plain_data():
    c = decode_attention_choice(None, batch=4, heads=16, kv_heads=4, keys=500, head_dim=64)
    assert DecodeAttentionChoice.from_dict(c.to_dict()) == c


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(12, 8, 128), (32, 8, 96), (32, 8, 512)])
def test_heads_that_are_no_whole_groups_or_odd_head_sizes_are_an_op_error(heads, kv_heads, dim):
    with pytest.raises(OpError, match="power-of-two head size"):
        decode_attention_choice(H200, batch=1, heads=heads, kv_heads=kv_heads, keys=64, head_dim=dim)


# -- which calls take the kernel ------------------------------------------------------------------------------------

class _Module:
    training = False


def call(q_len=1, dtype=torch.float16, mask="bool", keys=40):
    q = torch.randn(2, 8, q_len, 32).to(dtype)
    k = torch.randn(2, 2, keys, 32).to(dtype)
    m = {"bool": torch.ones(2, 1, q_len, keys, dtype=torch.bool), "float": torch.zeros(2, 1, q_len, keys, dtype=dtype),
         None: None}[mask]
    return q, k, k.clone(), m


@interpreted
def test_a_decode_call_in_fp16_takes_the_kernel():
    q, k, v, m = call()
    assert attention.why_not(_Module(), q, k, v, m, 0.0, {}) is None


@interpreted
@pytest.mark.parametrize(("kwargs", "why"), [
    ({"q_len": 5}, "prefill"), ({"mask": "float"}, "mask not a boolean"),
    ({"dtype": torch.bfloat16}, "not on a CUDA device"), ({"dtype": torch.float32}, "not on a CUDA device"),
])
def test_what_the_kernel_does_not_take_stays_sdpa(kwargs, why):
    q, k, v, m = call(**kwargs)
    assert why in attention.why_not(_Module(), q, k, v, m, 0.0, {})


@interpreted
def test_softcap_stays_sdpa():
    q, k, v, m = call()
    assert "softcap" in attention.why_not(_Module(), q, k, v, m, 0.0, {"softcap": 30.0})


@interpreted
def test_the_attention_function_returns_transformers_layout_and_matches_sdpa():
    q, k, v, m = call()
    m[1, ..., 30:] = False
    ours, weights = attention.attention_forward(_Module(), q, k, v, m, scaling=0.2)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = _Module()
    module.num_key_value_groups = 4
    ref, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), m, scaling=0.2)
    assert weights is None and ours.shape == ref.shape == (2, 1, 8, 32)
    assert float((ours.float() - ref).norm() / ref.norm()) < 2e-3


# -- optimize() -----------------------------------------------------------------------------------------------------

def tiny_llama():
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval().half()


def greedy(model, n=4):
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                              output_logits=True, return_dict_in_generate=True)


@interpreted
def test_optimize_points_transformers_at_the_kernel_and_generate_matches_sdpa(monkeypatch):
    model = tiny_llama()
    ref = greedy(model)
    calls = []
    real = attention.decode_attention
    monkeypatch.setattr(attention, "decode_attention", lambda *a: calls.append(a[0].shape) or real(*a))
    report = optimize(model, ops=["attention"])
    assert model.config._attn_implementation == attention.NAME
    assert any("decode-attention kernel" in n for n in report.notes)
    got = greedy(model)
    assert torch.equal(got.sequences, ref.sequences)
    assert len(calls) == 3 * 2  # three decode steps (the prompt's pass is SDPA), two layers each
    for ours, theirs in zip(got.logits, ref.logits, strict=True):
        assert float((ours.float() - theirs.float()).norm() / theirs.float().norm()) < 1e-2


@interpreted
def test_restore_gives_the_config_back_sdpa():
    model = tiny_llama()
    optimize(model, ops=["attention"])
    restore(model)
    assert model.config._attn_implementation == "sdpa" and not attention.installed(model)


def test_ops_without_attention_leave_sdpa():
    model = tiny_llama()
    optimize(model, ops=["rms_norm"])
    assert model.config._attn_implementation == "sdpa"


def test_another_attention_implementation_is_left_alone():
    model = tiny_llama()
    model.config._attn_implementation = "eager"
    assert attention.install(model) is False and model.config._attn_implementation == "eager"


@interpreted
def test_a_static_cache_generates_the_same_tokens_its_unfilled_slots_masked(monkeypatch):
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded row

    def run():
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                                  pad_token_id=0, cache_implementation="static")

    ref = run()
    optimize(model, ops=["attention"], decode_graphs=False)
    masks = []
    real = attention.decode_attention
    monkeypatch.setattr(attention, "decode_attention", lambda *a: masks.append(a[3]) or real(*a))
    assert torch.equal(run(), ref)
    # two decode steps of two layers, each under the mask: the padded row's first slots and the unfilled slots hidden
    assert len(masks) == 2 * 2 and all(m is not None and not m[1, :2].any() for m in masks) and not masks[0][0, -1]


def _sdpa_calls(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((attn_mask is None, is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def _compiled_prompt(model, ids, attention_mask=None, use_cache=True):
    torch._dynamo.reset()
    forward = torch.compile(model.forward, backend="eager", dynamic=False, fullgraph=True)
    with torch.no_grad():
        return forward(input_ids=ids, attention_mask=attention_mask, use_cache=use_cache).logits


@interpreted
def test_under_torch_compile_an_unpadded_prompt_runs_sdpa_causal_without_a_mask(monkeypatch):
    # model(ids): a prompt into a fresh cache, compiled whole (fullgraph: no graph break either)
    model = tiny_llama().float()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    optimize(model, ops=["attention"], decode_graphs=False)
    calls = _sdpa_calls(monkeypatch)
    got = _compiled_prompt(model, ids)
    assert calls == [(True, True)] * 2  # two layers, each causal SDPA with no [q, k] mask
    assert float((got - ref).abs().max()) < 1e-4


@interpreted
def test_under_torch_compile_a_padding_mask_is_still_built(monkeypatch):
    model = tiny_llama().float()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(4))
    pad = torch.ones_like(ids)
    pad[1, :3] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=pad).logits
    optimize(model, ops=["attention"], decode_graphs=False)
    calls = _sdpa_calls(monkeypatch)
    got = _compiled_prompt(model, ids, pad)
    assert calls == [(False, False)] * 2
    assert float((got[0] - ref[0]).abs().max()) < 1e-4 and float((got[1, 3:] - ref[1, 3:]).abs().max()) < 1e-4


@interpreted
def test_under_torch_compile_a_prompt_without_a_cache_keeps_transformers_mask(monkeypatch):
    # use_cache=False: transformers checks the positions for packed sequences, which under tracing it cannot read,
    # so its mask function is no longer the plain causal one and the [q, k] mask is built, as without optimize()
    model = tiny_llama().float()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(4))
    optimize(model, ops=["attention"], decode_graphs=False)
    calls = _sdpa_calls(monkeypatch)
    _compiled_prompt(model, ids, use_cache=False)
    assert calls == [(False, False)] * 2


@pytest.mark.parametrize("change", [{"q_length": 1, "kv_length": 1}, {"kv_length": 12}, {"kv_offset": 3},
                                    {"local_size": 4}, {"allow_is_causal_skip": False},
                                    {"mask_function": lambda *a: True}])
def test_a_mask_that_is_not_a_whole_unpadded_prompts_causal_one_is_transformers_own(change):
    kw = dict(batch_size=1, q_length=9, kv_length=9, q_offset=0, kv_offset=0, attention_mask=None,
              allow_is_causal_skip=True, device="cpu")
    assert attention._plain_causal_prompt(kw)
    assert not attention._plain_causal_prompt({**kw, **change})


def test_a_model_whose_attention_code_is_its_own_keeps_it():
    # Falcon branches on the string "sdpa" itself: another name would change its path
    config = transformers.FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1, vocab_size=64,
                                       attn_implementation="sdpa")
    model = transformers.FalconForCausalLM(config)
    assert attention.install(model) is False and model.config._attn_implementation == "sdpa"


# -- on a GPU (compiled kernels, bf16, torch.compile) -----------------------------------------------------------------

on_gpu = pytest.mark.skipif(not torch.cuda.is_available() or dispatch.interpreter_active(), reason="needs a CUDA GPU")


def gpu_qkv(batch, keys, seed):
    """Llama-3-8B's heads (32 over 8 KV heads of 128) in bf16 on the GPU, and the generator for what else a test
    draws."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 32, 128, generator=g).bfloat16().cuda()
    k, v = (torch.randn(batch, 8, keys, 128, generator=g).bfloat16().cuda() for _ in range(2))
    return q, k, v, g


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize(("batch", "keys"), [(1, 192), (4, 1000), (32, 192)])
def test_on_a_gpu_the_chosen_config_matches_float64_attention_in_bf16(batch, keys):
    q, k, v, g = gpu_qkv(batch, keys, seed=batch)
    lengths = torch.randint(keys // 2, keys + 1, (batch,), generator=g).cuda()
    mask = torch.arange(keys, device="cuda")[None, :] < lengths[:, None]
    c = attention.choice(q.device, batch=batch, heads=32, kv_heads=8, keys=keys, head_dim=128)
    out = decode_attention(q, k, v, mask, scale=128 ** -0.5, block_n=c.BLOCK_N, splits=c.splits)
    assert err(out, reference(q, k, v, mask)) < 1e-2


def _gpu_llama():
    config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=256, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval().bfloat16().cuda()


def _gpu_generate(model, compile: bool):
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.inference_mode():
        return model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0,
                              cache_implementation="static", output_logits=True, return_dict_in_generate=True,
                              disable_compile=not compile)


def _close(got, ref, tol=2e-2) -> bool:
    """Each step's logits within ``tol`` (relative norm) of the reference's, up to the first step whose greedy
    token differs (a near-tie a bf16 rounding flips; the steps after it decode another sequence)."""
    for step, (a, b) in enumerate(zip(got.logits, ref.logits, strict=True)):
        if float((a.float() - b.float()).norm() / b.float().norm()) >= tol:
            return False
        if not torch.equal(a.argmax(-1), b.argmax(-1)):
            return step > 0  # the first step is the prefill: its tokens must agree
    return True


@pytest.mark.gpu
@on_gpu
def test_on_a_gpu_the_traced_launch_compiles_into_inductors_graph_and_matches():
    # the launch torch.compile traces, its mask built in the compiled graph
    q, k, v, _ = gpu_qkv(4, 300, seed=7)
    lengths = torch.tensor([300, 250, 17, 1], device="cuda")

    @torch.compile(fullgraph=True)
    def step(q, k, v, lengths):
        mask = (torch.arange(300, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
        return attention.traced_decode_attention(q, k, v, 128 ** -0.5, mask[:, 0, 0, :].expand(4, 300))

    mask = torch.arange(300, device="cuda")[None, :] < lengths[:, None]
    assert err(step(q, k, v, lengths), reference(q, k, v, mask)) < 1e-2


@pytest.mark.gpu
@on_gpu
def test_on_a_gpu_the_kernel_matches_float64_attention_under_a_random_mask():
    q, k, v, g = gpu_qkv(8, 1000, seed=8)
    mask = torch.rand(8, 1000, generator=g).cuda() < 0.7
    out = decode_attention(q, k, v, mask, scale=128 ** -0.5, block_n=64, splits=4)
    assert err(out, reference(q, k, v, mask)) < 1e-2


@pytest.mark.gpu
@on_gpu
def test_on_a_gpu_an_eager_static_cache_decode_runs_the_kernel_and_matches_sdpa(monkeypatch):
    model = _gpu_llama()
    ref = _gpu_generate(model, compile=False)
    optimize(model, ops=["attention"], decode_graphs=False)
    calls = []
    real = attention.decode_attention
    monkeypatch.setattr(attention, "decode_attention", lambda *a: calls.append(a[0].shape) or real(*a))
    assert _close(_gpu_generate(model, compile=False), ref) and len(calls) == 7 * 2


@pytest.mark.gpu
@on_gpu
def test_on_a_gpu_the_compiled_decode_graph_holds_the_kernel_captures_and_matches(monkeypatch):
    from autoopt.nn import decode_graphs

    model = _gpu_llama()
    ref = _gpu_generate(model, compile=False)
    optimize(model, ops=["attention"])
    traced = []  # the traced launch's body runs when torch.compile traces it (on fake tensors), not after
    real = attention.decode_attention
    monkeypatch.setattr(attention, "decode_attention", lambda *a: traced.append(a[0].shape) or real(*a))
    got = _gpu_generate(model, compile=True)
    runners = decode_graphs.installed(model)
    assert runners and runners[0].graphs and not runners[0].failed, runners and runners[0].failed
    assert traced and _close(got, ref)


@interpreted
def test_under_torch_compile_the_call_goes_through_the_traced_launch(monkeypatch):
    q, k, v, m = call()
    module = _Module()
    module.num_key_value_groups = 4
    calls = []
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(attention, "traced_decode_attention", lambda *a: calls.append(len(a)) or a[0][:, None])
    attention.attention_forward(module, q, k, v, m, scaling=0.2)
    assert calls == [5]  # q, k, v, scale and the mask


@interpreted
def test_the_traced_launch_run_eagerly_matches_the_plain_one():
    q, k, v = qkv(batch=2, heads=8, kv_heads=2, keys=50, dim=64)
    mask = torch.arange(50)[None, :] < torch.tensor([[50], [31]])
    traced = attention.traced_decode_attention(q, k, v, 1 / 8, mask)
    assert torch.equal(traced, attention.decode_attention(q, k, v, mask, 1 / 8))


@interpreted
def test_the_attention_function_traces_in_one_graph_under_torch_compile(monkeypatch):
    # transformers compiles its decode step whole: the checks and the route to the traced launch must not break
    # the graph. Under the interpreter torch.compile cannot trace a Triton launch non-strictly ("Unsupported
    # output type for nonstrict_trace-ed function"), so the launch here is the float64 reference, traced the same
    # way; the GPU tests above compile the real one
    q, k, v, m = call()
    module = _Module()
    module.num_key_value_groups = 4

    @_traced
    def launch(q, k, v, scale, *mask):
        return reference(q, k, v, mask[0] if mask else None, scale).to(q.dtype)[:, None]

    monkeypatch.setattr(attention, "traced_decode_attention", launch)

    def step(q, k, v, m):
        return attention.attention_forward(module, q, k, v, m, scaling=0.2)[0]

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert float((compiled(q, k, v, m).float() - step(q, k, v, m).float()).abs().max()) < 1e-2


def test_the_choice_cache_stays_bounded_over_a_growing_cache(monkeypatch):
    monkeypatch.setattr(attention, "_MAX_CHOICES", 8)
    monkeypatch.setattr(attention, "_CHOICES", {})
    for keys in range(1, 30):  # a dynamic cache: one more key every step
        attention.choice(torch.device("cpu"), batch=1, heads=8, kv_heads=2, keys=keys, head_dim=64)
    assert len(attention._CHOICES) <= 8


def test_the_price_constants_are_the_fit_to_the_committed_probe(capsys):
    # benchmarks/fit_decode_attention.py over h200/decode_attention_probe_loops.json (the shipped loop's 90 configs)
    import json
    import sys
    from pathlib import Path

    from autoopt.kernels import attention as price

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from benchmarks import fit_decode_attention

    assert fit_decode_attention.main([str(root / "benchmarks/results/h200/decode_attention_probe_loops.json")]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert {n: getattr(price, n) for n in fit_decode_attention.NAMES} == {n: fit[n] for n in fit_decode_attention.NAMES}
    assert fit["configs"] == 90 and fit["ratio_min"] >= 0.8 and fit["ratio_max"] <= 1.22


@pytest.mark.parametrize(("text", "says"), [("not json", "not JSON"), ('{"rows": []}', "not a decode_attention_probe"),
                                            (None, "regular file")])
def test_the_fit_script_refuses_a_file_that_is_not_a_probe_in_one_line(tmp_path, capsys, text, says):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import fit_decode_attention

    path = tmp_path / "probe.json"
    if text is None:
        path.mkdir()  # a directory, not a regular file
    else:
        path.write_text(text)
    assert fit_decode_attention.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fit_decode_attention: ") and says in err and err.count("\n") == 1


def test_transformers_5_17s_mask_call_with_cache_positions_is_read_the_same():
    # transformers 5.17 passes cache_position (the query's positions) where 5.24 passes q_length and q_offset
    kw = dict(batch_size=1, cache_position=torch.arange(9), kv_length=9, kv_offset=0, attention_mask=None)
    assert attention._plain_causal_prompt(kw)
    assert not attention._plain_causal_prompt({**kw, "kv_length": 12})
