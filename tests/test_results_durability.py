"""The results store under SIGKILL and under eight concurrent writers: nothing committed is lost,
nothing is duplicated, the file always opens and passes SQLite's integrity check."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from _results_rows import KERNEL_HASH, POOL_KEYS, POOL_WRITERS, config, pool_writes

from autoopt.results.records import config_key
from autoopt.results.store import ResultStore

WRITER = str(Path(__file__).with_name("_results_rows.py"))
KILLS = 60


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.Popen([sys.executable, WRITER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _duplicates(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM (SELECT 1 FROM results GROUP BY device, driver, torch, triton, "
                            "kind, shape, dtype, layout, out_dtype, kernel_hash, config_key "
                            "HAVING count(*) > 1)").fetchone()[0]


def test_sigkill_at_random_points_loses_no_committed_row_and_leaves_a_sound_store(tmp_path):
    db = tmp_path / "results.sqlite3"
    rng = random.Random(20260101)
    committed: dict[int, int] = {}  # n -> row id the writer reported after its commit returned
    before_ready = 0
    start = time.perf_counter()
    for k in range(KILLS):
        proc = _spawn("kill", str(db), str(k * 100_000))  # each run its own keys
        assert proc.stdout is not None
        if k % 5 == 0:  # every fifth kill lands anywhere: interpreter start, imports, opening, creating
            time.sleep(rng.uniform(0.0, 0.4))
            before_ready += 1
        else:  # the others while rows are being written: right after "ready", 0-60 ms in
            line = proc.stdout.readline()
            assert line == "ready\n", line + proc.stderr.read() if proc.stderr else ""
            time.sleep(rng.uniform(0.0, 0.06))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err
        for line in out.splitlines():  # a line cut by the kill has no newline and is not in splitlines' output
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                committed[int(parts[1])] = int(parts[0])
    elapsed = time.perf_counter() - start

    with ResultStore(db, create=False) as store:
        assert store.integrity_check() == "ok"
        count = store.count()
        present = {r.row_id: r for r in store.rows()}
    missing = [n for n, rid in committed.items()
               if rid not in present or present[rid].config_key != config_key(config(n))]
    print(f"\n{KILLS} SIGKILLs ({before_ready} before the writer was ready) in {elapsed:.1f} s: "
          f"{len(committed)} rows reported committed, {count} rows in the store, {len(missing)} lost")
    assert missing == []
    assert len(committed) >= KILLS  # the kills did land among writes
    assert count >= len(committed)  # a row committed just before the kill, unreported, may be there too
    assert _duplicates(db) == 0


def test_eight_concurrent_writers_of_overlapping_keys_leave_each_key_once_with_the_newest_row(tmp_path):
    db = tmp_path / "results.sqlite3"  # not created yet: the writers race to create it too
    go = tmp_path / "go"
    procs = [_spawn("pool", str(db), str(p), str(go)) for p in range(POOL_WRITERS)]
    time.sleep(0.5)  # let every interpreter start and wait at the line
    go.touch()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err

    newest: dict[int, tuple[float, float]] = {}
    for p in range(POOL_WRITERS):
        for key, at, us in pool_writes(p):
            if key not in newest or at > newest[key][0]:
                newest[key] = (at, us)
    with ResultStore(db, create=False) as store:
        assert store.integrity_check() == "ok"
        rows = store.rows()
    by_config = {r.config_key: r for r in rows}
    assert len(rows) == POOL_KEYS == len(newest)
    assert len(by_config) == len(rows)
    assert {k: (by_config[config_key(config(k))].measured_at, by_config[config_key(config(k))].us)
            for k in newest} == newest
    assert all(r.kernel_hash == KERNEL_HASH for r in rows)
    assert _duplicates(db) == 0
