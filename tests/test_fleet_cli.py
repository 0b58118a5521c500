"""``autoopt tune|bench --gpus|--ray``: the fleet behind the CLI, on fake-GPU CPU workers.

The fake GPUs (``AUTOOPT_FLEET_FAKE_GPUS``) are CPU workers standing for known profiles; under
Triton's interpreter (conftest switches it on without a GPU) they check each config (``checked``),
as the serial path does in this process.
"""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path

import pytest

from autoopt.cli import main
from autoopt.fleet import Item, run_pool
from autoopt.fleet import devices as fleet_devices
from autoopt.fleet.cost import estimated_cost
from autoopt.fleet.devices import FAKE_ENV
from autoopt.fleet.pool import Backlog, op_key
from autoopt.hardware.library import load_profile
from autoopt.kernels import suite as suites
from autoopt.kernels.ops import OpSpec

TESTS = Path(__file__).resolve().parent
#: two small GEMMs (the interpreter is slow): as many ops as fake GPUs, so each search is the serial one
TINY = [("tiny M=16", OpSpec(kind="gemm", shape=(16, 256, 256), dtype="fp16")),
        ("tiny M=32", OpSpec(kind="gemm", shape=(32, 256, 256), dtype="fp16"))]
GEMM_CFG = {"kernel": "gemm", "path": "standard", "template": "gemm",
            "config": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}}


@pytest.fixture(autouse=True)
def _fleet_env(monkeypatch, tmp_path):
    """Workers find tests/ (fleet_evaluators) and see no GPU; a 'tiny' suite; an empty store of our own."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(suites.SUITES, "tiny", lambda dtype="bf16": list(TINY))
    from autoopt.results.lookup import reset_default_lookup

    reset_default_lookup()
    yield
    reset_default_lookup()  # forget winners remembered in memory by a test's tuning


def _json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _fails(capsys, argv: list[str]) -> str:
    """stderr of a run that must exit 2 with one line and no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


# -- same labels as the serial path --------------------------------------------------------

def test_bench_on_two_fake_gpus_gives_the_serial_rows_from_both_workers(monkeypatch, capsys):
    argv = ["bench", "--suite", "tiny", "--top", "2", "--format", "json"]
    serial = _json(capsys, [*argv, "--profile", "h100-sxm"])
    monkeypatch.setenv(FAKE_ENV, "h100-sxm,h100-sxm")
    fleet = _json(capsys, [*argv, "--gpus", "all"])
    assert [(r["shape"], r["config"], r["label"]) for r in fleet["rows"]] == \
           [(r["shape"], r["config"], r["label"]) for r in serial["rows"]]
    assert {r["worker"] for r in fleet["rows"]} == {"cpu0", "cpu1"}
    assert {r["fingerprint"] for r in fleet["rows"]} == {load_profile("h100-sxm").gpu.device_fingerprint}


def test_tune_on_two_fake_gpus_tries_the_serial_configs_with_the_serial_labels(monkeypatch, capsys):
    from autoopt.tuning import campaign

    argv = ["tune", "--suite", "tiny", "--trials", "3", "--format", "json"]
    monkeypatch.setattr(campaign, "_require_gpu", lambda: None)  # the serial path, checked in the interpreter
    serial = _json(capsys, [*argv, "--profile", "h100-sxm"])
    monkeypatch.setenv(FAKE_ENV, "h100-sxm,h100-sxm")
    fleet = _json(capsys, [*argv, "--gpus", "0,1"])
    trials = [[(t["config"], t["label"]) for t in op["trials"]] for op in fleet["ops"]]
    assert trials == [[(t["config"], t["label"]) for t in op["trials"]] for op in serial["ops"]]
    assert [len(t) for t in trials] == [3, 3] and [d["device"] for d in fleet["devices"]] == ["cpu0", "cpu1"]


def test_fleet_tune_says_on_stderr_where_each_workers_seconds_went(monkeypatch, capsys):
    monkeypatch.setenv(FAKE_ENV, "h100-sxm,h100-sxm")
    assert main(["tune", "--suite", "tiny", "--trials", "2", "--format", "json", "--gpus", "0,1"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays the data
    line = next(x for x in captured.err.splitlines() if x.startswith("autoopt: fleet: "))
    assert line.startswith("autoopt: fleet: 4 evaluations in ") and "cpu0 " in line and "cpu1 " in line


def test_fleet_tune_stores_each_trial_under_the_gpu_its_worker_detected(monkeypatch):
    """Heterogeneous GPUs are distinct devices: each kind is tuned, its rows keyed by its fingerprint."""
    from autoopt.fleet import jobs
    from autoopt.results.store import open_default

    monkeypatch.setenv(FAKE_ENV, "h100-sxm,a100-sxm-80gb")
    op = OpSpec(kind="gemm", shape=(48, 128, 128), dtype="fp16")
    with jobs.open_fleet(mode="tune", gpus="all", evaluator="fleet_evaluators:fake_measured") as fleet:
        done = jobs.tune(fleet, [("g", op)], budget_trials=2)
    store = open_default()
    assert store is not None
    rows = store.rows(op=op)
    fps = [load_profile(p).gpu.device_fingerprint for p in ("h100-sxm", "a100-sxm-80gb")]
    assert sorted(r.env.device for r in rows) == sorted(fps * 2)  # 2 trials per kind, written here once each
    assert [t.name for t in done] == ["g @ NVIDIA H100 80GB HBM3", "g @ NVIDIA A100-SXM4-80GB"]
    assert all(t.result.best is not None for t in done)


def _made_up(op, configs):
    """Results with made-up times (the config's position in its round), for the tuner's rounds."""
    from types import SimpleNamespace

    return [SimpleNamespace(label="measured", us=10.0 + i, rel_err=1e-3, reason="") for i, _ in enumerate(configs)]


def test_one_proposal_per_round_is_the_serial_search():
    from autoopt.tuning.tuner import tune

    gpu, op = load_profile("h100-sxm").gpu, OpSpec(kind="gemm", shape=(256, 4096, 4096))
    serial = tune(gpu, op, budget_trials=6, evaluate=lambda o, c: _made_up(o, [c])[0], prefetch=False)
    rounds = tune(gpu, op, budget_trials=6, evaluate_many=_made_up, batch=1, prefetch=False)
    assert [t.config.key() for t in rounds.trials] == [t.config.key() for t in serial.trials]


def test_a_tuning_round_hands_several_distinct_proposals_to_the_fleet_at_once():
    from autoopt.tuning.tuner import tune

    seen: list[list[tuple]] = []

    def many(op, configs):
        seen.append([c.key() for c in configs])
        return _made_up(op, configs)
    result = tune(load_profile("h100-sxm").gpu, OpSpec(kind="gemm", shape=(256, 4096, 4096)), budget_trials=7,
                  evaluate_many=many, batch=3, prefetch=False)
    assert [len(r) for r in seen] == [3, 3, 1] and len(result.trials) == 7
    assert len({k for r in seen for k in r}) == 7


# -- longest first --------------------------------------------------------------------------

def test_cost_grows_with_gemm_size_and_with_stages_warps_and_tiles():
    small, large = ({"kind": "gemm", "shape": s, "dtype": "bf16"} for s in ([16, 256, 256], [4096, 28672, 4096]))
    deeper = {**GEMM_CFG, "config": {**GEMM_CFG["config"], "num_stages": 5}}
    wider = {**GEMM_CFG, "config": {**GEMM_CFG["config"], "num_warps": 8}}
    bigger = {**GEMM_CFG, "config": {**GEMM_CFG["config"], "BLOCK_M": 128, "BLOCK_N": 256}}
    base = estimated_cost(small, GEMM_CFG)
    assert estimated_cost(large, GEMM_CFG) > base + 0.05
    assert estimated_cost(small, deeper) == pytest.approx(base + 2 * 0.05)
    assert estimated_cost(small, wider) == pytest.approx(base + 4 * 0.02)
    assert estimated_cost(small, bigger) > estimated_cost(small, deeper)


def test_backlog_hands_a_worker_its_kinds_costliest_item_and_retries_first():
    costs = [("a", 1.0), ("a", 5.0), ("b", 9.0), ("a", 3.0), (None, 4.0), ("a", 0.1)]
    items = [Item(id=i, op={}, config={}, kind=kind, cost=cost) for i, (kind, cost) in enumerate(costs)]
    backlog = Backlog()
    for item in items[:5]:
        backlog.push(item)
    backlog.push(items[5], attempt=2)
    assert [backlog.take("a") for _ in range(6)] == [(items[5], 2), (items[1], 1), (items[4], 1), (items[3], 1),
                                                     (items[0], 1), None]
    assert backlog.take("b") == (items[2], 1)


def test_backlog_keeps_a_worker_on_the_op_it_evaluated_last_before_a_costlier_one():
    a, b = {"kind": "gemm", "shape": [4096, 512, 512]}, {"kind": "gemm", "shape": [16, 512, 512]}
    items = [Item(id=0, op=a, config={}, cost=9.0), Item(id=1, op=b, config={}, cost=2.0),
             Item(id=2, op=b, config={}, cost=1.0), Item(id=3, op=a, config={}, cost=8.0)]
    backlog = Backlog()
    for item in items:
        backlog.push(item)
    assert backlog.take(None, warm=[op_key(b)]) == (items[1], 1)
    assert backlog.take(None, warm=[op_key(b)]) == (items[2], 1)
    assert backlog.take(None, warm=[op_key(b)]) == (items[0], 1)  # b is done: the costliest of all


def test_backlog_prefers_the_most_recent_warm_op_that_has_an_item():
    a, b, c = ({"kind": "add", "shape": [n, 8]} for n in (1, 2, 3))
    backlog = Backlog()
    for k, (op, cost) in enumerate([(a, 1.0), (b, 2.0), (c, 9.0)]):
        backlog.push(Item(id=k, op=op, config={}, cost=cost))
    assert backlog.take(None, warm=[op_key(b), op_key(a)])[0].id == 0  # a is the most recent
    assert backlog.take(None, warm=[op_key(b), op_key(a)])[0].id == 1  # then b, before the costlier c


def test_an_item_pinned_to_a_device_goes_only_to_that_worker_while_it_lives():
    backlog = Backlog()
    backlog.push(Item(id=0, op={}, config={}, cost=9.0, device="1"))
    backlog.push(Item(id=1, op={}, config={}, cost=1.0))
    assert backlog.take(None, device="0", live={"0", "1"})[0].id == 1  # not the costlier item pinned to 1
    assert backlog.take(None, device="0", live={"0", "1"}) is None
    assert backlog.take(None, device="0", live={"0"})[0].id == 0  # 1's worker is gone: any worker may


def test_each_search_keeps_to_one_device_costliest_ops_first():
    from autoopt.fleet.devices import Device
    from autoopt.fleet.jobs import _Job, _lanes

    gpu = load_profile("h100-sxm").gpu
    devs = [Device(name=str(i), gpu=gpu) for i in range(2)]
    ops = [OpSpec(kind="gemm", shape=(m, 512, 512), dtype="bf16") for m in (16, 4096, 256)]
    jobs = [_Job(name=str(k), op=op, device=devs[0], width=1) for k, op in enumerate(ops)]
    lanes = _lanes({devs[0].kind: devs}, jobs)
    assert [pin for _, pin in lanes] == ["0", "1"]
    assert list(lanes[0][0]) == [1, 2, 0] and lanes[0][0] is lanes[1][0]  # one queue, largest M first


def test_a_search_whose_round_spans_gpus_keeps_to_none():
    from autoopt.fleet.devices import Device
    from autoopt.fleet.jobs import _Job, _lanes

    gpu = load_profile("h100-sxm").gpu
    devs = [Device(name=str(i), gpu=gpu) for i in range(4)]
    job = _Job(name="one", op=OpSpec(kind="gemm", shape=(64, 512, 512), dtype="bf16"), device=devs[0], width=4)
    assert [pin for _, pin in _lanes({devs[0].kind: devs}, [job])] == [None]


def test_fleet_searches_compile_ahead_unless_autoopt_precompile_is_0(monkeypatch):
    from autoopt.fleet import jobs
    from autoopt.tuning import precompile

    class Pool:
        def submit(self, op, configs):
            return 0

    pool = Pool()
    monkeypatch.setattr(precompile, "default_precompiler", lambda: pool)
    monkeypatch.delenv("AUTOOPT_PRECOMPILE", raising=False)
    assert jobs._ahead() == pool.submit
    monkeypatch.setenv("AUTOOPT_PRECOMPILE", "0")
    assert jobs._ahead() is False
    monkeypatch.delenv("AUTOOPT_PRECOMPILE")
    monkeypatch.setattr(precompile, "default_precompiler", lambda: None)  # no CUDA here: none to compile for
    assert jobs._ahead() is False


def test_a_worker_remembers_its_last_ops_as_many_as_the_runner_caches():
    from autoopt.backend.runner import CACHE_OPS
    from autoopt.fleet.pool import WARM_OPS, remember

    warm: list[str] = []
    for key in ["a", "b", "c", "d", "b", "e"]:
        remember(warm, key)
    assert WARM_OPS == CACHE_OPS and warm == ["c", "d", "b", "e"]


def test_a_retry_goes_before_the_warm_ops_items():
    a = {"kind": "add", "shape": [8, 8]}
    backlog = Backlog()
    backlog.push(Item(id=0, op=a, config={}, cost=5.0))
    backlog.push(Item(id=1, op={"kind": "add", "shape": [4, 4]}, config={}, cost=0.1), attempt=2)
    assert backlog.take(None, warm=[op_key(a)])[0].id == 1


def test_one_worker_evaluates_each_ops_configs_together_costliest_op_first():
    big, small = ({"kind": "gemm", "shape": [m, 512, 512], "dtype": "bf16"} for m in (4096, 256))
    cfgs = [{**GEMM_CFG, "config": {**GEMM_CFG["config"], "num_stages": s}} for s in (2, 3, 4)]
    # costs interleave the ops: plain LPT would alternate big, small, big, ...
    items = [Item(id=k, op=op, config=c, cost=cost) for k, (op, c, cost) in enumerate(
        [(big, cfgs[0], 9.0), (small, cfgs[0], 8.5), (big, cfgs[1], 8.0), (small, cfgs[1], 7.5),
         (big, cfgs[2], 7.0), (small, cfgs[2], 6.5)])]
    order: list[int] = []
    run_pool(items, ["cpu0"], evaluator="fleet_evaluators:echo", on_outcome=lambda o: order.append(o.result["m"]))
    assert order == [4096, 4096, 4096, 256, 256, 256]


def test_a_submit_from_another_thread_wakes_a_waiting_poll():
    import threading
    import time

    from autoopt.fleet.pool import LocalPool

    with LocalPool(["cpu0"], evaluator="fleet_evaluators:echo") as pool:
        item = Item(id=1, op={"kind": "add", "shape": [4, 4]}, config={"config": {}})
        threading.Timer(0.3, pool.submit, args=(item,)).start()
        t0 = time.monotonic()
        pool.poll(wait_s=30.0)  # nothing to do until the submit: woken by it, not by the 30 s
        assert time.monotonic() - t0 < 10.0


def test_many_submits_before_a_poll_do_not_fill_the_wake_pipe():
    import threading

    from autoopt.fleet.pool import LocalPool

    with LocalPool(["cpu0"], evaluator="fleet_evaluators:echo") as pool:
        op = {"kind": "add", "shape": [4, 4]}
        # one wake message per submit would fill a 64 KiB pipe after ~16k and block the submitter
        submitter = threading.Thread(target=lambda: [pool.submit(Item(id=k, op=op, config={"config": {}}))
                                                     for k in range(40_000)], daemon=True)
        submitter.start()
        submitter.join(timeout=60)
        assert not submitter.is_alive()
        assert len(pool._backlog) == 40_000


@pytest.mark.parametrize("jobs, devices, searches", [(20, 1, 2), (20, 2, 2), (20, 8, 8), (3, 8, 3), (1, 1, 1)])
def test_tune_runs_one_search_per_device_and_two_on_one_device(jobs, devices, searches):
    from autoopt.fleet.jobs import _searches

    assert _searches(jobs, devices) == searches


def test_one_worker_evaluates_items_longest_first():
    ops = [{"kind": "gemm", "shape": [m, 512, 512], "dtype": "bf16"} for m in (16, 4096, 256, 1024)]
    items = [Item(id=k, op=op, config=GEMM_CFG, cost=estimated_cost(op, GEMM_CFG)) for k, op in enumerate(ops)]
    order: list[int] = []
    run_pool(items, ["cpu0"], evaluator="fleet_evaluators:echo", on_outcome=lambda o: order.append(o.result["m"]))
    assert order == [4096, 1024, 256, 16]


# -- bad flags --------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, says", [
    ("0,x", "'x' is not a GPU index"),
    ("", "--gpus is empty"),
    ("0,5", "has no GPU 5 (it has 0,1)"),
    ("1,1", "GPU 1 is named twice"),
])
def test_a_bad_gpus_value_is_one_line_naming_it_and_the_accepted_form(monkeypatch, capsys, spec, says):
    monkeypatch.setenv(FAKE_ENV, "h100-sxm,h100-sxm")
    err = _fails(capsys, ["bench", "--op", "gemm", "--shape", "16,256,256", "--gpus", spec])
    assert says in err and "such as 0,1,3" in err


def test_gpus_on_a_host_without_gpus_says_so(monkeypatch, capsys):
    monkeypatch.delenv(FAKE_ENV, raising=False)
    monkeypatch.setattr(fleet_devices, "_detected_devices", dict)
    err = _fails(capsys, ["tune", "gemm", "--shape", "16,256,256", "--gpus", "all"])
    assert "this host has no GPU" in err


def test_gpus_with_profile_is_refused(capsys):
    err = _fails(capsys, ["tune", "gemm", "--shape", "16,256,256", "--gpus", "0", "--profile", "h100-sxm"])
    assert "drop --profile" in err


@pytest.mark.parametrize("command", [["bench", "--op", "gemm"], ["tune", "gemm"]])
def test_ray_without_ray_installed_says_how_to_install_it(monkeypatch, capsys, command):
    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_ray)
    err = _fails(capsys, [*command, "--shape", "16,256,256", "--profile", "h100-sxm", "--ray"])
    assert "pip install 'autoopt[ray]'" in err


def test_the_fleet_ranks_each_op_once_ahead_in_the_order_its_lanes_take_them(monkeypatch):
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from autoopt.fleet import jobs
    from autoopt.fleet.devices import Device

    gpu = load_profile("h200").gpu
    made = []
    monkeypatch.setattr(jobs.tuner, "ranking", lambda g, op: made.append(op.shape[0]) or ([], []))
    device = Device(name="cpu0", gpu=gpu, profile="h200")
    ops = [jobs._Job(name=f"M={m}", op=OpSpec(kind="gemm", shape=(m, 256, 256)), device=device, width=1)
           for m in (16, 32, 48)]
    queue = deque([2, 0, 1])  # costliest first; two lanes share one kind's queue
    with ThreadPoolExecutor(max_workers=1) as ranker:
        rankings = jobs._rank_ahead(ranker, ops, [(queue, "cpu0"), (queue, "cpu1")])
        assert {k: f.result() for k, f in rankings.items()} == {0: ([], []), 1: ([], []), 2: ([], [])}
    assert made == [48, 16, 32]
