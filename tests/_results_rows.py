"""Synthetic results-store rows for the store tests, and the writer processes of the durability tests.

Run as a script it is one writer process (the tests start it with ``sys.executable``):

    python tests/_results_rows.py kill DB START     put rows START, START+1, ... forever, printing
                                                     "<row id> <n>" after each commit returns
    python tests/_results_rows.py pool DB P GO      wait for file GO, then put writer P's share of the
                                                     shared key pool (see ``pool_writes``)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # a writer process: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec
from autoopt.results.keys import kernel_source
from autoopt.results.records import EnvKey, StoredResult

GPU = GPUProfile(name="NVIDIA H100 80GB HBM3", cc_major=9, cc_minor=0, sm_count=132,
                 memory_total_bytes=85520809984, driver_version="570.86.15")
ENV = EnvKey(device="synthetic00000001", gpu="Synthetic GPU", driver="1.0", torch="2.5.0", triton="3.1.0")
OP = OpSpec(kind="gemm", shape=(256, 6144, 4096), dtype="bf16")
KERNEL_FILE, KERNEL_HASH = kernel_source("autoopt.backend.kernels.gemm")
T0 = 1_750_000_000.0  # a fixed date in 2025: synthetic rows never depend on the clock


def config(n: int, kernel: str = "gemm") -> KernelConfig:
    """A distinct config per ``n`` (``SEQ`` is not a real Triton key; the store does not care)."""
    return KernelConfig(kernel=kernel, params={"BLOCK_M": 64, "BLOCK_N": 128, "SEQ": n}, template="gemm")


def row(n: int, *, us: float | None = None, label: str = "measured", env: EnvKey = ENV, op: OpSpec = OP,
        measured_at: float | None = None, kernel_file: str = KERNEL_FILE, kernel_hash: str = KERNEL_HASH,
        reason: str = "") -> StoredResult:
    """Synthetic row ``n``: its own config, a time of ``10 + n`` µs unless given."""
    if us is None and label == "measured":
        us = 10.0 + n
    return StoredResult(env=env, op=op, config=config(n), label=label, us=us,
                        max_error=1e-3 if label == "measured" else None, reason=reason,
                        kernel_file=kernel_file, kernel_hash=kernel_hash,
                        measured_at=T0 + n if measured_at is None else measured_at, autoopt_version="test")


#: the concurrent-writer test: 8 writers, a pool of 120 keys, writer p writes keys p*15 .. p*15+44
#: (45 keys, wrapping), so every key is written by 3 writers, each with its own measured_at
POOL_KEYS = 120
POOL_WRITERS = 8
POOL_SHARE = 45


def pool_writes(p: int) -> list[tuple[int, float, float]]:
    """(key, measured_at, us) that writer ``p`` puts, in order."""
    out = []
    for j in range(POOL_SHARE):
        key = (p * 15 + j) % POOL_KEYS
        out.append((key, T0 + 1000.0 * p + j, 100.0 + 10 * p + j / 100))
    return out


def _kill_writer(db: str, start: int) -> None:
    from autoopt.results.store import ResultStore

    store = ResultStore(db)
    # checkpoint every few pages instead of every 1000, so kills also land inside checkpoints
    assert store._conn is not None
    store._conn.execute("PRAGMA wal_autocheckpoint = 8")
    print("ready", flush=True)
    n = start
    while True:
        row_id = store.put(row(n))
        print(row_id, n, flush=True)  # only after put() returned: the row is committed
        if n % 7 == 0 and n > start:  # and now and then a newer measurement of an older key (an update)
            store.put(row(n - 3, us=5.0, measured_at=T0 + n + 0.5))
        n += 1


def _pool_writer(db: str, p: int, go: str) -> None:
    from autoopt.results.store import ResultStore

    while not os.path.exists(go):  # all writers start together, on a store nobody created yet
        time.sleep(0.001)
    store = ResultStore(db)
    for key, at, us in pool_writes(p):
        store.put(row(key, us=us, measured_at=at))
    store.close()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "kill":
        _kill_writer(sys.argv[2], int(sys.argv[3]))
    elif mode == "pool":
        _pool_writer(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
