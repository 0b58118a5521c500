"""Regenerate what a cold ``recommend()`` reads instead of computing, after a template, cost-model,
profile or catalog change: the shipped rank cache (``autoopt/search/shipped/*.ranks``) and the JSON
mirrors of the shipped YAML (``autoopt/hardware/profiles.mirror.json``, ``autoopt/planning/models.mirror.json``).

    PYTHONPATH=. python benchmarks/regen_startup_cache.py

Runs :func:`autoopt.planning.startup.regenerate` (~1 minute on a 2-core box). Until it is run, a
changed template, constant or YAML file makes the old files stale: they are ignored on their own
(the first ``recommend()`` ranks / parses YAML again, slower, with the same answers) and
``tests/test_rank_cache.py`` fails, naming this command.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoopt.planning.startup import regenerate  # noqa: E402


def main() -> int:
    t0 = time.perf_counter()
    files = regenerate()
    size = sum(p.stat().st_size for p in files)
    print(f"wrote {len(files)} files ({size / 1024:.0f} KiB) in {time.perf_counter() - t0:.0f} s:")
    for p in files:
        print(f"  {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
