"""autoopt.validation on the CPU: the plain-torch Llama, the prediction side and the comparison logic.

The checks' own targets (5 % memory, 20 % step time) are judged on a GPU host; here a tiny model
(2-4 layers, hidden 256) runs the same functions to show that the model is correct, that what it
allocates is what autoopt counts, and that the comparison and plan handling say what they should.
The command line (``autoopt check``) and ``benchmarks/model_checks.py`` are tested at the end.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from autoopt.errors import BackendError  # noqa: E402
from autoopt.hardware.detection import build_profile  # noqa: E402
from autoopt.hardware.profile import HardwareProfile  # noqa: E402
from autoopt.planning.memory import kv_cache_bytes  # noqa: E402
from autoopt.planning.model import ModelSpec, from_module  # noqa: E402
from autoopt.planning.quant import get_format, weight_bytes  # noqa: E402
from autoopt.validation import check_memory, check_pipeline, summary_table  # noqa: E402
from autoopt.validation.counters import LiveTensorMemory  # noqa: E402
from autoopt.validation.llama import build_model, place, rotate_half  # noqa: E402
from autoopt.validation.memory import MemoryMeasurement, compare_memory, measure_memory, predict_memory  # noqa: E402
from autoopt.validation.pipeline import PlanSummary, StagePlan, predict_pipeline, stages_for  # noqa: E402
from autoopt.validation.run import CheckRun, NotRun  # noqa: E402
from autoopt.validation.timing import Marks, pipeline_forward  # noqa: E402
from autoopt.validation.workload import CheckOptions, OptionError, llama_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
TINY = ModelSpec(name="tiny", architecture="llama", hidden_size=256, intermediate_size=896, num_layers=2,
                 num_attention_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1000)
NO_GPU = HardwareProfile(name="cpu-only")


@pytest.fixture(scope="module")
def h200x2():
    """The profile autoopt builds from a real 2 x H200 capture (the code path of the GPU run)."""
    return build_profile(json.loads((ROOT / "tests" / "fixtures" / "h200x2_live_raw.json").read_text()))


def _options(**extra) -> CheckOptions:
    return CheckOptions(batch=2, prompt_len=32, gen_len=4, warmup=0, reps_prefill=1, reps_decode=1, **extra)


def _committed(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / "h200" / name).read_text())


def _keys(d):
    """The nested key structure of a result (values left out), to compare with a committed file."""
    return {k: _keys(v) for k, v in d.items()} if isinstance(d, dict) else None


# -- the model -------------------------------------------------------------------------------

def test_llama_spec_keeps_the_catalog_shapes_with_fewer_layers():
    s = llama_spec(4)
    assert (s.num_layers, s.hidden_size, s.intermediate_size, s.num_attention_heads, s.num_kv_heads, s.head_dim,
            s.vocab_size, s.tied_embeddings) == (4, 4096, 14336, 32, 8, 128, 128256, False)


def test_built_model_holds_exactly_the_weight_bytes_autoopt_predicts():
    model = build_model(TINY, device=CPU, max_context=16)
    assert model.param_bytes() == weight_bytes(TINY, get_format("bf16")) == 4_565_504


def test_autoopt_reads_the_built_module_back_as_the_same_shapes():
    back = from_module(build_model(TINY, device=CPU, max_context=16))
    keys = ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
            "vocab_size", "tied_embeddings", "norm", "norms_per_layer", "qkv_bias")
    assert {k: getattr(back, k) for k in keys} == {k: getattr(TINY, k) for k in keys}


def test_kv_cache_tensors_hold_exactly_the_bytes_autoopt_predicts():
    model = build_model(TINY, device=CPU, max_context=40)
    assert model.allocate_kv(3, 40) == kv_cache_bytes(TINY, batch=3, context=40) == 2 * 2 * 2 * 64 * 2 * 3 * 40


def test_attention_equals_naive_causal_grouped_query_attention():
    model = build_model(TINY, device=CPU, dtype=torch.float32, max_context=8)
    model.allocate_kv(2, 8)
    attn = model.layers[0].self_attn
    x = torch.randn(2, 8, 256)
    cos, sin = model.rope(CPU)
    with torch.inference_mode():
        out = attn(x, cos, sin, 0)
        q = attn.q_proj(x).view(2, 8, 4, 64).transpose(1, 2)
        k = attn.k_proj(x).view(2, 8, 2, 64).transpose(1, 2)
        v = attn.v_proj(x).view(2, 8, 2, 64).transpose(1, 2)
        q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2)) / 8.0 + torch.full((8, 8), float("-inf")).triu(1)
        ref = attn.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 8, 256))
    assert torch.allclose(out, ref, atol=1e-5)


def test_prefill_then_decode_through_the_kv_cache_equals_one_full_forward():
    model = build_model(TINY, device=CPU, dtype=torch.float32, max_context=20)
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
    model = build_model(TINY, device=CPU, max_context=16)
    model.allocate_kv(1, 16)
    with torch.inference_mode(), pytest.raises(ValueError, match="chunked prefill"):
        model(torch.zeros(1, 4, dtype=torch.long), 4)


def test_two_stage_pipeline_gives_the_single_device_logits_and_times_each_part():
    model = build_model(TINY, device=CPU, dtype=torch.float32, max_context=12)
    model.allocate_kv(2, 12)
    ids = torch.randint(TINY.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        single = model(ids, 0)
        marks = Marks()
        piped = pipeline_forward(model, ids, 0, [(range(0, 1), CPU), (range(1, 2), CPU)], marks)
    assert torch.equal(piped, single)
    assert sorted(marks.spans()) == ["stage0", "stage1", "xfer0"]


def test_place_refuses_stages_that_skip_a_layer():
    model = build_model(TINY, device=CPU, max_context=8)
    with pytest.raises(ValueError, match=r"cover layers 0\.\.1"):
        place(model, [(range(0, 1), CPU), (range(2, 2), CPU)])


# -- memory: measurement and comparison --------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_memory():
    measured = measure_memory(TINY, device=CPU, batch=2, prompt_len=64, gen_len=4, mem=LiveTensorMemory())
    predicted = predict_memory(TINY, gpu=None, batch=2, prompt_len=64, gen_len=4)
    return predicted, measured, compare_memory(TINY, predicted, measured, batch=2)


def test_measured_terms_add_up_to_the_measured_peak(tiny_memory):
    _, measured, cmp = tiny_memory
    assert sum(t.measured_bytes or 0 for t in cmp.terms.values()) == measured.peak_bytes


def test_weights_and_kv_cache_terms_match_exactly(tiny_memory):
    _, _, cmp = tiny_memory
    assert cmp.terms["weights"].gap_bytes == 0
    assert cmp.terms["kv_cache"].gap_bytes == 0
    assert cmp.terms["unmodelled"].measured_bytes == 2 * 68 * 64 * 2  # RoPE cos+sin, 68 positions


def test_prefill_peak_holds_three_hidden_and_three_mlp_wide_tensors_per_token(tiny_memory):
    # transformers' layer keeps the layer input, the residual and the normed input (3 x hidden) alive
    # next to gate/silu/up (3 x intermediate); autoopt counts 2 x hidden.
    _, measured, cmp = tiny_memory
    per_token = cmp.terms["activations"].measured_bytes / 2 / (2 * 64)
    assert measured.peak_phase == "prefill"
    assert abs(per_token - (3 * 256 + 3 * 896)) < 0.05 * 256
    assert "3.0" in cmp.analysis and "hidden-size tensors were live" in cmp.analysis


def _synthetic(predicted, act_scale):
    weights, kv = round(predicted.weights), round(predicted.weights + predicted.kv_cache)
    peak = round(predicted.weights + predicted.kv_cache + predicted.workspace + act_scale * predicted.activations)
    return MemoryMeasurement(baseline_bytes=0, after_weights_bytes=weights, after_kv_bytes=kv, param_bytes=weights,
                             rope_table_bytes=0, kv_tensor_bytes=kv - weights, prefill_peak_bytes=peak,
                             decode_peak_bytes=0, peak_bytes=peak, workspace_bytes=round(predicted.workspace),
                             reserved_peak_bytes=peak, prefill_logits_finite=True, peak_phase="prefill")


@pytest.mark.parametrize(("act_scale", "passes"), [(1.0, True), (1.4, True), (2.0, False)])
def test_total_is_judged_against_five_percent_of_the_peak(act_scale, passes):
    spec = llama_spec(4)
    predicted = predict_memory(spec, gpu=None, batch=4, prompt_len=1024, gen_len=16)
    cmp = compare_memory(spec, predicted, _synthetic(predicted, act_scale), batch=4)
    assert cmp.total.passed is passes
    assert cmp.to_dict()["total"]["pass"] is passes


def test_analysis_names_the_term_that_carries_the_gap():
    spec = llama_spec(4)
    predicted = predict_memory(spec, gpu=None, batch=4, prompt_len=1024, gen_len=16)
    cmp = compare_memory(spec, predicted, _synthetic(predicted, 1.5), batch=4)
    assert "Largest term gap: activations" in cmp.analysis
    assert cmp.terms["activations"].ratio == pytest.approx(1 / 1.5, rel=1e-6)


def test_check_memory_runs_on_the_cpu_and_keeps_context_and_driver_apart():
    out = check_memory(_options(), profile=NO_GPU, device=CPU, spec=TINY)
    assert out.outside_allocator["predicted_reserve_bytes"] > 0
    assert out.comparison.total.predicted_is == "weights + kv_cache + activations + workspace"
    assert "max_memory_allocated" in out.comparison.scope
    assert "allocator peak" in summary_table({"memory": out.to_dict()})
    # the result file keeps the format of the committed GPU runs
    assert _keys(json.loads(json.dumps(out.to_dict()))) == _keys(_committed("model_checks_memory.json")["memory"])


def test_check_memory_without_a_device_on_a_machine_with_no_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(BackendError, match="no CUDA device"):
        check_memory(_options(), profile=NO_GPU, spec=TINY)


# -- pipeline: prediction and the CPU run of the same code --------------------------------------

def test_pipeline_prediction_is_the_sum_of_stages_plus_transfer_not_the_microbatched_makespan(h200x2):
    pipe = predict_pipeline(h200x2, llama_spec(8), phase="prefill", batch=4, prompt_len=1024).pipeline
    assert [s.layers for s in pipe.stages] == [(0, 4), (4, 8)]
    assert pipe.sequential_us == pytest.approx(sum(s.predicted_us for s in pipe.stages) + pipe.transfer_us)
    # 4096 tokens x 4096 x bf16 over 450 GB/s NVLink
    assert pipe.transfer_us == pytest.approx(4096 * 4096 * 2 / 450e3)
    assert pipe.plan_microbatches > 1 and pipe.plan_predicted_us < pipe.sequential_us


def test_single_gpu_decode_prediction_has_no_transfer(h200x2):
    single = predict_pipeline(h200x2, llama_spec(8), phase="decode", batch=4, prompt_len=1024).single
    assert single.transfer_us == 0.0 and single.sequential_us == single.plan_predicted_us


def test_plan_stage_k_runs_on_torch_device_k_and_no_plan_splits_evenly():
    devs = [torch.device("cuda", 0), torch.device("cuda", 1)]
    plan = PlanSummary(kind="pipeline", tp=1, pp=2, fits=True, transfer_us=0.0, sequential_us=0.0,
                       plan_predicted_us=0.0, plan_microbatches=1,
                       stages=tuple(StagePlan(layers=lay, profile_devices=(k,), device_name="gpu", predicted_us=0.0)
                                    for k, lay in enumerate(((0, 5), (5, 8)))))
    stages, how = stages_for(plan, 8, devs)
    assert stages == [(range(0, 5), devs[0]), (range(5, 8), devs[1])] and "planner" in how
    stages, how = stages_for(None, 8, devs)
    assert stages == [(range(0, 4), devs[0]), (range(4, 8), devs[1])] and "even split" in how


def test_check_pipeline_runs_every_eager_step_on_cpu_devices(h200x2):
    spec = ModelSpec.from_dict({**TINY.to_dict(), "num_layers": 4})
    out = check_pipeline(_options(), profiles={"detected": h200x2}, devices=[CPU, CPU], spec=spec)
    steps = {(r.layout, r.step) for r in out.rows if r.profile == "detected"}
    assert steps == {("single", "prefill"), ("single", "decode_eager"), ("pipeline", "prefill"),
                     ("pipeline", "decode_eager")}
    assert all(r.verdict.measured_us > 0 for r in out.rows)
    assert {p.part for p in out.measurements["pipeline"]["prefill"].vs["detected"].stages} == \
        {"stage0 layers 0-1", "stage1 layers 2-3", "transfer"}
    data = json.loads(json.dumps(out.to_dict()))
    assert "pipeline prefill [detected]" in summary_table({"pipeline": data})
    # the result file keeps the format of the committed 2 x H200 run
    committed = _committed("model_checks_2xh200.json")["pipeline"]
    assert list(data) == list(committed)
    assert _keys(data["rows"][0]) == _keys(committed["rows"][0])
    assert _keys(data["predictions"]["detected"]) == _keys(committed["predictions"]["detected"])
    assert _keys(data["measurements"]["pipeline"]["prefill"]) == \
        _keys({**committed["measurements"]["pipeline"]["prefill"],
               "vs": {"detected": committed["measurements"]["pipeline"]["prefill"]["vs"]["detected"]}})


# -- the run record and the options -----------------------------------------------------------------

def test_a_raised_check_fails_the_run_and_a_skipped_one_does_not():
    skipped = CheckRun(meta={}, args={}, profiles={}, pipeline=NotRun(reason="needs 2 GPUs; torch sees 1",
                                                                      skipped=True))
    assert not skipped.failed and skipped.to_dict()["pipeline"] == {"skipped": "needs 2 GPUs; torch sees 1"}
    failed = dataclasses.replace(skipped, memory=NotRun(reason="RuntimeError: boom"))
    assert failed.failed and failed.to_dict()["memory"] == {"error": "RuntimeError: boom"}
    assert list(failed.to_dict()) == list(_committed("model_checks_memory.json"))
    assert "RuntimeError: boom" in summary_table(failed.to_dict())


def test_prompt_beyond_the_prefill_chunk_is_refused():
    with pytest.raises(OptionError, match="prefill chunk"):
        CheckOptions(batch=16, prompt_len=1024)


def test_importing_the_package_imports_no_torch():
    code = "import sys, autoopt.validation, autoopt.validation.run; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False"


def test_only_the_command_line_imports_the_package():
    importers = set()
    for path in (ROOT / "autoopt").rglob("*.py"):
        if "validation" in path.relative_to(ROOT / "autoopt").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "autoopt.validation" or n.startswith("autoopt.validation.") for n in names):
                importers.add(path.relative_to(ROOT).as_posix())
    assert importers <= {"autoopt/cli/check.py"}


# -- the command line and the benchmark script ------------------------------------------------------

def _autoopt(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "autoopt", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_cli_check_memory_without_a_gpu_is_one_line_and_exit_2():
    res = _autoopt("check", "memory")
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoopt: error: ") and "no CUDA device" in lines[0]


def test_cli_check_refuses_a_bad_option_or_model_in_one_line():
    for args, needle in ((("--batch", "0"), "batch must be positive"), (("--model", "mixtral-8x7b"), "dense Llama")):
        res = _autoopt("check", "memory", *args)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and needle in res.stderr


def _script():
    spec = importlib.util.spec_from_file_location("model_checks", ROOT / "benchmarks" / "model_checks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_script_without_cuda_prints_one_line_and_exits_2(capsys, tmp_path):
    assert _script().main(["--out", str(tmp_path / "x.json")]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA device" in out
    assert not (tmp_path / "x.json").exists()


def test_script_refuses_a_prompt_beyond_the_prefill_chunk():
    with pytest.raises(SystemExit) as exc:
        _script().parse_args(["--out", "x.json", "--batch", "16", "--prompt-len", "1024"])
    assert exc.value.code == 2
