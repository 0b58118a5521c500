"""The runnable examples run as shipped (CI runs them through this file)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_runtime_startup_prints_a_plan_from_predictions_without_a_gpu():
    res = _run("examples/runtime_startup.py", "--profile", "h100-sxm", "--model", "llama-3-8b")
    assert res.returncode == 0, res.stderr
    assert "llama-3-8b" in res.stdout and "predicted" in res.stdout.lower()


def test_optimize_hf_model_swaps_generates_and_restores_on_the_cpu():
    import glob

    import pytest

    pytest.importorskip("transformers")
    # no GPU: the kernels run in Triton's interpreter (a GPU machine runs them compiled, on bf16)
    args = ("--new-tokens", "3") + (("--interpret",) if not glob.glob("/dev/nvidia[0-9]*") else ())
    res = _run("examples/optimize_hf_model.py", "--family", "gemma", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gated_mlp 2 replaced" in res.stdout and "rms_norm 5 replaced" in res.stdout
    assert "kernels: triton" in res.stdout and "identical to the original: True" in res.stdout
