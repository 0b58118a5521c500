"""autoopt.optimize / autoopt.restore on tiny real transformers models (CPU: Triton's interpreter, or torch).

Each model is built from its config (hidden 64, 2 layers, vocab 128) with its weights nudged off their
init values (Llama's norms start at 1, Gemma's at 0: a wrong formula would still pass on those).
"""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import autoopt  # noqa: E402
from autoopt.errors import AutooptError, OpError  # noqa: E402
from autoopt.nn import dispatch  # noqa: E402
from autoopt.nn import ops as aops  # noqa: E402
from autoopt.nn.modules import (  # noqa: E402
    AutooptGatedMLP,
    AutooptLayerNorm,
    AutooptLinear,
    AutooptPlainMLP,
    AutooptQKV,
    AutooptQKVPart,
    AutooptRMSNorm,
    Replacement,
)
from autoopt.nn.optimize import optimize, restore  # noqa: E402

LAYERS = 2
COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),         # q/k/v with bias
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),  # (1 + w) RMSNorm, tanh-GELU MLP
}
_NEOX = {k: v for k, v in COMMON.items() if k != "num_key_value_heads"}
#: plain-MLP families (fc1 -> act -> fc2, LayerNorm): config, model, config keys, the MLP's activation
PLAIN_FAMILIES = {
    # q/k/v/o, c_fc/c_proj with biases; gelu_pytorch_tanh; sequential block
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", COMMON, "gelu_tanh"),
    # fused query_key_value with bias; exact GELU; parallel attention + MLP (use_parallel_residual)
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {**_NEOX, "bos_token_id": 0, "eos_token_id": 0}, "gelu"),
    # one LayerNorm feeding attention and MLP in parallel; gelu_new (tanh-GELU in Python); biased lm_head
    "phi": ("PhiConfig", "PhiForCausalLM", COMMON, "gelu_tanh"),
    # FalconLinear (a Linear subclass with its own forward), no biases, exact GELU, parallel_attn
    "falcon": ("FalconConfig", "FalconForCausalLM",
               {k: COMMON[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")},
               "gelu"),
}


@pytest.fixture
def torch_fallback(monkeypatch):
    """The ops run torch (the dispatch's CPU fallback) instead of Triton's interpreter: whole-model
    generate loops under the interpreter take seconds per family (its GEMV is ~0.1 s a call). The
    swapping, the gate_up rewrite and the (1 + w) norm are the same code either way; the kernels run
    under the interpreter in the other tests."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    dispatch.clear_cache()
    yield
    monkeypatch.undo()
    dispatch.clear_cache()


def build(family: str = "llama", dtype=torch.float32, **overrides):
    if family in PLAIN_FAMILIES:
        config_cls, model_cls, keys, _ = PLAIN_FAMILIES[family]
    else:
        config_cls, model_cls, extra = FAMILIES[family]
        keys = {**COMMON, **extra}
    return instantiate(config_cls, model_cls, {**keys, **overrides}, dtype)


def instantiate(config_cls: str, model_cls: str, keys: dict, dtype=torch.float32):
    """A transformers model of that class and config, seeded, its weights perturbed off their init (so
    norms and biases are not all ones and zeros), in ``dtype``."""
    config = getattr(transformers, config_cls)(**keys)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.to(dtype)


def ids(n: int = 6):
    return torch.randint(0, COMMON["vocab_size"], (1, n), generator=torch.Generator().manual_seed(1))


def logits(model, x):
    with torch.no_grad():
        return model(x).logits


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def snapshot(model):
    return ({k: v.detach().clone() for k, v in model.state_dict().items()},
            {name: (type(m), m) for name, m in model.named_modules()},
            {name: p for name, p in model.named_parameters()})


def assert_restored(model, snap):
    state, modules, params = snap
    now = model.state_dict()
    assert list(now) == list(state)
    assert all(torch.equal(now[k], state[k]) for k in state)
    assert {n: (type(m), m) for n, m in model.named_modules()} == modules  # same types, same objects
    assert {n: p for n, p in model.named_parameters()} == params          # same Parameter objects
    assert not any(isinstance(m, Replacement) for m in model.modules())
    ptrs = [p.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(set(ptrs)) == len(ptrs)  # every Parameter has its own storage again (gate/up untied)


# -- the families -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_is_replaced_matches_and_restores(family):
    model = build(family)
    x = ids()
    ref = logits(model, x)
    snap = snapshot(model)

    report = optimize(model)
    counts = report.counts()
    assert counts["linear"] == {"replaced": 2 * LAYERS + 1, "fused": 5 * LAYERS}  # o down + lm_head; q k v gate up
    assert counts["qkv"] == {"replaced": LAYERS}
    assert counts["gated_mlp"] == {"replaced": LAYERS}
    assert counts["rms_norm"] == {"replaced": 2 * LAYERS + 1}
    assert counts["attention"] == {"kept": LAYERS}
    assert not [r for r in report.rows if r.status == "kept" and r.kind != "attention" and r.kind != "other"]
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp, AutooptGatedMLP)
    assert mlp.activation == ("gelu_tanh" if family == "gemma" else "silu")
    norm = model.model.layers[0].input_layernorm
    assert isinstance(norm, AutooptRMSNorm) and norm.unit_offset == (family == "gemma")
    assert isinstance(model.lm_head, AutooptLinear)
    if family == "gemma":  # tied embeddings stay tied: the replacement holds the same Parameter
        assert model.lm_head.weight is model.model.embed_tokens.weight

    assert rel(logits(model, x), ref) < 1e-4

    assert restore(model) == (4 * LAYERS + 1) + LAYERS + (2 * LAYERS + 1)  # linears, MLPs, norms
    assert_restored(model, snap)
    assert torch.equal(logits(model, x), ref)


def _generates_the_same_tokens(family: str) -> None:
    model = build(family)
    x = ids()
    ref_tokens = model.generate(x, max_new_tokens=4, do_sample=False)
    optimize(model)
    assert torch.equal(model.generate(x, max_new_tokens=4, do_sample=False), ref_tokens)
    restore(model)
    assert torch.equal(model.generate(x, max_new_tokens=4, do_sample=False), ref_tokens)


def test_generate_gives_the_same_greedy_tokens_through_the_kernels():
    _generates_the_same_tokens("llama")  # under the interpreter on a CPU: every op a Triton kernel


@pytest.mark.parametrize("family", ["gemma", "mistral", "qwen2"])
def test_generate_gives_the_same_greedy_tokens(family, torch_fallback):
    _generates_the_same_tokens(family)


@pytest.mark.parametrize("family, mlp, norm", [("llama", "gated_mlp", "rms_norm"),
                                              ("starcoder2", "plain_mlp", "layer_norm")])
def test_fp16_model_matches(family, mlp, norm):
    model = build(family, torch.float16)
    x = ids()
    ref = logits(model, x)
    report = optimize(model)
    assert report.count(mlp) == LAYERS and report.count(norm) == 2 * LAYERS + 1
    assert all(r.tolerance == 5e-3 for r in report.rows if r.error is not None)
    assert rel(logits(model, x), ref) < 5e-3


# -- plain-MLP families: StarCoder2, GPT-NeoX (Pythia), Phi, Falcon ---------------------------------------------
# fp32 throughout: under Triton's interpreter an fp32 tl.dot is numpy's fp32 matmul (no TF32), so the logits
# agree to ~1e-7 and a wrong epilogue (a bias added twice, tanh-GELU for exact GELU: ~1e-3) cannot hide in
# the tolerance. bf16 is out (the interpreter's bf16 tl.dot is wrong with triton 3.9 and torch 2.13: the
# dispatch runs torch there); test_fp16_model_matches runs StarCoder2 in fp16.

@pytest.fixture(scope="module")
def plain_optimized():
    """``family -> (model, report, logits after optimize(), logits before)``: one optimize() per family under
    the interpreter, shared by the tests that only read the result."""
    done = {}

    def get(family):
        if family not in done:
            model = build(family)
            x = ids()
            ref = logits(model, x)
            report = optimize(model)
            done[family] = (model, report, logits(model, x), ref)
        return done[family]
    return get


@pytest.mark.parametrize("family", sorted(PLAIN_FAMILIES))
def test_plain_mlp_family_logits_match_the_original(family, plain_optimized):
    _, _, got, ref = plain_optimized(family)
    assert rel(got, ref) < 1e-5
    assert float((got - ref).abs().max()) < 1e-5


@pytest.mark.parametrize("family", sorted(PLAIN_FAMILIES))
def test_plain_mlp_family_report_lists_plain_mlps_and_layer_norms_as_replaced(family, plain_optimized):
    model, report, _, _ = plain_optimized(family)
    activation = PLAIN_FAMILIES[family][3]
    mlps = [m for m in model.modules() if isinstance(m, AutooptPlainMLP)]
    assert len(mlps) == LAYERS and {m.fused_activation for m in mlps} == {activation}
    norms = [m for m in model.modules() if isinstance(m, AutooptLayerNorm)]
    assert len(norms) >= LAYERS + 1 and not [m for m in model.modules() if type(m) is nn.LayerNorm]
    counts = report.counts()
    assert counts["plain_mlp"] == {"replaced": LAYERS} and counts["layer_norm"] == {"replaced": len(norms)}
    assert not [r for r in report.rows if r.status == "kept" and r.kind not in ("attention", "other")]
    rows = [r for r in report.rows if r.kind == "plain_mlp"]
    bias = "bias + " if family != "falcon" else ""  # Falcon's linears have no bias
    assert all(r.kernels["fc1"].endswith(f"epilogue {bias}{activation}") for r in rows)
    fc1 = [r for r in report.rows if r.path.startswith(rows[0].path + ".") and r.status == "fused"]
    assert len(fc1) == 1 and f"the {activation} in the epilogue" in fc1[0].reason


@pytest.mark.parametrize("family", sorted(PLAIN_FAMILIES))
def test_plain_mlp_family_restore_brings_back_the_modules_and_logits(family):
    model = build(family)
    x = ids()
    ref = logits(model, x)
    snap = snapshot(model)
    optimize(model)
    placed = sum(isinstance(c, Replacement) for m in model.modules() if not isinstance(m, Replacement)
                 for c in m.children())  # what restore() puts back: replacements not inside another one
    assert placed >= 3 * LAYERS and restore(model) == placed
    assert_restored(model, snap)
    assert torch.equal(logits(model, x), ref)


def test_gpt_neox_with_a_sequential_residual_matches_too():
    model = build("gpt_neox", use_parallel_residual=False)  # the default is parallel: both block shapes work
    x = ids()
    ref = logits(model, x)
    report = optimize(model)
    assert report.count("plain_mlp") == LAYERS and rel(logits(model, x), ref) < 1e-5


def test_plain_mlp_generate_gives_the_same_greedy_tokens_through_the_kernels():
    _generates_the_same_tokens("gpt_neox")  # decode (M = 1) runs the epilogue GEMM/GEMV kernels too


def _aot_targets(model, x):
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def spy(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    try:
        got = logits(torch.compile(model, backend=aot_autograd(fw_compiler=spy), fullgraph=False), x)
    finally:
        torch._dynamo.reset()
    return got, {str(n.target).removesuffix(".default") for gm in graphs for n in gm.graph.nodes
                 if n.op == "call_function"}


def test_torch_compile_after_optimize_puts_torch_ops_where_the_dispatch_chose_torch(torch_fallback):
    model = build("llama", num_hidden_layers=1)
    x = ids()
    optimize(model)
    expected = logits(model, x)
    got, targets = _aot_targets(model, x)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    # every op's choice here is the torch fallback (no CUDA, no interpreter): decided at trace time, the
    # graph holds the torch ops themselves, so Inductor fuses them and no custom op costs host time
    assert not [t for t in targets if t.startswith("autoopt.")], targets
    assert "aten.mm" in targets and "aten.rsqrt" in targets, targets


def test_torch_compile_after_optimize_runs_the_autoopt_kernels_as_custom_ops():
    if not dispatch.interpreter_active():
        pytest.skip("needs the kernels: a GPU or Triton's interpreter")
    model = build("llama", torch.float16, num_hidden_layers=1)
    x = ids(24)  # above a decode step's 16 rows, whose RMSNorm Inductor runs (next test)
    optimize(model)
    expected = logits(model, x)
    got, targets = _aot_targets(model, x)
    assert torch.allclose(got, expected, rtol=1e-3, atol=1e-3)
    assert {"autoopt.linear", "autoopt.rms_norm", "autoopt.swiglu"} <= targets  # opaque custom ops, no break


def test_torch_compile_after_optimize_leaves_a_decode_steps_rms_norm_to_inductor():
    if not dispatch.interpreter_active():
        pytest.skip("needs the kernels: a GPU or Triton's interpreter")
    model = build("llama", torch.float16, num_hidden_layers=1)
    x = ids(6)
    optimize(model)
    expected = logits(model, x)
    got, targets = _aot_targets(model, x)
    assert torch.allclose(got, expected, rtol=1e-3, atol=1e-3)
    assert "autoopt.rms_norm" not in targets and "aten.rsqrt" in targets
    assert {"autoopt.linear", "autoopt.swiglu"} <= targets


# -- restore, context manager, memory ------------------------------------------------------------------------

def test_context_manager_restores_on_exit_and_report_restore_is_idempotent():
    model = build("qwen2")
    snap = snapshot(model)
    with autoopt.optimize(model, check=False) as report:
        assert isinstance(model.model.layers[1].mlp, AutooptGatedMLP)
        assert report.check is False and all(r.error is None for r in report.rows)
    assert_restored(model, snap)
    assert report.restore() == 0


def _storage_bytes(model) -> int:
    seen = {}
    for t in [*model.parameters(), *model.buffers()]:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def test_gate_up_is_built_once_and_the_weights_are_not_doubled_by_default():
    model = build("llama")
    before = _storage_bytes(model)
    gate_w = model.model.layers[0].mlp.gate_proj.weight
    report = optimize(model, check=False)
    mlp = model.model.layers[0].mlp
    assert mlp.tied and mlp.is_tied() and mlp.gate_proj.weight is gate_w  # same Parameter, now a view
    assert gate_w.untyped_storage().data_ptr() == mlp.gate_up_weight.untyped_storage().data_ptr()
    extra_norms = 0  # Llama's norms need no derived weight
    assert _storage_bytes(model) == before + extra_norms and report.extra_bytes == 0
    assert list(model.state_dict()) == list(snapshot(build("llama"))[0])  # same keys: gate_up is not saved


def test_keep_original_copies_gate_up_and_leaves_the_weights_untouched():
    model = build("llama")
    ptr = model.model.layers[0].mlp.up_proj.weight.data_ptr()
    report = optimize(model, keep_original=True, ops=["gated_mlp", "linear"], check=False)
    mlp = model.model.layers[0].mlp
    assert not mlp.tied and mlp.up_proj.weight.data_ptr() == ptr
    assert report.extra_bytes == LAYERS * 2 * 128 * 64 * 4
    # load_state_dict refreshes the copy
    sd = {k: v * 2 if k.endswith("mlp.up_proj.weight") else v for k, v in model.state_dict().items()}
    model.load_state_dict(sd)
    assert torch.equal(mlp.gate_up_weight[128:], mlp.up_proj.weight)


def test_tied_gate_up_follows_load_state_dict_and_dtype_moves():
    model = build("llama")
    x = ids()
    optimize(model, check=False)
    mlp = model.model.layers[0].mlp
    sd = model.state_dict()
    sd = {k: (v * 2 if k.endswith("mlp.gate_proj.weight") else v) for k, v in sd.items()}
    model.load_state_dict(sd)
    assert mlp.is_tied() and torch.equal(mlp.gate_up_weight[:128], sd["model.layers.0.mlp.gate_proj.weight"])
    model.load_state_dict(sd, assign=True)  # new tensors: gate_up is rebuilt and tied again
    assert mlp.is_tied()
    _half_stays_tied_and_matches_a_restored_copy(model, mlp, "gate_up_weight", x)


def _half_stays_tied_and_matches_a_restored_copy(model, rep, fused, x):
    model.to(torch.float16)
    assert rep.is_tied() and getattr(rep, fused).dtype == torch.float16
    ref = copy.deepcopy(model)
    restore(ref)
    assert rel(logits(model, x), logits(ref, x)) < 5e-3


def test_qkv_is_one_gemm_over_slices_of_one_weight():
    model = build("qwen2")  # q/k/v with biases, k/v narrower than q (GQA)
    before = _storage_bytes(model)
    attn = model.model.layers[0].self_attn
    q_w, k_w, v_b = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.bias
    optimize(model, check=False)
    q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
    assert isinstance(q, AutooptQKV) and isinstance(k, AutooptQKVPart) and isinstance(v, AutooptQKVPart)
    assert q.tied and q.is_tied() and q.weight is q_w and k.weight is k_w and v.bias is v_b  # same Parameters
    assert k_w.data_ptr() == q.qkv_weight[q.out_features:].data_ptr()
    assert _storage_bytes(model) == before  # the weights exist once
    assert list(model.state_dict()) == list(snapshot(build("qwen2"))[0])  # same keys: qkv_weight is not saved


def test_qkv_parts_answer_from_the_fused_gemm_and_release_it_after_v():
    model = build("llama")
    optimize(model, check=False)
    attn = model.model.layers[0].self_attn
    h = torch.randn(1, 3, 64)
    with torch.no_grad():
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        assert k.data_ptr() == q.data_ptr() + q.shape[-1] * q.element_size()  # a slice of one output
        assert attn.q_proj.__dict__["_stash"] is None  # v took the last slice: nothing kept alive
        for got, lin in ((q, attn.q_proj), (k, attn.k_proj), (v, attn.v_proj)):
            assert rel(got, torch.nn.functional.linear(h, lin.weight, lin.bias)) < 1e-5


def test_a_qkv_part_called_on_another_input_computes_its_own_gemm():
    model = build("llama")
    optimize(model, check=False)
    attn = model.model.layers[0].self_attn
    h, other = torch.randn(1, 3, 64), torch.randn(1, 3, 64)
    with torch.no_grad():
        attn.q_proj(h)
        k = attn.k_proj(other)  # not the tensor q_proj saw: its own GEMM, the right answer
        v = attn.v_proj(other)
        assert rel(k, torch.nn.functional.linear(other, attn.k_proj.weight)) < 1e-5
        assert rel(v, torch.nn.functional.linear(other, attn.v_proj.weight)) < 1e-5


def test_tied_qkv_follows_load_state_dict_and_dtype_moves():
    model = build("qwen2")
    x = ids()
    optimize(model, check=False)
    q = model.model.layers[0].self_attn.q_proj
    key = "model.layers.0.self_attn.v_proj.weight"
    sd = {k: (v * 2 if k == key else v) for k, v in model.state_dict().items()}
    model.load_state_dict(sd)
    assert q.is_tied() and torch.equal(q.qkv_weight[-sd[key].shape[0]:], sd[key])
    model.load_state_dict(sd, assign=True)  # new tensors: qkv is rebuilt once v has loaded, and tied again
    assert q.is_tied() and torch.equal(q.qkv_weight[-sd[key].shape[0]:], sd[key])
    _half_stays_tied_and_matches_a_restored_copy(model, q, "qkv_weight", x)


def test_a_qkv_check_failure_keeps_the_projections_apart(monkeypatch):
    model = build("llama")
    x = ids()
    ref = logits(model, x)
    monkeypatch.setattr(AutooptQKV, "forward", lambda self, h: torch.zeros_like(h))  # a wrong q
    report = optimize(model)
    row = report.row("model.layers.0.self_attn.qkv")
    assert row.status == "kept" and "check failed" in row.reason and "one by one" in row.reason
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_proj, AutooptLinear) and isinstance(attn.v_proj, AutooptLinear)
    assert report.count("qkv") == 0 and rel(logits(model, x), ref) < 1e-4


def test_qkv_not_in_ops_replaces_q_k_v_one_by_one():
    model = build("llama")
    report = optimize(model, ops=["linear", "rms_norm", "gated_mlp"], check=False)
    assert report.count("qkv") == 0 and report.count("linear") == 5 * LAYERS + 1
    assert isinstance(model.model.layers[0].self_attn.k_proj, AutooptLinear)
    assert "qkv and linear must both be in ops=" in report.row("model.layers.0.self_attn.qkv").reason


# -- check=True, ops=, skip= ------------------------------------------------------------------------------------

def test_check_keeps_the_original_when_the_replacement_is_wrong(monkeypatch):
    model = build("llama")
    x = ids()
    ref = logits(model, x)
    monkeypatch.setattr(aops, "rms_norm", lambda x, w, eps: x * 2)
    report = optimize(model)
    assert report.count("rms_norm", "kept") == 2 * LAYERS + 1 and report.count("rms_norm") == 0
    row = report.row("model.norm")
    assert row.status == "kept" and "check failed" in row.reason and row.error > row.tolerance
    assert not isinstance(model.model.norm, AutooptRMSNorm)
    assert report.count("linear") == 2 * LAYERS + 1 and report.count("qkv") == LAYERS  # the others: unaffected
    assert rel(logits(model, x), ref) < 1e-4
    assert "check failed" in str(report)


def test_check_keeps_the_original_when_the_replacement_raises(monkeypatch):
    model = build("llama")

    def broken(gate_up):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(aops, "swiglu", broken)
    report = optimize(model)
    row = report.row("model.layers.0.mlp")
    assert row.status == "kept" and "kernel exploded" in row.reason
    assert report.count("linear") == 4 * LAYERS + 1  # o + the kept MLPs' linears, one by one (q/k/v: fused)
    assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"


def test_ops_subset_is_respected():
    model = build("llama")
    x = ids()
    ref = logits(model, x)
    report = optimize(model, ops=["linear"])
    assert report.ops == ("linear",)
    assert report.count("linear") == 7 * LAYERS + 1 and report.count("rms_norm") == 0
    assert report.count("gated_mlp", "kept") == LAYERS and "not in ops=" in report.row("model.layers.0.mlp").reason
    assert report.row("model.norm").status == "kept"
    assert rel(logits(model, x), ref) < 1e-4
    restore(model)

    report = optimize(model, ops="gated_mlp")  # the MLP alone: gate_up through torch, fused activation
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp, AutooptGatedMLP) and not mlp.use_linear_op and type(mlp.down_proj) is nn.Linear
    assert report.count("linear") == 0 and rel(logits(model, x), ref) < 1e-4


def test_skip_patterns_and_a_second_optimize_leave_modules_alone():
    model = build("llama")
    report = optimize(model, skip=["lm_head", "model.layers.1.*"], check=False)
    assert report.row("lm_head").status == "skipped" and type(model.lm_head) is nn.Linear
    assert report.row("model.layers.1.mlp").status == "skipped"
    assert report.count("gated_mlp") == 1
    again = optimize(model, check=False)
    assert again.row("model.layers.0.mlp").status == "skipped"  # already optimised
    assert again.row("lm_head").status == "replaced" and again.count("gated_mlp") == 1


# -- recognition by structure and behaviour ------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, norm: nn.Module, act: nn.Module | None = None) -> None:
        super().__init__()
        self.norm = norm
        self.mlp = _MLP(act or nn.SiLU())

    def forward(self, x):
        return self.mlp(self.norm(x))


class _MLP(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(64, 96, bias=False)
        self.up_proj = nn.Linear(64, 96, bias=False)
        self.down_proj = nn.Linear(96, 64, bias=False)
        self.act_fn = act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class _NotANorm(nn.Module):
    """A weight and an eps, but not a norm's output."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(64) * 1.5)
        self.eps = 1e-6

    def forward(self, x):
        return x * self.weight


def _randomize(module):
    torch.manual_seed(3)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return module


@pytest.mark.parametrize("norm, kind", [
    (nn.RMSNorm(64, eps=None), "rms_norm"),
    (nn.RMSNorm(64, eps=1e-5), "rms_norm"),
    (nn.LayerNorm(64), "layer_norm"),
    (nn.LayerNorm(64, bias=False), "layer_norm"),
])
def test_torch_norm_modules_are_recognised(norm, kind):
    block = _randomize(_Block(norm)).eval()
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        ref = block(x)
    report = optimize(block)
    assert report.row("norm").kind == kind and report.row("norm").status == "replaced"
    assert report.row("mlp").status == "replaced"
    with torch.no_grad():
        assert rel(block(x), ref) < 1e-4
    assert restore(block) == 2  # the norm and the MLP (its down_proj lives inside it)


def test_lookalikes_are_kept_with_the_reason():
    block = _randomize(_Block(_NotANorm(), act=nn.GELU())).eval()  # exact erf-GELU: no fused kernel
    report = optimize(block)
    norm, mlp = report.row("norm"), report.row("mlp")
    assert norm.status == "kept" and "matches no norm formula" in norm.reason
    assert mlp.status == "kept" and "neither SiLU nor tanh-GELU" in mlp.reason
    assert report.count("linear") == 3  # its projections are still plain linears


class _PlainMLP(nn.Module):
    """fc_in -> act -> fc_out, the activation a module or a function (``act_fn``)."""

    def __init__(self, act, bias: bool = True) -> None:
        super().__init__()
        self.fc_in = nn.Linear(64, 96, bias=bias)
        self.fc_out = nn.Linear(96, 64, bias=bias)
        self.act_fn = act

    def forward(self, x):
        return self.fc_out(self.act_fn(self.fc_in(x)))


class _PlainBlock(nn.Module):
    def __init__(self, act, bias: bool = True) -> None:
        super().__init__()
        self.mlp = _PlainMLP(act, bias)

    def forward(self, x):
        return self.mlp(x)


def _plain_block(act, bias: bool = True):
    return _randomize(_PlainBlock(act, bias)).eval()


def _hf_act(name: str):
    from transformers.activations import ACT2FN

    return ACT2FN[name]


@pytest.mark.parametrize("act, expected", [
    ("gelu", "gelu"), ("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"), ("gelu_fast", "gelu_tanh"),
    ("relu", "relu"), (nn.GELU(approximate="tanh"), "gelu_tanh"), (torch.nn.functional.gelu, "gelu"),
], ids=lambda a: a if isinstance(a, str) else getattr(a, "__name__", type(a).__name__))
def test_plain_mlp_activation_is_identified_by_what_it_computes(act, expected):
    from autoopt.nn.recognize import match_plain_mlp

    match = match_plain_mlp(_plain_block(_hf_act(act) if isinstance(act, str) else act).mlp)
    assert not isinstance(match, str), match
    assert (match.activation, match.fc1_name, match.fc2_name) == (expected, "fc_in", "fc_out")
    assert (match.hidden, match.intermediate, match.out_features) == (64, 96, 64)


def test_plain_mlp_without_biases_and_a_function_activation_is_replaced_and_matches():
    block = _plain_block(torch.nn.functional.relu, bias=False)  # act_fn: a function, not a child module
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        ref = block(x)
    report = optimize(block)
    assert report.row("mlp").status == "replaced" and block.mlp.fused_activation == "relu"
    assert report.row("mlp.fc_in").status == "fused" and report.row("mlp.fc_out").status == "replaced"
    with torch.no_grad():
        assert rel(block(x), ref) < 1e-5


@pytest.mark.parametrize("act, name", [(nn.SiLU(), "SiLU"), ("gelu_10", "ClippedGELUActivation"),
                                       ("quick_gelu", "QuickGELUActivation")], ids=["silu", "clipped", "quick"])
def test_plain_mlp_with_another_activation_is_kept_with_the_reason(act, name):
    # SiLU and QuickGELU differ everywhere; GELU clipped to [-10, 10] differs only past 10 (the -60..60 probe)
    block = _plain_block(_hf_act(act) if isinstance(act, str) else act)
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        ref = block(x)
    report = optimize(block)
    row = report.row("mlp")
    assert row.status == "kept"
    assert f"activation {name} computes none of exact GELU, tanh-GELU and ReLU" in row.reason
    assert report.count("linear") == 2 and type(block.mlp) is _PlainMLP  # its linears, one by one
    with torch.no_grad():
        assert rel(block(x), ref) < 1e-5


def test_plain_mlp_not_in_ops_keeps_it_and_replaces_its_linears_one_by_one():
    block = _plain_block(nn.GELU())
    report = optimize(block, ops=["linear"])
    assert report.row("mlp").status == "kept" and report.row("mlp").reason == "plain_mlp not in ops="
    assert report.count("linear") == 2 and isinstance(block.mlp.fc_in, AutooptLinear)


def test_plain_mlp_without_linear_in_ops_keeps_fc2_as_the_torch_linear():
    block = _plain_block(nn.GELU())
    report = optimize(block, ops="plain_mlp")
    assert isinstance(block.mlp, AutooptPlainMLP) and type(block.mlp.fc_out) is nn.Linear
    assert report.row("mlp.fc_out").status == "kept" and report.row("mlp.fc_out").reason == "linear not in ops="


def test_a_plain_mlp_check_failure_keeps_it_and_tries_its_linears(monkeypatch):
    block = _plain_block(nn.GELU())
    monkeypatch.setattr(AutooptPlainMLP, "forward", lambda self, x: torch.zeros_like(x))
    report = optimize(block)
    row = report.row("mlp")
    assert row.status == "kept" and "check failed" in row.reason and "tried one by one" in row.reason
    assert report.count("linear") == 2 and type(block.mlp) is _PlainMLP


def test_a_plain_mlp_whose_fc1_has_a_forward_hook_is_kept_and_the_hook_keeps_firing():
    block = _plain_block(nn.GELU())
    calls = []
    block.mlp.fc_in.register_forward_hook(lambda mod, args, out: calls.append(out.shape))
    report = optimize(block)
    row = report.row("mlp")
    assert row.status == "kept" and "mlp.fc_in has forward hooks" in row.reason
    assert isinstance(block.mlp.fc_in, AutooptLinear)  # replaced one by one: it shares the hook
    calls.clear()
    with torch.no_grad():
        block(torch.randn(2, 3, 64))
    assert calls == [(2, 3, 96)]


def test_a_sequential_of_linear_act_linear_is_not_replaced_as_a_whole():
    model = _randomize(nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 64)))
    root = nn.Module()
    root.seq = model  # code may index a Sequential (seq[0]): replacing it as one module would break that
    report = optimize(root)
    assert report.count("plain_mlp") == 0 and report.count("linear") == 2 and type(root.seq) is nn.Sequential


class _MatmulLinear(nn.Linear):
    """Falcon's FalconLinear: its own forward, the same arithmetic."""

    def forward(self, x):
        return x @ self.weight.T + self.bias


class _ScaledLinear(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


class _AdapterLinear(nn.Linear):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.lora_A = nn.Parameter(torch.zeros(4, self.in_features))  # zero: the probe alone would pass it

    def forward(self, x):
        return super().forward(x) + (x @ self.lora_A.T).sum(-1, keepdim=True)


@pytest.mark.parametrize("cls, reason", [
    (_MatmulLinear, None),
    (_ScaledLinear, "_ScaledLinear has its own forward, which does not compute x @ W^T + b on a probe"),
    (_AdapterLinear, "_AdapterLinear has its own forward and holds lora_A besides weight and bias"),
])
def test_a_linear_subclass_with_its_own_forward_is_served_only_when_it_is_a_plain_linear(cls, reason):
    from autoopt.nn.recognize import linear_problem

    problem = linear_problem(_randomize(cls(64, 32)))
    assert problem == reason if reason is None else reason in problem


# -- report and errors ------------------------------------------------------------------------------------------------

def test_report_serialises_and_prints():
    model = build("gemma")
    report = optimize(model)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["counts"]["gated_mlp"] == {"replaced": LAYERS} and data["keep_original"] is False
    assert any(r["path"] == "model.layers.0.mlp" and "gelu_tanh_mul" in r["kernels"] for r in data["rows"])
    text = str(report)
    assert text.splitlines()[0].startswith("autoopt.optimize: ") and "model.layers.1.post_attention_layernorm" in text
    assert "(1 + weight)" in text and "attention stays the model's own" in text
    label = report.backend
    assert label in ("triton-interpreter", "torch fallback", "triton") or "+" in label
    assert repr(report).startswith("<OptimizeReport")


def test_bad_input_raises_typed_errors():
    with pytest.raises(TypeError, match=r"takes a torch\.nn\.Module, got str"):
        autoopt.optimize("llama")
    with pytest.raises(TypeError, match=r"takes a torch\.nn\.Module"):
        autoopt.restore(42)
    model = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(OpError, match=r"unknown op name.*'conv'.*choose from linear, rms_norm") as exc:
        autoopt.optimize(model, ops=["linear", "conv"])
    assert isinstance(exc.value, AutooptError) and isinstance(exc.value, ValueError)
    with pytest.raises(TypeError, match="check=, keep_original= and decode_graphs= take a bool"):
        autoopt.optimize(model, check="yes")
    with pytest.raises(TypeError, match="ops= takes op names"):
        autoopt.optimize(model, ops=3)
    assert type(model[0]) is nn.Linear  # nothing was touched


def test_public_names_are_lazy_and_listed():
    assert {"optimize", "restore", "OptimizeReport"} <= set(autoopt.__all__)
    assert autoopt.optimize is optimize and autoopt.restore is restore


def test_a_report_does_not_keep_a_deleted_model_alive():
    import gc
    import weakref

    model = nn.Sequential(nn.Linear(16, 16), nn.RMSNorm(16))
    alive = weakref.ref(model)
    report = optimize(model)
    assert report.count("linear") == 1 and report.count("rms_norm") == 1
    del model
    gc.collect()
    assert alive() is None and report.restore() == 0
