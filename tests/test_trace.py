"""autoopt trace: streaming reader, kernel classifier, summary and compare of profiler traces.

The GPU traces here are written in Kineto's Chrome-trace format by :func:`_kineto` with kernel names in
the forms cuBLAS, FlashAttention, ATen, NCCL and Inductor emit; they are hand-made (no GPU in CI).
The CPU trace is a real one, exported by torch.profiler in the test.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import pytest

from autoopt.errors import TraceError
from autoopt.trace import classify, compare, inductor_ops, read, summarize

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501 - verbatim kernel name
NVJET = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, true, false, false, true, true, false>(pytorch_flash::Flash_fwd_params)"  # noqa: E501 - verbatim kernel name
ATEN_ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"  # noqa: E501 - verbatim kernel name
ATEN_POW = "void at::native::vectorized_elementwise_kernel<4, at::native::pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#1}, std::array<char*, 2ul>)"  # noqa: E501 - verbatim kernel name
ATEN_MEAN = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4>)"  # noqa: E501 - verbatim kernel name
SILU = "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#8}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#8}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)"  # noqa: E501 - verbatim kernel name
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RMS_FUSED = "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1"
SILU_FUSED = "triton_poi_fused_mul_silu_2"
HIP = "Cijk_Alik_Bljk_BBS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1_ABV0"


def _kineto(path: Path, kernels: list[tuple[str, float]], *, steps: int = 1, gz: bool = False,
            memcpy: int = 0) -> Path:
    """A trace in the layout torch.profiler's export_chrome_trace writes, kernels back to back per step."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    t = 1000.0
    for s in range(steps):
        start = t
        for name, dur in kernels:
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t, "dur": dur,
                           "args": {"device": 0, "stream": 7}})
            t += dur + 1.0
        for _ in range(memcpy):
            events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0,
                           "tid": 7, "ts": t, "dur": 2.0})
            t += 3.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                       "ts": start, "dur": t - start})
    doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events, "traceName": str(path)}
    text = json.dumps(doc)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


# an eager Llama-style layer: RMSNorm as ATen pow/mean/mul kernels, SiLU and mul separate
EAGER = [(ATEN_POW, 3.0), (ATEN_MEAN, 4.0), (ATEN_ADD, 3.0), (GEMM, 40.0), (FLASH, 20.0), (GEMM, 15.0),
         (ATEN_ADD, 3.0), (ATEN_POW, 3.0), (ATEN_MEAN, 4.0), (NVJET, 60.0), (SILU, 5.0), (ATEN_ADD, 4.0),
         (GEMM, 30.0)]
# the same layer under torch.compile: Inductor fuses each norm (with its residual add) and the SiLU*mul
COMPILED = [(RMS_FUSED, 5.0), (GEMM, 40.0), (FLASH, 20.0), (GEMM, 15.0), (RMS_FUSED, 5.0), (NVJET, 60.0),
            (SILU_FUSED, 5.0), (GEMM, 30.0)]


@pytest.mark.parametrize(("name", "cls"), [
    (GEMM, "gemm"), (NVJET, "gemm"), (HIP, "gemm"), (FLASH, "attention"), (ATEN_ADD, "elementwise"),
    (ATEN_MEAN, "reduction"), (SILU, "activation"), (NCCL, "communication"), (RMS_FUSED, "norm"),
    (SILU_FUSED, "activation"), ("triton_tem_fused_mm_0", "gemm"), ("_gemv_kernel", "gemm"),
    ("rms_norm_kernel", "norm"), ("ck_fmha_fwd_d128", "attention"), ("fused_moe_kernel", "moe_gemm"),
])
def test_kernel_names_of_each_library_land_in_their_class(name, cls):
    assert classify(name) == cls


def test_inductor_names_give_the_ops_they_fused():
    assert inductor_ops(RMS_FUSED) == ("_to_copy", "add", "mean", "mul", "pow", "rsqrt")
    assert inductor_ops(GEMM) == ()


def test_a_trace_is_summarized_by_class_and_the_classes_add_up_to_the_total(tmp_path):
    ev = read(_kineto(tmp_path / "eager.json", EAGER, steps=3, memcpy=1))
    s = summarize(ev)
    assert s.steps == 3 and s.kernels == 3 * (len(EAGER) + 1)
    assert sum(us for us, _ in s.by_class.values()) == pytest.approx(s.total_us)
    assert s.total_us == pytest.approx(3 * (sum(d for _, d in EAGER) + 2.0))
    assert s.per_step("gemm") == (pytest.approx(145.0), pytest.approx(4.0))
    assert s.other_share == 0.0


def test_gzipped_traces_read_the_same(tmp_path):
    plain = summarize(read(_kineto(tmp_path / "a.json", EAGER)))
    packed = summarize(read(_kineto(tmp_path / "a.json.gz", EAGER, gz=True)))
    assert plain.by_class == packed.by_class


def test_compare_finds_what_inductor_fused_and_what_it_saves(tmp_path):
    a = summarize(read(_kineto(tmp_path / "eager.json", EAGER, steps=2)))
    b = summarize(read(_kineto(tmp_path / "compiled.json", COMPILED, steps=2)))
    out = compare(a, b)
    rows = {r["class"]: r for r in out["classes"]}
    assert rows["gemm"]["ratio_b_over_a"] == 1.0
    assert rows["norm"]["a_us"] == 0.0 and rows["norm"]["b_us"] == 10.0
    fused = [f for f in out["fusions"] if f["kind"] == "fused kernel" and f["kernel"] == RMS_FUSED]
    assert fused and fused[0]["side"] == "b" and fused[0]["launches_saved_per_step"] > 0
    assert any(f["kind"] == "class only on one side" and f["class"] == "norm" and f["side"] == "b"
               for f in out["fusions"])


def test_a_real_cpu_only_profiler_trace_is_refused_by_name(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.nn.Linear(8, 8)(torch.randn(2, 8))
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    with pytest.raises(TraceError, match="CPU-only trace"):
        read(path)


@pytest.mark.parametrize(("content", "needle"), [
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}, {"ph": "X", "ca',
     "truncated"),
    (bytes(range(256)) * 4, "not UTF-8"),
    (b'{"schemaVersion": 1}', "no \\\"traceEvents\\\""),
    (b"hello", "does not start with a JSON object or array"),
    (b"", "empty"),
    (b'{"traceEvents": []}', "no events"),
])
def test_bad_trace_files_raise_a_typed_error_naming_the_problem(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=needle):
        read(path)


def test_a_folder_is_not_read_as_a_trace(tmp_path):
    with pytest.raises(TraceError, match="not a regular file"):
        read(tmp_path)


def test_a_large_trace_is_streamed_in_bounded_memory(tmp_path):
    """200k kernels (about 30 MB of JSON): peak Python memory stays far below the file size."""
    import tracemalloc

    path = _kineto(tmp_path / "big.json", EAGER * 2000, steps=8)
    size = path.stat().st_size
    tracemalloc.start()
    ev = read(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(ev) == len(EAGER) * 2000 * 8
    assert peak < size / 4


def test_cli_summary_and_compare(tmp_path, capsys):
    from autoopt.cli import main

    a = _kineto(tmp_path / "eager.json", EAGER)
    b = _kineto(tmp_path / "compiled.json", COMPILED)
    assert main(["trace", "summary", str(a), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["by_class"]["gemm"]["launches"] == 4
    png = tmp_path / "classes.png"
    assert main(["trace", "compare", str(a), str(b), "--plot", str(png)]) == 0
    assert "fusion differences" in capsys.readouterr().out and png.stat().st_size > 1000


def test_cli_bad_trace_is_one_line_exit_2(tmp_path, capsys):
    from autoopt.cli import main

    bad = tmp_path / "t.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X"')
    assert main(["trace", "summary", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truncated" in err


def test_a_plugin_adds_a_kernel_rule(tmp_path):
    from autoopt.plugins.hookspecs import hookimpl
    from autoopt.plugins.manager import get_plugin_manager, reset_plugin_manager
    from autoopt.trace import rules

    class Plugin:
        @hookimpl
        def autoopt_trace_rules(self):
            return [{"class": "attention", "pattern": r"^my_paged_decode"}, {"class": "nope", "pattern": "x"}]

    reset_plugin_manager()
    try:
        get_plugin_manager().register(Plugin(), name="trace-plugin")
        assert classify("my_paged_decode_v2", rules=rules()) == "attention"
        assert classify("my_paged_decode_v2") == "other"
        assert get_plugin_manager().problems
    finally:
        reset_plugin_manager()


def test_the_repeating_layer_is_found_from_the_kernel_sequence(tmp_path):
    ev = read(_kineto(tmp_path / "eager.json", EAGER * 32, steps=2))
    s = summarize(ev)
    assert s.layers_per_step == 32
    assert s.layer_us == pytest.approx(sum(d for _, d in EAGER))


def test_traces_of_models_with_different_layer_counts_are_refused(tmp_path):
    a = summarize(read(_kineto(tmp_path / "a.json", EAGER * 32)))
    b = summarize(read(_kineto(tmp_path / "b.json", COMPILED * 28)))
    with pytest.raises(TraceError, match="32 and 28 layers per step: different models"):
        compare(a, b)


def test_eager_and_compiled_runs_of_one_model_compare_per_layer(tmp_path):
    a = summarize(read(_kineto(tmp_path / "a.json", EAGER * 32)))
    b = summarize(read(_kineto(tmp_path / "b.json", COMPILED * 32)))
    out = compare(a, b)
    assert out["layers_per_step"] == 32
    assert out["a_layer_us"] == pytest.approx(194.0) and out["b_layer_us"] == pytest.approx(180.0)


def test_known_hand_written_fused_kernels_are_decomposed():
    assert inductor_ops("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, ...)") == \
        ("add", "rsqrt")
    assert classify("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, ...)") == "norm"
    assert inductor_ops("void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel>(...)") == ("silu", "mul")


def test_compare_reports_launches_per_layer(tmp_path):
    a = summarize(read(_kineto(tmp_path / "a.json", EAGER * 4)))
    b = summarize(read(_kineto(tmp_path / "b.json", COMPILED * 4)))
    rows = {r["class"]: r for r in compare(a, b)["classes"]}
    assert rows["elementwise"]["a_launches_per_layer"] == 5.0 and rows["elementwise"]["b_launches_per_layer"] == 0.0


# -- real traces: Llama-3-8B (random bf16 weights) profiled on the lent H100 and H200 ------------------
# (benchmarks/capture_traces.py; GPU events and step markers of 3 profiled steps, CPU ops dropped)
REAL = Path(__file__).parent / "fixtures" / "traces"


@functools.cache
def _real(name: str):
    return summarize(read(REAL / f"{name}.json.gz"))


@pytest.mark.parametrize("name", ["h100_llama3-8b_eager_decode_b1", "h100_llama3-8b_compile_decode_b1",
                                  "h200_llama3-8b_eager_prefill_b1", "h200_llama3-8b_compile_prefill_b1"])
def test_real_traces_are_98_percent_classified_and_their_classes_sum_to_the_total(name: str) -> None:
    s = _real(name)
    assert s.to_dict()["other_share"] <= 0.02
    assert sum(us for us, _ in s.by_class.values()) == pytest.approx(s.total_us, rel=0.01)
    assert s.steps == 3 and s.layers_per_step == 32  # Llama-3-8B has 32 layers


def test_real_eager_and_compiled_traces_compare_as_one_model_with_the_same_gemm_launches() -> None:
    eager, compiled = _real("h100_llama3-8b_eager_decode_b1"), _real("h100_llama3-8b_compile_decode_b1")
    report = compare(eager, compiled)
    gemm = next(r for r in report["classes"] if r["class"] == "gemm")
    assert gemm["a_launches"] == gemm["b_launches"] == 386  # 32 x (q, k, v, o, gate, up, down) + ... per step
    assert compiled.per_step("norm")[1] == 65  # Inductor's fused RMSNorm: 2 per layer + the final one


def test_inductor_pointwise_kernel_named_for_sdpa_is_rope_not_attention() -> None:
    # a real kernel name from the H100 compile trace: RoPE for cuDNN attention's inputs, a pointwise kernel
    name = ("triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy__unsafe_view_add_arange_bmm_cat_"
            "clone_cos_expand_le_mul_neg_scalar_tensor_sin_slice_transpose_unsqueeze_view_where_5")
    assert classify(name) == "rotary"
    assert classify("triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_14") == "norm"


# -- fusions attributed by aligning the two runs on their GEMM/attention launches ---------------------------
DECODE = ("h100_llama3-8b_eager_decode_b1", "h100_llama3-8b_compile_decode_b1")
PREFILL = ("h200_llama3-8b_eager_prefill_b1", "h200_llama3-8b_compile_prefill_b1")


def _fused(report: dict) -> list[dict]:
    return [f for f in report["fusions"] if f["kind"] != "class only on one side"]


@pytest.mark.parametrize(("pair", "total"), [(DECODE, 1778.51), (PREFILL, 11363.56)])
def test_real_fusion_savings_add_up_to_no_more_than_the_time_between_gemms_the_compiled_step_lost(pair, total):
    """Each eager kernel's time is credited to at most one fusion. The bound is the step difference less the
    GEMM/attention difference: on the H200 prefill trace compile's GEMMs and cuDNN attention run 7.8 ms per
    step slower than eager's, so its step is only 3.5 ms shorter while fusions saved 11.4 ms."""
    report = compare(_real(pair[0]), _real(pair[1]))
    align = report["fusion_alignment"]
    saved = [f["us_saved_per_step"] for f in _fused(report)]
    between = align["a_step_us"] - align["b_step_us"] - align["a_minus_b_us"]["anchor kernels"]
    assert align["mode"] == "aligned segments"
    assert sum(saved) == pytest.approx(total, abs=0.05)
    assert sum(saved) <= between + 0.05
    assert max(saved) <= align["a_step_us"]
    if pair == DECODE:  # GEMMs and attention about as fast on both sides: the step difference bounds it too
        assert sum(saved) <= align["a_step_us"] - align["b_step_us"]


def test_real_compiled_rmsnorm_replaces_the_eager_reduction_and_elementwise_kernels() -> None:
    norms = [f for f in _fused(compare(_real(DECODE[0]), _real(DECODE[1])))
             if f["side"] == "b" and {"rsqrt", "mean", "pow"} <= set(f["ops"])]
    main = max(norms, key=lambda f: f["launches_per_step"])  # the per-layer norms (+ residual add)
    assert main["launches_per_step"] == 61
    # eager: cast, pow, mean, add eps, rsqrt, mul, cast, mul weight, residual add = 8 elementwise + 1 reduce
    assert main["replaced"] == {"elementwise": 488.0, "reduction": 61.0}
    assert main["launches_saved_per_step"] == 488.0
    assert main["us_saved_per_step"] == pytest.approx(732.5, abs=0.1)


@pytest.mark.parametrize(("pair", "signatures"), [(DECODE, 9), (PREFILL, 7)])
def test_every_inductor_fusion_of_the_real_compiled_trace_is_found_and_attributed(pair, signatures) -> None:
    compiled = _real(pair[1])
    present = {tuple(ops) for _, ops, _, _ in compiled.fused}  # call-site numbers dropped
    reported = {tuple(f["ops"]): f for f in _fused(compare(_real(pair[0]), compiled)) if f["side"] == "b"}
    assert len(present) == signatures
    assert set(reported) == present
    assert all(f["segment_pairs"] > 0 and f["attribution"].startswith("aligned") for f in reported.values())


def test_a_fusion_inductor_moved_past_a_gemm_is_credited() -> None:
    """Eager runs SiLU after the gate GEMM and the mul after the up GEMM; Inductor runs both, fused, after
    the up GEMM: the pair with the lone SiLU joins the next one."""
    silu = next(f for f in _fused(compare(_real(DECODE[0]), _real(DECODE[1]))) if f["ops"] == ["view", "mul", "silu"])
    assert silu["replaced"] == {"activation": 32.0, "elementwise": 32.0}
    assert silu["launches_saved_per_step"] == 32.0 and silu["segment_pairs"] == 32


def test_traces_with_different_gemm_counts_fall_back_to_a_labelled_class_level_report(tmp_path):
    qkv_fused = [k for k in COMPILED if k != (GEMM, 15.0)]  # one GEMM fewer per layer, as if K and V were one
    a = summarize(read(_kineto(tmp_path / "a.json", EAGER * 4)))
    b = summarize(read(_kineto(tmp_path / "b.json", qkv_fused * 4)))
    out = compare(a, b)
    assert out["fusion_alignment"]["mode"] == "class-level"
    assert "20 (A) and 16 (B) GEMM/attention/communication kernels" in out["fusion_alignment"]["reason"]
    fused = _fused(out)
    assert {f["kind"] for f in fused} == {"fused kernel (class-level estimate)"}
    rms = next(f for f in fused if f["kernel"] == RMS_FUSED)
    # each eager class credited once: the norm (most launches) takes elementwise, the SiLU*mul keeps SiLU
    assert rms["replaced"] == {"reduction": 8.0, "elementwise": 20.0} and rms["us_saved_per_step"] == 56.0
    classes = [c for f in fused for c in f["replaced"]]
    assert len(classes) == len(set(classes))


def test_a_class_only_one_side_runs_names_the_kernels_launched_around_it() -> None:
    report = compare(_real("h100_llama3-8b_eager_decode_b1"), _real("h100_llama3-8b_compile_decode_b1"))
    norm = next(f for f in report["fusions"] if f["kind"] == "class only on one side" and f["class"] == "norm")
    assert norm["side"] == "b"
    # Inductor's fused RMSNorm sits between GEMMs: launched after the previous projection's split-K
    # reduce ("before": what runs just before it), followed by the next projection's nvjet GEMM
    assert norm["around"]["before"][0][0].startswith("cublasLt::splitKreduce")
    assert norm["around"]["after"][0][0].startswith("nvjet_sm90")


def test_a_matmul_over_a_quantized_weight_is_a_gemm_and_the_activation_quantizer_is_not() -> None:
    assert classify("_quant_gemv_kernel") == "gemm"
    assert classify("_quant_gemm_kernel") == "gemm"
    assert classify("_act_quant_kernel") == "quantize"
