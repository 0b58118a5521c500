"""What the CPU-side timing benchmarks (rank_speed.py, recommend_speed.py) share: the host CPU's name
for the results file, and running a timed ``python -c`` child that prints its numbers as JSON."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def child_json(code: str, args: list[str], env: dict[str, str]) -> Any:
    """Run ``code`` in a fresh interpreter with ``args`` and ``env``; its last stdout line, as JSON."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
