"""Capture a real GPU host for autoopt: raw facts, the merged profile, optional measurements.

Run on the machine to describe (from the repository root)::

    PYTHONPATH=. python benchmarks/capture_hw.py --out captures/h200 [--measure]

Writes ``<out>/raw.json`` (:func:`autoopt.detection.capture`, the format of
``tests/fixtures/*_raw.json``), ``<out>/profile.json`` (:func:`autoopt.detection.build_profile`,
with measured values when ``--measure``), ``<out>/measure.json`` (the probes' own
numbers) and ``<out>/meta.json`` (how long each step took).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoopt.hardware.detection import build_profile, capture, match_torch_devices


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder to write raw.json and profile.json into")
    ap.add_argument("--measure", action="store_true", help="also time copy bandwidth and bf16 matmul per GPU")
    ap.add_argument("--no-torch", action="store_true", help="capture without importing torch")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, object] = {"argv": sys.argv[1:]}

    t0 = time.perf_counter()
    capture(use_torch=False)
    meta["capture_no_torch_s"] = round(time.perf_counter() - t0, 4)
    t0 = time.perf_counter()
    raw = capture(use_torch=not args.no_torch)
    meta["capture_s"] = round(time.perf_counter() - t0, 4)
    raw["_source"] = "benchmarks/capture_hw.py"
    (args.out / "raw.json").write_text(json.dumps(raw, indent=2) + "\n")

    t0 = time.perf_counter()
    profile = build_profile(raw)
    meta["build_profile_s"] = round(time.perf_counter() - t0, 4)

    if args.measure:
        from autoopt.hardware.detection import measure_profile
        from autoopt.hardware.probes import measure_gpu

        results: dict[int, dict] = {}
        for nvml_index, torch_index in sorted(match_torch_devices(raw).items()):
            t0 = time.perf_counter()
            try:
                results[nvml_index] = measure_gpu(torch_index)
            except Exception as exc:  # keep going: a capture without numbers is still useful
                results[nvml_index] = {"error": f"{type(exc).__name__}: {exc}"}
            meta[f"measure_gpu{nvml_index}_s"] = round(time.perf_counter() - t0, 2)
        by_gpu = {str(k): v for k, v in results.items()}
        (args.out / "measure.json").write_text(json.dumps(by_gpu, indent=2) + "\n")
        profile = measure_profile(profile, raw, results)

    (args.out / "profile.json").write_text(profile.to_json(indent=2) + "\n")
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    for gpu in profile.gpus:
        print(f"GPU {gpu.index}: {gpu.name} profile={gpu.profile} cc={gpu.cc} sms={gpu.sm_count} "
              f"bw={gpu.mem_bandwidth_gbs} measured_bw={gpu.measured_bandwidth_gbs} "
              f"bf16={gpu.tflops('bf16')} nvlink={gpu.nvlink_links}")
    for link in profile.links:
        print(f"link {link.a}-{link.b}: {link.kind} x{link.links} {link.bandwidth_gbs} GB/s")
    for note in profile.notes:
        print("note:", note)
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
