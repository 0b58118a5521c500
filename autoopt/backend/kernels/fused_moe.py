"""autoopt's fused-MoE kernel: both expert GEMMs of a MoE layer, one launch each over every expert.

Config semantics are the runtimes' (vLLM/SGLang ``fused_moe_kernel``): keys ``BLOCK_SIZE_M/N/K``,
``GROUP_SIZE_M``, ``num_warps``, ``num_stages``.

- :func:`moe_align`: the routed token slots (``M * topk``, slot ``s`` = token ``s // topk``'s ``s % topk``-th
  choice) sorted by expert and padded per expert to a multiple of ``BLOCK_SIZE_M``; padding holds the
  sentinel ``M * topk``. Each M-block then belongs to one expert (``expert_ids``; -1 past the end).
  No host synchronisation (the buffers have the worst-case size and the kernel exits early past
  ``num_tokens_post_padded``). Up to :data:`ALIGN_ONE_PROGRAM_SLOTS` slots and :data:`ALIGN_ONE_PROGRAM_EXPERTS`
  experts it is one Triton program (a decode step's case); beyond, ~20 torch ops (a sort among them), whose
  launches a prefill's GEMMs dwarf.
- :func:`fused_moe_gemm`: ``C[slot] = A[slot // a_div] @ W[expert]^T`` for every real slot of every
  M-block, fp32 accumulation, tiles in group-M order over (M-blocks, N-tiles), optionally times the
  slot's routing weight. ``W`` is ``[E, N_out, K]`` (rows of an ``nn.Linear`` per expert).
- :func:`fused_experts`: gate_up GEMM, ``silu(gate) * up`` (gate is the first half of the 2N rows; one pass
  of ``gated.py``'s kernel, fp32 math), down GEMM with the routing weights, sum over the top-k.

Weights as transformers 5 stores fused experts (``MixtralExperts``, ``Qwen3MoeExperts``: ``gate_up_proj``
``[E, 2N, K]``, ``down_proj`` ``[E, K, N]``), which is also vLLM's ``w13``/``w2`` layout. 16-bit experts, or
W8A8 FP8: e4m3 experts with fp32 scales per expert (``[E]``), per output channel (``[E, N_out]``) or
per 128 x 128 block (``[E, ceil(N_out/128), ceil(K/128)]``), activations quantized per token (per token per
128-group for blocks) by ``act_quant.py`` before each GEMM; or W8A16 INT8 (vLLM's ``int8_w8a16``): int8 experts
with an fp32 scale per output channel (``[E, N_out]``), the 16-bit activations as they are, each weight tile
converted to their type on chip (exact: |code| <= 127) and the channel scale applied once after the K loop; or
W4A16 INT4 (vLLM's ``int4_w4a16``): each expert as :func:`autoopt.backend.quant.quantize`
packs ``int4`` (``uint8`` ``[E, N_out, Kp/2]``, K padded to the group, byte ``j`` of a group holding codes ``j``
and ``j + G/2``; scales ``[E, N_out, Kp/G]``, and for ``int4-asym`` offsets of the same shape, ``w = (q - 8) s +
z``: vLLM's zero points, stored as the value at the middle code), decoded to ``q - 8`` in the activations' type
by the dense GEMV's PTX (``quant_gemv.int4_tile_dot``), a K-tile inside one group (``32 <= BLOCK_SIZE_K <= G``)
and its product scaled by the group's scale (plus the offset times the tile's activation sum).
Under Triton's CPU interpreter (triton 3.9) a bf16 ``tl.dot`` is wrong and there is no fp8 dot: the operands
go through fp32 / fp16 there (exact).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels import interpreter_active, traceable
from autoopt.backend.kernels.quant_gemv import int4_tile_dot

__all__ = ["ALIGN_ONE_PROGRAM_EXPERTS", "ALIGN_ONE_PROGRAM_SLOTS", "CONFIG_KEYS", "fused_experts", "fused_moe_gemm",
           "fused_moe_prepare", "moe_align", "moe_align_torch"]

CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
#: side of a block-FP8 scale block (DeepSeek-V3's 128 x 128; autoopt.kernels.quant.FP8_BLOCK)
_FP8_BLOCK = 128
#: scale kinds of the weight (constexpr QUANT): none, FP8 per expert, FP8 per output channel, FP8 per 128 x 128
#: block (these three with e4m3 activations), INT8 per output channel, symmetric INT4 per output channel per
#: K-group (these two with 16-bit activations)
_Q_NONE, _Q_TENSOR, _Q_CHANNEL, _Q_BLOCK, _Q_INT8, _Q_INT4 = 0, 1, 2, 3, 4, 5
#: the kinds whose activations are quantized to e4m3 before each GEMM
_W8A8 = (_Q_TENSOR, _Q_CHANNEL, _Q_BLOCK)


#: the largest slot count (M * topk) and expert count :func:`moe_align` runs as one Triton program: a decode
#: step's align in one launch instead of ~20 (each ~2-3 us in a CUDA graph; the sort alone is several). Its
#: loops walk the slots in chunks of :data:`_ALIGN_CHUNK` against every expert, so its time grows with
#: slots x experts: past these sizes a prefill's GEMMs dwarf the torch path's launches anyway.
ALIGN_ONE_PROGRAM_SLOTS = 1024
ALIGN_ONE_PROGRAM_EXPERTS = 512
_ALIGN_CHUNK = 32
#: the gated activation between the GEMMs: the elementwise template's everyday config (a memory-bound pass;
#: one launch instead of torch's silu and mul, and no intermediate)
_GATED_PARAMS = {"BLOCK_SIZE": 1024, "num_warps": 4}


@triton.jit
def _moe_align_kernel(ids_ptr, sorted_ptr, expert_ids_ptr, total_ptr, numel, cap,  # type: ignore[no-untyped-def]
                      BLOCK_M: tl.constexpr, EXPERTS: tl.constexpr, CHUNK: tl.constexpr):
    """One program: counts per expert, padded starts (an exclusive cumsum), each slot's place (its expert's
    start + the slots of that expert before it), the sentinel fill, the scatter, and each M-block's expert.
    Experts are a ``[EXPERTS]`` axis and slots come in ``[CHUNK]`` chunks, so a slot's per-expert values are
    picked by a one-hot ``[EXPERTS, CHUNK]`` sum, not a gather."""
    e = tl.arange(0, EXPERTS)
    c = tl.arange(0, CHUNK)
    counts = tl.zeros([EXPERTS], dtype=tl.int32)
    for base in range(0, numel, CHUNK):
        ids = tl.load(ids_ptr + base + c, mask=base + c < numel, other=-1).to(tl.int32)
        counts += tl.sum((ids[None, :] == e[:, None]).to(tl.int32), axis=1)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    for base in range(0, cap, CHUNK):  # the sentinel everywhere first; the scatter below overwrites
        tl.store(sorted_ptr + base + c, tl.zeros([CHUNK], dtype=tl.int32) + numel, mask=base + c < cap)
    tl.debug_barrier()  # the fill's stores land before the scatter's (one CTA: bar.sync orders global memory)
    seen = tl.zeros([EXPERTS], dtype=tl.int32)
    for base in range(0, numel, CHUNK):
        ids = tl.load(ids_ptr + base + c, mask=base + c < numel, other=-1).to(tl.int32)
        hot = (ids[None, :] == e[:, None]).to(tl.int32)  # [EXPERTS, CHUNK]
        before = tl.cumsum(hot, axis=1) - hot  # this chunk's earlier slots of the same expert
        pos = tl.sum(hot * (starts[:, None] + seen[:, None] + before), axis=0)
        tl.store(sorted_ptr + pos, base + c, mask=base + c < numel)
        seen += tl.sum(hot, axis=1)
    for base in range(0, cap // BLOCK_M, CHUNK):
        first = (base + c) * BLOCK_M
        expert = tl.sum((ends[:, None] <= first[None, :]).to(tl.int32), axis=0)  # searchsorted(ends, right)
        expert = tl.where(first < total, expert, -1)
        tl.store(expert_ids_ptr + base + c, expert, mask=base + c < cap // BLOCK_M)
    tl.store(total_ptr, total)


def moe_align(topk_ids: Any, block_m: int, num_experts: int) -> tuple[Any, Any, Any]:
    """``(sorted_token_ids, expert_ids, num_tokens_post_padded)`` for ``topk_ids`` ``[M, topk]``.

    ``sorted_token_ids`` (int32, worst-case length ``min(M*topk + E*(block_m-1), M*topk*block_m)``
    rounded up to ``block_m``): slots grouped by expert in expert order, within an expert in slot order,
    each expert's run padded to a multiple of ``block_m`` with the sentinel ``M*topk``; unused tail also
    the sentinel. ``expert_ids`` (int32, one per M-block): the block's expert, -1 past the padded total.
    ``num_tokens_post_padded`` (int32 ``[1]``): that total, ``sum_e ceil(count_e / block_m) * block_m``."""
    numel = topk_ids.numel()
    if 0 < numel <= ALIGN_ONE_PROGRAM_SLOTS and 0 < num_experts <= ALIGN_ONE_PROGRAM_EXPERTS \
            and (topk_ids.is_cuda or interpreter_active()):
        return _align_one_program(topk_ids, block_m, num_experts)
    return moe_align_torch(topk_ids, block_m, num_experts)


def _align_cap(numel: int, block_m: int, num_experts: int) -> int:
    """The worst-case padded length, rounded up to ``block_m`` (see :func:`moe_align`)."""
    worst = min(numel + num_experts * (block_m - 1), numel * block_m)
    return -(-max(worst, 1) // block_m) * block_m


def _align_one_program(topk_ids: Any, block_m: int, num_experts: int) -> tuple[Any, Any, Any]:
    """:func:`moe_align` as one launch of :func:`_moe_align_kernel`."""
    import torch

    flat = topk_ids.reshape(-1).contiguous()
    numel, dev = flat.numel(), flat.device
    cap = _align_cap(numel, block_m, num_experts)
    sorted_ids = torch.empty((cap,), dtype=torch.int32, device=dev)
    expert_ids = torch.empty((cap // block_m,), dtype=torch.int32, device=dev)
    total = torch.empty((1,), dtype=torch.int32, device=dev)
    experts = triton.next_power_of_2(num_experts)
    traceable(_moe_align_kernel)[(1,)](flat, sorted_ids, expert_ids, total, numel, cap, BLOCK_M=block_m,
                                       EXPERTS=experts, CHUNK=_ALIGN_CHUNK, num_warps=8 if experts > 128 else 4)
    return sorted_ids, expert_ids, total


def moe_align_torch(topk_ids: Any, block_m: int, num_experts: int) -> tuple[Any, Any, Any]:
    """:func:`moe_align` in torch ops (any size; the one-program kernel's reference in the tests)."""
    import torch

    flat = topk_ids.reshape(-1).to(torch.int64)
    numel = flat.numel()
    dev = flat.device
    # scatter_add, not bincount: CUDA's bincount reads the maximum id back to the host, which a CUDA graph
    # cannot capture (optimize()'s decode step is captured whole)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    cap = _align_cap(numel, block_m, num_experts)
    order = torch.argsort(flat, stable=True)
    by_expert = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    pos = starts[by_expert] + torch.arange(numel, device=dev) - first_of_expert[by_expert]
    sorted_ids = torch.full((cap,), numel, dtype=torch.int32, device=dev)
    sorted_ids[pos] = order.to(torch.int32)
    block_starts = torch.arange(cap // block_m, device=dev) * block_m
    expert_of_block = torch.searchsorted(ends, block_starts, right=True)
    total = ends[-1:] if num_experts else torch.zeros(1, dtype=torch.int64, device=dev)
    expert_ids = torch.where(block_starts < total, expert_of_block, -1).to(torch.int32)
    return sorted_ids, expert_ids, total.to(torch.int32)


@triton.jit
def _fused_moe_kernel(a_ptr, w_ptr, c_ptr, a_s_ptr, w_s_ptr, w_z_ptr, topk_w_ptr,  # type: ignore[no-untyped-def]
                      sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, N, K, EM, num_valid,
                      stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
                      stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk,
                      A_DIV: tl.constexpr, MUL_ROUTED: tl.constexpr, QUANT: tl.constexpr,
                      SCALE_BLOCK: tl.constexpr, DOT_CAST: tl.constexpr,
                      BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                      GROUP_SIZE_M: tl.constexpr, INT4_F16: tl.constexpr = False, ASM: tl.constexpr = False,
                      HAS_Z: tl.constexpr = False):
    # group-M tile order over (M-blocks, N-tiles): GROUP_SIZE_M consecutive M-blocks walk the N-tiles together
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    in_group = GROUP_SIZE_M * num_pid_n
    first_m = (pid // in_group) * GROUP_SIZE_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m
    if pid_m * BLOCK_SIZE_M >= tl.load(ntpp_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slot = tl.load(sorted_ids_ptr + offs_m).to(tl.int64)
    valid = slot < num_valid
    row = slot // A_DIV
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + row[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    if QUANT == 5:  # int4: every K-tile lies in one group (SCALE_BLOCK, the group, is a multiple of BLOCK_SIZE_K)
        acc = _int4_tiles(acc, a_ptr, w_ptr, w_s_ptr, w_z_ptr, row, valid, offs_n % N, expert, K, stride_am,
                          stride_ak, stride_we, stride_wn, stride_wse, stride_wsn, SCALE_BLOCK, BLOCK_SIZE_K, INT4_F16,
                          ASM, HAS_Z)
    else:  # a constexpr branch: Triton compiles only the taken one (int4's uint8 codes never meet tl.dot here)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            k_ok = offs_k < K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if QUANT == 4:  # int8 codes are exact in the activations' 16-bit type
                w = w.to(a.dtype)
            if DOT_CAST == 1:
                a = a.to(tl.float16)
                w = w.to(tl.float16)
            elif DOT_CAST == 2:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            if QUANT == 3:  # block-FP8: each K-tile lies in one 128-block; scale its product before adding
                kb = (k * BLOCK_SIZE_K) // SCALE_BLOCK
                a_s = tl.load(a_s_ptr + row * stride_asm + kb * stride_ask, mask=valid, other=0.0)
                w_s = tl.load(w_s_ptr + expert * stride_wse + (offs_n // SCALE_BLOCK) * stride_wsn + kb * stride_wsk,
                              mask=n_ok, other=0.0)
                acc += tl.dot(a, w) * (a_s[:, None] * w_s[None, :])
            else:
                acc = tl.dot(a, w, acc)
            a_ptrs += BLOCK_SIZE_K * stride_ak
            w_ptrs += BLOCK_SIZE_K * stride_wk
    if QUANT == 1 or QUANT == 2:  # per-token activation scale x the expert's (or its channel's) weight scale
        a_s = tl.load(a_s_ptr + row * stride_asm, mask=valid, other=0.0)
        if QUANT == 1:
            acc = acc * a_s[:, None] * tl.load(w_s_ptr + expert * stride_wse)
        else:
            w_s = tl.load(w_s_ptr + expert * stride_wse + offs_n * stride_wsn, mask=n_ok, other=0.0)
            acc = acc * (a_s[:, None] * w_s[None, :])
    if QUANT == 4:
        acc = acc * tl.load(w_s_ptr + expert * stride_wse + offs_n * stride_wsn, mask=n_ok, other=0.0)[None, :]
    if MUL_ROUTED:
        acc = acc * tl.load(topk_w_ptr + slot, mask=valid, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + slot[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _int4_tiles(acc, a_ptr, w_ptr, s_ptr, z_ptr, row, valid, offs_wn, expert, K,  # type: ignore[no-untyped-def]
                stride_am, stride_ak, stride_we, stride_wn, stride_se, stride_sn,
                G: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, F16: tl.constexpr, ASM: tl.constexpr,
                HAS_Z: tl.constexpr):
    """``acc`` plus A's gathered rows times one expert's int4 codes over all of K: each K-tile is ``BLOCK_SIZE_K /
    2`` bytes of one group (byte ``j`` of a group holds codes ``j`` and ``j + G/2``), two dots on ``q - 8`` in the
    16-bit type (:func:`~autoopt.backend.kernels.quant_gemv.int4_tile_dot`), scaled by the group's scale
    (``HAS_Z``: plus its offset, laid out as the scales, times the tile's activation sums). ``offs_wn`` are
    wrapped rows (loads stay in bounds; the store masks them)."""
    HB: tl.constexpr = G // 2
    TB: tl.constexpr = BLOCK_SIZE_K // 2
    w_rows = w_ptr + expert * stride_we + offs_wn * stride_wn
    s_exp = s_ptr + expert * stride_se
    z_exp = z_ptr + expert * stride_se
    kp = tl.cdiv(K, G) * G
    for t in range(0, kp // BLOCK_SIZE_K):
        byte0 = t * TB
        pb = byte0 + tl.arange(0, TB)
        grp = byte0 // HB
        wb = tl.load(w_rows[:, None] + pb[None, :])
        k_lo = grp * G + pb % HB
        k_hi = k_lo + HB
        a_lo = tl.load(a_ptr + row[:, None] * stride_am + k_lo[None, :] * stride_ak,
                       mask=valid[:, None] & (k_lo < K)[None, :], other=0.0)
        a_hi = tl.load(a_ptr + row[:, None] * stride_am + k_hi[None, :] * stride_ak,
                       mask=valid[:, None] & (k_hi < K)[None, :], other=0.0)
        acc = int4_tile_dot(acc, a_lo, a_hi, wb, s_exp, z_exp, offs_wn, stride_sn, grp, HAS_Z, F16, ASM)
    return acc


def _quant_kind(w: Any, w_scale: Any | None) -> int:
    import torch

    if w_scale is None:
        return _Q_NONE
    e, n_out, k = w.shape
    if w.dtype == torch.uint8:
        if w_scale.dim() != 3 or tuple(w_scale.shape[:2]) != (e, n_out) or (2 * k) % w_scale.shape[2]:
            raise ValueError(f"int4 experts {tuple(w.shape)} (packed, K/2 bytes a row) take one scale per output "
                             f"channel per K-group, [E, N_out, groups] with E={e}, N_out={n_out}; got "
                             f"{tuple(w_scale.shape)}")
        return _Q_INT4
    if w.dtype == torch.int8:
        if tuple(w_scale.shape) != (e, n_out):
            raise ValueError(f"int8 experts {tuple(w.shape)} take one scale per output channel, [E, N_out] = "
                             f"{[e, n_out]}; got {tuple(w_scale.shape)}")
        return _Q_INT8
    if w_scale.dim() == 1 or w_scale.numel() == e:
        return _Q_TENSOR
    if w_scale.dim() == 2 and tuple(w_scale.shape) == (e, n_out):
        return _Q_CHANNEL
    if w_scale.dim() == 3 and tuple(w_scale.shape) == (e, -(-n_out // _FP8_BLOCK), -(-k // _FP8_BLOCK)):
        return _Q_BLOCK
    raise ValueError(f"weight scales {tuple(w_scale.shape)} fit none of [E], [E, N_out], [E, ceil(N_out/128), "
                     f"ceil(K/128)] for experts {tuple(w.shape)}")


def _check_offset(quant: int, w_scale: Any | None, w_offset: Any | None) -> None:
    """Offsets only beside int4 scales, in their shape (the kernel reads both through one set of strides)."""
    if w_offset is None:
        return
    if quant != _Q_INT4 or w_scale is None:
        raise ValueError("weight offsets (zero points) are an int4 option; these experts are not int4")
    if tuple(w_offset.shape) != tuple(w_scale.shape) or w_offset.stride() != w_scale.stride():
        raise ValueError(f"int4 offsets {tuple(w_offset.shape)} must have the scales' shape {tuple(w_scale.shape)} "
                         "and strides")


def _check_config(config: Mapping[str, int], quant: int, group: int = _FP8_BLOCK) -> dict[str, int]:
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise ValueError(f"fused-MoE config lacks {missing}; expected keys {list(CONFIG_KEYS)}")
    cfg = {k: int(config[k]) for k in CONFIG_KEYS}
    bk = cfg["BLOCK_SIZE_K"]
    if quant == _Q_BLOCK and bk > _FP8_BLOCK:
        raise ValueError(f"BLOCK_SIZE_K={bk} > {_FP8_BLOCK}: a block-FP8 K-tile must lie in one scale block")
    # int4: a K-tile is two dots of BLOCK_SIZE_K/2 codes (mma's 16-bit K step is 16) inside one group
    if quant == _Q_INT4 and not (32 <= bk <= group and group % bk == 0):
        raise ValueError(f"BLOCK_SIZE_K={bk}: int4 experts take 32 to the group {group}, dividing it (a K-tile "
                         "lies in one group)")
    return cfg


def _int4_group(w: Any, w_scale: Any, k: int) -> int:
    """The K-group of int4 experts ``w`` ``[E, N_out, Kp/2]`` for K = ``k`` (Kp: k padded to the group)."""
    group = 2 * w.shape[2] // w_scale.shape[2]
    if -(-k // group) * group != 2 * w.shape[2]:
        raise ValueError(f"int4 experts {tuple(w.shape)} with {w_scale.shape[2]} groups a row hold K="
                         f"{2 * w.shape[2]} padded codes, not K={k} padded to groups of {group}")
    return group


def _dot_cast(dtype: Any) -> int:
    import torch

    if not interpreter_active():
        return 0
    return 1 if dtype == torch.float8_e4m3fn else 2 if dtype == torch.bfloat16 else 0


def fused_moe_gemm(a: Any, w: Any, out: Any, align: tuple[Any, Any, Any], config: Mapping[str, int], *,
                   a_div: int, num_valid: int, w_scale: Any | None = None, a_scale: Any | None = None,
                   topk_weights: Any | None = None, w_offset: Any | None = None) -> Callable[[], None]:
    """A launcher of one expert GEMM: ``out[s] = (A[s // a_div] @ w[e(s)]^T) [* topk_weights[s]]`` for each
    real slot ``s`` (``out`` ``[num_valid, N_out]``; padding rows are never written).

    ``a`` ``[rows, K]`` (16-bit, or e4m3 with ``a_scale`` ``[rows]`` / ``[rows, ceil(K/128)]``), ``w``
    ``[E, N_out, K]`` (16-bit, or e4m3 with ``w_scale``: see the module docstring), ``align`` from
    :func:`moe_align` with ``config["BLOCK_SIZE_M"]``; ``a_div`` = top-k when A holds one row per token,
    1 when one row per slot. ``topk_weights`` ``[M, topk]`` (contiguous) multiplies each slot's row.
    ``w_offset``: asymmetric int4's offsets, the scales' shape and strides."""
    quant = _quant_kind(w, w_scale)
    _check_offset(quant, w_scale, w_offset)
    _, n_out, k = w.shape
    group = _FP8_BLOCK
    if quant == _Q_INT4:
        k = a.shape[1]
        group = _int4_group(w, w_scale, k)
    cfg = _check_config(config, quant, group)
    sorted_ids, expert_ids, ntpp = align
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    em = sorted_ids.numel()
    grid = (triton.cdiv(em, bm) * triton.cdiv(n_out, bn),)
    if quant in _W8A8 and a_scale is None:
        raise ValueError("FP8 experts take e4m3 activations with their scales (a_scale)")
    a_s = a_scale if a_scale is not None else a
    w_s = w_scale if w_scale is not None else w
    if a_scale is not None and a_scale.dim() == 1:
        a_s = a_scale[:, None]
    if quant == _Q_TENSOR:
        w_s = w_s.reshape(-1, 1, 1)
    elif quant in (_Q_CHANNEL, _Q_INT8):
        w_s = w_s[:, :, None]
    tw = topk_weights.reshape(-1) if topk_weights is not None else a
    w_z = w_offset if w_offset is not None else w_s
    dot_cast = 0 if quant == _Q_INT4 else _dot_cast(a.dtype if quant == _Q_INT8 else w.dtype)
    import torch

    int4_f16 = a.dtype == torch.float16 or interpreter_active()  # the interpreter's bf16 dot is wrong

    def run() -> None:
        traceable(_fused_moe_kernel)[grid](
            a, w, out, a_s, w_s, w_z, tw, sorted_ids, expert_ids, ntpp, n_out, k, em, num_valid,
            a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1),
            a_s.stride(0), a_s.stride(1) if a_s.dim() > 1 else 0, w_s.stride(0), w_s.stride(1), w_s.stride(2),
            A_DIV=a_div, MUL_ROUTED=topk_weights is not None, QUANT=quant, SCALE_BLOCK=group,
            DOT_CAST=dot_cast, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=cfg["GROUP_SIZE_M"],
            INT4_F16=int4_f16, ASM=not interpreter_active(), HAS_Z=w_offset is not None, num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"])
    return run


def _quantize_rows(x: Any, quant: int) -> tuple[Any, Any]:
    """e4m3 rows and their scales (per row, or per row per 128-group for block-FP8) by ``act_quant.py``."""
    import torch

    from autoopt.backend.kernels.act_quant import act_quant_prepare

    rows, k = x.shape
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    if quant == _Q_BLOCK:
        s = torch.empty((rows, -(-k // _FP8_BLOCK)), dtype=torch.float32, device=x.device)
        act_quant_prepare(x, q, s, group=_FP8_BLOCK)()
    else:
        s = torch.empty((rows,), dtype=torch.float32, device=x.device)
        act_quant_prepare(x, q, s)()
    return q, s


def _check_shapes(w13: Any, w2: Any, w13_scale: Any | None, w2_scale: Any | None) -> None:
    """Experts ``[E, 2N, K]`` and ``[E, K, N]`` (int4: the last dim packed, K or N padded to the group, halved)."""
    import torch

    e, two_n = w13.shape[:2]
    n, k = two_n // 2, w2.shape[1]
    if w13.dtype == torch.uint8 and w13_scale is not None and w2_scale is not None:
        gk, gn = 2 * w13.shape[2] // w13_scale.shape[2], 2 * w2.shape[2] // w2_scale.shape[2]
        want13, want2 = (e, two_n, -(-k // gk) * gk // 2), (e, k, -(-n // gn) * gn // 2)
    else:
        want13, want2 = (e, two_n, k), (e, k, n)
    if two_n % 2 or tuple(w13.shape) != want13 or tuple(w2.shape) != want2:
        raise ValueError(f"experts w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} are not [E, 2N, K] and [E, K, N] "
                         "(int4: the last dim packed two codes a byte, padded to the group)")


def fused_moe_prepare(hidden: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any, out: Any, *,
                      config: Mapping[str, int], activation: str = "silu", w13_scale: Any | None = None,
                      w2_scale: Any | None = None, gemm: str = "both", w13_offset: Any | None = None,
                      w2_offset: Any | None = None) -> Callable[[], None]:
    """A launcher of :func:`fused_experts` (``gemm="both"``) or of one of its GEMMs writing ``out``.

    ``gemm="gate_up"``: ``hidden`` ``[M, K]`` -> ``out`` ``[M*topk, 2N]`` (one row per slot). ``gemm="down"``:
    ``hidden`` is the activation ``[M*topk, N]`` -> ``out`` ``[M*topk, K]``, each row times its routing
    weight. Buffers are allocated here, outside any timed region; the align step runs inside."""
    import torch

    if activation != "silu":
        raise ValueError(f"activation {activation!r} is not supported; the fused experts run 'silu' (SwiGLU)")
    if gemm not in ("both", "gate_up", "down"):
        raise ValueError(f"gemm must be 'both', 'gate_up' or 'down', got {gemm!r}")
    e, two_n = w13.shape[:2]
    n, k = two_n // 2, w2.shape[1]
    _check_shapes(w13, w2, w13_scale, w2_scale)
    topk_ids = topk_ids.contiguous()
    topk_weights = topk_weights.contiguous()
    m, topk = topk_ids.shape
    slots = m * topk
    quant = _quant_kind(w13, w13_scale)
    cfg = _check_config(config, quant, _int4_group(w13, w13_scale, k) if quant == _Q_INT4 else _FP8_BLOCK)
    dev, dt = hidden.device, hidden.dtype
    inter = torch.empty((slots, 2 * n), dtype=dt, device=dev) if gemm == "both" else None
    act = torch.empty((slots, n), dtype=dt, device=dev) if gemm == "both" else None
    partial = torch.empty((slots, k), dtype=dt, device=dev) if gemm == "both" else None
    gated = None
    if inter is not None and act is not None:  # silu(gate) * up in one pass over the strided halves (fp32 math)
        from autoopt.backend.kernels.gated import gated_prepare

        gated = gated_prepare(inter[:, :n], inter[:, n:], act, _GATED_PARAMS, gelu=False)

    def run() -> None:
        align = moe_align(topk_ids, cfg["BLOCK_SIZE_M"], e)
        if gemm == "down":
            x, xs = _quantize_rows(hidden, quant) if quant in _W8A8 else (hidden, None)
            fused_moe_gemm(x, w2, out, align, cfg, a_div=1, num_valid=slots, w_scale=w2_scale, a_scale=xs,
                           topk_weights=topk_weights, w_offset=w2_offset)()
            return
        x, xs = _quantize_rows(hidden, quant) if quant in _W8A8 else (hidden, None)
        first = out if gemm == "gate_up" else inter
        fused_moe_gemm(x, w13, first, align, cfg, a_div=topk, num_valid=slots, w_scale=w13_scale, a_scale=xs,
                       w_offset=w13_offset)()
        if gemm == "gate_up":
            return
        assert gated is not None and act is not None and partial is not None
        gated()
        y, ys = _quantize_rows(act, quant) if quant in _W8A8 else (act, None)
        fused_moe_gemm(y, w2, partial, align, cfg, a_div=1, num_valid=slots, w_scale=w2_scale, a_scale=ys,
                       topk_weights=topk_weights, w_offset=w2_offset)()
        torch.sum(partial.view(m, topk, k), dim=1, out=out)
    return run


def fused_experts(hidden: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any, *, config: Mapping[str, int],
                  activation: str = "silu", w13_scale: Any | None = None, w2_scale: Any | None = None,
                  w13_offset: Any | None = None, w2_offset: Any | None = None) -> Any:
    """A MoE layer's experts: ``sum_j topk_weights[:, j] * down_e(silu(gate_e(x)) * up_e(x))``, ``e = topk_ids[:, j]``.

    ``hidden`` ``[M, K]``; ``w13`` ``[E, 2N, K]`` (gate rows first, then up: transformers 5's
    ``gate_up_proj``); ``w2`` ``[E, K, N]`` (``down_proj``); ``topk_weights`` / ``topk_ids`` ``[M, topk]``;
    ``config``: the six runtime keys (one config for both GEMMs). FP8 experts: e4m3 ``w13``/``w2`` with
    their scales; int4 experts: packed codes, scales and (asymmetric) offsets. Returns ``[M, K]`` in
    ``hidden``'s dtype."""
    import torch

    out = torch.empty((hidden.shape[0], w2.shape[1]), dtype=hidden.dtype, device=hidden.device)
    fused_moe_prepare(hidden, w13, w2, topk_weights, topk_ids, out, config=config, activation=activation,
                      w13_scale=w13_scale, w2_scale=w2_scale, w13_offset=w13_offset, w2_offset=w2_offset)()
    return out
