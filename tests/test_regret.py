"""Measured regret (autoopt.regret): the alternatives enumerated, the regret arithmetic, and the harness end to
end on the CPU with a tiny model (the same code path a GPU run takes, the kernels falling back to torch)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autoopt.hardware.library import load_profile
from autoopt.regret import BATCHES, Option, RegretOptionError, enumerate_options, parse_batches
from autoopt.regret.run import Measured, _workload

H100 = load_profile("h100-sxm").gpu
A100 = load_profile("a100-sxm-80gb").gpu


def test_on_an_h100_every_format_runs_with_and_without_graphs_at_each_batch():
    opts = enumerate_options(H100)
    assert len(opts) == len(BATCHES) * 4 * 2
    assert {o.weights for o in opts} == {"bf16", "fp8", "int8", "int4"}
    assert {(o.batch, o.cuda_graphs) for o in opts} == {(b, g) for b in BATCHES for g in (False, True)}
    assert all(o.runnable and o.gpus == 1 for o in opts)


def test_an_a100_has_no_w8a8_fp8_to_try():
    assert {o.weights for o in enumerate_options(A100, batches=(1,))} == {"bf16", "int8", "int4"}


def test_the_cpu_tries_no_cuda_graphs_and_no_fp8():
    opts = enumerate_options(None, batches=(1,))
    assert {(o.weights, o.cuda_graphs) for o in opts} == {("bf16", False), ("int8", False), ("int4", False)}


def test_multi_gpu_layouts_run_tensor_parallel_in_bf16_and_replicas_in_every_format():
    opts = enumerate_options(H100, gpus=4, batches=(8,), formats=("bf16", "int4"))
    multi = {(o.weights, o.layout, o.cuda_graphs): o for o in opts if o.gpus == 4}
    assert len(multi) == 8 and all(o.runnable for k, o in multi.items() if k[:2] != ("int4", "tensor-parallel"))
    assert all(not o.runnable and "DTensor" in o.why for k, o in multi.items() if k[:2] == ("int4", "tensor-parallel"))


def test_tensor_parallel_and_replicas_are_measured_in_one_torchrun_group_on_two_cpu_processes():
    # gloo on the CPU: the same torchrun group and transformers tp_plan a GPU host runs with NCCL
    from autoopt.regret.run import measure_layouts

    opts = [Option(weights=w, cuda_graphs=False, batch=b, gpus=2, layout=layout)
            for layout, w in (("tensor-parallel", "bf16"), ("replicas", "int4")) for b in (1, 3)]
    got = measure_layouts("llama-3-8b", opts, layers=None, tiny=True, steps=2)
    assert list(got) == opts and all(isinstance(ms, float) and ms > 0 for ms in got.values())


def test_a_layout_that_fails_in_the_group_is_its_rows_reason_and_the_others_still_measure():
    from autoopt.regret.run import measure_layouts

    ok = Option(weights="bf16", cuda_graphs=False, batch=1, gpus=2, layout="replicas")
    bad = Option(weights="bf16", cuda_graphs=True, batch=1, gpus=2, layout="replicas")  # graphs need CUDA
    got = measure_layouts("llama-3-8b", [ok, bad], layers=None, tiny=True, steps=2)
    assert isinstance(got[ok], float) and isinstance(got[bad], str) and got[bad]


def test_layouts_of_mixed_gpu_counts_are_refused():
    from autoopt.regret.run import measure_layouts

    with pytest.raises(ValueError, match="one GPU count"):
        measure_layouts("llama-3-8b", [Option(weights="bf16", cuda_graphs=False, batch=1, gpus=2, layout="replicas"),
                                       Option(weights="bf16", cuda_graphs=False, batch=1, gpus=4,
                                              layout="replicas")], layers=None, tiny=True, steps=2)


@pytest.mark.parametrize("bad", ["", "0", "1,x", "-1", "5000", "1.5"])
def test_a_bad_batch_list_is_refused_with_the_accepted_range(bad):
    with pytest.raises(RegretOptionError, match="1 to 4096"):
        parse_batches(bad)


def test_batches_parse_sorted_and_unique():
    assert parse_batches("32, 1,8,1") == (1, 8, 32)


def test_an_unknown_format_is_refused_naming_the_known_ones():
    with pytest.raises(RegretOptionError, match="bf16, fp8, int8, int4"):
        enumerate_options(H100, formats=("nf4",))


def test_an_option_round_trips_through_its_dict():
    opt = Option(weights="int4", cuda_graphs=True, batch=8)
    assert Option.from_dict(opt.to_dict()) == opt
    with pytest.raises(RegretOptionError, match="batch"):
        Option.from_dict({**opt.to_dict(), "batch": "eight"})


def _row(fmt: str, ms: float) -> Measured:
    return Measured(option=Option(weights=fmt, cuda_graphs=True, batch=1), predicted_ms=1.0, measured_ms=ms)


def test_regret_is_the_picks_measured_step_over_the_fastest_less_one():
    rows = [_row("bf16", 9.0), _row("fp8", 6.0), _row("int4", 5.0)]
    w = _workload(1, rows, rows[1].option, "recommend(): fp8")
    assert (w.recommended, w.best, w.regret) == ("fp8 graphs b1", "int4 graphs b1", 0.2)


def test_a_pick_that_measured_fastest_has_zero_regret():
    rows = [_row("bf16", 9.0), _row("fp8", 6.0)]
    assert _workload(1, rows, rows[1].option, "").regret == 0.0


def test_no_pick_means_no_regret_and_the_reason_kept():
    w = _workload(1, [_row("bf16", 9.0)], None, "recommend() chose fp8, which is not among the runnable options here")
    assert (w.recommended, w.regret) == (None, None) and "fp8" in w.recommended_reason


@pytest.mark.slow
def test_the_harness_runs_end_to_end_on_the_cpu_and_writes_its_table(tmp_path):
    out = tmp_path / "regret.json"
    proc = subprocess.run([sys.executable, "-m", "autoopt", "check", "regret", "--model", "llama-3-8b", "--tiny",
                           "--layers", "1", "--batches", "1,2", "--formats", "bf16,int8", "--profile", "h100-sxm",
                           "--steps", "2", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [w["batch"] for w in data["workloads"]] == [1, 2]
    rows = [r for w in data["workloads"] for r in w["options"]]
    assert {r["label"] for r in rows} == {"bf16 eager b1", "int8 eager b1", "bf16 eager b2", "int8 eager b2"}
    assert all(r["measured_ms"] > 0 and r["predicted_ms"] > 0 for r in rows)
    assert all(r["measured_blocks_ms"] == [round(r["measured_ms"], 4)] for r in rows)  # one block on a CPU
    assert data["device"] == "cpu" and "test the code path" in data["notes"][0]
    assert data["hardware"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"  # what a re-score predicts on
    assert "batch 1: recommended" in proc.stdout
    assert "batch 1: recommended" in proc.stderr  # each batch's line as it is measured


@pytest.mark.slow
def test_a_run_hands_on_the_table_so_far_after_each_batch_but_the_last():
    import autoopt
    from autoopt.regret.run import run_regret

    seen = []
    run = run_regret("llama-3-8b", autoopt.load_profile("h100-sxm"), device="cpu", batches=(1, 2),
                     formats=("bf16",), layers=1, tiny=True, steps=1, on_progress=seen.append)
    assert [len(p.workloads) for p in seen] == [1] and "partial: 1 of 2 batches" in seen[0].notes[-1]
    assert len(run.workloads) == 2 and not any(n.startswith("partial") for n in run.notes)


@pytest.mark.slow
def test_a_budget_starts_no_batch_the_slowest_so_far_says_would_end_past_it(monkeypatch):
    import autoopt
    from autoopt.regret import run as regret_run

    clock = iter(range(0, 1000, 10))  # each read 10 s later: every batch takes 10 s, 10 s pass between them
    monkeypatch.setattr(regret_run, "_clock", lambda: float(next(clock)))
    run = regret_run.run_regret("llama-3-8b", autoopt.load_profile("h100-sxm"), device="cpu", batches=(1, 2, 4),
                                formats=("bf16",), layers=1, tiny=True, steps=1, budget_s=45)
    assert [w.batch for w in run.workloads] == [1, 2]
    assert run.notes[-1].startswith("budget: batches 4 not measured")


@pytest.mark.parametrize("budget", ["0", "nan", "100000"])
def test_the_cli_refuses_a_budget_out_of_range_in_one_line(budget):
    proc = subprocess.run([sys.executable, "-m", "autoopt", "check", "regret", "--budget-s", budget],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--budget-s" in proc.stderr
    assert "1 to 86400 seconds" in proc.stderr


def test_the_cli_refuses_a_bad_batch_list_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "autoopt", "check", "regret", "--batches", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "1 to 4096" in proc.stderr


def test_an_option_that_fails_to_run_is_a_row_with_the_reason_and_the_run_goes_on(monkeypatch):
    from autoopt.regret import run

    def oom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 96.00 GiB")
    monkeypatch.setattr(run, "measure_ms", oom)
    row = run._measured("llama-3-8b", Option(weights="int4", cuda_graphs=True, batch=32), 4.5, device="cuda",
                        layers=2, tiny=False, steps=3)
    assert (row.measured_ms, row.predicted_ms) == (None, 4.5)
    assert row.why.startswith("RuntimeError: CUDA out of memory")


def test_the_pick_is_recommends_format_with_the_graphs_setting_predicted_faster():
    from autoopt.regret.run import model_spec, recommended

    hw = load_profile("h100-sxm")
    spec = model_spec("llama-3-8b", 2)
    opts = enumerate_options(H100, batches=(1,))
    predicted = {o: (3.0 if o.cuda_graphs else 4.0) for o in opts}
    pick, reason = recommended(hw, spec, 1, predicted)
    assert pick is not None and pick.cuda_graphs and reason.startswith(f"recommend(): {pick.weights}")


def test_rescoring_a_committed_h100_run_keeps_its_measurements_and_scores_todays_pick():
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.rescore_regret import rescore

    run = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h100"
                      / "regret_1gpu_layers8.json").read_text())
    out = rescore(run, "h100-sxm")
    assert [w["batch"] for w in out["workloads"]] == [1, 8, 32]
    measured = {r["label"]: r["measured_ms"] for w in run["workloads"] for r in w["options"]}
    assert all(r["measured_ms"] == measured[r["label"]] for w in out["workloads"] for r in w["options"])
    assert all(w["recommended"] is not None and w["regret"] is not None for w in out["workloads"])


def test_rescoring_measures_an_uncompiled_row_by_its_least_block_and_a_graphed_row_as_run():
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.rescore_regret import rescore

    run = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200"
                      / "regret_1gpu_layers8_run7.json").read_text())
    rows = {(w["batch"], r["label"]): r for w in run["workloads"] for r in w["options"]}
    out = rescore(run, "h200")
    for w in out["workloads"]:
        for r in w["options"]:
            given = rows[(w["batch"], r["label"])]
            blocks = given.get("measured_blocks_ms")
            assert r["measured_ms"] == (min(blocks) if blocks else given["measured_ms"])
    # int4 eager b1 on 2026-11-29: blocks 17.37, 12.38, 12.05, 18.34, 17.85 ms; its median was reported
    assert rows[(1, "int4 eager b1")]["measured_ms"] == pytest.approx(17.37, abs=0.01)
    assert {r["label"]: r["measured_ms"] for r in out["workloads"][0]["options"]}["int4 eager b1"] == 12.0455


def test_a_failed_torchrun_group_is_reported_by_its_ranks_exception_line():
    from autoopt.regret.run import _root_cause

    log = ("[rank1]:   File \"x.py\", line 3, in f\n"
           "[rank1]: autoopt.errors.WeightFormatError: weights='int4' quantizes bf16/fp16 weights\n"
           "E1127 torch/distributed/elastic: failed (exitcode: 1)\n")
    assert _root_cause(log) == "autoopt.errors.WeightFormatError: weights='int4' quantizes bf16/fp16 weights"
    assert _root_cause("terminate called without an active exception\nSignal 6 (SIGABRT)") == \
        "terminate called without an active exception Signal 6 (SIGABRT)"


@pytest.mark.parametrize("content", [None, b"\xff\xfe", b"[1, 2]", b'{"model": "x"}'])
def test_rescoring_refuses_what_is_not_a_regret_run_in_one_line(tmp_path, capsys, content):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.rescore_regret import main

    run = tmp_path / "run.json"
    if content is None:
        run.mkdir()  # not a regular file
    else:
        run.write_bytes(content)
    assert main([str(run), "--profile", "h100-sxm", "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rescore_regret: ") and "\n" not in err and not (tmp_path / "out.json").exists()


def test_the_cli_refuses_more_gpus_than_the_host_has_in_one_line(monkeypatch, capsys):
    import torch

    from autoopt.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["check", "regret", "--gpus", "2", "--tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--gpus 2 is more than this host's 1 GPUs" in err


def _rescore_committed(run: str, profile: str):
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from benchmarks.rescore_regret import rescore

    results = root / "benchmarks" / "results" / "h100"
    return rescore(json.loads((results / run).read_text()), str(results / profile))


def test_a_two_gpu_run_rescored_on_its_hosts_detected_profile_prices_both_layouts():
    out = _rescore_committed("regret_2gpu_layers8.json", "profile_2xh100_detected.json")
    labels = {r["label"] for w in out["workloads"] for r in w["options"]}
    assert {"bf16 graphs b1 tensor-parallel x2", "int4 graphs b8 replicas x2"} <= labels
    assert all(r["predicted_ms"] > 0 for w in out["workloads"] for r in w["options"])


def test_a_replica_layout_is_picked_in_the_format_recommend_keeps_for_a_replicas_share_of_the_batch():
    # batch 32 over two replicas is 16 a GPU: recommend(fastest) keeps int4 there, fp8 at 32 on one GPU
    out = _rescore_committed("regret_2gpu_layers8.json", "profile_2xh100_detected.json")
    b32 = next(w for w in out["workloads"] if w["batch"] == 32)
    assert b32["recommended"] == "int4 graphs b32 replicas x2" and "int4" in b32["recommended_reason"]


def test_tensor_parallel_is_predicted_with_transformers_uncompiled_modules():
    from autoopt.planning.recommendation import UNCOMPILED_TRANSFORMERS_LAYER_US
    from autoopt.regret.run import model_spec, predicted_ms

    hw = load_profile(str(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h100"
                          / "profile_2xh100_detected.json"))
    spec = model_spec("llama-3-8b", 8)
    tp = Option(weights="bf16", cuda_graphs=True, batch=1, gpus=2, layout="tensor-parallel")
    from autoopt.planning.recommendation import recommend

    base = recommend(hw, spec, batch=1, max_devices=2, tensor_parallel=2, prompt_len=128, gen_len=28,
                     phase="decode", weight_dtype="bf16", cuda_graphs=True, runtime="transformers")
    # the shard's repeat_kv copy over 156 keys (1.6 MB) is smaller than the fit's (one GPU, 192 keys: 3.9 MB)
    want = (base.predicted["decode_step_us"] + 8 * (UNCOMPILED_TRANSFORMERS_LAYER_US - 1.497)) / 1e3
    assert predicted_ms(hw, spec, tp) == pytest.approx(want, abs=2e-4)
    assert base.split.tp == 2 and any(o.name == "k_proj" for o in base.ops)  # its tp_plan's separate linears


def _tp_trace() -> dict:
    return json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200"
                       / "tp_trace_2gpu.json").read_text())


@pytest.mark.parametrize("rows", [1, 8, 32])
def test_the_uncompiled_norms_reduction_by_rows_is_what_the_tensor_parallel_trace_measured(rows):
    # the step's reduce kernels are its 17 norms and the greedy argmax over 128256 logits (priced apart)
    from autoopt.planning.recommendation import ARGMAX_NS_PER_LOGIT, UNCOMPILED_NORM_REDUCE_US

    reduction = _tp_trace()["tensor_parallel"][str(rows)]["by_class_per_step"]["reduction"]
    assert reduction["launches"] == 18
    per_norm = (reduction["us"] - ARGMAX_NS_PER_LOGIT * 128256 / 1e3) / 17
    assert per_norm == pytest.approx(UNCOMPILED_NORM_REDUCE_US[rows], abs=0.02)


def test_the_uncompiled_norms_growth_is_none_at_one_row_and_flat_past_32():
    from autoopt.planning.recommendation import uncompiled_norm_growth_us

    assert uncompiled_norm_growth_us(1) == 0.0
    assert uncompiled_norm_growth_us(16) == pytest.approx(5.08 + (9.01 - 5.08) * 8 / 24 - 2.02)
    assert uncompiled_norm_growth_us(256) == uncompiled_norm_growth_us(32) == pytest.approx(6.99)


@pytest.mark.parametrize("batch,low,high", [(1, 0.95, 1.02), (8, 0.89, 0.95), (32, 0.91, 0.97)])
def test_a_tensor_parallel_graphed_step_is_priced_near_its_traced_replay(batch, low, high):
    # two H200s, 192 keys (the harness's 56 steps): 1.725 / 1.760, 1.852 / 2.044, 2.431 / 2.590 ms; without the
    # norms' growth by rows 0.882 and 0.895 at batch 8 and 32. What is left: ~0.35 us between the graph's ~470
    # kernels, which at batch 1 hide in the all-reduces' waits
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from rescore_regret import hardware

    from autoopt.regret.run import model_spec, predicted_ms

    run = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200" / "regret_2gpu_layers8_run2.json"
    hw = hardware("run", json.loads(run.read_text()))
    option = Option(weights="bf16", cuda_graphs=True, batch=batch, gpus=2, layout="tensor-parallel")
    ratio = predicted_ms(hw, model_spec("llama-3-8b", 8), option, steps=56) / (
        _tp_trace()["tensor_parallel"][str(batch)]["wall_ms_per_step"])
    assert low <= ratio <= high


@pytest.mark.parametrize("profile", ["no-such-gpu", "/dev/urandom", "big", "not-a-profile", "run"])
def test_rescoring_with_a_profile_that_is_none_exits_2_in_one_line(tmp_path, capsys, profile):
    # a name the library lacks, a device, a huge file, JSON of another shape, and a run that recorded none
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from benchmarks.rescore_regret import main

    if profile == "big":
        profile = str(tmp_path / "big.json")
        Path(profile).write_bytes(b" " * (3 << 20))
    elif profile == "not-a-profile":
        profile = str(tmp_path / "p.json")
        Path(profile).write_text('{"a": 1}')
    run = root / "benchmarks" / "results" / "h100" / "regret_1gpu_layers8.json"
    assert main([str(run), "--profile", profile, "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("rescore_regret: ")
    assert not (tmp_path / "o.json").exists()


def test_a_one_gpu_option_is_priced_with_the_attention_glue_it_runs_uncompiled():
    from autoopt.planning.recommendation import recommend
    from autoopt.regret.run import model_spec, predicted_ms

    hw = load_profile("h100-sxm")
    spec = model_spec("llama-3-8b", 8)
    one = Option(weights="int4", cuda_graphs=True, batch=8, gpus=1)
    base = recommend(hw, spec, batch=8, runtime="autoopt", max_devices=1, prompt_len=128, gen_len=28,
                     phase="decode", weight_dtype="int4", cuda_graphs=True)
    # optimize()'s decode attention makes no repeat_kv copy: 33.0 us a layer at batch 8, as the H200's traces measured
    want = (base.predicted["decode_step_us"] + 8 * 33.0) / 1e3
    assert predicted_ms(hw, spec, one) == pytest.approx(want, abs=2e-4)


def test_the_predicted_step_reads_the_cache_the_harness_allocates():
    # decode_step_ms allocates prompt + steps + 8 slots and transformers' SDPA walks them all
    from autoopt.nn.e2e import CACHE_SLACK
    from autoopt.regret.run import PROMPT, STEPS

    assert (PROMPT, STEPS, CACHE_SLACK) == (128, 20, 8)


def test_at_batch_32_the_uncompiled_repeat_kv_copy_is_priced_at_its_measured_rate_under_tensor_parallelism():
    # Llama-3-8B over 156 keys on one of 2 ranks: (1 + 4) x 10.2 MB of K/V copied, 47.2 MB beyond the batch-1 fit,
    # at 1.02 TB/s uncompiled instead of 2.95: +30.3 us a layer over transformers' own uncompiled modules, and its
    # two norms' reductions at 32 rows, 6.99 us each beyond one row
    from autoopt.planning.recommendation import UNCOMPILED_TRANSFORMERS_LAYER_US
    from autoopt.regret.run import _uncompiled_layer_us, model_spec

    spec = model_spec("llama-3-8b", 8)
    us = _uncompiled_layer_us(load_profile("h100-sxm"), spec, batch=32, keys=156, tp=2)
    assert us == pytest.approx(UNCOMPILED_TRANSFORMERS_LAYER_US + 30.3 + 2 * 6.99, abs=0.1)


def test_on_one_gpu_optimizes_decode_attention_copies_nothing_at_any_batch():
    # no repeat_kv term at any batch or cache length: only the measured glue by batch
    from autoopt.regret.run import _uncompiled_layer_us, model_spec

    spec = model_spec("llama-3-8b", 8)
    hw = load_profile("h100-sxm")
    assert _uncompiled_layer_us(hw, spec, batch=1, keys=156, tp=1) == 26.05
    assert _uncompiled_layer_us(hw, spec, batch=32, keys=156, tp=1) == \
        _uncompiled_layer_us(hw, spec, batch=32, keys=4096, tp=1) == 33.0


def _b32_trace() -> dict:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h100" / "quant_trace_b32_layers8.json"
    return json.loads(path.read_text())


def test_the_sdpa_efficiency_is_what_the_batch_32_trace_measured():
    # 8 layers of Llama-3-8B at batch 32 over 192 keys: SDPA read 4 repeated copies of 25.2 MB of K/V a layer
    from autoopt.planning.recommendation import SDPA_DECODE_KV_EFFICIENCY

    trace = _b32_trace()["variants"]["autoopt-bf16"]
    sdpa_us = trace["compiled"]["by_class_per_step"]["attention"]["us"] / 8
    kv = 2 * 32 * 192 * 8 * 128 * 2
    assert 4 * kv / (sdpa_us * 1e3) / 2948 == pytest.approx(SDPA_DECODE_KV_EFFICIENCY, abs=0.01)


def test_the_uncompiled_copy_rate_is_what_the_batch_32_trace_measured():
    # uncompiled minus compiled graphed step a layer, less the batch-1 glue the constant already holds, is
    # the repeat_kv copy's extra time: 5 x 25.2 MB less the batch-1 copy, moved at ~1.02 TB/s instead of 2.95
    # (bf16 998 GB/s, fp8 1040)
    from autoopt.planning.recommendation import UNCOMPILED_REPEAT_KV_GBS

    moved = 5 * (2 * 32 * 192 * 8 * 128 * 2 - 2 * 1 * 192 * 8 * 128 * 2)
    for name in ("autoopt-bf16", "fp8"):
        trace = _b32_trace()["variants"][name]
        extra_us = (trace["eager"]["gpu_kernel_us_per_step"] - trace["compiled"]["gpu_kernel_us_per_step"]) / 8 - 28.6
        rate = moved / (extra_us * 1e-6 + moved / 2948e9) / 1e9
        assert rate == pytest.approx(UNCOMPILED_REPEAT_KV_GBS, rel=0.05), name


#: the multi-GPU regret tables the host constants below were fitted on (H100 and H200 hosts), by GPU count; the
#: four-H200 Qwen tables of 2026-11-29 (regret_qwen_4gpu_layers8_b{1,16}.json) came after, out of sample
_MULTI_GPU_TABLES = {
    2: ("h100/regret_2gpu_layers8.json", "h100/regret_qwen_2gpu_layers8.json", "h200/regret_2gpu_layers8.json",
        "h200/regret_2gpu_layers8_run2.json", "h200/regret_qwen_2gpu_layers8.json"),
    4: ("h100/regret_4gpu_layers8.json", "h100/regret_qwen_4gpu_layers8.json", "h200/regret_4gpu_layers8.json",
        "h200/regret_4gpu_layers8_b8.json", "h200/regret_4gpu_layers8_b32.json"),
}


def _uncompiled_steps(table: str) -> dict[tuple[str, int, str], float]:
    """(format, batch, layout) -> the table's measured uncompiled step, ms."""
    data = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / table).read_text())
    return {(o["option"]["weights"], o["option"]["batch"], o["option"]["layout"]): o["measured_ms"]
            for w in data["workloads"] for o in w["options"]
            if not o["option"]["cuda_graphs"] and o["measured_ms"] is not None}


@pytest.mark.parametrize("gpus,pairs", [(2, 56), (4, 40)])
def test_the_replica_host_factor_is_the_median_replica_step_over_one_process_in_every_committed_table(gpus, pairs):
    # each replica step over the single-process step of its format and batch in the same table: the host's phase
    # cancels within a table, and the pool spans two hosts, two models and five calls per GPU count
    from autoopt.planning.recommendation import EAGER_REPLICA_HOST_FACTOR

    ratios = [ms / steps[(fmt, batch, "single")] for table in _MULTI_GPU_TABLES[gpus]
              for steps in [_uncompiled_steps(table)] for (fmt, batch, layout), ms in steps.items()
              if layout == "replicas" and (fmt, batch, "single") in steps]
    assert len(ratios) == pairs
    assert statistics.median(ratios) == pytest.approx(EAGER_REPLICA_HOST_FACTOR[gpus], abs=0.001)


@pytest.mark.parametrize("gpus,steps_measured", [(2, 14), (4, 10)])
def test_the_tensor_parallel_host_time_is_the_median_uncompiled_step_of_every_committed_table(gpus, steps_measured):
    from autoopt.planning.recommendation import EAGER_TP_HOST_LAYER_US

    layer_us = [ms * 1e3 / 8 for table in _MULTI_GPU_TABLES[gpus]
                for (_, _, layout), ms in _uncompiled_steps(table).items() if layout == "tensor-parallel"]
    assert len(layer_us) == steps_measured
    assert statistics.median(layer_us) == pytest.approx(EAGER_TP_HOST_LAYER_US[gpus], abs=1.0)


def test_the_tensor_parallel_host_time_grows_with_the_ranks_between_and_past_its_points():
    from autoopt.planning.recommendation import eager_tp_host_layer_us

    assert eager_tp_host_layer_us(2) == 1711.0
    assert eager_tp_host_layer_us(3) == pytest.approx((1711.0 + 2476.0) / 2)
    assert eager_tp_host_layer_us(8) == pytest.approx(2476.0 + 2 * (2476.0 - 1711.0))


def test_the_replica_host_factor_is_one_for_one_process_and_linear_between_its_points():
    from autoopt.planning.recommendation import eager_replica_host_factor

    assert eager_replica_host_factor(1) == 1.0
    assert eager_replica_host_factor(3) == pytest.approx((1.151 + 1.253) / 2)
    assert eager_replica_host_factor(8) == pytest.approx(1.253 + 4 * (1.253 - 1.151) / 2)


def test_uncompiled_replicas_are_priced_at_their_processes_host_time_and_graphed_ones_are_not():
    from autoopt.planning.recommendation import eager_replica_host_factor
    from autoopt.regret.run import model_spec, predicted_ms

    hw, spec = load_profile("h100-sxm"), model_spec("llama-3-8b", 8)
    one = predicted_ms(hw, spec, Option(weights="int4", cuda_graphs=False, batch=1, gpus=1, layout="single"))
    four = predicted_ms(hw, spec, Option(weights="int4", cuda_graphs=False, batch=4, gpus=4, layout="replicas"))
    assert four == pytest.approx(one * eager_replica_host_factor(4))
    graphed = [predicted_ms(hw, spec, Option(weights="int4", cuda_graphs=True, batch=b, gpus=g, layout=lay))
               for b, g, lay in ((1, 1, "single"), (4, 4, "replicas"))]
    assert graphed[0] == pytest.approx(graphed[1])


def test_an_eager_step_is_timed_over_blocks_each_with_a_cache_of_its_own(monkeypatch):
    # every block prefills a fresh static cache of the harness's length, so five blocks of 20 steps fit where one
    # cache would overflow after the first (transformers keeps its own write position)
    from autoopt.nn import e2e

    net = e2e.build_model("llama-3-8b", dtype="fp32", device="cpu", tiny=True, layers=1)
    seen: list[int] = []
    block = e2e._eager_block
    monkeypatch.setattr(e2e, "_eager_block", lambda *a: seen.append(1) or block(*a))
    ms = e2e.decode_step_ms(net, 1, 8, 20, graphed=False, blocks=5)
    assert len(seen) == 5 and ms > 0


def test_an_eager_step_is_its_least_block_and_hands_every_block_back():
    from autoopt.nn import e2e

    net = e2e.build_model("llama-3-8b", dtype="fp32", device="cpu", tiny=True, layers=1)
    blocks: list[float] = []
    ms = e2e.decode_step_ms(net, 1, 8, 4, graphed=False, blocks=3, blocks_ms=blocks)
    assert len(blocks) == 3 and ms == min(blocks)


def test_a_measured_row_lists_its_blocks_only_when_it_has_some():
    from autoopt.regret.run import Measured

    opt = Option(weights="bf16", cuda_graphs=False, batch=1)
    assert "measured_blocks_ms" not in Measured(option=opt, measured_ms=2.0).to_dict()
    row = Measured(option=opt, measured_ms=2.0, measured_blocks_ms=(1.9, 2.0, 3.51234)).to_dict()
    assert row["measured_blocks_ms"] == [1.9, 2.0, 3.5123]


@pytest.mark.parametrize("blocks", [0, -1, 2.5])
def test_a_block_count_below_one_or_not_whole_is_refused_naming_the_range(blocks):
    from autoopt.errors import AutooptError
    from autoopt.nn import e2e

    with pytest.raises(AutooptError, match="1 or more"):
        e2e.decode_step_ms(object(), 1, 8, 20, graphed=False, blocks=blocks)


def test_an_uncompiled_layer_with_autoopts_decode_attention_adds_what_the_h200_traces_measured_by_batch():
    # eager against compiled step, both graphed: 26.0 / 26.1 us a layer at batch 1, 32.3-34.6 at 8, 33.0 at 32
    from autoopt.planning.recommendation import uncompiled_decode_attention_layer_us

    assert uncompiled_decode_attention_layer_us(1) == 26.05
    assert uncompiled_decode_attention_layer_us(8) == uncompiled_decode_attention_layer_us(32) == 33.0
    assert uncompiled_decode_attention_layer_us(4) == pytest.approx(26.05 + 3 * (33.0 - 26.05) / 7)
