"""The CLI: data on stdout, one line on stderr and exit 2 for any bad input, never a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def autoopt(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("TRITON_INTERPRET", None)  # conftest's interpreter switch is for in-process kernel tests
    return subprocess.run([sys.executable, "-m", "autoopt", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def assert_one_line_usage_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoopt: error: "), res.stderr
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in lines[0]


def test_profile_of_a_known_name_as_json_has_the_gpu_and_recommended_kernels():
    res = autoopt("profile", "--profile", "h100-sxm", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    gpu = data["profile"]["gpus"][0]
    assert (gpu["sm_count"], gpu["smem_per_block_optin_bytes"], gpu["arch"]) == (132, 232448, "sm_90a")
    assert all(k["best"]["label"] == "predicted" for k in data["kernels"])


def test_profile_of_this_machine_reports_real_cores():
    res = autoopt("profile", "--format", "json", "--no-recommend")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["profile"]["cpu"]["logical_cores"] == os.cpu_count()


def test_profile_table_is_readable_text():
    res = autoopt("profile", "--profile", "h100-sxm")
    assert res.returncode == 0, res.stderr
    assert "SMEM per block (opt-in)" in res.stdout and "232448 B" in res.stdout


def test_saved_profile_loads_back_by_path(tmp_path):
    path = tmp_path / "m.yaml"
    assert autoopt("profile", "--profile", "h200", "--save", str(path), "--no-recommend").returncode == 0
    res = autoopt("profile", "--profile", str(path), "--format", "json", "--no-recommend")
    assert json.loads(res.stdout)["profile"]["gpus"][0]["name"] == "NVIDIA H200"


def test_profiles_lists_every_shipped_yaml():
    res = autoopt("profiles", "--format", "json")
    names = {p["name"] for p in json.loads(res.stdout)}
    assert {p.stem for p in (ROOT / "profiles").glob("*.yaml")} <= names


def test_kernel_json_holds_best_first_candidates_with_triton_keys():
    res = autoopt("kernel", "gemm", "--shape", "256,6144,4096", "--dtype", "bf16", "--profile", "h100-sxm",
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    cands = json.loads(res.stdout)["candidates"]
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"} <= set(cands[0]["config"])
    assert [c["predicted_us"] for c in cands] == sorted(c["predicted_us"] for c in cands)
    assert all({"path", "bound"} <= set(c) for c in cands)


def test_unknown_profile_name_suggests_close_ones():
    assert_one_line_usage_error(autoopt("profile", "--profile", "h100-sxn"), "h100-sxm")


def test_missing_profile_file_is_named():
    assert_one_line_usage_error(autoopt("profile", "--profile", "/nonexistent/p.yaml"), "p.yaml")


def test_malformed_profile_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    assert_one_line_usage_error(autoopt("profile", "--profile", str(bad)), "bad.yaml")


@pytest.mark.parametrize("args,needle", [
    (("kernel", "gemm", "--shape", "256,x,4096"), "shape"),
    (("kernel", "gemm", "--shape", "0,1,1"), "positive"),
    (("kernel", "conv", "--shape", "1,1,1"), "conv"),
    (("kernel", "gemm", "--shape", "1,1,1", "--dtype", "int3"), "int3"),
    (("kernel", "gemm"), "--shape"),
    (("frobnicate",), "frobnicate"),
])
def test_bad_kernel_input_is_one_line_and_exit_2(args, needle):
    res = autoopt(*args, "--profile", "h100-sxm") if args[0] == "kernel" and "--shape" in args else autoopt(*args)
    assert_one_line_usage_error(res, needle)


def test_unwritable_save_path_is_one_line(tmp_path):
    res = autoopt("profile", "--profile", "h100-sxm", "--save", str(tmp_path / "no" / "dir" / "p.json"))
    assert_one_line_usage_error(res, "--save")


def test_kernel_without_a_gpu_profile_on_a_cpu_machine_says_so():
    res = autoopt("kernel", "gemm", "--shape", "1,1,1")
    assert_one_line_usage_error(res, "--profile")


def test_recommend_json_for_a_catalog_model_on_eight_h100():
    res = autoopt("recommend", "--model", "llama-3-70b", "--profile", "h100-sxm-8x", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["label"] == "predicted" and data["fits"] is True



def test_recommend_cuda_graphs_flag_prices_decode_as_replayed():
    base = ("recommend", "--model", "llama-3-8b", "--profile", "h100-sxm", "--phase", "decode", "--format", "json")
    plain, graphed = autoopt(*base), autoopt(*base, "--cuda-graphs")
    assert plain.returncode == 0 and graphed.returncode == 0, graphed.stderr
    p, g = json.loads(plain.stdout), json.loads(graphed.stdout)
    assert g["workload"]["cuda_graphs"] is True
    assert g["predicted"]["decode_step_us"] < p["predicted"]["decode_step_us"]

def test_recommend_fastest_preference_names_its_pick_and_the_others_times():
    res = autoopt("recommend", "--model", "llama-3-8b", "--profile", "h100-sxm", "--runtime", "autoopt", "--phase",
                  "decode", "--batch", "8", "--preference", "fastest", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["preference"] == "fastest" and data["quant"]["reason"].startswith("fastest: ")


def test_recommend_reads_a_hugging_face_config_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                               "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
                               "vocab_size": 32000, "torch_dtype": "bfloat16"}))
    res = autoopt("recommend", "--model", str(cfg), "--profile", "l4", "--format", "json")
    assert res.returncode == 0, res.stderr


def test_recommend_with_a_bad_model_config_names_the_field(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                               "num_hidden_layers": 4, "num_attention_heads": 15, "vocab_size": 32000}))
    assert_one_line_usage_error(autoopt("recommend", "--model", str(cfg), "--profile", "l4"), "num_attention_heads")


def test_recommend_with_an_unknown_catalog_name_is_one_line():
    assert_one_line_usage_error(autoopt("recommend", "--model", "llama-9-9000b", "--profile", "h100-sxm"),
                                "llama-9-9000b")


def test_bench_without_a_gpu_reports_predictions_labelled_as_such():
    res = autoopt("bench", "--op", "rmsnorm", "--shape", "4096,4096", "--profile", "h100-sxm", "--format", "json")
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)["rows"]
    assert row["label"] == "predicted" and row["torch_us"] is None and row["us"] > 0


def test_bench_top_k_gives_each_ops_k_best_predicted_configs_fastest_first():
    res = autoopt("bench", "--op", "rmsnorm", "--shape", "4096,4096", "--top", "3", "--profile", "h100-sxm",
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert len(rows) == 3 and len({json.dumps(r["config"], sort_keys=True) for r in rows}) == 3
    assert [r["us"] for r in rows] == sorted(r["us"] for r in rows)


def test_bench_top_with_a_model_is_one_line():
    assert_one_line_usage_error(autoopt("bench", "--model", "llama-3-8b", "--top", "3"), "--top picks configs per op")


def test_bench_top_outside_1_to_50_is_one_line():
    assert_one_line_usage_error(autoopt("bench", "--top", "51", "--profile", "h100-sxm"), "--top must be in 1..50")


def test_bench_op_without_shape_is_one_line():
    assert_one_line_usage_error(autoopt("bench", "--op", "gemm", "--profile", "h100-sxm"), "--shape")


def test_plugins_json_lists_the_builtin_templates():
    res = autoopt("plugins", "--format", "json")
    builtin = next(p for p in json.loads(res.stdout)["plugins"] if p["name"] == "builtin")
    assert {"gemm", "gemv", "elementwise", "norm", "hopper-tma-gemm"} <= set(builtin["templates"])


def test_profile_of_a_partly_known_gpu_still_shows_the_profile(tmp_path):
    # no bandwidth or peak rates: nothing can be ranked or planned, but the profile itself is data
    path = tmp_path / "mystery.json"
    path.write_text(json.dumps({"name": "mystery", "gpus": [{"name": "Mystery GPU", "cc_major": 9, "cc_minor": 0,
                                                             "sm_count": 100, "memory_total_bytes": 8 * 10**10}]}))
    res = autoopt("profile", "--profile", str(path), "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["profile"]["gpus"][0]["sm_count"] == 100
    assert "bandwidth" in data["recommendation_error"]
    assert all("error" in k for k in data["kernels"])


def test_bench_model_without_a_gpu_runs_the_tiny_config_and_says_so(tmp_path, capsys):
    from autoopt.cli import main

    out = tmp_path / "e2e.json"
    assert main(["bench", "--model", "llama-3-8b", "--format", "json", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "tiny config" in err
    data = json.loads(out.read_text())
    assert data["tiny"] is True and set(data["variants"]) == {"eager", "optimize"}
    assert data["variants"]["optimize"]["agreement_vs_eager"]["top1_agreement"] == 1.0
    decisive = data["variants"]["optimize"]["agreement_vs_eager_decisive"]
    assert decisive["margin"] == data["decisive_margin"] and 0 < decisive["prompts"] <= decisive["of"]
    assert decisive["top1_agreement"] == 1.0


def test_bench_model_unknown_is_one_line_exit_2(capsys):
    from autoopt.cli import main

    assert main(["bench", "--model", "no-such-model"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_e2e_run_refuses_an_unknown_part_before_building_a_model():
    from autoopt.errors import AutooptError
    from autoopt.nn.e2e import run

    with pytest.raises(AutooptError, match="parts: prefill, generate, profile, graphed, agreement"):
        run("llama-3-8b", device="cpu", tiny=True, parts=("graphs",))


@pytest.mark.parametrize("flags", [["--prefill", "1x"], ["--prefill", "2048"], ["--decode-batches", "one"],
                                   ["--parts", "graphs"]])
def test_e2e_benchmark_bad_flags_are_one_line_exit_2(tmp_path, flags):
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "e2e.py"
    proc = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "e.json"), *flags],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("e2e: ")
    assert not (tmp_path / "e.json").exists()
