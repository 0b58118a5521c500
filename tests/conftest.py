"""Shared test setup.

Triton's CPU interpreter must be switched on before ``triton`` is first imported
(module-level ``@triton.jit`` helpers inside triton are decorated at import),
so on a machine with no NVIDIA device node it is switched on here, before any
test module is collected. With a GPU the backend tests run compiled.
"""

from __future__ import annotations

import glob
import os

if not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests never read or write the user's results store: each session gets its own empty one
# (a measured winner there would change what rank() and recommend() return).
if "AUTOOPT_CACHE_DIR" not in os.environ or os.environ.get("AUTOOPT_TESTS_KEEP_CACHE") != "1":
    import tempfile

    os.environ["AUTOOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="autoopt-test-cache-")
