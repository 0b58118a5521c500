"""The decode attention probe (benchmarks/probes/decode_attention_probe.py) on the CPU, under Triton's interpreter
(fp16: the interpreter's bf16 ``tl.dot`` is wrong with triton 3.9): its lengths-to-mask wrapper over autoopt's
kernel, its KV copies, its refusal without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.probes import decode_attention_probe as probe  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("batch,keys,block_n,splits", [(1, 40, 16, 1), (2, 130, 32, 3), (1, 64, 64, 4)])
def test_the_split_key_kernel_matches_float64_attention(batch, keys, block_n, splits):
    q, k, v, lengths = probe.inputs(batch, keys, torch.float16, DEV)
    got = probe.decode_attention(q, k, v, lengths, block_n=block_n, splits=splits)
    ref = probe.reference(q, k, v, lengths)
    assert got.shape == q.shape and got.dtype == torch.float16
    assert probe._rel_err(got, ref) < 2e-3


def test_keys_past_a_rows_length_are_not_attended():
    q, k, v, lengths = probe.inputs(2, 48, torch.float16, DEV)
    lengths = torch.tensor([5, 48], dtype=torch.int32, device=DEV)
    v[0, :, 5:] = 1e4  # what a masked slot holds must not reach the output
    got = probe.decode_attention(q, k, v, lengths, block_n=16, splits=2)
    assert probe._rel_err(got, probe.reference(q, k, v, lengths)) < 2e-3
    assert got[0].abs().max() < 10


def test_more_splits_than_key_blocks_leave_empty_splits_out():
    q, k, v, lengths = probe.inputs(1, 24, torch.float16, DEV)
    got = probe.decode_attention(q, k, v, lengths, block_n=16, splits=8)
    assert probe._rel_err(got, probe.reference(q, k, v, lengths)) < 2e-3


def test_the_probe_says_it_needs_a_gpu_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe runs")
    proc = subprocess.run([sys.executable, "benchmarks/probes/decode_attention_probe.py", "--out", "x.json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no CUDA device" in proc.stderr


def test_kv_copies_pass_three_l2s_within_bounds():
    k = torch.zeros(1, 8, 192, 128, dtype=torch.float16)
    v = torch.zeros_like(k)
    per = 2 * k.numel() * 2  # K and V, fp16
    copies = probe.kv_copies(k, v, l2_bytes=10 * per)
    assert len(copies) == 30 and copies[0][0] is k and copies[1][0] is not k
    assert len(probe.kv_copies(k, v, l2_bytes=per // 4)) == 2
    assert len(probe.kv_copies(k, v, l2_bytes=1000 * per, most=64)) == 64
