"""The local fleet pool: one worker process per device, fault-tolerant (CPU workers in predicted mode)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoopt.errors import AutooptError
from autoopt.fleet import Item, run_pool
from autoopt.hardware.library import load_profile
from autoopt.kernels.ops import OpSpec
from autoopt.search.ranking import rank

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _worker_path(monkeypatch, tmp_path):
    """Spawned workers import the evaluators from tests/ and read their cues from a temp folder."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(TESTS.parent),
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("AUTOOPT_TEST_FLEET_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def _items(n_shapes: int = 3, per_shape: int = 4) -> list[Item]:
    """Real configs: the top ``per_shape`` of rank() for 256x256 GEMMs of M = 16, 32, 48 ... (H100 profile)."""
    gpu = load_profile("h100-sxm").gpu
    items = []
    for s in range(n_shapes):
        op = OpSpec(kind="gemm", shape=(16 * (s + 1), 256, 256), dtype="fp16")  # small: the interpreter is slow
        for c in rank(gpu, op, top=per_shape).candidates:
            items.append(Item(id=len(items), op=op.to_dict(), config=c.config.to_dict(), profile="h100-sxm"))
    return items


def test_two_cpu_workers_evaluate_every_item_once():
    """Without a GPU each worker runs the kernel in Triton's interpreter (checked against the reference,
    untimed) when TRITON_INTERPRET is on (conftest sets it), else gives the cost model's time."""
    items = _items()
    out, stats = run_pool(items, ["cpu0", "cpu1"], timeout_s=300)
    assert [o.item for o in out] == [i.id for i in items]
    assert all(o.status == "done" for o in out)
    assert all(o.result["label"] == "checked" if os.environ.get("TRITON_INTERPRET") == "1"
               else o.result["label"] == "predicted" and o.result["us"] > 0 for o in out)
    assert set(stats.per_device) == {"cpu0", "cpu1"} and sum(stats.per_device.values()) == len(items)
    assert stats.restarts == 0 and stats.duplicates_dropped == 0


def test_pool_stats_sum_each_devices_evaluation_seconds_from_the_workers_answers():
    items = _items(n_shapes=1, per_shape=2)
    out, stats = run_pool(items, ["cpu0"], timeout_s=300)
    assert stats.busy_s["cpu0"] == pytest.approx(sum(o.result["eval_s"] for o in out))
    assert stats.compile_s == {}  # a CPU stand-in has no compile clock
    assert 0 < stats.boot_s["cpu0"] < 120  # spawn, imports and the wait for its first item
    assert [("boot_s" in o.result) for o in out] == [True, False]  # the first answer alone carries it
    if os.environ.get("TRITON_INTERPRET") == "1":  # run in the interpreter: one op set up for its two configs
        assert stats.phase_s["cpu0"]["setups"] == 1 and stats.phase_s["cpu0"]["check"] > 0


def test_each_worker_gets_its_share_of_the_hosts_cores_for_torchs_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    items = [Item(id=k, op={"kind": "add", "shape": [4, 4]}, config={}) for k in range(2)]
    out, _ = run_pool(items, ["cpu0", "cpu1"], evaluator="fleet_evaluators:threads", timeout_s=300)
    assert {o.result["omp"] for o in out} == {str(max(1, (os.cpu_count() or 1) // 2))}


def test_an_item_pinned_to_a_device_the_pool_lacks_is_refused():
    from autoopt.fleet import LocalPool

    with LocalPool(["cpu0"], evaluator="fleet_evaluators:echo") as pool, \
            pytest.raises(AutooptError, match="no worker of device cpu7 for item 0"):
        pool.submit(Item(id=0, op={"kind": "add", "shape": [4, 4]}, config={}, device="cpu7"))


def test_pool_stats_utilisation_line_names_each_devices_busy_and_compiling_share():
    from autoopt.fleet.pool import PoolStats

    stats = PoolStats(per_device={"0": 0, "1": 0})
    for device, result in (("0", {"eval_s": 3.0, "compile_s": 1.0}), ("0", {"eval_s": 2.0, "compile_s": 0.5}),
                           ("1", {"eval_s": 4.0}), ("1", None), ("1", {"eval_s": True})):
        stats.per_device[device] += 1
        stats.add_seconds(device, result)
    assert stats.busy_s == {"0": 5.0, "1": 4.0} and stats.compile_s == {"0": 1.5}
    assert stats.utilisation(10.0) == ("5 evaluations in 10.0 s: 0 2 in 5.0 s (50 %, 1.5 s compiling); "
                                       "1 3 in 4.0 s (40 %)")


def test_pool_stats_line_adds_each_devices_boot_and_its_seconds_by_the_runners_phases():
    from autoopt.fleet.pool import PoolStats

    stats = PoolStats(per_device={"0": 2})
    for phases in ({"setup": 1.5, "setups": 1, "first": 0.25, "timing": 2.0}, {"first": 0.25, "timing": 1.0},
                   {"timing": "x", 3: 1.0}):  # malformed entries are left out
        stats.add_seconds("0", {"eval_s": 1.0, "phase_s": phases})
    stats.add_seconds("0", {"boot_s": 4.3})
    stats.add_seconds("0", {"boot_s": 9.0})  # a restarted worker's boot is not the fleet's start-up
    assert stats.phase_s == {"0": {"setup": 1.5, "setups": 1.0, "first": 0.5, "timing": 3.0}}
    assert stats.utilisation(6.0) == ("2 evaluations in 6.0 s: 0 2 in 3.0 s (50 %, up after 4.3 s; setup 1.5 s "
                                      "x1, first 0.5 s, timing 3.0 s)")


def test_a_gpu_workers_compile_clock_counts_the_seconds_spent_in_tritons_compiler(monkeypatch):
    import time

    import triton.compiler as tc

    from autoopt.fleet.worker import _compile_clock

    monkeypatch.setattr(tc, "compile", lambda *a, **k: time.sleep(0.05) or "kernel")
    clock = _compile_clock()
    assert clock is not None and clock() == 0.0
    assert tc.compile("src", target=None) == "kernel"  # what a JIT launcher's bind calls
    assert 0.05 <= clock() < 1.0


def test_a_worker_killed_mid_sweep_loses_and_duplicates_nothing(tmp_path):
    items = _items()
    (tmp_path / "crash-once-32").touch()  # the first M=32 item kills its worker (SIGKILL)
    out, stats = run_pool(items, ["cpu0", "cpu1"], evaluator="fleet_evaluators:crash_once", timeout_s=300)
    assert all(o.status == "done" for o in out) and len(out) == len(items)
    assert stats.restarts == 1 and stats.retries == 1
    assert len({o.item for o in out}) == len(items)


def test_an_item_that_kills_its_worker_twice_is_failed_with_the_signal(tmp_path):
    items = _items(n_shapes=2, per_shape=2)
    (tmp_path / "crash-always-32").touch()
    out, _ = run_pool(items, ["cpu0", "cpu1"], evaluator="fleet_evaluators:crash_always", timeout_s=300)
    failed = [o for o in out if o.status == "failed"]
    assert {o.item for o in failed} == {i.id for i in items if i.op["shape"][0] == 32}
    assert all("segfault (SIGSEGV)" in o.reason and o.attempts == 2 for o in failed)
    assert all(o.status == "done" for o in out if o not in failed)


def test_a_hung_item_is_killed_at_its_timeout_and_recorded_failed(tmp_path):
    items = _items(n_shapes=2, per_shape=1)
    (tmp_path / "hang-16").touch()
    out, stats = run_pool(items, ["cpu0"], evaluator="fleet_evaluators:hang", timeout_s=8)
    assert out[0].status == "failed" and "timeout: no result after 8 s" in out[0].reason
    assert out[1].status == "done" and stats.timeouts == 1


def test_an_exception_in_the_evaluator_fails_the_item_not_the_worker(tmp_path):
    items = _items(n_shapes=2, per_shape=1)
    (tmp_path / "raise-32").touch()
    out, stats = run_pool(items, ["cpu0"], evaluator="fleet_evaluators:raise_on", timeout_s=300)
    assert out[1].status == "failed" and out[1].reason == "RuntimeError: evaluation broke"
    assert out[0].status == "done" and stats.restarts == 0


def test_no_devices_is_a_typed_error():
    with pytest.raises(AutooptError, match="no devices"):
        run_pool(_items(1, 1), [])


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A real local Ray cluster with 2 CPUs (no GPUs here): the actors evaluate on CPU; their cue folder
    is fixed for the module (actors do not see a test's own environment)."""
    ray = pytest.importorskip("ray")
    tests = str(Path(__file__).resolve().parent)
    cues = tmp_path_factory.mktemp("ray-cues")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([tests, str(Path(tests).parent)]),
                                       "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", ""),
                                       "AUTOOPT_TEST_FLEET_DIR": str(cues)}})
    yield ray, cues
    ray.shutdown()


def test_ray_actors_evaluate_every_item_once(local_ray):
    from autoopt.fleet.ray_backend import run_ray

    items = _items(n_shapes=2, per_shape=2)
    out, stats = run_ray(items, timeout_s=120)
    assert [o.item for o in out] == [i.id for i in items] and all(o.status == "done" for o in out)
    assert len(stats.per_device) == 2  # both actors worked


def test_ray_actor_killed_mid_sweep_is_replaced_and_its_item_retried(local_ray):
    from autoopt.fleet.ray_backend import run_ray

    _, cues = local_ray
    (cues / "crash-once-32").touch()
    items = _items(n_shapes=2, per_shape=1)
    out, stats = run_ray(items, evaluator="fleet_evaluators:crash_once", timeout_s=120)
    assert all(o.status == "done" for o in out) and stats.restarts == 1 and stats.retries == 1


def test_bench_over_ray_gives_the_serial_rows_keyed_by_the_profile_its_cpu_actors_stand_for(local_ray, capsys):
    import json

    from autoopt.cli import main

    argv = ["bench", "--op", "gemm", "--shape", "16,256,256", "--dtype", "fp16", "--profile", "h100-sxm",
            "--format", "json"]
    assert main(argv) == 0
    serial = json.loads(capsys.readouterr().out)
    assert main([*argv, "--ray"]) == 0
    fleet = json.loads(capsys.readouterr().out)
    assert [(r["config"], r["label"]) for r in fleet["rows"]] == [(r["config"], r["label"]) for r in serial["rows"]]
    assert [r["fingerprint"] for r in fleet["rows"]] == [load_profile("h100-sxm").gpu.device_fingerprint]


def test_without_ray_the_flag_says_how_to_install(monkeypatch):
    import builtins

    from autoopt.fleet import ray_backend

    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray":
            raise ImportError("no ray")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(AutooptError, match=r"pip install 'autoopt\[ray\]'"):
        ray_backend._ray()


def test_fleet_inventory_of_this_host_names_it_and_its_gpus(capsys):
    import socket

    from autoopt.cli import main

    assert main(["fleet", "--format", "json"]) == 0
    data = __import__("json").loads(capsys.readouterr().out)
    assert data["hosts"] == [socket.gethostname()]
    assert all("gpu" in r for r in data["rows"])


def test_fleet_inventory_over_ray_runs_detection_on_every_node(local_ray):
    import socket

    from autoopt.fleet.inventory import inventory

    rows = inventory(use_ray=True)
    assert {r["host"] for r in rows} == {socket.gethostname()}  # the local cluster's one node

