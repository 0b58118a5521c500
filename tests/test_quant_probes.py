"""The int4 decode GEMV's GPU probes refuse what they cannot run in one line, exit 2 (this machine has no GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv,why", [
    (["--top", "0"], "give 1 to 100"),
    (["--weight", "int5"], "unknown weight format 'int5'"),
])
def test_the_runner_probe_refuses_a_bad_argument_in_one_line(argv, why):
    proc = _run("benchmarks/probes/quant_gemv_runner.py", *argv)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and why in proc.stderr


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs torch")
def test_the_word_path_check_says_it_needs_a_gpu_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe runs")
    proc = _run("benchmarks/probes/int4_words_check.py")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no CUDA device" in proc.stderr


def test_the_step_variants_probe_refuses_an_unknown_variant_in_one_line():
    proc = _run("benchmarks/probes/step_variants.py", "--out", "x.json", "--variants", "base,fast")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown variant(s) fast" in proc.stderr


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.parametrize("probe", ["graph_launch.py", "replay_host.py", "step_variants.py", "fused_graph_check.py"])
def test_the_host_probes_say_they_need_a_gpu_in_one_line(probe):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe runs")
    proc = _run(f"benchmarks/probes/{probe}", "--out", "x.json")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no CUDA device" in proc.stderr


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs torch")
def test_a_step_variant_is_undone_when_its_block_ends():
    sys.path.insert(0, str(ROOT))
    from autoopt.kernels.constants import constants
    from autoopt.nn import ops
    from benchmarks.probes.step_variants import applied

    left = ops._left_to_inductor
    assert ops._left_to_inductor(1) is True
    with applied("autoopt_norm"):
        assert ops._left_to_inductor(1) is False
    with applied("run80"):
        assert constants().dram_run_bytes == 80.0
    assert ops._left_to_inductor is left and constants().dram_run_bytes == 50.0


@pytest.mark.parametrize("argv,why", [
    (["--old", "/dev/urandom"], "not a regular file"),
    (["--old", "README.md"], "expected a .py file"),
    (["--old", "benchmarks/probes/probe_kit.py"], "defines no dequant_prepare()"),
    (["--old", "no/such/file.py"], "cannot read it"),
    (["--formats", "int5"], "unknown weight format 'int5'"),
    (["--formats", "int4,fp8"], "fp8 quantizes activations"),
])
def test_the_dequant_probe_refuses_a_bad_argument_in_one_line(argv, why):
    proc = _run("benchmarks/probes/dequant_probe.py", "--out", "x.json", *argv)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and why in proc.stderr


def test_the_dequant_probe_takes_an_earlier_text_of_the_module():
    from benchmarks.probes.dequant_probe import old_problem

    assert old_problem(str(ROOT / "autoopt/backend/kernels/quant_dequant.py")) is None


@pytest.mark.parametrize("probe,argv,why", [
    ("fused_chain_probe", ["--layers", "0"], "--layers 0"),
    ("fused_chain_probe", ["--rounds", "5000"], "--rounds 5000"),
    ("fused_chain_probe", ["--format", "int5"], "--format 'int5' (one of int4"),
    ("fused_graph_check", ["--layers", "2,0"], "--layers 2,0: chain lengths take whole numbers from 1 to 4096"),
    ("fused_graph_check", ["--keys", "0"], "--keys 0: a whole number from 1 to 4096"),
    ("fused_graph_check", ["--formats", "int4,nf4"], "--formats: 'nf4' is not one of int4"),
])
def test_the_fused_probes_refuse_a_bad_argument_in_one_line(probe, argv, why):
    proc = _run(f"benchmarks/probes/{probe}.py", "--out", "x.json", *argv)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and why in proc.stderr


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs torch")
def test_the_fused_chain_probe_says_it_needs_a_gpu_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe runs")
    proc = _run("benchmarks/probes/fused_chain_probe.py", "--out", "x.json")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "needs a CUDA GPU" in proc.stderr


def test_the_trace_splits_the_decode_gemvs_by_linear_in_launch_order():
    from array import array

    sys.path.insert(0, str(ROOT))
    from autoopt.trace.analysis import StepKernels
    from benchmarks.quant_trace import gemv_by_linear

    names = ("_quant_gemv_kernel", "triton_red_fused_rms_norm_add_0", "_decode_attention_split")
    # two layers: norm, qkv, attention, o, norm, gate_up, down
    seq = array("i", [1, 0, 2, 0, 1, 0, 0] * 2)
    dur = array("d", [2.0, 7.0, 3.0, 6.0, 2.0, 20.0, 15.0, 2.0, 8.0, 3.0, 6.5, 2.0, 21.0, 16.0])
    step = StepKernels(names=names, classes=("gemm", "elementwise", "attention"), fused_ops=((), (), ()),
                       seq=seq, dur=dur)
    assert gemv_by_linear(step) == {"qkv": 15.0, "o": 12.5, "gate_up": 41.0, "down": 31.0}


def test_the_trace_gives_no_split_where_the_gemvs_are_not_four_a_layer():
    from array import array

    sys.path.insert(0, str(ROOT))
    from autoopt.trace.analysis import StepKernels
    from benchmarks.quant_trace import gemv_by_linear

    step = StepKernels(names=("_quant_gemv_kernel",), classes=("gemm",), fused_ops=((),),
                       seq=array("i", [0, 0, 0]), dur=array("d", [1.0, 2.0, 3.0]))
    assert gemv_by_linear(step) is None and gemv_by_linear(None) is None
