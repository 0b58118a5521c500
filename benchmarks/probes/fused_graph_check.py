"""Whether each fused decode GEMV (issue 27) gives the same output replayed from a CUDA graph as launched eagerly,
per fusion (norm, gated, residual, norm + gated) and format, then the plain and fused chains of ``--layers``
lengths eager against graphed (each graph replayed twice from the same input).

Written when ``fused_chain_probe.py`` reported its graphed fused chain 21x off float64 while the same chain eager
agreed to 2 %: on the H200 every launch and every chain (2, 8 and 32 layers) replayed bit-identical to eager
(``h200/fused_graph_check_32.json``); the probe had freed the plain chain's input buffer, which its graph kept
writing (fixed there).

    PYTHONPATH=. python benchmarks/probes/fused_graph_check.py --out $OUT/fused_graph_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.fused_chain_probe import (
    FORMATS,
    HEAD_DIM,
    HIDDEN,
    KV_HEADS,
    build_layers,
    configs,
    fused_configs,
    make_chain,
    make_fused_chain,
    rel,
)
from benchmarks.probes.model_kit import no_cuda


def graphed_vs_eager(fn: Any, out: Any) -> float:
    """Relative difference of ``out`` written by ``fn`` replayed from a CUDA graph against ``fn`` run eagerly."""
    import torch

    from autoopt.backend.runner import captured

    fn()
    torch.cuda.synchronize()
    eager = out.clone()
    out.zero_()
    captured(fn, warmups=1)
    return rel(out, eager)


def per_launch(layer: dict[str, Any], cfgs: dict[str, dict[str, int]], norm_w: Any) -> dict[str, float]:
    """Each of the layer's GEMVs, plain and with every fusion it takes, graphed against eager."""
    import torch

    from autoopt.backend.kernels.quant_gemv import quant_gemv_prepare

    per: dict[str, float] = {}
    for name, q in layer.items():
        x = torch.randn((1, q.k), device="cuda").bfloat16()
        kinds: dict[str, dict[str, Any]] = {"plain": {}}
        if q.k == HIDDEN:
            kinds["norm"] = {"norm_weight": norm_w, "eps": 1e-5}
        if name == "gate_up":
            kinds["gated"] = {"gated": True}
            kinds["norm_gated"] = {"norm_weight": norm_w, "eps": 1e-5, "gated": True}
        if name in ("o", "down"):
            kinds["residual"] = {"residual": torch.randn((1, q.n), device="cuda").bfloat16()}
        for kind, kw in kinds.items():
            out = torch.empty((1, q.n // 2 if kw.get("gated") else q.n), device="cuda", dtype=torch.bfloat16)
            per[f"{name}/{kind}"] = graphed_vs_eager(quant_gemv_prepare(x, q, out, cfgs[name], **kw), out)
    return per


def chain_checks(layers: list[dict[str, Any]], lengths: list[int], keys: int, norm_w: Any) -> dict[str, list[float]]:
    """The plain and fused chains of each length: [graphed against eager, a second replay against the first]."""
    import torch

    from autoopt.backend.runner import captured

    kv = tuple(torch.randn((1, KV_HEADS, keys, HEAD_DIM), device="cuda").bfloat16() for _ in range(2))
    x_init = torch.randn((1, HIDDEN), device="cuda").bfloat16()
    chains = (("plain", make_chain, configs(layers[0])), ("fused", make_fused_chain, fused_configs(layers[0])))
    out: dict[str, list[float]] = {}
    for n in lengths:
        for cname, make, c in chains:
            x0 = x_init.clone()
            step = make(layers[:n], c, x0, kv, norm_w)
            eager = step().clone()
            x0.copy_(x_init)
            g = captured(step, warmups=1)
            replays = []
            for _ in range(2):
                x0.copy_(x_init)
                g.replay()
                torch.cuda.synchronize()
                replays.append(x0.clone())
            out[f"{cname}/{n}_layers"] = [rel(replays[0], eager), rel(replays[1], replays[0])]
    return out


def problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the arguments, each with the accepted range."""
    bad = [f"--formats: {f!r} is not one of {', '.join(FORMATS)}" for f in args.formats.split(",") if f not in FORMATS]
    lengths = args.layers.split(",")
    if not all(n.isdigit() and 1 <= int(n) <= 4096 for n in lengths):
        bad.append(f"--layers {args.layers}: chain lengths take whole numbers from 1 to 4096, comma separated")
    if not 1 <= args.keys <= 4096:
        bad.append(f"--keys {args.keys}: a whole number from 1 to 4096")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--formats", default="int4,fp8")
    ap.add_argument("--layers", default="1,2", help="chain lengths, comma separated (default %(default)s)")
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--unit-norm", action="store_true", help="norm weight of ones (the chain probe's)")
    args = ap.parse_args()
    bad = problems(args)
    if bad:
        print(f"fused_graph_check: {'; '.join(bad)}", file=sys.stderr)
        return 2
    if no_cuda("fused_graph_check", "its kernels eager and replayed from CUDA graphs"):
        return 2
    import torch

    from benchmarks.hw_limit import environment

    lengths = [int(n) for n in args.layers.split(",")]
    result: dict[str, Any] = {"env": environment(), "per_launch": {}, "chains": {}}
    for fmt in args.formats.split(","):
        layers = build_layers(max(lengths), fmt)
        norm_w = (torch.ones(HIDDEN, device="cuda") if args.unit_norm else torch.rand(HIDDEN, device="cuda") + 0.5
                  ).bfloat16()
        result["per_launch"][fmt] = per_launch(layers[0], fused_configs(layers[0]), norm_w)
        chains = chain_checks(layers, lengths, args.keys, norm_w)
        result["chains"].update({f"{fmt}/{k}": v for k, v in chains.items()})
        print(json.dumps({"format": fmt, "per_launch": result["per_launch"][fmt], "chains": chains}), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
