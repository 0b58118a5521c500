"""What the decode GEMV's fusions buy in a decode step (issue 27: the int4 step's share of its weight-read
floor is bound by its launches): a Llama-3-8B decode chain at batch 1 built from the kernels a step runs, captured in
one CUDA graph, two ways, same process:

- ``plain``: per layer RMSNorm, the fused qkv GEMV, attention over a ``--keys`` cache (SDPA, GQA), the o GEMV, the
  residual add, RMSNorm, the gate_up GEMV, SwiGLU, the down GEMV (split-K where chosen) and the residual add, every
  GEMV on autoopt's kernel for ``--format`` (int4-g128 by default; fp8, int8) with the config ``optimize()`` would
  choose (``autoopt.nn.dispatch.choose``);
- ``fused``: RMSNorm in the qkv and gate_up GEMVs' prologue, SwiGLU in gate_up's epilogue, the residual adds in o's
  and down's (``quant_gemv_prepare(norm_weight=, gated=, residual=)``; split-K 1 where an epilogue fuses).

Each layer has its own weights. Checked before anything is timed: the plain GEMVs against the float64 dequantized
reference, each fused GEMV against its separate ops in float64; the fused chain's output against the plain chain's is
recorded (rounding differs: the fused norm rounds x g once). Timed: graph replays, the variants interleaved over
``--rounds`` rounds, the median of each. Labelled measured.

    PYTHONPATH=. python benchmarks/probes/fused_chain_probe.py --out $OUT/fused_chain_int4.json
    PYTHONPATH=. python benchmarks/probes/fused_chain_probe.py --format fp8 --out $OUT/fused_chain_fp8.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128
SHAPES = {"qkv": (6144, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
ORDER = ("qkv", "o", "gate_up", "down")
#: the weight formats whose decode GEMV takes the fusions (M = 1, the FMA path)
FORMATS = ("int4", "int4-asym", "int8", "fp8", "fp8_block")
#: the kernel's output against the float64 reference (the module tests' bound)
REL_TOL = 8e-3


def build_layers(n_layers: int, spec: str) -> list[dict[str, Any]]:
    """One layer's weights quantized once, copied per layer (distinct memory, same values)."""
    import torch

    from autoopt.backend.quant import QuantizedWeight, quantize

    gen = torch.Generator(device="cuda").manual_seed(0)
    base = {}
    for name, (n, k) in SHAPES.items():
        w = (torch.randn((n, k), device="cuda", generator=gen) * k ** -0.5).bfloat16()
        base[name] = quantize(w, spec)
        del w

    def copy(q: Any) -> Any:
        return QuantizedWeight(fmt=q.fmt, qweight=q.qweight.clone(), scales=q.scales.clone(),
                               offsets=None if q.offsets is None else q.offsets.clone(), n=q.n, k=q.k)
    return [{name: copy(q) for name, q in base.items()} for _ in range(n_layers)]


def configs(layer: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The decode (M = 1) config optimize() runs for each linear."""
    import torch

    from autoopt.nn.dispatch import choose, matmul_kind

    out = {}
    for name, q in layer.items():
        c = choose("quant_linear", matmul_kind(1), (1, q.n, q.k), torch.bfloat16, torch.device("cuda"),
                   weight=q.fmt.spec)
        if c.config is None:
            raise RuntimeError(f"no decode kernel chosen for {name}: {c.fallback}")
        out[name] = dict(c.config.params)
    return out


def check_kernels(layer: dict[str, Any], cfgs: dict[str, dict[str, int]]) -> dict[str, float]:
    """Relative error of each shape's GEMV against the float64 dequantized reference."""
    import torch

    from autoopt.backend.accuracy import rel_error
    from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare
    from autoopt.backend.quant import reference_matmul

    errs = {}
    for name, q in layer.items():
        x = torch.randn((1, q.k), device="cuda").bfloat16()
        out = torch.empty((1, q.n), device="cuda", dtype=torch.bfloat16)
        quant_gemv_prepare(x, q, out, cfgs[name])()
        torch.cuda.synchronize()
        errs[name] = float(rel_error(out.float(), reference_matmul(x, q, gemm=False).float()))
        if not errs[name] <= REL_TOL:
            raise RuntimeError(f"{name}: rel err {errs[name]:.3g} against the reference (bound {REL_TOL})")
    return errs


def make_chain(layers: list[dict[str, Any]], cfgs: dict[str, dict[str, int]], x0: Any, kv: tuple[Any, Any],
               norm_w: Any) -> Any:
    """The step as a function of the hidden state buffer ``x0`` (updated in place, returned)."""
    import torch
    import torch.nn.functional as F

    from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare

    k_cache, v_cache = kv
    flat = [(i, name) for i in range(len(layers)) for name in ORDER]

    def gemv(j: int, a: Any) -> Any:
        i, name = flat[j]
        q = layers[i][name]
        out = torch.empty((1, q.n), device="cuda", dtype=torch.bfloat16)
        quant_gemv_prepare(a, q, out, cfgs[name])()
        return out

    def step() -> Any:
        x = x0
        for i in range(len(layers)):
            j = 4 * i
            h = F.rms_norm(x, (HIDDEN,), norm_w, 1e-5)
            qkv = gemv(j, h)
            q = qkv[:, :HIDDEN].view(1, HEADS, 1, HEAD_DIM)
            attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
            o = gemv(j + 1, attn.reshape(1, HIDDEN))
            x = x + o
            h = F.rms_norm(x, (HIDDEN,), norm_w, 1e-5)
            gu = gemv(j + 2, h)
            a = F.silu(gu[:, :INTER]) * gu[:, INTER:]
            x = x + gemv(j + 3, a)
        x0.copy_(x)
        return x0
    return step


def fused_configs(layer: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The configs the fused decode layer runs (:mod:`autoopt.nn.fused_linear`): the best ranked that each fusion
    can take (BLOCK_M 1, split-K 1: ``fused_linear.FUSED_REQUIRE``)."""
    import torch

    from autoopt.nn.dispatch import choose, matmul_kind
    from autoopt.nn.fused_linear import FUSED_REQUIRE

    out = {}
    for name, q in layer.items():
        c = choose("quant_linear", matmul_kind(1), (1, q.n, q.k), torch.bfloat16, torch.device("cuda"),
                   weight=q.fmt.spec, require=FUSED_REQUIRE)
        if c.config is None:
            raise RuntimeError(f"no fused decode kernel chosen for {name}: {c.fallback}")
        out[name] = dict(c.config.params)
    return out


def check_fused_kernels(layer: dict[str, Any], cfgs: dict[str, dict[str, int]], norm_w: Any) -> dict[str, float]:
    """Each fused GEMV against its separate ops in float64: norm + qkv, o + residual, norm + gate_up + SwiGLU,
    down + residual."""
    import torch

    from autoopt.backend.accuracy import rel_error
    from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare
    from autoopt.backend.quant import dequantize

    def norm(x: Any) -> Any:
        xd = x.double()
        return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_w.double()

    errs = {}
    for name, q in layer.items():
        w = dequantize(q).double()
        x = torch.randn((1, q.k), device="cuda").bfloat16()
        r = torch.randn((1, q.n), device="cuda").bfloat16()
        kw: dict[str, Any] = {}
        if name == "qkv":
            kw, ref = {"norm_weight": norm_w, "eps": 1e-5}, norm(x) @ w.t()
        elif name == "gate_up":
            h = norm(x) @ w.t()
            kw = {"norm_weight": norm_w, "eps": 1e-5, "gated": True}
            ref = torch.nn.functional.silu(h[:, :INTER]) * h[:, INTER:]
        else:
            kw, ref = {"residual": r}, r.double() + x.double() @ w.t()
        out = torch.empty((1, ref.shape[1]), device="cuda", dtype=torch.bfloat16)
        quant_gemv_prepare(x, q, out, cfgs[name], **kw)()
        torch.cuda.synchronize()
        errs[name] = float(rel_error(out.float(), ref.float()))
        bound = 2 * REL_TOL if name == "gate_up" else REL_TOL
        if not errs[name] <= bound:
            raise RuntimeError(f"fused {name}: rel err {errs[name]:.3g} against separate ops (bound {bound})")
    return errs


def make_fused_chain(layers: list[dict[str, Any]], cfgs: dict[str, dict[str, int]], x0: Any, kv: tuple[Any, Any],
                     norm_w: Any) -> Any:
    """The same step with RMSNorm in the qkv and gate_up GEMVs' prologue, SwiGLU in gate_up's epilogue and the
    residual adds in o's and down's: five launches a layer where the plain chain has ten (eleven with split-K)."""
    import torch
    import torch.nn.functional as F

    from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare

    k_cache, v_cache = kv

    def gemv(q: Any, cfg: dict[str, int], a: Any, n_out: int, **kw: Any) -> Any:
        out = torch.empty((1, n_out), device="cuda", dtype=torch.bfloat16)
        quant_gemv_prepare(a, q, out, cfg, **kw)()
        return out

    def step() -> Any:
        x = x0
        for layer in layers:
            qkv = gemv(layer["qkv"], cfgs["qkv"], x, layer["qkv"].n, norm_weight=norm_w, eps=1e-5)
            q = qkv[:, :HIDDEN].view(1, HEADS, 1, HEAD_DIM)
            attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
            x = gemv(layer["o"], cfgs["o"], attn.reshape(1, HIDDEN), HIDDEN, residual=x)
            a = gemv(layer["gate_up"], cfgs["gate_up"], x, INTER, norm_weight=norm_w, eps=1e-5, gated=True)
            x = gemv(layer["down"], cfgs["down"], a, HIDDEN, residual=x)
        x0.copy_(x)
        return x0
    return step


def reference_chain(layer: dict[str, Any], n_layers: int, x0: Any, kv: tuple[Any, Any], norm_w: Any) -> Any:
    """The plain step in float64 on the dequantized weights (every layer holds layer 0's values): what both
    chains approximate, so that a difference between them can be laid at one's door."""
    import torch
    import torch.nn.functional as F

    from autoopt.backend.quant import dequantize

    w = {name: dequantize(q).double() for name, q in layer.items()}
    k_cache, v_cache = (t.double() for t in kv)
    g = norm_w.double()

    def norm(x: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

    x = x0.double()
    for _ in range(n_layers):
        q = (norm(x) @ w["qkv"].t())[:, :HIDDEN].view(1, HEADS, 1, HEAD_DIM)
        attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        x = x + attn.reshape(1, HIDDEN) @ w["o"].t()
        gu = norm(x) @ w["gate_up"].t()
        x = x + (F.silu(gu[:, :INTER]) * gu[:, INTER:]) @ w["down"].t()
    return x


def rel(a: Any, b: Any) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--keys", type=int, default=192)
    ap.add_argument("--format", default="int4", help="weight format: int4, int4-asym, int8, fp8, fp8_block")
    args = ap.parse_args()
    bad = [f"--{k} {v}" for k, v in vars(args).items()
           if k not in ("out", "format") and not (type(v) is int and 1 <= v <= 4096)]
    if args.format not in FORMATS:
        bad.append(f"--format {args.format!r} (one of {', '.join(FORMATS)})")
    if bad:
        print(f"fused_chain_probe: {', '.join(bad)}: counts take a whole number from 1 to 4096", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("fused_chain_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    from autoopt.backend.runner import captured, replayed_us
    from benchmarks.hw_limit import environment

    t0 = time.perf_counter()
    layers = build_layers(args.layers, args.format)
    cfgs = configs(layers[0])
    errs = check_kernels(layers[0], cfgs)
    fcfgs = fused_configs(layers[0])
    norm_w = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    fused_errs = check_fused_kernels(layers[0], fcfgs, norm_w)
    kv = tuple(torch.randn((1, KV_HEADS, args.keys, HEAD_DIM), device="cuda").bfloat16() for _ in range(2))
    x_init = torch.randn((1, HIDDEN), device="cuda").bfloat16()
    variants: dict[str, dict[str, Any]] = {}
    outs = {}
    for name, make, c in (("plain", make_chain, cfgs), ("fused", make_fused_chain, fcfgs)):
        x0 = x_init.clone()
        g = captured(make(layers, c, x0, kv, norm_w), warmups=1)
        x0.copy_(x_init)
        g.replay()
        torch.cuda.synchronize()
        outs[name] = x0.clone()
        # x0 stays referenced: the graph replays into its address, and a freed x0 is memory the next tensor gets
        # (the 2026-11-29 runs before this lost the fused chain's output that way: its copy landed in the plain
        # chain's freed x0 and the plain graph's timed replays wrote over it: "21x off", never the kernels)
        variants[name] = {"graph": g, "times": [], "configs": c, "x0": x0}
    for _ in range(args.rounds):
        for v in variants.values():
            v["times"].append(replayed_us(v["graph"], 1, samples=args.replays) / 1e3)
    base = statistics.median(variants["plain"]["times"])
    rows = []
    for name, v in variants.items():
        ms = statistics.median(v["times"])
        rows.append({"variant": name, "measured_step_ms": round(ms, 4), "rounds_ms": [round(t, 4) for t in v["times"]],
                     "speedup_vs_plain": round(base / ms, 4), "configs": v["configs"]})
        print(json.dumps(rows[-1]), flush=True)
    chain_err = rel(outs["fused"], outs["plain"])
    ref = reference_chain(layers[0], args.layers, x_init, kv, norm_w)
    vs_ref = {name: rel(o, ref) for name, o in outs.items()}
    one = reference_chain(layers[0], 1, x_init, kv, norm_w)  # one layer: each chain's own error before amplifying
    for name, make, c in (("plain", make_chain, cfgs), ("fused", make_fused_chain, fcfgs)):
        x0 = x_init.clone()
        vs_ref[f"{name}_1_layer"] = rel(make(layers[:1], c, x0, kv, norm_w)(), one)
        x0 = x_init.clone()
        vs_ref[f"{name}_eager"] = rel(make(layers, c, x0, kv, norm_w)(), ref)
    print(json.dumps({"chain_rel_err_vs_float64": vs_ref, "fused_vs_plain": chain_err}), flush=True)
    result = {"env": environment(), "label": "measured (CUDA-graph replay of the chain, median of rounds of medians)",
              "format": args.format, "layers": args.layers, "keys": args.keys,
              "measured_rel_err_vs_reference": errs, "measured_fused_rel_err_vs_separate_ops": fused_errs,
              "fused_chain_rel_err_vs_plain": chain_err, "chain_rel_err_vs_float64": vs_ref, "rows": rows,
              "elapsed_s": round(time.perf_counter() - t0, 1)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
