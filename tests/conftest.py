"""Shared test setup.

Triton's CPU interpreter must be switched on before ``triton`` is first imported
(module-level ``@triton.jit`` helpers inside triton are decorated at import),
so on a machine with no NVIDIA device node it is switched on here, before any
test module is collected. With a GPU the backend tests run compiled.

Property tests are deterministic unless asked otherwise: the ``ci`` Hypothesis profile (loaded when
``CI`` is set) derandomizes, keeps no example database and prints the ``@reproduce_failure`` blob of a
failure; ``dev`` (every other run, so the README's test command passes every time) is the same with
the local database kept, so a failure found once is replayed first. ``pytest --hypothesis-profile
explore`` runs each property test with ``_fuzz.EXPLORE_FACTOR`` times its CI budget, randomized: the
long hunt before a release. The command line's profile wins over the one loaded here.
"""

from __future__ import annotations

import glob
import os

from _fuzz import BASE_EXAMPLES, EXPLORE_FACTOR
from hypothesis import settings

if not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests never read or write the user's results store: each session gets its own empty one
# (a measured winner there would change what rank() and recommend() return).
if "AUTOOPT_CACHE_DIR" not in os.environ or os.environ.get("AUTOOPT_TESTS_KEEP_CACHE") != "1":
    import tempfile

    os.environ["AUTOOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="autoopt-test-cache-")

settings.register_profile("ci", max_examples=BASE_EXAMPLES, derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", max_examples=BASE_EXAMPLES, derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=BASE_EXAMPLES * EXPLORE_FACTOR, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
