"""How long `autoopt trace compare` takes on two ~100 MB traces, and how much memory it holds.

One question: does compare stay within 10 s and bounded memory on this 2-core machine for traces of
the size a profiled 8B-model run writes? The traces are written in Kineto's Chrome-trace layout with
the kernel names of tests/test_trace.py (hand-made, no GPU here), sized to ~100 MB each: an eager and a
compiled run of one 1000-layer model, so compare aligns them on their GEMM/attention launches and
attributes the fusions (13,000 and 8,000 kernels in the first step). Writes
benchmarks/results/trace_speed.json:

    PYTHONPATH=. python benchmarks/trace_speed.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_trace import COMPILED, EAGER, _kineto  # noqa: E402

# VmHWM (Linux): this process image's peak; ru_maxrss would carry over the forking parent's peak
_CHILD = """
import sys
from autoopt.cli import main
code = main(["trace", "compare", sys.argv[1], sys.argv[2], "--format", "json"])
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(int(hwm.split()[1]), file=sys.stderr)
sys.exit(code)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/trace_speed.json",
                    help="where the result JSON goes (default: %(default)s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a = _kineto(Path(tmp) / "eager.json", EAGER * 1000, steps=24)
        b = _kineto(Path(tmp) / "compiled.json", COMPILED * 1000, steps=58)  # same 1000 layers per step
        t0 = time.perf_counter()
        # the child reports its own peak memory
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(a), str(b)], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - t0
        rss_kb = int(proc.stderr.strip().splitlines()[-1])
        out = json.loads(proc.stdout)
        saved = sum(f["us_saved_per_step"] for f in out["fusions"] if f["kind"] == "fused kernel")
        result = {"a_bytes": a.stat().st_size, "b_bytes": b.stat().st_size, "wall_s": round(wall, 2),
                  "max_rss_mb": round(rss_kb / 1024, 1), "a_per_step_us": out["a_per_step_us"],
                  "b_per_step_us": out["b_per_step_us"], "fusion_mode": out["fusion_alignment"]["mode"],
                  "fusion_us_saved_per_step": round(saved, 3),
                  "cpu": platform.processor() or platform.machine(),
                  "cores": os.cpu_count(), "python": platform.python_version(), "target_s": 10}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
