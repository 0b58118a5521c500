"""Matmuls with a fused epilogue: ``C = act(A @ W^T + bias)``, ``act`` one of GELU (erf), tanh-GELU, ReLU.

The plain MLP of StarCoder2, GPT-NeoX/Pythia, Phi and Falcon is ``fc2(act(fc1(x)))`` with biased
linears. Adding fc1's bias and applying the activation to the fp32 accumulator before its one store
saves a read and a write of the ``[M, intermediate]`` activation and a launch, and rounds once
instead of after the GEMM, the bias and the activation. A biased linear alone (GPT-NeoX's
``query_key_value``) takes the same path with no activation.

The config is the one ranked for the plain ``gemm`` / ``gemv`` / ``gemm_tma`` kernel of the same
shape: the epilogue adds one bias load per output tile and elementwise math on the accumulator, little
next to the K loop, so the ranking (and a measured winner) is taken to carry over. That is an
assumption: these variants have not been timed on a GPU yet. By path:

- ``gemm`` / ``gemv`` with ``SPLIT_K == 1``: :func:`_gemm_ep_kernel` / :func:`_gemv_ep_kernel`, the
  main loop of ``gemm.py`` / ``gemv.py`` with the epilogue before the store (the GEMM's group-M tile
  order is ``gemm_tma.py``'s ``_tile_of``: the same bands of rows, the last band's tiles rotated);
- ``gemm`` / ``gemv`` with ``SPLIT_K > 1``: the plain kernel writes its fp32 partials and the epilogue
  runs in the reduce that sums them (:func:`_reduce_ep_kernel`, which reads every output element
  once anyway): no extra pass;
- ``gemm_tma`` data-parallel (``SPLIT_K == 1``, no stream-K): :func:`_gemm_tma_ep_kernel`, the
  persistent TMA loop with the epilogue on each tile before its TMA store;
- ``gemm_tma`` split-K or stream-K: the plain kernel, then the epilogue as one in-place pass over C
  (the reduce kernel over one slice): a launch and a pass more, on the shapes where those
  decompositions are picked (few output tiles, so C is small next to the weights).

Why these are copies and not flags on the kernels in ``gemm.py``, ``gemv.py`` and ``gemm_tma.py``: a
stored measurement is tied to its kernel file's hash (:class:`autoopt.backend.registry.KernelEntry`),
and editing those files would turn every shipped H100/H200 matmul measurement stale. With
``HAS_BIAS=False`` and ``ACT=0`` the kernels here give what those give, so when the plain kernels are
next re-measured they can be folded into these (split-K and stream-K included).

The activations in fp32: GELU ``0.5 x (1 + erf(x / sqrt 2))``; tanh-GELU as ``x / (1 + exp(-2z))``
with ``z = sqrt(2/pi) (x + 0.044715 x^3)`` (the same identity as ``gated.py``: no ``tanh``, which the
interpreter lacks; ``exp`` -> inf gives -0, not NaN); ReLU ``max(x, 0)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from autoopt.backend.kernels.gated import _SQRT_2_OVER_PI
from autoopt.backend.kernels.gemm import _gemm_kernel, _needs_fp16_dot, k_split, split_k_launcher, weight_dims
from autoopt.backend.kernels.gemm_tma import _tile_of, gemm_tma_prepare, tma_support
from autoopt.backend.kernels.gemv import _gemv_kernel
from autoopt.errors import BackendError

log = logging.getLogger(__name__)

__all__ = ["ACTIVATIONS", "epilogue_prepare"]

#: activation name -> the ``ACT`` code the kernels branch on at compile time.
ACTIVATIONS = {"none": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}
_RSQRT_2 = tl.constexpr(0.7071067811865476)  # a global a @triton.jit body reads must be constexpr
_REDUCE_BLOCK = 1024


# The @triton.jit functions here carry no annotations on purpose: Triton reads a parameter's annotation
# as its type or specialisation (``n: int`` would pin n to i32), so each is exempt from mypy's
# no-untyped-def by a `type: ignore` on its def line.
@triton.jit
def _activate(y, ACT: tl.constexpr):  # type: ignore[no-untyped-def]
    """``y`` (fp32) through the activation coded ``ACT`` (see :data:`ACTIVATIONS`)."""
    if ACT == 1:
        y = 0.5 * y * (1.0 + tl.erf(y * _RSQRT_2))
    elif ACT == 2:
        z = _SQRT_2_OVER_PI * (y + 0.044715 * y * y * y)
        y = y / (1.0 + tl.exp(-2.0 * z))
    elif ACT == 3:
        y = tl.maximum(y, 0.0)
    return y


@triton.jit
def _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):  # type: ignore[no-untyped-def]
    """A ``[rows, BLOCK_N]`` fp32 accumulator of columns ``offs_n`` plus the bias, through the activation."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    return _activate(acc, ACT)


@triton.jit
def _gemm_ep_kernel(a_ptr, b_ptr, c_ptr, M, N, K,  # type: ignore[no-untyped-def]
                    stride_am, stride_ak, stride_bk, stride_bn,
                    stride_cs, stride_cm, stride_cn, tiles_per_split, bias_ptr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP16: tl.constexpr,
                    HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """``gemm.py``'s tiled GEMM over the whole K (one slice), the epilogue on the accumulator."""
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tiles_per_split):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if DOT_FP16:
            a = a.to(tl.float16)
            b = b.to(tl.float16)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    acc = _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACT)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemv_ep_kernel(x_ptr, w_ptr, c_ptr, M, N, K,  # type: ignore[no-untyped-def]
                    stride_xm, stride_xk, stride_wn, stride_wk,
                    stride_cs, stride_cm, stride_cn, tiles_per_split, bias_ptr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT_M: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP16: tl.constexpr,
                    HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """``gemv.py``'s decode GEMV over the whole K (one slice), the epilogue on the accumulator."""
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_wn[:, None] * stride_wn + offs_k[None, :] * stride_wk

    if BLOCK_M == 1:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        x_ptrs = x_ptr + offs_k * stride_xk
        for kt in range(0, tiles_per_split):
            if EVEN_K:
                w = tl.load(w_ptrs, eviction_policy="evict_first")
                x = tl.load(x_ptrs)
            else:
                kmask = offs_k < K - kt * BLOCK_K
                w = tl.load(w_ptrs, mask=kmask[None, :], other=0.0, eviction_policy="evict_first")
                x = tl.load(x_ptrs, mask=kmask, other=0.0)
            acc2 += w.to(tl.float32) * x.to(tl.float32)[None, :]
            w_ptrs += BLOCK_K * stride_wk
            x_ptrs += BLOCK_K * stride_xk
        acc = tl.sum(acc2, axis=1)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = _activate(acc, ACT)
        tl.store(c_ptr + offs_n * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=offs_n < N)
    else:
        offs_m = tl.arange(0, DOT_M)
        m_ok = offs_m < M
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
        acc = tl.zeros((DOT_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, tiles_per_split):
            if EVEN_K:
                w = tl.load(w_ptrs, eviction_policy="evict_first")
                x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            else:
                kmask = offs_k < K - kt * BLOCK_K
                w = tl.load(w_ptrs, mask=kmask[None, :], other=0.0, eviction_policy="evict_first")
                x = tl.load(x_ptrs, mask=m_ok[:, None] & kmask[None, :], other=0.0)
            if DOT_FP16:
                w = w.to(tl.float16)
                x = x.to(tl.float16)
            acc = tl.dot(x, tl.trans(w), acc)
            w_ptrs += BLOCK_K * stride_wk
            x_ptrs += BLOCK_K * stride_xk
        acc = _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACT)
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & (offs_n[None, :] < N))


@triton.jit
def _gemm_tma_ep_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K,  # type: ignore[no-untyped-def]
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, KN: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """``gemm_tma.py``'s persistent data-parallel TMA GEMM, the epilogue on each tile before its store."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])  # past K: TMA fills the box with zeros
            if KN:
                acc = tl.dot(a, b_desc.load([ki * BLOCK_K, off_n]), acc)
            else:
                acc = tl.dot(a, b_desc.load([off_n, ki * BLOCK_K]).T, acc)
        acc = _epilogue(acc, bias_ptr, off_n + tl.arange(0, BLOCK_N), N, HAS_BIAS, ACT)
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))  # TMA clips the rows and columns past M, N


@triton.jit
def _reduce_ep_kernel(ws_ptr, c_ptr, bias_ptr, MN, N, stride_s,  # type: ignore[no-untyped-def]
                      SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """``c[i] = act(sum_s ws[s * stride_s + i] + bias[i % N])`` in a fixed order (deterministic), cast to
    c's dtype. With one slice and ``ws`` = ``c`` it is the epilogue as an in-place pass over C."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * stride_s + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + offs, _activate(acc, ACT).to(c_ptr.dtype.element_ty), mask=mask)


# -- launchers ---------------------------------------------------------------------------------------------

def _reduce_prepare(ws: Any, out: Any, split_k: int, split_stride: int, bias: Any, act: int) -> Callable[[], None]:
    """A launcher of :func:`_reduce_ep_kernel` summing ``split_k`` slices of ``ws`` into contiguous ``out``."""
    mn, n = out.numel(), out.shape[-1]
    grid = (triton.cdiv(mn, _REDUCE_BLOCK),)
    meta = dict(SPLIT_K=split_k, BLOCK=_REDUCE_BLOCK, HAS_BIAS=bias is not None, ACT=act, num_warps=4)
    b = bias if bias is not None else out  # never read without a bias

    def run() -> None:
        _reduce_ep_kernel[grid](ws, out, b, mn, n, split_stride, **meta)
    return run


def _tiled_prepare(kernel: str, a: Any, w: Any, out: Any, params: dict[str, int], bias: Any, act: int,
                   layout: str) -> Callable[[], None]:
    """``gemm`` or ``gemv``: the epilogue kernel for one K slice, else the plain kernel into an fp32
    ``[SPLIT_K, M, N]`` workspace and the epilogue in the reduce."""
    import torch

    M, K = a.shape
    N, stride_wn, stride_wk = weight_dims(w, layout)
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    split_k = params.get("SPLIT_K", 1)
    if split_k > 1 and not out.is_contiguous():
        raise ValueError(f"split-K {kernel} writes a contiguous output; got a strided one")
    tiles_per_split, even_k = k_split(K, bk, split_k)
    meta: dict[str, Any] = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=even_k, DOT_FP16=_needs_fp16_dot(a),
                                num_warps=params.get("num_warps", 4), num_stages=params.get("num_stages", 3))
    if kernel == "gemv":
        if bm < M:
            raise ValueError(f"gemv BLOCK_M={bm} must be >= M={M} (one program covers every row of X)")
        grid = (triton.cdiv(N, bn), split_k)
        meta["DOT_M"] = max(16, bm)
        fused, plain = _gemv_ep_kernel, _gemv_kernel
        strides = (a.stride(0), a.stride(1), stride_wn, stride_wk)
    else:
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split_k)
        meta["GROUP_M"] = params.get("GROUP_M", 8)
        fused, plain = _gemm_ep_kernel, _gemm_kernel
        strides = (a.stride(0), a.stride(1), stride_wk, stride_wn)  # the GEMM reads W as (k, n)
    dims = (M, N, K)
    if split_k == 1:
        ep = dict(bias_ptr=bias if bias is not None else out, HAS_BIAS=bias is not None, ACT=act)
        return split_k_launcher(fused, grid, a, w, out, dims, strides, tiles_per_split, 1, {**meta, **ep})
    if kernel == "gemm":
        meta["SPLIT_K"] = split_k
    ws = torch.empty((split_k, M, N), device=a.device, dtype=torch.float32)
    reduce = _reduce_prepare(ws, out, split_k, M * N, bias, act)

    def run() -> None:
        plain[grid](a, w, ws, *dims, *strides, ws.stride(0), ws.stride(1), ws.stride(2), tiles_per_split, **meta)
        reduce()
    return run


def _tma_prepare(a: Any, w: Any, out: Any, params: dict[str, int], bias: Any, act: int,
                 layout: str) -> Callable[[], None]:
    """``gemm_tma``: the persistent epilogue kernel when data-parallel, else the plain kernel and an in-place
    epilogue pass."""
    if params.get("SPLIT_K", 1) > 1 or params.get("STREAM_K", 0):
        gemm = gemm_tma_prepare(a, w, out, params, layout=layout)
        if not out.is_contiguous():
            raise BackendError("gemm_tma's epilogue pass after split-K or stream-K needs a contiguous output")
        epilogue = _reduce_prepare(out, out, 1, out.numel(), bias, act)

        def run_then_epilogue() -> None:
            gemm()
            epilogue()
        return run_then_epilogue

    import torch

    why = tma_support(a.device)
    if why:
        raise BackendError(why)
    from triton.tools.tensor_descriptor import TensorDescriptor

    for name, t in (("A", a), ("W", w), ("C", out)):
        if t.stride(-1) != 1 or (t.stride(0) * t.element_size()) % 16:
            raise BackendError(f"gemm_tma: {name} rows must be contiguous and 16-byte aligned "
                               f"(TMA rule); got strides {tuple(t.stride())}, {t.element_size()} B/elem")
    M, K = a.shape
    N = w.shape[0] if layout == "nk" else w.shape[1]
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk] if layout == "nk" else [bk, bn])
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    # on the interpreter (no CUDA device): a few programs, so the persistent tile loop is exercised
    num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.device.type == "cuda" else 4
    grid = (min(triton.cdiv(M, bm) * triton.cdiv(N, bn), num_sms),)
    b = bias if bias is not None else out  # never read without a bias
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=params.get("GROUP_M", 8), NUM_SMS=num_sms,
                KN=layout == "kn", HAS_BIAS=bias is not None, ACT=act,
                num_warps=params.get("num_warps", 4), num_stages=params.get("num_stages", 3))

    def run() -> None:
        _gemm_tma_ep_kernel[grid](a_desc, b_desc, c_desc, b, M, N, K, **meta)
    return run


def epilogue_prepare(kernel: str, a: Any, w: Any, out: Any, params: dict[str, int], *, bias: Any = None,
                     activation: str = "none", layout: str = "nk") -> Callable[[], None]:
    """Bind a ``gemm`` / ``gemv`` / ``gemm_tma`` config to tensors for ``out = act(a @ W^T + bias)``;
    returns a no-argument launcher (workspaces and descriptors made here).

    ``a`` is ``[M, K]``, ``w`` ``[N, K]`` (``nk``) or ``[K, N]`` (``kn``), ``out`` ``[M, N]``, ``bias``
    ``[N]`` with unit stride or None; ``activation`` a key of :data:`ACTIVATIONS`. ValueError for an
    unknown activation or kernel.
    """
    act = ACTIVATIONS.get(activation)
    if act is None:
        raise ValueError(f"unknown epilogue activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != out.shape[-1] or bias.stride(0) != 1):
        raise ValueError(f"epilogue bias must be a unit-stride [N={out.shape[-1]}] vector; got shape "
                         f"{tuple(bias.shape)}, strides {tuple(bias.stride())}")
    if kernel == "gemm_tma":
        return _tma_prepare(a, w, out, params, bias, act, layout)
    if kernel in ("gemm", "gemv"):
        return _tiled_prepare(kernel, a, w, out, params, bias, act, layout)
    raise ValueError(f"no epilogue variant of kernel {kernel!r}; expected gemm, gemv or gemm_tma")
