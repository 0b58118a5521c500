"""RMSNorm with rows split over the programs of one launch (``rmsnorm_coop``) against what ships, on a GPU.

For each RMSNorm shape of ``hw_limit.py``'s norm section: a device-to-device copy of the same bytes
(what memory does at this size), the zero-shot top-1 of today's ranking, and a grid of
``rmsnorm_coop`` configs. Every config is checked against the float64 reference on three fresh
inputs and run 20 times on one input with the outputs compared bit for bit (a result that moves
between runs is a race); only then is it timed (``do_bench`` median, L2 flushed). One JSON file:

    PYTHONPATH=. python benchmarks/probes/norm_coop_probe.py --out $OUT/norm_coop_probe.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoopt.backend import registry, runner
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.search.ranking import rank
from benchmarks.hw_limit import NORM_SHAPES
from benchmarks.probes.probe_kit import probe_main


def copy_us(nbytes: int) -> float:
    """Median time of a device-to-device copy moving ``nbytes`` (read + write) in all."""
    import torch
    import triton.testing

    src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    return float(triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")) * 1e3


def coop_configs(n: int) -> list[KernelConfig]:
    out = []
    for block in (4096, 8192, 16384, 32768):
        split = -(-n // block)
        if split < 2 or split > 128:
            continue
        for warps in (4, 8, 16, 32):
            if not 16 <= block // (warps * 32) <= 64:
                continue
            out.append(KernelConfig(kernel="rmsnorm_coop", template="norm", path="standard",
                                    params={"BLOCK_N": block, "SPLIT_N": split, "num_warps": warps}))
    return out


def stable(op: OpSpec, config: KernelConfig, runs: int = 20) -> bool:
    """Whether ``runs`` launches on one input give bit-identical outputs."""
    import torch

    inputs = registry.make_inputs(op, "cuda", seed=7)
    out = registry.alloc_out(op, "cuda")
    fn = registry.prepare(inputs, config, out, op)
    fn()
    first = out.clone()
    for _ in range(runs - 1):
        out.fill_(float("nan"))
        fn()
        if not torch.equal(out, first):
            return False
    return True


def probe(gpu: Any, rows: int, n: int, copy: float) -> list[dict[str, Any]]:
    op = OpSpec(kind="rmsnorm", shape=(rows, n), dtype="bf16")
    ref_us = copy_us(int(op.min_bytes))
    results = []
    top1 = rank(gpu, op, top=1, measured=False).best.config
    for config in [top1, *coop_configs(n)]:
        checks = [runner.evaluate(op, config, gpu=gpu, seed=s, check_only=True) for s in (1, 2, 3)]
        row: dict[str, Any] = {"shape": [rows, n], "config": config.to_dict(), "copy_same_bytes_us": round(ref_us, 2),
                               "checks": [c.label for c in checks]}
        if all(c.label == "checked" for c in checks):
            row["stable"] = stable(op, config)
            res = runner.evaluate(op, config, gpu=gpu, seed=0, warmup_ms=25, rep_ms=200)
            row.update(label=res.label, us=res.us, rel_err=res.rel_err, reason=res.reason)
            if res.us:
                row["pct_of_copy"] = round(100 * op.min_bytes / (res.us * 1e-6) / 1e9 / copy, 1)
                row["pct_of_same_size_copy"] = round(100 * ref_us / res.us, 1)
        else:
            row["reason"] = "; ".join(c.reason or "" for c in checks if c.label != "checked")
        results.append(row)
        print(f"{rows}x{n} {config.kernel:14s} {dict(config.params)} {row.get('label', row['checks'])} "
              f"{row.get('us') or float('nan'):8.2f} us {row.get('pct_of_copy', '')}% copy "
              f"(same-size copy {ref_us:.2f} us) stable={row.get('stable')}", file=sys.stderr, flush=True)
    return results


def main() -> int:
    return probe_main("norm_coop_probe", __doc__ or "", "rows",
                      lambda gpu, copy: (probe(gpu, rows, n, copy) for rows, n in NORM_SHAPES))


if __name__ == "__main__":
    sys.exit(main())
