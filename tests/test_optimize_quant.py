"""autoopt.optimize(model, weights=...) on tiny real transformers models: quantized in place, checked, restored.

Models: Llama and Qwen2 (q/k/v biases), 2 layers, bf16, hidden 128 / intermediate 256 (K = 128: one whole int4
group) and hidden 192 / intermediate 320 (K not a multiple of 128: the last int4 group padded). Most tests
run the quantized linears on the torch fallback (dequantize, then matmul: the path a CPU without Triton's
interpreter takes), which is fast; the ``interpreter`` tests run autoopt's quant_gemv / quant_gemm / act_quant
kernels under Triton's interpreter, W8A8 fp8 included.

Logit bounds: each quantized linear's error is within its format's bound (``QUANT_BOUNDS``: fp8 6 %, int8 3 %,
int4 15 %); the logits come out of 2 layers x (attention, MLP) = 4 quantized stages in series, whose
independent errors add in quadrature, so the logits are held to sqrt(4) = 2 x the format's bound (measured on
these models: fp8 4.0-5.9 %, int8 1.3-1.5 %, int4 17-23 %: at most 0.75 x that limit).
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from autoopt.backend.quant import quantize  # noqa: E402
from autoopt.errors import AutooptError, RestoreError, WeightFormatError  # noqa: E402
from autoopt.kernels.quant import parse_weight  # noqa: E402
from autoopt.nn import compare, dispatch, ops  # noqa: E402
from autoopt.nn.modules import Replacement  # noqa: E402
from autoopt.nn.optimize import optimize, restore  # noqa: E402
from autoopt.nn.quant_modules import AutooptQuantGatedMLP, AutooptQuantLinear, AutooptQuantQKV, QuantLinear  # noqa: E402

LAYERS = 2
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
#: (hidden, intermediate): K = 128 (one int4 group), and K = 192 / 320 (not multiples of 128)
SIZES = {"k128": (128, 256), "k192": (192, 320)}
#: the quantized stages in series in these models (attention and MLP of each layer)
STAGES = 2 * LAYERS


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    dispatch.reset()
    yield
    dispatch.reset()


@pytest.fixture
def torch_fallback(monkeypatch):
    """The quantized linears run the dequantize-then-matmul torch path (the CPU's without the interpreter)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    dispatch.clear_cache()


def build(family: str = "llama", size: str = "k128", dtype=torch.bfloat16, kv_heads: int = 2):
    hidden, inter = SIZES[size]
    config_cls, model_cls = FAMILIES[family]
    config = getattr(transformers, config_cls)(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=LAYERS,
                                               num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=128,
                                               max_position_embeddings=64)
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval().to(dtype)


def ids(n: int = 20):
    # 20 tokens: M = 20 > 16, so the prefill takes the GEMM kinds (W8A8 quantizes activations there)
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(1))


def logits(model, x):
    with torch.no_grad():
        return model(x).logits.float()


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def bound(spec: str) -> float:
    return compare.QUANT_BOUNDS[parse_weight(spec).name]


def expected_bytes(model, spec: str) -> int:
    """Bytes the model's tensors should hold after quantizing into ``spec``: every linear but the LM head at the
    format's exact bytes (fused gate_up and q/k/v as one weight: per-row formats make that the same), the rest
    (embeddings, norms, LM head, biases, buffers) as they are."""
    fmt = parse_weight(spec)
    head = model.get_output_embeddings()
    total = 0
    for m in model.modules():
        if isinstance(m, nn.Linear) and m is not head:
            total += fmt.weight_bytes(m.out_features, m.in_features)
            total += m.bias.numel() * m.bias.element_size() if m.bias is not None else 0
        elif not isinstance(m, nn.Linear) or m is head:
            own = (*m.parameters(recurse=False), *m.buffers(recurse=False))
            total += sum(t.numel() * t.element_size() for t in own)
    return total


def generate(model, n: int = 3):
    with torch.no_grad():
        return model.generate(ids(6), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)


# -- each format on each family (the torch fallback: fast) -------------------------------------------------------------

@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("spec", ["fp8", "fp8-wo", "int8", "int4", "int4-asym"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_format_quantizes_in_place_within_its_bound(family, spec, size, torch_fallback):
    model = build(family, size)
    x = ids()
    ref = logits(model, x)
    expected = expected_bytes(model, spec)
    before = sum(p.numel() * p.element_size() for p in model.parameters())

    report = optimize(model, "h100-sxm", weights=spec)
    fmt = parse_weight(spec).spec
    assert report.weight_format == fmt and fmt in str(report)
    assert f"{fmt} as asked" in report.weights["reason"]
    # every linear but the LM head is quantized: q/k/v and gate/up as one fused weight each, o and down alone
    mlp, attn = model.model.layers[0].mlp, model.model.layers[0].self_attn
    assert isinstance(mlp, AutooptQuantGatedMLP) and isinstance(mlp.down_proj, AutooptQuantLinear)
    assert isinstance(attn.q_proj, AutooptQuantQKV) and isinstance(attn.o_proj, AutooptQuantLinear)
    assert type(model.lm_head) is not AutooptQuantLinear and any("LM head" in n for n in report.notes)
    errors = report.errors()
    assert len(errors) == 4 * LAYERS  # qkv, o_proj, the MLP's gate_up, down_proj
    assert all(0 < e <= bound(spec) for e in errors.values()), errors
    assert all(r.tolerance == bound(spec) for r in report.rows if r.path in errors)

    # logits: 4 quantized stages in series (module docstring)
    err = rel(logits(model, x), ref)
    assert err <= STAGES ** 0.5 * bound(spec), err
    # memory: the format's exact bytes plus what stays 16-bit, the 16-bit linear weights freed
    after = report.memory_bytes[1]
    assert after <= 1.03 * expected and after < report.memory_bytes[0]
    assert sum(p.numel() * p.element_size() for p in model.parameters()) < before
    assert generate(model).shape == (1, 9)


# -- the kernels under Triton's interpreter ----------------------------------------------------------------------------

@pytest.mark.parametrize(("family", "spec", "size"), [("llama", "int4", "k192"), ("qwen2", "fp8", "k128"),
                                                      ("llama", "int8", "k128")])
def test_the_quantized_kernels_run_the_model(family, spec, size):
    """quant_gemv at decode (M <= 16), quant_gemm at the prefill (M = 20), W8A8 fp8's act_quant too; generate()."""
    if not dispatch.interpreter_active():
        pytest.skip("Triton's interpreter is off (a GPU runs these compiled in test_kernels_gpu)")
    model = build(family, size)
    x = ids()
    ref = logits(model, x)
    report = optimize(model, weights=spec)
    assert report.backend == "triton-interpreter + torch fallback"  # the 16-bit LM head: bf16 matmul falls back
    kernels = " ".join(k for r in report.rows if r.weight for k in r.kernels.values())
    assert "quant_gemv" in kernels and "quant_gemm" in kernels
    assert rel(logits(model, x), ref) <= STAGES ** 0.5 * bound(spec)
    calls = dispatch.fallback_counts()
    assert not any(op == "quant_linear" for op, _ in calls), calls
    assert generate(model, 2).shape == (1, 8)
    quant_choices = [c for c in dispatch.choices() if c.op == "quant_linear"]
    assert {c.kind for c in quant_choices} == {"gemv", "gemm"} and all(c.weight == report.weight_format
                                                                       for c in quant_choices)


# -- keep_original / restore -------------------------------------------------------------------------------------------

def test_keep_original_restores_identical_logits(torch_fallback):
    model = build("qwen2")
    x = ids()
    ref = logits(model, x)
    params = dict(model.named_parameters())
    report = optimize(model, weights="int4", keep_original=True)
    assert rel(logits(model, x), ref) > 0  # quantized
    assert report.extra_bytes > 0  # the packed weights beside the kept 16-bit ones
    assert restore(model) > 0
    assert not any(isinstance(m, Replacement) for m in model.modules())
    assert dict(model.named_parameters()) == params
    assert torch.equal(logits(model, x), ref)


def test_restore_after_freeing_raises_and_changes_nothing(torch_fallback):
    model = build("llama")
    x = ids()
    report = optimize(model, weights="int8")
    got = logits(model, x)
    modules = {n: m for n, m in model.named_modules()}
    for undo in (lambda: restore(model), report.restore):
        with pytest.raises(RestoreError, match=r"keep_original=True") as exc:
            undo()
        assert isinstance(exc.value, AutooptError)
        assert any("mlp" in f and "bfloat16" in f for f in exc.value.freed)
        assert {n: m for n, m in model.named_modules()} == modules
        assert torch.equal(logits(model, x), got)


# -- the check: over the bound, the layer stays 16-bit -----------------------------------------------------------------

def test_check_keeps_16bit_where_the_error_is_over_the_bound(torch_fallback, monkeypatch):
    model = build("llama")
    x = ids()
    ref = logits(model, x)
    monkeypatch.setitem(compare.QUANT_BOUNDS, "int4", 1e-4)
    report = optimize(model, weights="int4")
    assert not report.errors()  # nothing stayed quantized
    assert not any(isinstance(m, (AutooptQuantLinear, AutooptQuantGatedMLP, AutooptQuantQKV)) for m in model.modules())
    assert model.model.layers[0].self_attn.o_proj.weight.numel()  # the 16-bit weight is still there
    kept = [n for n in report.notes if "kept 16-bit: int4-g128 check failed" in n]
    assert len(kept) == 4 * LAYERS and "its format's bound" in kept[0]
    assert "kept 16-bit" in str(report)
    assert rel(logits(model, x), ref) < 2e-2  # the 16-bit kernels
    # check=False: the errors are still measured and reported, but nothing falls back
    model = build("llama")
    report = optimize(model, weights="int4", check=False)
    assert len(report.errors()) == 4 * LAYERS and all("LM head" in n for n in report.notes)


# -- bad input ---------------------------------------------------------------------------------------------------------

def snapshot(model):
    return ({n: (type(m), m) for n, m in model.named_modules()},
            {k: v.clone() for k, v in model.state_dict().items()})


def assert_unchanged(model, snap):
    modules, state = snap
    assert {n: (type(m), m) for n, m in model.named_modules()} == modules
    now = model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in state.items())


def test_w8a8_on_a_gpu_without_fp8_tensor_cores_is_refused_naming_what_runs():
    model = build("llama")
    snap = snapshot(model)
    with pytest.raises(WeightFormatError) as exc:
        optimize(model, "a100-sxm-80gb", weights="fp8")
    msg = str(exc.value)
    assert "'fp8'" in msg and "A100" in msg and "fp8-wo" in msg and "unchanged" in msg
    assert (exc.value.format, exc.value.instead) == ("fp8", "fp8-wo") and "A100" in exc.value.gpu
    assert_unchanged(model, snap)
    assert dispatch.profile() is None  # nor the process-wide profile


def test_an_unknown_format_lists_the_accepted_ones():
    model = build("llama")
    snap = snapshot(model)
    with pytest.raises(WeightFormatError, match=r"unknown weights='int3'.*accepted: auto, bf16, fp16, fp8, fp8-wo"):
        optimize(model, weights="int3")
    with pytest.raises(TypeError, match="weights= takes a format name"):
        optimize(model, weights=4)
    model32 = build("llama", dtype=torch.float32)
    with pytest.raises(WeightFormatError, match=r"quantizes bfloat16/float16 weights.*float32"):
        optimize(model32, weights="int8")
    assert_unchanged(model, snap)


# -- weights="auto": recommend()'s format ------------------------------------------------------------------------------

@pytest.mark.parametrize(("profile", "want"), [("h100-sxm", "fp8"), ("a100-sxm-80gb", None)])
def test_auto_takes_the_format_recommend_chooses_and_says_why(profile, want, torch_fallback):
    from autoopt.planning.recommendation import recommend

    model = build("llama")
    rec = recommend(profile, model, batch=1, prompt_len=1024, runtime="autoopt", max_devices=1)
    report = optimize(model, profile, weights="auto")
    assert report.weight_format == want
    assert rec.quant.format.name == (want or "bf16")
    why = report.weights["reason"]
    assert why.startswith(f"recommend(): {rec.quant.format.name} - {rec.quant.reason}") and "runtime autoopt" in why
    assert report.weights["predicted"]["decode_step_us"] == pytest.approx(rec.predicted["decode_step_us"])
    assert f"weights: {want or '16-bit'} - recommend()" in str(report)
    assert bool(report.errors()) == (want is not None)


# -- a checkpoint's own block-FP8 linears (transformers' FP8Linear) ----------------------------------------------------

def fp8_checkpoint_model():
    """A tiny Llama whose linears transformers' finegrained-FP8 integration turned into its FP8Linear modules
    (``replace_with_fp8_linear`` with a ``FineGrainedFP8Config``, as ``from_pretrained`` does), their weights
    quantized by transformers' own ``Fp8Quantize`` (128 x 128 blocks). ``from_pretrained`` itself refuses FP8
    on a machine without a GPU, so the load is done by hand: the modules and the quantization are transformers'."""
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    model = build("llama", kv_heads=4)  # k/v 128 rows: whole 128 x 128 blocks, as real checkpoints have
    state = {k: v.clone() for k, v in model.state_dict().items()}
    buffers = {k: v.clone() for k, v in model.named_buffers()}  # RoPE's inv_freq is not in the state_dict
    config = transformers.FineGrainedFP8Config(weight_block_size=(128, 128), modules_to_not_convert=["lm_head"])
    fp8.replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=config)
    model.to_empty(device="cpu")
    quant = fp8.Fp8Quantize(types.SimpleNamespace(quantization_config=config))
    loaded = {}
    for name, m in model.named_modules():
        if isinstance(m, fp8.FP8Linear):
            loaded.update(quant.convert({f"{name}.weight": state[f"{name}.weight"]}))
    missing = model.load_state_dict({**state, **loaded}, strict=True)
    assert not missing.missing_keys
    with torch.no_grad():
        for name, buf in buffers.items():
            model.get_buffer(name).copy_(buf)
    return model, fp8.FP8Linear


def dequantized_reference(model, x):
    """The checkpoint model's logits with every FP8 linear run in torch on its dequantized weight."""
    from autoopt.backend.quant import QuantizedWeight, dequantize

    twin = build("llama", kv_heads=4)
    with torch.no_grad():
        for name, m in model.named_modules():
            if hasattr(m, "weight_scale_inv"):
                qw = QuantizedWeight.of("fp8_block", m.out_features, m.in_features,
                                        {"qweight": m.weight, "scales": m.weight_scale_inv})
                twin.get_submodule(name).weight.copy_(dequantize(qw))
    return logits(twin, x)


def test_a_checkpoints_fp8_linears_run_fp8_block_on_their_own_tensors():
    model, fp8_linear = fp8_checkpoint_model()
    x = ids()
    ref = dequantized_reference(model, x)
    tensors = {n: (m.weight, m.weight_scale_inv, m.weight.data_ptr()) for n, m in model.named_modules()
               if isinstance(m, fp8_linear)}
    assert len(tensors) == 7 * LAYERS

    report = optimize(model)  # weights= not needed: recognised by the tensors they hold
    assert report.weight_format is None
    want = "fp8_block" if dispatch.gpu_for(torch.device("cpu")).features.fp8 else "fp8_block-wo"
    for name, (w, s, ptr) in tensors.items():
        rep = model.get_submodule(name)
        assert isinstance(rep, AutooptQuantLinear) and rep.weight_format == want
        assert rep.weight is w and rep.weight_scale_inv is s and rep.weight.data_ptr() == ptr  # not re-quantized
        assert report.row(name).weight == want and report.row(name).error <= compare.QUANT_BOUNDS["fp8_block"]
    assert set(model.state_dict()) >= {f"{n}.weight_scale_inv" for n in tensors}  # the checkpoint's keys
    assert rel(logits(model, x), ref) <= STAGES ** 0.5 * compare.QUANT_BOUNDS["fp8_block"]
    # nothing 16-bit was freed: the FP8Linear modules come back
    assert restore(model) == 7 * LAYERS + 2 * LAYERS + 1 + 1  # the linears, the norms, the final norm, lm_head
    assert all(isinstance(model.get_submodule(n), fp8_linear) for n in tensors)


def _compiled_with_ops(seq, x):
    """(eager output, compiled output, the ops of the compiled forward graph) of ``seq`` on ``x``."""
    from torch._dynamo.backends.common import aot_autograd

    seen: list[str] = []

    def spy(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        eager = seq(x)
        compiled = torch.compile(seq, backend=aot_autograd(fw_compiler=spy), fullgraph=True)(x)
    torch._dynamo.reset()
    return eager, compiled, seen


def test_a_quant_linear_runs_under_torch_compile(torch_fallback):
    """The quantized op is a custom op: it traces (fake implementation) and runs compiled."""
    lin = nn.Linear(128, 64, bias=True).to(torch.bfloat16)
    seq = nn.Sequential(lin)
    optimize(seq, weights="int8")
    assert isinstance(seq[0], QuantLinear)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = seq(x)
        compiled = torch.compile(seq, backend="eager", fullgraph=True)(x)
    assert torch.equal(eager, compiled)


def test_a_compiled_quant_linear_with_offsets_and_bias_keeps_the_custom_op_off_the_vendor_path(torch_fallback):
    # the traced variant passes its optional tensors through a mask; away from cuBLASLt's fp8 GEMM (here: a CPU,
    # int4-asym) the graph holds the custom op, and the output is eager's
    lin = nn.Linear(256, 64, bias=True).to(torch.bfloat16)
    seq = nn.Sequential(lin)
    optimize(seq, weights="int4-asym")
    x = torch.randn(20, 256, dtype=torch.bfloat16)
    eager, compiled, seen = _compiled_with_ops(seq, x)
    assert torch.equal(eager, compiled)
    assert "autoopt.quant_linear.default" in seen and "aten._scaled_mm.default" not in seen, seen


def test_the_traced_dequant_path_gives_the_custom_ops_output(monkeypatch):
    # what torch.compile traces where the dequantize + cuBLAS path is chosen (a GPU at prefill sizes; the choice is
    # forced here): the dequantization kernel and a GEMM, run eagerly (the CPU's interpreter, or the GPU where one is)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)).bfloat16().to(dev)
    qw = quantize(w, "int4-asym")
    x = torch.randn(2, 10, 256, generator=torch.Generator().manual_seed(4)).bfloat16().to(dev)
    bias = torch.randn(64).bfloat16().to(dev)
    monkeypatch.setattr(ops, "_dequant_mm_params", lambda m, q, a: dict(BLOCK_N=16, BLOCK_K=128, num_warps=2))
    got = ops._quant_linear_traced(x, qw.qweight, qw.scales, "int4-asym", 256, (True, True), qw.offsets, bias)
    want = ops.dequant_linear(x, qw, bias)
    assert got.shape == (2, 10, 64) and rel(got.float(), want.float()) < 1e-2


def test_the_dequant_path_is_traced_only_on_a_gpu():
    qw = quantize(torch.randn(64, 256).bfloat16(), "int4")
    assert ops._dequant_mm_params(2048, qw, torch.empty(2048, 256, dtype=torch.bfloat16)) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor traces wrap_triton launches on a GPU only")
def test_a_compiled_quant_linear_on_the_dequant_path_holds_the_kernel_and_the_gemm():
    seq = nn.Sequential(nn.Linear(4096, 4096, bias=False)).to("cuda", torch.bfloat16)
    optimize(seq, weights="int4")
    x = torch.randn(2048, 4096, dtype=torch.bfloat16, device="cuda")
    eager, compiled, seen = _compiled_with_ops(seq, x)
    assert "autoopt.quant_linear.default" not in seen and "aten.mm.default" in seen, seen
    assert rel(compiled.float(), eager.float()) <= 1e-3


# -- the CLI: bench --model ... --weights ------------------------------------------------------------------------------

def test_bench_model_weights_quantizes_the_optimize_variant(tmp_path, capsys, torch_fallback):
    from autoopt.cli import main

    out = tmp_path / "e2e.json"
    assert main(["bench", "--model", "llama-3-8b", "--weights", "int8", "--format", "json", "--out", str(out)]) == 0
    import json

    data = json.loads(out.read_text())
    report = data["variants"]["optimize"]["optimize_report"]
    assert data["weights"] == "int8" and report["weights"]["format"] == "int8"
    assert any(r["weight"] == "int8" for r in report["rows"])
    assert data["variants"]["optimize"]["agreement_vs_eager"]["rel_err"] < 2 * compare.QUANT_BOUNDS["int8"]
    capsys.readouterr()
    assert main(["bench", "--model", "llama-3-8b", "--weights", "int3"]) == 2
    err = capsys.readouterr().err
    assert "accepted: auto" in err and "tiny config" not in err  # refused before any model is built
    assert main(["bench", "--suite", "llm", "--weights", "int8"]) == 2


def test_quantizes_layer_by_layer_freeing_each_original_as_it_goes(torch_fallback, monkeypatch):
    """The memory peak stays the 16-bit model's plus one module's packed weights: each module is quantized, placed
    and its 16-bit weights freed before the next is quantized (at most a gated MLP's down_proj and gate_up are
    packed and not yet freed at once)."""
    from autoopt.nn import build as build_module
    from autoopt.nn.quant_modules import QuantReplacement

    packed, released, pending = [], [], []
    pack, release = build_module.pack_rows, QuantReplacement.release
    monkeypatch.setattr(build_module, "pack_rows", lambda ws, fmt: (packed.append(1), pending.append(
        len(packed) - len(released)), pack(ws, fmt))[-1])
    monkeypatch.setattr(QuantReplacement, "release", lambda self, path: (released.append(path), release(self, path)))
    model = build("llama")
    optimize(model, weights="int4")
    assert len(packed) == len(released) == 4 * LAYERS and max(pending) <= 2


@pytest.mark.parametrize("spec", ["int4-asym", "int8", "fp8-wo"])
def test_a_prefill_rank_gives_to_dequantize_and_cublas_runs_that_path(spec):
    """Where rank() picks ``quant_dequant_cublas`` (large-M weight-only prefills on the H100), quant_linear runs it:
    forced here on a small shape by putting that config in the dispatch's choice."""
    if not dispatch.interpreter_active():
        pytest.skip("Triton's interpreter is off (a GPU reaches this path at its own prefill shapes)")
    from dataclasses import replace

    from autoopt.kernels.config import KernelConfig

    torch.manual_seed(0)
    qw = quantize(torch.randn(256, 192) / 192 ** 0.5, spec)
    x, cpu = torch.randn(40, 192).to(torch.bfloat16), torch.device("cpu")
    spec = qw.fmt.spec
    choice = dispatch.choose("quant_linear", "gemm", (40, 256, 192), torch.bfloat16, cpu, weight=spec)
    config = KernelConfig(kernel="quant_dequant_cublas", template="quant-dequant-cublas",
                          params={"BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4})
    key = ("quant_linear", "gemm", 64, (256, 192), torch.bfloat16, cpu, spec)  # dispatch.choose's key
    dispatch._CACHE[key] = replace(choice, config=config)
    out = ops.quant_linear(x, qw.qweight, qw.scales, qw.offsets, None, weight=spec, k=192)
    assert rel(out.float(), ops.dequant_linear(x, qw, None).float()) < 1e-2
    assert not dispatch.fallback_counts()
