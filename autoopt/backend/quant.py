"""Quantize bf16/fp16 weights in place into the packed formats the kernels read, and the torch references.

:func:`quantize` turns an ``nn.Linear`` weight ``W[N, K]`` into a :class:`QuantizedWeight` for a
:class:`~autoopt.kernels.quant.WeightFormat`; :func:`dequantize` gives the float32 weight the kernels
compute with (the kernels are checked against it, :func:`reference_matmul`); quantization error
against the original layer is a separate number (:func:`autoopt.backend.accuracy.rel_error`). torch is imported lazily.

Scales, per format (q: the stored code):

- ``fp8``: ``s[n] = amax(|W[n, :]|) / 448`` in fp32, ``q = e4m3(W / s)`` (448: e4m3's largest finite).
- ``fp8_block``: ``s[i, j] = amax(|W[128i:128i+128, 128j:128j+128]|) / 448``, fp32 ``[ceil(N/128), ceil(K/128)]``.
- ``int8``: ``s[n] = amax / 127``, ``q = round(W / s)`` in [-127, 127].
- ``int4`` symmetric: per row and K-group of g, ``s = e / -8`` where ``e`` is the group's value of
  largest magnitude with its sign (llama.cpp's Q4_0 rule: the extreme lands exactly on code 0), rounded
  to bf16 first; ``q = clamp(round(W / s) + 8, 0, 15)``; ``w = (q - 8) * s``.
- ``int4`` asymmetric: ``s = (max - min) / 15`` and ``z = min + 8 s`` (the value at the middle code,
  as torchao's tinygemm layout keeps it: it is small, so its bf16 rounding costs less than a stored
  minimum's), both rounded to bf16 before ``q = clamp(round((W - z) / s) + 8, 0, 15)``;
  ``w = (q - 8) * s + z``. Codes are chosen against the stored (rounded) scale and offset.

All-zero channels/blocks/groups get scale 1 (their codes are all zero-valued).

INT4 packing, layout ``int4_group_halves``: ``qweight`` is uint8 ``[N, Kp / 2]`` with
``Kp = ceil(K / g) * g``. Within each row, group ``t`` (K indices ``t*g .. t*g + g - 1``) owns the
``g / 2`` bytes from byte ``t*g/2``; byte ``j`` of the group holds K index ``t*g + j`` in its low
nibble and ``t*g + g/2 + j`` in its high nibble::

    K index:   0  1  2 .. 63 | 64 65 .. 127 | 128 ..              (g = 128)
    byte:      0  1  2 .. 63 |  0  1 .. 63  | 64 ..
    nibble:    lo lo lo   lo | hi hi    hi  | lo ..

So a 16-byte load of a row (one thread's vector load) is 16 contiguous K of the group's first half
(low nibbles) and the same 16 positions of its second half (high nibbles): both halves meet
contiguous activation slices, and no nibble needs moving across lanes before the FMAs or the MMA
(each half is one ``tl.dot`` operand). A group's scale, offset and codes are all in one row, so
one ``[BLOCK_N, BLOCK_K / 2]`` byte tile with ``BLOCK_K`` a multiple or a divisor of ``g`` needs one
scale column per group it covers. The last group is padded when ``K % g != 0``: padded codes are
8 (symmetric: weight 0) or 8 (asymmetric: weight ``z``), and the kernels mask activations past K
to zero, so padding never reaches an output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoopt.errors import BackendError
from autoopt.kernels.quant import FP8_BLOCK, WeightFormat, parse_weight

__all__ = ["FP8_MAX", "QuantizedWeight", "dequantize", "quantize", "quantize_activations", "reference_matmul",
]

#: largest finite float8 e4m3fn value (OCP FP8 spec, E4M3: S.1111.110 = 448)
FP8_MAX = 448.0
_INT8_MAX = 127.0


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizedWeight:
    """A packed weight: its format, the tensors the kernels read, and the original ``[N, K]`` shape.

    ``qweight``: e4m3 ``[N, K]`` (fp8 formats), int8 ``[N, K]``, or uint8 ``[N, Kp/2]`` (int4);
    ``scales``: fp32 ``[N]`` / ``[ceil(N/128), ceil(K/128)]``, bf16 ``[N, ceil(K/g)]`` (int4);
    ``offsets``: int4 asymmetric only, the scales' shape and dtype.
    """

    fmt: WeightFormat
    qweight: Any
    scales: Any
    offsets: Any = None
    n: int
    k: int

    @property
    def nbytes(self) -> int:
        """Bytes the packed tensors hold (equals ``fmt.weight_bytes(n, k)``)."""
        return sum(int(t.numel() * t.element_size()) for t in (self.qweight, self.scales, self.offsets)
                   if t is not None)

    def tensors(self) -> dict[str, Any]:
        """The tensors by their input names (``qweight``, ``scales``, ``offsets`` when asymmetric)."""
        out = {"qweight": self.qweight, "scales": self.scales}
        if self.offsets is not None:
            out["offsets"] = self.offsets
        return out

    @classmethod
    def of(cls, fmt: WeightFormat | str, n: int, k: int, tensors: dict[str, Any]) -> QuantizedWeight:
        """Rebuild from :meth:`tensors`; ``BackendError`` when a tensor is missing or mis-shaped."""
        f = parse_weight(fmt) if isinstance(fmt, str) else fmt
        try:
            q = cls(fmt=f, qweight=tensors["qweight"], scales=tensors["scales"], offsets=tensors.get("offsets"),
                    n=n, k=k)
        except KeyError as exc:
            raise BackendError(f"quantized weight {f.spec} [{n}, {k}] lacks its {exc.args[0]!r} tensor") from None
        q.check()
        return q

    def check(self) -> None:
        """``BackendError`` when a tensor's shape does not match the format and shape."""
        f = self.fmt
        want = {"qweight": f.packed_shape(self.n, self.k), "scales": f.scale_shape(self.n, self.k)}
        if not f.symmetric:
            want["offsets"] = f.scale_shape(self.n, self.k)
        elif self.offsets is not None:
            raise BackendError(f"{f.spec} is symmetric but offsets were given")
        for name, shape in want.items():
            t = getattr(self, name)
            if t is None or tuple(t.shape) != shape:
                got = None if t is None else tuple(t.shape)
                raise BackendError(f"{f.spec} [{self.n}, {self.k}]: {name} has shape {got}, expected {shape}")


def _torch() -> Any:
    import torch

    return torch


def _bf16_round(t: Any) -> Any:
    return t.to(_torch().bfloat16).float()


def quantize(weight: Any, fmt: WeightFormat | str) -> QuantizedWeight:
    """Quantize ``weight`` (``[N, K]``, any float dtype, any device) into ``fmt`` (see the module docstring)."""
    torch = _torch()
    f = parse_weight(fmt) if isinstance(fmt, str) else fmt
    if weight.dim() != 2 or not weight.is_floating_point():
        raise BackendError(f"quantize takes a floating [N, K] weight, got {tuple(weight.shape)} {weight.dtype}")
    n, k = weight.shape
    w = weight.detach().float()
    if f.name == "fp8":
        s = _safe(w.abs().amax(dim=1) / FP8_MAX)
        q = (w / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return QuantizedWeight(fmt=f, qweight=q, scales=s, n=n, k=k)
    if f.name == "int8":
        s = _safe(w.abs().amax(dim=1) / _INT8_MAX)
        q = torch.round(w / s[:, None]).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
        return QuantizedWeight(fmt=f, qweight=q, scales=s, n=n, k=k)
    if f.name == "fp8_block":
        b = FP8_BLOCK
        nb, kb = f.scale_shape(n, k)
        padded = torch.zeros((nb * b, kb * b), dtype=torch.float32, device=w.device)
        padded[:n, :k] = w
        blocks = padded.view(nb, b, kb, b)
        s = _safe(blocks.abs().amax(dim=(1, 3)) / FP8_MAX)
        full = (blocks / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(nb * b, kb * b)
        return QuantizedWeight(fmt=f, qweight=full[:n, :k].to(torch.float8_e4m3fn).contiguous(), scales=s, n=n, k=k)
    return _quantize_int4(w, f)


def _div_rn(x: Any, divisor: float) -> Any:
    """``x / divisor`` correctly rounded, as the kernels' ``div_rn``: torch on CUDA divides by a Python
    scalar as a multiply by its reciprocal, one ulp off (seen on the H100: 0.0074 scales differing in
    the last bit), so the divisor goes in as a tensor."""
    return x / _torch().full_like(x, divisor)


def _safe(scale: Any) -> Any:
    """Scale 1 where a channel/block/group is all zeros (its codes then all mean zero)."""
    return _torch().where(scale > 0, scale, _torch().ones_like(scale))


def _quantize_int4(w: Any, f: WeightFormat) -> QuantizedWeight:
    torch = _torch()
    n, k = w.shape
    g = f.group_size
    assert g is not None
    kp = f.padded_k(k)
    groups = kp // g
    valid = torch.zeros((n, kp), dtype=torch.bool, device=w.device)
    valid[:, :k] = True
    wp = torch.zeros((n, kp), dtype=torch.float32, device=w.device)
    wp[:, :k] = w
    wg, vg = wp.view(n, groups, g), valid.view(n, groups, g)
    if f.symmetric:
        s = _int4_sym_scales(wg, vg)
        z = torch.zeros_like(s)
    else:
        big = torch.finfo(torch.float32).max
        mn = torch.where(vg, wg, torch.full_like(wg, big)).amin(dim=2)
        mx = torch.where(vg, wg, torch.full_like(wg, -big)).amax(dim=2)
        s = _bf16_round(_safe((mx - mn) / 15.0))
        z = _bf16_round(mn + 8.0 * s)
    codes = torch.round((wg - z[..., None]) / s[..., None]) + 8.0
    codes = torch.where(vg, codes.clamp(0, 15), torch.full_like(codes, 8.0)).to(torch.uint8)
    halves = codes.view(n, groups, 2, g // 2)
    packed = (halves[:, :, 0, :] | (halves[:, :, 1, :] << 4)).reshape(n, kp // 2).contiguous()
    sdt = torch.bfloat16 if f.scale_dtype == "bf16" else torch.float32
    return QuantizedWeight(fmt=f, qweight=packed, scales=s.to(sdt).contiguous(),
                           offsets=None if f.symmetric else z.to(sdt).contiguous(), n=n, k=k)


#: Symmetric int4 scale candidates per group, as the signed extreme over the code it lands on: -8 (the
#: extreme on code 0) shrunk by these clip ratios, or +7 (the extreme on code 15, the other side gets
#: -8). Each group keeps the candidate of least squared error. On N(0, 1) weights [4096, 4096], group 128,
#: the relative Frobenius error goes 0.1031 (extreme / -8 alone) -> 0.0971, under the 0.0997 of asymmetric
#: min/max (torchao's int4 is the peer: issue 27 asks for a per-linear error at most its own).
INT4_SYM_CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8)


def _int4_sym_scales(wg: Any, vg: Any) -> Any:
    """Per-group symmetric scales ``[N, groups]`` (bf16-rounded) of the least squared error among the
    ``INT4_SYM_CLIPS`` candidates; ``wg``/``vg``: the grouped fp32 weights and their valid mask."""
    torch = _torch()
    mag = torch.where(vg, wg.abs(), torch.zeros_like(wg))
    ext = torch.gather(wg, 2, mag.argmax(dim=2, keepdim=True)).squeeze(2)
    cands = [ext / (-8.0 / r) for r in INT4_SYM_CLIPS] + [ext / 7.0]
    best_s, best_e = None, None
    for cand in cands:
        sc = _bf16_round(_safe_signed(cand))
        deq = (torch.round(wg / sc[..., None]).clamp(-8, 7)) * sc[..., None]
        err = torch.where(vg, (deq - wg) ** 2, torch.zeros_like(wg)).sum(dim=2)
        if best_s is None:
            best_s, best_e = sc, err
        else:
            better = err < best_e
            best_s, best_e = torch.where(better, sc, best_s), torch.where(better, err, best_e)
    return best_s


def _safe_signed(scale: Any) -> Any:
    torch = _torch()
    return torch.where(scale != 0, scale, torch.ones_like(scale))


def unpack_int4(q: QuantizedWeight) -> Any:
    """The int4 codes ``[N, Kp]`` (uint8 0..15) in K order, undoing the group-halves packing."""
    torch = _torch()
    g = q.fmt.group_size
    assert g is not None
    b = q.qweight
    n, half = b.shape
    groups = 2 * half // g
    bg = b.view(n, groups, g // 2)
    return torch.stack((bg & 0xF, bg >> 4), dim=2).view(n, 2 * half)


def dequantize(q: QuantizedWeight) -> Any:
    """The float32 ``[N, K]`` weight the kernels compute with (codes times scales, exactly)."""
    f, n, k = q.fmt, q.n, q.k
    if f.name in ("fp8", "int8"):
        return q.qweight.float() * q.scales.float()[:, None]
    if f.name == "fp8_block":
        b = FP8_BLOCK
        s = q.scales.float().repeat_interleave(b, 0).repeat_interleave(b, 1)[:n, :k]
        return q.qweight.float() * s
    g = f.group_size
    assert g is not None
    codes = unpack_int4(q).float()[:, :k] - 8.0
    s = q.scales.float().repeat_interleave(g, 1)[:, :k]
    w = codes.double() * s.double()
    if q.offsets is not None:
        w = w + q.offsets.double().repeat_interleave(g, 1)[:, :k]
    return w.float()


def quantize_activations(a: Any, fmt: WeightFormat) -> tuple[Any, Any]:
    """The W8A8 activations: e4m3 ``A`` and fp32 scales, ``[M]`` per token or ``[M, ceil(K/128)]``
    per token per 128-group (``s = amax / 448``, all-zero rows/groups scale 1), as the kernels make them."""
    torch = _torch()
    x = a.float()
    m, k = x.shape
    if fmt.activation == "per_token":
        s = _safe(_div_rn(x.abs().amax(dim=1), FP8_MAX))
        return (x / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), s
    if fmt.activation != "per_token_group":
        raise BackendError(f"{fmt.spec} does not quantize activations")
    g = FP8_BLOCK
    kb = -(-k // g)
    padded = torch.zeros((m, kb * g), dtype=torch.float32, device=x.device)
    padded[:, :k] = x
    xg = padded.view(m, kb, g)
    s = _safe(_div_rn(xg.abs().amax(dim=2), FP8_MAX))
    q = (xg / s[..., None]).clamp(-FP8_MAX, FP8_MAX).view(m, kb * g)[:, :k]
    return q.to(torch.float8_e4m3fn).contiguous(), s


def dequantize_activations(aq: Any, scales: Any) -> Any:
    """float32 ``A`` from :func:`quantize_activations`' output."""
    x = aq.float()
    if scales.dim() == 1:
        return x * scales[:, None]
    return x * scales.repeat_interleave(FP8_BLOCK, 1)[:, : x.shape[1]]


def reference_matmul(a: Any, q: QuantizedWeight, *, gemm: bool = True, bias: Any = None) -> Any:
    """The float64 ``A @ dequantize(W)^T (+ bias)`` the kernels are checked against. With ``gemm`` and a
    W8A8 format, A is first quantized per token (group) as the GEMM does; GEMVs keep A as it is."""
    x = a
    if gemm and q.fmt.quantizes_activations:
        x = dequantize_activations(*quantize_activations(a, q.fmt))
    out = x.double() @ dequantize(q).double().t()
    return out if bias is None else out + bias.double()


