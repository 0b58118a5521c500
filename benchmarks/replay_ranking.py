"""Score the cost model's ranking on committed GPU timings, with the constants in use and with changes.

One question: does a change to the constants rank the configs measured so far better or worse? For
each data set (shape by shape: Spearman rho between predicted and measured time, and the top-1 ratio:
the fastest measured time over the measured time of the config the model ranks first) it prints the
median rho, the geomean and the worst top-1 ratio, for the constants in use and for each
``--set NAME=VALUE[,NAME=VALUE]`` variant. Nothing runs on a GPU: every time is a committed measurement.

    PYTHONPATH=. python benchmarks/replay_ranking.py --set dram_run_bytes=0 --set dram_run_bytes=70

Data sets: the GEMV/GEMM rows of ``{h100,h200}/wide_sweep.json`` and ``broad_sweep.json``, the 576
rows of ``h100/calibrate_sweep_run1_rows.json``, the M = 4096 grids re-timed in one run
(``{h100,h200}/ranking_samerun_m4096_{skdram,smsp}.json``) and the H200 grid (``h200_gemm_grid.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt._paths import builtin_templates
from autoopt.hardware.library import load_profile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.constants import CostConstants, constants
from autoopt.kernels.ops import OpSpec
from autoopt.search.calibration import Sample, grid_samples, score
from autoopt.search.ranking import validate_config

RESULTS = Path(__file__).resolve().parent / "results"
PROFILES = {"h100": "h100-sxm", "h200": "h200"}


def sweep_samples(gpu_dir: str, name: str) -> list[Sample]:
    """The measured GEMM/GEMV rows of a ``stream_sweep.py`` result file."""
    gpu = load_profile(PROFILES[gpu_dir]).gpu
    assert gpu is not None
    out: list[Sample] = []
    for entry in json.loads((RESULTS / gpu_dir / name).read_text())["ops"]:
        o = entry["op"]
        if o["kind"] not in ("gemm", "gemv"):
            continue
        op = OpSpec(kind=o["kind"], shape=tuple(o["shape"]), dtype=o["dtype"], layout=o.get("layout", "nk"),
                    out_dtype=o.get("out_dtype"))
        for row in entry["rows"]:
            if row.get("measured_us"):
                c = row["config"]
                config = KernelConfig(kernel=c["kernel"], path=c.get("path", "standard"),
                                      template=c.get("template", ""), params=c["config"])
                out.append((gpu, op, config, float(row["measured_us"])))
    return out


def samerun_samples(gpu_dir: str, name: str) -> list[Sample]:
    """The grid configs re-timed in one run by ``ranking_quality.py --rerun-tma all --rerun-plain 8``
    (``grid_rerun``: TMA configs as ``gemm_tma``, the plain ones as ``gemm``), shape by shape."""
    gpu = load_profile(PROFILES[gpu_dir]).gpu
    assert gpu is not None
    out: list[Sample] = []
    for shape, entry in json.loads((RESULTS / gpu_dir / name).read_text())["shapes"].items():
        op = OpSpec(kind="gemm", shape=tuple(int(x) for x in shape.split("x")), dtype="bf16")
        for key, kernel, template, path, extra in (
                ("rows_gemm_tma", "gemm_tma", "hopper-tma-gemm", "tma_wgmma", {"SPLIT_K": 1, "STREAM_K": 0}),
                ("rows_gemm", "gemm", "gemm", "wgmma", {"SPLIT_K": 1})):
            for row in entry.get("grid_rerun", {}).get(key, []):
                if row.get("label") == "measured" and row.get("us"):
                    config = KernelConfig(kernel=kernel, template=template, path=path,
                                          params={**extra, **row["config"]})
                    if not validate_config(gpu, op, config):  # the model never ranks what it rejects
                        out.append((gpu, op, config, float(row["us"])))
    return out


def datasets() -> dict[str, list[Sample]]:
    from autoopt.results.transfer import read_file

    sets = {f"{g} {name.split('_')[0]} sweep": sweep_samples(g, name)
            for g in PROFILES for name in ("wide_sweep.json", "broad_sweep.json")}
    h100 = load_profile("h100-sxm").gpu
    rows = read_file(RESULTS / "h100/calibrate_sweep_run1_rows.json")
    sets["h100 calibrate sweep"] = [(h100, r.op, r.config, r.us) for r in rows if r.label == "measured" and r.us]
    h200 = load_profile("h200").gpu
    assert h100 is not None and h200 is not None
    for g in PROFILES:
        for name in ("ranking_samerun_m4096_skdram.json", "ranking_samerun_m4096_smsp.json"):
            sets[f"{g} samerun {name.split('_')[-1][:-5]}"] = samerun_samples(g, name)
    sets["h200 grid"] = grid_samples(json.loads((RESULTS / "h200_gemm_grid.json").read_text()), h200)
    return sets


def variant(spec: str) -> tuple[str, CostConstants]:
    """``NAME=VALUE[,NAME=VALUE]`` -> (label, the constants in use with those changed)."""
    changes: dict[str, Any] = {}
    for item in spec.split(","):
        name, _, value = item.partition("=")
        changes[name.strip()] = float(value)
    return spec, replace(constants(), **changes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]")
    args = ap.parse_args()
    builtin_templates()
    variants = [("in use", constants()), *(variant(s) for s in args.set)]
    for name, samples in datasets().items():
        cells = []
        for label, consts in variants:
            s = score(samples, consts)
            cells.append(f"{label}: rho {s.median_spearman:.3f} top-1 {s.geomean_top1:.3f} (worst {s.min_top1:.3f})")
        print(f"{name:22s} n={len(samples):5d} | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
