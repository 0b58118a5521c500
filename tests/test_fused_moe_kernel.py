"""autoopt's fused-MoE kernel (align step, one GEMM, both GEMMs) against float64 per-expert references.

Under Triton's CPU interpreter where there is no CUDA (as tests/test_kernels_interpret.py): tiny ragged
shapes, odd M, E not a power of two, top-k 1/2/8, experts that receive no token; dots in fp16/fp32 only
(the interpreter's bf16 ``tl.dot`` is wrong in triton 3.9).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from _fuzz import budget  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from autoopt.backend import registry  # noqa: E402
from autoopt.backend.kernels import fused_moe as fm  # noqa: E402
from autoopt.backend.kernels.fused_moe import fused_experts, fused_moe_gemm, moe_align, moe_align_torch  # noqa: E402
from autoopt.backend.runner import evaluate  # noqa: E402
from autoopt.kernels.config import KernelConfig  # noqa: E402
from autoopt.kernels.ops import OpSpec  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 2, "num_warps": 4,
       "num_stages": 2}


def routing(m: int, e: int, topk: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w, ids = torch.softmax(torch.randn((m, e), generator=g), dim=-1).topk(topk, dim=-1)
    return w.to(DEV), ids.to(DEV)


def experts(m: int, e: int, n: int, k: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, k), generator=g)
    w13 = torch.randn((e, 2 * n, k), generator=g) / k ** 0.5
    w2 = torch.randn((e, k, n), generator=g) / n ** 0.5
    return tuple(t.to(DEV, dtype) for t in (x, w13, w2))


def reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor,
              ids: torch.Tensor) -> torch.Tensor:
    """Token by token, choice by choice, in float64."""
    x, w13, w2, tw = x.double(), w13.double(), w2.double(), tw.double()
    n = w2.shape[2]
    out = torch.zeros((x.shape[0], w2.shape[1]), dtype=torch.float64, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w13[e] @ x[t]
            out[t] += tw[t, j] * (w2[e] @ (torch.nn.functional.silu(h[:n]) * h[n:]))
    return out


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


# -- the align step ---------------------------------------------------------------------------------

@pytest.mark.parametrize("m,e,topk,block_m", [(1, 3, 1, 16), (3, 5, 2, 16), (17, 5, 2, 32), (5, 8, 8, 16),
                                              (40, 3, 2, 16)])
def test_align_groups_every_slot_once_under_its_expert_padded_per_expert(m, e, topk, block_m):
    _, ids = routing(m, e, topk)
    sorted_ids, expert_ids, total = moe_align(ids, block_m, e)
    slots = m * topk
    flat = ids.reshape(-1).cpu()
    counts = torch.bincount(flat, minlength=e)
    want_total = int(((counts + block_m - 1) // block_m * block_m).sum())
    assert int(total[0]) == want_total and sorted_ids.numel() % block_m == 0
    s = sorted_ids.cpu()
    real = s[s < slots]
    assert sorted(real.tolist()) == list(range(slots))  # every slot exactly once
    assert bool((s[want_total:] == slots).all())  # the tail is the sentinel
    for b in range(want_total // block_m):
        block = s[b * block_m:(b + 1) * block_m]
        mine = block[block < slots]
        assert mine.numel() > 0 and bool((flat[mine.long()] == int(expert_ids[b])).all())
    assert bool((expert_ids.cpu()[want_total // block_m:] == -1).all())


def test_align_keeps_slot_order_within_an_expert():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], device=DEV)
    sorted_ids, expert_ids, total = moe_align(ids, 4, 5)
    assert sorted_ids.cpu().tolist()[:12] == [1, 4, 6, 6, 3, 6, 6, 6, 0, 2, 5, 6]
    assert expert_ids.cpu().tolist()[:4] == [0, 1, 2, -1] and int(total[0]) == 12


@budget(40)
@given(st.data())
def test_the_one_program_align_equals_the_torch_align(data):
    # any ids, repeats and experts with no slot included, E not a power of two, int32 or int64 ids
    e = data.draw(st.integers(1, 300), label="experts")
    slots = data.draw(st.integers(1, 300), label="slots")
    topk = data.draw(st.sampled_from([d for d in (1, 2, 3, 4, 6, 8) if slots % d == 0]), label="topk")
    block_m = data.draw(st.sampled_from([16, 32, 64, 128]), label="block_m")
    flat = data.draw(st.lists(st.integers(0, e - 1), min_size=slots, max_size=slots), label="ids")
    dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), label="dtype")
    ids = torch.tensor(flat, dtype=dtype, device=DEV).reshape(slots // topk, topk)
    got, want = fm._align_one_program(ids, block_m, e), moe_align_torch(ids, block_m, e)
    for name, a, b in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), got, want, strict=True):
        assert a.dtype == torch.int32 and torch.equal(a.cpu(), b.cpu()), name


def test_a_decode_steps_align_is_one_program_and_a_prefills_the_torch_ops(monkeypatch):
    calls = []
    monkeypatch.setattr(fm, "_align_one_program", lambda *a: calls.append("one") or moe_align_torch(*a))
    monkeypatch.setattr(fm, "moe_align_torch", lambda *a: calls.append("torch") or moe_align_torch(*a))
    decode = torch.zeros((fm.ALIGN_ONE_PROGRAM_SLOTS // 8, 8), dtype=torch.int64, device=DEV)
    prefill = torch.zeros((fm.ALIGN_ONE_PROGRAM_SLOTS // 8 + 1, 8), dtype=torch.int64, device=DEV)
    fm.moe_align(decode, 16, 128)
    fm.moe_align(prefill, 16, 128)
    fm.moe_align(decode, 16, fm.ALIGN_ONE_PROGRAM_EXPERTS + 1)
    assert calls == ["one", "torch", "torch"]


def test_align_gives_an_expert_with_no_tokens_no_block():
    ids = torch.tensor([[0], [0], [4]], device=DEV)
    _, expert_ids, total = moe_align(ids, 16, 5)
    assert int(total[0]) == 32
    assert [x for x in expert_ids.cpu().tolist() if x >= 0] == [0, 4]


# -- the kernel -------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,e,topk", [(1, 3, 1), (3, 5, 2), (17, 5, 2), (5, 8, 8), (3, 3, 2)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fused_experts_match_the_per_token_reference(m, e, topk, dtype):
    x, w13, w2 = experts(m, e, 48, 40, dtype)
    tw, ids = routing(m, e, topk)
    out = fused_experts(x, w13, w2, tw.to(dtype), ids, config=CFG)
    assert out.shape == (m, 40) and out.dtype == dtype
    assert rel(out, reference(x, w13, w2, tw, ids)) <= (5e-3 if dtype == torch.float16 else 1e-5)


def test_fused_experts_with_experts_that_get_no_token():
    x, w13, w2 = experts(4, 7, 32, 32, torch.float32)
    ids = torch.tensor([[6, 0], [0, 6], [6, 0], [0, 6]], device=DEV)  # experts 1..5 idle
    tw = torch.full((4, 2), 0.5, device=DEV)
    out = fused_experts(x, w13, w2, tw, ids, config=CFG)
    assert rel(out, reference(x, w13, w2, tw, ids)) <= 1e-5


@pytest.mark.parametrize("cfg", [{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1},
                                 {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 64}])
def test_fused_experts_agree_across_configs(cfg):
    x, w13, w2 = experts(9, 5, 40, 72, torch.float32)
    tw, ids = routing(9, 5, 2)
    out = fused_experts(x, w13, w2, tw, ids, config={**CFG, **cfg})
    assert rel(out, reference(x, w13, w2, tw, ids)) <= 1e-5


def test_one_gemm_multiplies_each_slot_by_its_routing_weight_when_asked():
    _, _, w2 = experts(5, 3, 24, 40, torch.float32)
    tw, ids = routing(5, 3, 2)
    act = torch.randn((10, 24), device=DEV)
    out = torch.full((10, 40), float("nan"), device=DEV)
    fused_moe_gemm(act, w2, out, moe_align(ids, 16, 3), CFG, a_div=1, num_valid=10, topk_weights=tw)()
    flat, wts = ids.reshape(-1), tw.reshape(-1)
    want = torch.stack([wts[s].double() * (w2[flat[s]].double() @ act[s].double()) for s in range(10)])
    assert rel(out, want) <= 1e-5


def test_fused_experts_refuse_weights_not_in_the_fused_layout():
    x, w13, w2 = experts(3, 3, 32, 32, torch.float32)
    tw, ids = routing(3, 3, 1)
    with pytest.raises(ValueError, match=r"\[E, 2N, K\]"):
        fused_experts(x, w13.transpose(1, 2).contiguous(), w2, tw, ids, config=CFG)


# -- through the registry and the runner --------------------------------------------------------------

@pytest.mark.parametrize("gemm", ["both", "gate_up", "down"])
@pytest.mark.parametrize("weight", [None, "fp8", "fp8_block", "int8", "int4", "int4-asym"])
def test_runner_checks_the_kernel_against_the_float64_reference(gemm, weight):
    op = OpSpec(kind="fused_moe", shape=(7, 5, 2, 64, 160), dtype="fp16", weight=weight, moe_gemm=gemm)
    cfg = KernelConfig(kernel="fused_moe", params={**CFG, "BLOCK_SIZE_K": 64})
    res = evaluate(op, cfg, check_only=True)
    assert res.label in ("checked", "measured"), res.reason
    assert res.rel_err is not None and res.rel_err <= registry.tolerance(op)


def test_registry_routing_is_a_softmax_top_k_never_zero():
    op = OpSpec(kind="fused_moe", shape=(6, 5, 2, 32, 64), dtype="fp16")
    inp = registry.make_inputs(op, "cpu")
    w, ids = inp["topk_weights"], inp["topk_ids"]
    assert w.shape == (6, 2) and bool((w > 0).all()) and bool((w.sum(-1) < 1).all())
    assert bool((ids[:, 0] != ids[:, 1]).all()) and inp["w13"].shape == (5, 64, 64) and inp["w2"].shape == (5, 64, 32)


def test_the_ops_of_one_layer_at_every_m_share_its_experts_drawn_once():
    small, large = (OpSpec(kind="fused_moe", shape=(m, 4, 2, 32, 64), dtype="fp16") for m in (3, 48))
    a, b = registry.make_inputs(small, "cpu"), registry.make_inputs(large, "cpu")
    assert b["w13"] is a["w13"] and b["w2"] is a["w2"] and a["x"].shape == (3, 64) and b["x"].shape == (48, 64)
    other = registry.make_inputs(small, "cpu", seed=1)
    assert not bool((other["w13"] == a["w13"]).all())
    again = registry.make_inputs(small, "cpu")  # drawn again after another seed's: the same values
    assert again["w13"] is not a["w13"] and bool((again["w13"] == a["w13"]).all())


def test_experts_no_op_holds_any_more_are_not_kept():
    import gc
    import weakref

    op = OpSpec(kind="fused_moe", shape=(3, 4, 2, 32, 64), dtype="fp16")
    inputs = registry.make_inputs(op, "cpu", seed=7)
    gone = weakref.ref(inputs["w13"])
    del inputs
    gc.collect()
    assert gone() is None  # the registry held them only weakly


def test_torch_baseline_is_the_per_expert_loop():
    op = OpSpec(kind="fused_moe", shape=(5, 3, 2, 32, 48), dtype="fp16")
    inp = registry.make_inputs(op, "cpu")
    inp = {k: (v.float() if v.is_floating_point() else v) for k, v in inp.items()}
    base = registry.torch_baseline(inp, op)
    assert base is not None
    assert rel(base(), registry.reference(inp, op)) <= 1e-5


def test_compile_only_inputs_carry_a_real_routing_for_the_align_step():
    # precompile workers run the launcher on uninitialised tensors; the align step indexes by the expert ids,
    # so garbage ids were out-of-bounds device asserts there (seen on the H100 during export --tune)
    from autoopt.backend.registry import make_inputs

    op = OpSpec(kind="fused_moe", shape=(5, 6, 2, 32, 64), dtype="fp16")
    inputs = make_inputs(op, "cpu", empty=True)
    assert inputs["topk_ids"].shape == (5, 2) and int(inputs["topk_ids"].min()) >= 0
    assert int(inputs["topk_ids"].max()) < 6


def _int8_experts(w):
    """Per-output-channel symmetric int8 codes and fp32 scales of ``w`` ``[E, N, K]``."""
    s = w.float().abs().amax(dim=2) / 127.0
    return torch.round(w.float() / s[:, :, None]).clamp(-127, 127).to(torch.int8), s


@pytest.mark.parametrize(("m", "e", "topk"), [(1, 4, 2), (7, 5, 2), (17, 3, 1)])
def test_int8_weight_only_experts_match_the_dequantized_reference(m, e, topk):
    gen = torch.Generator().manual_seed(m * 10 + e)
    n, k = 32, 64
    x = torch.randn(m, k, generator=gen).half()
    w13 = torch.randn(e, 2 * n, k, generator=gen) / k ** 0.5
    w2 = torch.randn(e, k, n, generator=gen) / n ** 0.5
    q13, s13 = _int8_experts(w13)
    q2, s2 = _int8_experts(w2)
    weights, ids = torch.softmax(torch.randn(m, e, generator=gen), -1).topk(topk, -1)
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 2}
    d13, d2 = (q13.float() * s13[:, :, None]).half(), (q2.float() * s2[:, :, None]).half()
    assert_matches_dequantized(x, weights, ids, cfg, (q13, q2, d13, d2), w13_scale=s13, w2_scale=s2)


def assert_matches_dequantized(x, weights, ids, cfg, experts, **scales):
    """The packed experts (``experts``: packed w13, w2, then their dequantized fp16) through the kernel match
    the dequantized ones through it, within 5e-3."""
    q13, q2, d13, d2 = experts
    got = fused_experts(x, q13, q2, weights, ids, config=cfg, **scales).float()
    want = fused_experts(x, d13, d2, weights, ids, config=cfg).float()
    assert (got - want).norm() / want.norm() < 5e-3


def test_int8_experts_refuse_scales_that_are_not_one_per_output_channel():
    q = torch.zeros(2, 8, 16, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"one scale per output channel, \[E, N_out\]"):
        fused_moe_gemm(torch.zeros(1, 16).half(), q, torch.zeros(1, 8).half(), moe_align(torch.zeros(1, 1).long(),
                       16, 2), {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1,
                                "num_warps": 4, "num_stages": 2}, a_div=1, num_valid=1, w_scale=torch.ones(2))


def _int4_experts(w):
    """autoopt's int4 (g128, symmetric) of each expert of ``w`` ``[E, N, K]``: packed codes, fp32 scales and
    the dequantized experts."""
    from autoopt.backend.quant import dequantize, quantize

    qs = [quantize(w[i], "int4") for i in range(w.shape[0])]
    return (torch.stack([q.qweight for q in qs]), torch.stack([q.scales.float() for q in qs]),
            torch.stack([dequantize(q) for q in qs]).half())


@pytest.mark.parametrize(("m", "e", "topk", "n", "k", "bk"),
                         [(1, 4, 2, 64, 128, 128), (7, 5, 2, 48, 200, 64), (17, 3, 1, 80, 256, 32)])
def test_int4_experts_match_their_dequantized_experts(m, e, topk, n, k, bk):
    # odd M, E not a power of two, K and N not multiples of the group (200, 48, 80: zero-padded codes)
    gen = torch.Generator().manual_seed(m * 10 + e)
    x = torch.randn(m, k, generator=gen).half()
    w13 = torch.randn(e, 2 * n, k, generator=gen) / k ** 0.5
    w2 = torch.randn(e, k, n, generator=gen) / n ** 0.5
    q13, s13, d13 = _int4_experts(w13)
    q2, s2, d2 = _int4_experts(w2)
    weights, ids = torch.softmax(torch.randn(m, e, generator=gen), -1).topk(topk, -1)
    assert_matches_dequantized(x, weights, ids, {**CFG, "BLOCK_SIZE_K": bk}, (q13, q2, d13, d2), w13_scale=s13,
                               w2_scale=s2)


def test_asymmetric_int4_experts_match_their_dequantized_experts():
    from autoopt.backend.quant import dequantize, quantize

    gen = torch.Generator().manual_seed(3)
    m, e, topk, n, k = 9, 3, 2, 48, 200  # K and N not multiples of the group: zero-padded codes
    x = torch.randn(m, k, generator=gen).half()
    packs = []
    for rows, cols in ((2 * n, k), (k, n)):
        qs = [quantize(torch.randn(rows, cols, generator=gen) / cols ** 0.5 + 0.05, "int4-asym") for _ in range(e)]
        packs.append(tuple(torch.stack(t) for t in zip(*((q.qweight, q.scales, q.offsets, dequantize(q).half())
                                                         for q in qs), strict=True)))
    (q13, s13, z13, d13), (q2, s2, z2, d2) = packs
    weights, ids = torch.softmax(torch.randn(m, e, generator=gen), -1).topk(topk, -1)
    assert_matches_dequantized(x, weights, ids, {**CFG, "BLOCK_SIZE_K": 64}, (q13, q2, d13, d2), w13_scale=s13,
                               w2_scale=s2, w13_offset=z13, w2_offset=z2)


def test_offsets_beside_int8_experts_are_refused():
    q = torch.zeros(2, 8, 16, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"offsets \(zero points\) are an int4 option"):
        fused_moe_gemm(torch.zeros(1, 16).half(), q, torch.zeros(1, 8).half(), moe_align(torch.zeros(1, 1).long(),
                       16, 2), CFG, a_div=1, num_valid=1, w_scale=torch.ones(2, 8), w_offset=torch.ones(2, 8))


@pytest.mark.parametrize("bk", [16, 256])
def test_int4_experts_refuse_a_k_tile_outside_one_group(bk):
    q13, s13, _ = _int4_experts(torch.randn(2, 64, 128))
    q2, s2, _ = _int4_experts(torch.randn(2, 128, 32))
    weights, ids = torch.softmax(torch.randn(3, 2), -1).topk(1, -1)
    with pytest.raises(ValueError, match=f"BLOCK_SIZE_K={bk}: int4 experts take 32 to the group 128"):
        fused_experts(torch.randn(3, 128).half(), q13, q2, weights, ids, config={**CFG, "BLOCK_SIZE_K": bk},
                      w13_scale=s13, w2_scale=s2)


def test_int4_experts_refuse_scales_that_are_not_per_channel_per_group():
    q = torch.zeros(2, 8, 64, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"one scale per output channel per K-group, \[E, N_out, groups\]"):
        fused_moe_gemm(torch.zeros(1, 128).half(), q, torch.zeros(1, 8).half(), moe_align(torch.zeros(1, 1).long(),
                       16, 2), CFG, a_div=1, num_valid=1, w_scale=torch.ones(2, 8))
