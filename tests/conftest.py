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
