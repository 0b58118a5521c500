"""benchmarks/model_checks.py on the CPU: the plain-torch Llama, the prediction side and the comparison logic.

The GPU script's own targets (5 % memory, 20 % step time) are judged on a GPU host;
here a tiny model (2-4 layers, hidden 256) runs the same functions to show that the
model is correct, that what it allocates is what autoopt counts, and that the
comparison and plan handling say what they should.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from autoopt.hardware.detection import build_profile  # noqa: E402
from autoopt.planning.memory import kv_cache_bytes  # noqa: E402
from autoopt.planning.model import ModelSpec, from_module  # noqa: E402
from autoopt.planning.quant import get_format, weight_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("model_checks", ROOT / "benchmarks" / "model_checks.py")
mc = importlib.util.module_from_spec(_spec)
sys.modules["model_checks"] = mc
_spec.loader.exec_module(mc)

CPU = torch.device("cpu")
TINY = ModelSpec(name="tiny", architecture="llama", hidden_size=256, intermediate_size=896, num_layers=2,
                 num_attention_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1000)


@pytest.fixture(scope="module")
def h200x2():
    """The profile autoopt builds from a real 2 x H200 capture (the code path of the GPU run)."""
    return build_profile(json.loads((ROOT / "tests" / "fixtures" / "h200x2_live_raw.json").read_text()))


def _args(*extra: str):
    return mc.parse_args(["--out", "unused.json", "--batch", "2", "--prompt-len", "32", "--gen-len", "4",
                          "--warmup", "0", "--reps-prefill", "1", "--reps-decode", "1", *extra])


# -- the model -------------------------------------------------------------------------------

def test_llama_spec_keeps_the_catalog_shapes_with_fewer_layers():
    s = mc.llama_spec(4)
    assert (s.num_layers, s.hidden_size, s.intermediate_size, s.num_attention_heads, s.num_kv_heads, s.head_dim,
            s.vocab_size, s.tied_embeddings) == (4, 4096, 14336, 32, 8, 128, 128256, False)


def test_built_model_holds_exactly_the_weight_bytes_autoopt_predicts():
    model = mc.build_model(TINY, device=CPU, max_context=16)
    assert model.param_bytes() == weight_bytes(TINY, get_format("bf16")) == 4_565_504


def test_autoopt_reads_the_built_module_back_as_the_same_shapes():
    back = from_module(mc.build_model(TINY, device=CPU, max_context=16))
    keys = ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
            "vocab_size", "tied_embeddings", "norm", "norms_per_layer", "qkv_bias")
    assert {k: getattr(back, k) for k in keys} == {k: getattr(TINY, k) for k in keys}


def test_kv_cache_tensors_hold_exactly_the_bytes_autoopt_predicts():
    model = mc.build_model(TINY, device=CPU, max_context=40)
    assert model.allocate_kv(3, 40) == kv_cache_bytes(TINY, batch=3, context=40) == 2 * 2 * 2 * 64 * 2 * 3 * 40


def test_attention_equals_naive_causal_grouped_query_attention():
    model = mc.build_model(TINY, device=CPU, dtype=torch.float32, max_context=8)
    model.allocate_kv(2, 8)
    attn = model.layers[0].self_attn
    x = torch.randn(2, 8, 256)
    cos, sin = model.rope(CPU)
    with torch.inference_mode():
        out = attn(x, cos, sin, 0)
        q = attn.q_proj(x).view(2, 8, 4, 64).transpose(1, 2)
        k = attn.k_proj(x).view(2, 8, 2, 64).transpose(1, 2)
        v = attn.v_proj(x).view(2, 8, 2, 64).transpose(1, 2)
        q, k = (t * cos + mc._rotate_half(t) * sin for t in (q, k))
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2)) / 8.0 + torch.full((8, 8), float("-inf")).triu(1)
        ref = attn.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 8, 256))
    assert torch.allclose(out, ref, atol=1e-5)


def test_prefill_then_decode_through_the_kv_cache_equals_one_full_forward():
    model = mc.build_model(TINY, device=CPU, dtype=torch.float32, max_context=20)
    ids = torch.randint(TINY.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        model.allocate_kv(2, 20)
        full = model(ids, 0)
        model.allocate_kv(2, 20)
        model(ids[:, :16], 0)
        for pos in range(16, 20):
            last = model(ids[:, pos:pos + 1], pos)
    assert torch.allclose(last, full, atol=1e-4)


def test_multi_token_step_after_position_zero_is_refused():
    model = mc.build_model(TINY, device=CPU, max_context=16)
    model.allocate_kv(1, 16)
    with torch.inference_mode(), pytest.raises(ValueError, match="chunked prefill"):
        model(torch.zeros(1, 4, dtype=torch.long), 4)


def test_two_stage_pipeline_gives_the_single_device_logits_and_times_each_part():
    model = mc.build_model(TINY, device=CPU, dtype=torch.float32, max_context=12)
    model.allocate_kv(2, 12)
    ids = torch.randint(TINY.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        single = model(ids, 0)
        marks = mc.Marks()
        piped = mc.pipeline_forward(model, ids, 0, [(range(0, 1), CPU), (range(1, 2), CPU)], marks)
    assert torch.equal(piped, single)
    assert sorted(marks.spans()) == ["stage0", "stage1", "xfer0"]


def test_place_refuses_stages_that_skip_a_layer():
    model = mc.build_model(TINY, device=CPU, max_context=8)
    with pytest.raises(ValueError, match="cover layers 0..1"):
        mc.place(model, [(range(0, 1), CPU), (range(2, 2), CPU)])


# -- memory: measurement and comparison --------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_memory():
    measured = mc.measure_memory(TINY, device=CPU, batch=2, prompt_len=64, gen_len=4, mem=mc.LiveTensorMemory())
    predicted = mc.predict_memory(TINY, gpu=None, batch=2, prompt_len=64, gen_len=4)
    return predicted, measured, mc.compare_memory(TINY, predicted, measured, batch=2)


def test_measured_terms_add_up_to_the_measured_peak(tiny_memory):
    _, measured, cmp = tiny_memory
    assert sum(t["measured_bytes"] or 0 for t in cmp["terms"].values()) == measured["peak_bytes"]


def test_weights_and_kv_cache_terms_match_exactly(tiny_memory):
    _, _, cmp = tiny_memory
    assert cmp["terms"]["weights"]["gap_bytes"] == 0
    assert cmp["terms"]["kv_cache"]["gap_bytes"] == 0
    assert cmp["terms"]["unmodelled"]["measured_bytes"] == 2 * 68 * 64 * 2  # RoPE cos+sin, 68 positions


def test_prefill_peak_holds_three_hidden_and_three_mlp_wide_tensors_per_token(tiny_memory):
    # transformers' layer keeps the layer input, the residual and the normed input (3 x hidden) alive
    # next to gate/silu/up (3 x intermediate); autoopt counts 2 x hidden.
    _, measured, cmp = tiny_memory
    per_token = cmp["terms"]["activations"]["measured_bytes"] / 2 / (2 * 64)
    assert measured["peak_phase"] == "prefill"
    assert abs(per_token - (3 * 256 + 3 * 896)) < 0.05 * 256
    assert "3.0" in cmp["analysis"] and "hidden-size tensors were live" in cmp["analysis"]


def _synthetic(predicted, act_scale):
    return {"peak_bytes": round(predicted["weights"] + predicted["kv_cache"] + predicted["workspace"]
                                + act_scale * predicted["activations"]),
            "param_bytes": round(predicted["weights"]), "after_weights_bytes": round(predicted["weights"]),
            "after_kv_bytes": round(predicted["weights"] + predicted["kv_cache"]),
            "workspace_bytes": round(predicted["workspace"])}


@pytest.mark.parametrize(("act_scale", "passes"), [(1.0, True), (1.4, True), (2.0, False)])
def test_total_is_judged_against_five_percent_of_the_peak(act_scale, passes):
    spec = mc.llama_spec(4)
    predicted = mc.predict_memory(spec, gpu=None, batch=4, prompt_len=1024, gen_len=16)
    cmp = mc.compare_memory(spec, predicted, _synthetic(predicted, act_scale), batch=4)
    assert cmp["total"]["pass"] is passes


def test_analysis_names_the_term_that_carries_the_gap():
    spec = mc.llama_spec(4)
    predicted = mc.predict_memory(spec, gpu=None, batch=4, prompt_len=1024, gen_len=16)
    cmp = mc.compare_memory(spec, predicted, _synthetic(predicted, 1.5), batch=4)
    assert "Largest term gap: activations" in cmp["analysis"]
    assert cmp["terms"]["activations"]["ratio"] == pytest.approx(1 / 1.5, rel=1e-6)


def test_check_memory_runs_on_the_cpu_and_keeps_context_and_driver_apart():
    out = mc.check_memory(_args(), None, device=CPU, spec=TINY)
    assert out["outside_allocator"]["predicted_reserve_bytes"] > 0
    assert out["total"]["predicted_is"] == "weights + kv_cache + activations + workspace"
    assert "max_memory_allocated" in out["scope"]
    assert "allocator peak" in mc.summary_table({"memory": out})


# -- pipeline: prediction and the CPU run of the same code --------------------------------------

def test_pipeline_prediction_is_the_sum_of_stages_plus_transfer_not_the_microbatched_makespan(h200x2):
    pred = mc.predict_pipeline(h200x2, mc.llama_spec(8), phase="prefill", batch=4, prompt_len=1024)
    pipe = pred["pipeline"]
    assert [s["layers"] for s in pipe["stages"]] == [[0, 4], [4, 8]]
    assert pipe["sequential_us"] == pytest.approx(sum(s["predicted_us"] for s in pipe["stages"])
                                                  + pipe["transfer_us"])
    # 4096 tokens x 4096 x bf16 over 450 GB/s NVLink
    assert pipe["transfer_us"] == pytest.approx(4096 * 4096 * 2 / 450e3)
    assert pipe["plan_microbatches"] > 1 and pipe["plan_predicted_us"] < pipe["sequential_us"]


def test_single_gpu_decode_prediction_has_no_transfer(h200x2):
    single = mc.predict_pipeline(h200x2, mc.llama_spec(8), phase="decode", batch=4, prompt_len=1024)["single"]
    assert single["transfer_us"] == 0.0 and single["sequential_us"] == single["plan_predicted_us"]


def test_plan_stage_k_runs_on_torch_device_k_and_no_plan_splits_evenly():
    devs = [torch.device("cuda", 0), torch.device("cuda", 1)]
    stages, how = mc.stages_for({"stages": [{"layers": [0, 5]}, {"layers": [5, 8]}]}, 8, devs)
    assert stages == [(range(0, 5), devs[0]), (range(5, 8), devs[1])] and "planner" in how
    stages, how = mc.stages_for(None, 8, devs)
    assert stages == [(range(0, 4), devs[0]), (range(4, 8), devs[1])] and "even split" in how


def test_check_pipeline_runs_every_eager_step_on_cpu_devices(h200x2):
    spec = ModelSpec.from_dict({**TINY.to_dict(), "num_layers": 4})
    out = mc.check_pipeline(_args(), {"detected": h200x2}, devices=[CPU, CPU], spec=spec)
    steps = {(r["layout"], r["step"]) for r in out["rows"] if r["profile"] == "detected"}
    assert steps == {("single", "prefill"), ("single", "decode_eager"), ("pipeline", "prefill"),
                     ("pipeline", "decode_eager")}
    assert all(r["measured_us"] > 0 for r in out["rows"])
    assert {r["part"] for r in out["measurements"]["pipeline"]["prefill"]["vs"]["detected"]["stages"]} == \
        {"stage0 layers 0-1", "stage1 layers 2-3", "transfer"}
    json.dumps(out)
    assert "pipeline prefill [detected]" in mc.summary_table({"pipeline": out})


# -- the command line -----------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_without_cuda_it_prints_one_line_and_exits_2(capsys, tmp_path):
    assert mc.main(["--out", str(tmp_path / "x.json")]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA device" in out
    assert not (tmp_path / "x.json").exists()


def test_prompt_beyond_the_prefill_chunk_is_refused():
    with pytest.raises(SystemExit) as exc:
        mc.parse_args(["--out", "x.json", "--batch", "16", "--prompt-len", "1024"])
    assert exc.value.code == 2
