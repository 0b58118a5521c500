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
