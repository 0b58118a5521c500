"""Memory model: KV cache (GQA, MLA, sliding window), activations, reserve, fit and headroom."""

from __future__ import annotations

import pytest
from _recommend_hw import H100, RTX3070

from autoopt.planning.catalog import get_model
from autoopt.planning.memory import (
    CUDA_CONTEXT_BYTES,
    DRIVER_RESERVED_BYTES,
    activation_bytes,
    estimate_memory,
    kv_bytes_per_token,
    kv_cache_bytes,
)
from autoopt.planning.quant import get_format


def test_llama3_8b_kv_cache_at_batch_8_context_8192():
    # 32 layers x 8 KV heads x 128 x 2 (K,V) x 8192 tokens x 8 seqs x 2 B = 8,589,934,592 B
    assert kv_cache_bytes(get_model("llama-3-8b"), batch=8, context=8192) == 8_589_934_592


def test_llama3_8b_bf16_on_h100_fits_with_stated_headroom():
    # weights 8,030,261,248 params x 2 B                         = 16,060,522,496
    # KV (above)                                                 =  8,589,934,592
    # activations: 8192-token prefill chunk x (2 x 4096 + 3 x 14336) x 2 B = 838,860,800
    #              + fp32 logits 8 x 128256 x 4 B = 4,104,192    =    842,964,992
    # cuBLAS workspace (Hopper) 32 MiB                           =     33,554,432
    # CUDA context 500,000,000 + driver reserve 503,316,480      =  1,003,316,480
    # fragmentation 5 % x (KV + activations)                     =    471,644,979.2
    # total 27,001,937,971.2 of 85,520,809,984 -> headroom 58,518,872,012.8 B (68.43 %)
    est = estimate_memory(get_model("llama-3-8b"), get_format("bf16"), capacity_bytes=H100.memory_total_bytes,
                          gpu=H100, batch=8, context=8192, prompt_len=7168)
    assert est.weights_bytes == 16_060_522_496
    assert est.activation_bytes == 842_964_992
    assert est.reserve_bytes == CUDA_CONTEXT_BYTES + DRIVER_RESERVED_BYTES == 1_003_316_480
    assert est.total_bytes == pytest.approx(27_001_937_971.2)
    assert est.fits and est.headroom_bytes == pytest.approx(58_518_872_012.8)
    assert est.headroom_pct == pytest.approx(68.43, abs=0.01)


def test_headroom_converts_to_extra_kv_tokens():
    est = estimate_memory(get_model("llama-3-8b"), get_format("bf16"), capacity_bytes=H100.memory_total_bytes,
                          gpu=H100, batch=8, context=8192, prompt_len=7168)
    # 131072 B per token (32 x 8 x 128 x 2 x 2); headroom / (131072 x 1.05)
    assert est.kv_bytes_per_token == 131072
    assert est.extra_kv_tokens == int(58_518_872_012.8 // (131072 * 1.05))


def test_llama3_70b_bf16_does_not_fit_one_h100():
    est = estimate_memory(get_model("llama-3-70b"), get_format("bf16"), capacity_bytes=H100.memory_total_bytes,
                          gpu=H100, batch=1, context=4096)
    assert est.weights_bytes == 2 * 70_553_706_496 and not est.fits and est.headroom_bytes < 0


def test_mla_caches_the_compressed_latent_once():
    # DeepSeek-V3: (512 + 64) x 2 B per layer per token, 61 layers, no x2 for K and V
    assert kv_bytes_per_token(get_model("deepseek-v3")) == 61 * 576 * 2


def test_sliding_window_layers_cache_only_the_window():
    # Gemma-2-9B at 8192: 21 local layers x 4096 + 21 global x 8192 tokens, x 8 KV heads x 256 x 2 x 2 B
    assert kv_cache_bytes(get_model("gemma-2-9b"), batch=1, context=8192) == (21 * 4096 + 21 * 8192) * 8192


def test_mistral_every_layer_is_windowed():
    assert kv_cache_bytes(get_model("mistral-7b"), batch=1, context=32768) == \
        kv_cache_bytes(get_model("mistral-7b"), batch=1, context=4096)


def test_fp8_kv_halves_the_cache():
    m = get_model("llama-3-8b")
    assert kv_cache_bytes(m, batch=1, context=1000, kv_dtype="fp8") * 2 == kv_cache_bytes(m, batch=1, context=1000)


def test_tensor_parallel_splits_kv_heads_but_never_below_one():
    m = get_model("llama-3-70b")  # 8 KV heads
    assert kv_bytes_per_token(m, tp=8) * 8 == kv_bytes_per_token(m)
    assert kv_bytes_per_token(m, tp=16) == kv_bytes_per_token(m, tp=8)


def test_decode_activations_are_sized_for_the_batch():
    m = get_model("llama-3-8b")
    # 4 tokens x 51200 elements x 2 B + 4 x 128256 x 4 B logits
    assert activation_bytes(m, tokens=4, batch=4) == 4 * 51200 * 2 + 4 * 128256 * 4


def test_pre_hopper_workspace_is_4_mib():
    est = estimate_memory(get_model("mistral-7b"), get_format("q4_k_m"), capacity_bytes=RTX3070.memory_total_bytes,
                          gpu=RTX3070, context=1024)
    assert est.workspace_bytes == 4 * 1024 * 1024
