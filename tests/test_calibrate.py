"""Calibration: the fit and its held-out scores, per-device constants files, rank() using them, the CLI.

Everything here runs on the CPU: timings are synthetic (predicted with a known, perturbed set of
constants, as if measured on a GPU the defaults were not fitted on) or replayed from the committed
H200 grid (benchmarks/results/h200_gemm_grid.json).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autoopt.api import load_profile
from autoopt.errors import AutooptError, BackendError, StoreError
from autoopt.kernels.cost import DEFAULT_CONSTANTS, CostConstants, explicit, using
from autoopt.kernels.ops import OpSpec
from autoopt.results import constants as rc
from autoopt.results import keys
from autoopt.results.lookup import reset_default_lookup
from autoopt.results.store import ResultStore
from autoopt.search.calibration import (
    DEFAULT_NAMES,
    calibrate,
    grid_samples,
    holdout_split,
    score,
    spearman,
)
from autoopt.search.ranking import predict_config, rank
from autoopt.tuning import calibrate as cal

ROOT = Path(__file__).resolve().parents[1]
H100 = load_profile("h100-sxm").gpu
H200 = load_profile("h200").gpu
L40S = load_profile("l40s").gpu
#: "another GPU": what the defaults (fitted on the H200) would have to learn: other rates, launch cost and
#: overlap, and pointer-fed and narrow wgmma losing more against TMA and full-width tiles
TRUTH = replace(DEFAULT_CONSTANTS, tc_efficiency=0.6, dram_efficiency=0.95, launch_us=2.5, overlap_exponent=2.0,
                pointer_wgmma_efficiency=0.65, narrow_wgmma_efficiency=0.6, n128_wgmma_efficiency=1.0)
OPS = [op for _, op in cal.sweep_ops()]
#: an NVIDIA device node: the no-GPU tests would run a real sweep here, so they are skipped
NVIDIA = bool(glob.glob("/dev/nvidia[0-9]*"))
no_gpu_only = pytest.mark.skipif(NVIDIA, reason="checks the answer on a machine without a GPU")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private results cache (store and constants) for one test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", str(folder))
    rc.clear_cache()
    reset_default_lookup()
    yield folder
    rc.clear_cache()
    reset_default_lookup()


def synthetic(gpu, ops, truth=TRUTH, *, top=8, spread=16, noise=0.02, seed=0):
    """Samples of the sweep's configs timed as ``truth`` predicts them, with lognormal noise."""
    rng = random.Random(seed)
    out = []
    with using(truth):
        for op in ops:
            for c in cal.plan_sweep(gpu, op, top=top, spread=spread):
                out.append((gpu, op, c, predict_config(gpu, op, c).us * rng.lognormvariate(0, noise)))
    return out


# -- scoring and the split ------------------------------------------------------------------------

def test_spearman_ranks_with_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0  # no spread
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9487, abs=1e-4)
    with pytest.raises(AutooptError):
        spearman([1, 2], [1])


def test_score_top1_is_the_best_time_over_the_time_of_the_models_pick():
    samples = synthetic(H100, OPS[4:5], spread=6, noise=0.0)
    with using(TRUTH):
        exact = score(samples)
    assert exact.median_spearman == pytest.approx(1.0) and exact.geomean_top1 == 1.0
    # a model that picks a slower config: top-1 is best/picked < 1
    worse = score(samples, replace(DEFAULT_CONSTANTS, tc_efficiency=0.2, launch_us=40.0))
    s = worse.per_shape[0]
    assert s.top1_ratio == pytest.approx(round(s.best_us / s.picked_us, 4)) and s.top1_ratio <= 1.0
    assert s.shape == "256x6144x4096" and s.n == len(samples)


def test_holdout_split_is_deterministic_disjoint_and_covers_every_sample():
    samples = synthetic(H100, OPS[:3], spread=10)
    train, held = holdout_split(samples)
    assert holdout_split(samples) == (train, held)
    ids = lambda xs: {(s[1], s[2].key()) for s in xs}  # noqa: E731
    shuffled = samples[:]
    random.Random(1).shuffle(shuffled)
    train1, held1 = holdout_split(shuffled)  # stratified: the input order does not change who is held out
    assert ids(held1) == ids(held) and ids(train1) == ids(train)
    assert not ids(train) & ids(held) and ids(train) | ids(held) == ids(samples)
    assert len(train) + len(held) == len(samples)
    for op in OPS[:3]:  # per shape: half held out, spanning fast and slow configs
        mine = sorted(s[3] for s in samples if s[1] == op)
        h = sorted(s[3] for s in held if s[1] == op)
        assert len(h) == len(mine) // 2 and h[0] <= mine[2] and h[-1] >= mine[-3]
    # unstratified: every second sample of each shape in the order given (the committed H200 split)
    train2, held2 = holdout_split(samples, stratify=False)
    assert len(train2) + len(held2) == len(samples)
    assert held2 == [s for op in OPS[:3] for s in [x for x in samples if x[1] == op][1::2]]
    assert holdout_split(samples, holdout=0.25)[1] != held
    with pytest.raises(AutooptError):
        holdout_split(samples, holdout=1.0)


def test_calibrating_on_timings_from_known_constants_recovers_them_and_lifts_heldout_rho():
    # spread 20: every path whose rate the fit names needs configs in the training half; at spread 12
    # the sweep's 7 pointer-fed wgmma configs all fell into the held-out half, and no fit can recover
    # pointer_wgmma_efficiency from samples that lack it
    samples = synthetic(H100, OPS, spread=20)
    assert {c.path for _, _, c, _ in holdout_split(samples)[0]} == {c.path for _, _, c, _ in samples}
    rep = calibrate(samples)
    assert rep.names == DEFAULT_NAMES and rep.start is DEFAULT_CONSTANTS
    assert rep.constants.tc_efficiency == pytest.approx(TRUTH.tc_efficiency, rel=0.05)
    assert rep.constants.dram_efficiency == pytest.approx(TRUTH.dram_efficiency, rel=0.05)
    assert rep.constants.launch_us == pytest.approx(TRUTH.launch_us, rel=0.15)
    assert rep.after.median_spearman > rep.before.median_spearman + 0.01
    # the defaults already rank these well (0.983 of the best: the busiest-SM term and split-K), so the
    # fit lifts top-1 by less than it did before them (0.9831 -> 0.9916)
    assert rep.after.geomean_top1 > rep.before.geomean_top1 + 0.005 and rep.better
    assert rep.train_loss_after < rep.train_loss_before / 5 and rep.heldout_loss_after < rep.heldout_loss_before / 5
    assert rep.n_heldout == len(holdout_split(samples)[1]) and 0 < rep.n_train <= len(samples) - rep.n_heldout
    d = rep.to_dict()
    assert d["heldout_after"]["median_spearman"] == rep.after.median_spearman
    assert {r["shape"] for r in d["per_shape"]} == {f"{o.shape[0]}x{o.shape[1]}x{o.shape[2]}" for o in OPS}
    assert set(d["changed"]) <= set(DEFAULT_NAMES) and "tc_efficiency" in d["changed"]
    json.dumps(d)


def test_calibration_of_a_gpu_the_defaults_never_saw_l40s():
    """An Ada L40S (no wgmma, mma.sync only): the defaults come from an H200; timings from other constants."""
    truth = replace(DEFAULT_CONSTANTS, tc_efficiency=0.55, dram_efficiency=0.95, launch_us=3.0, dram_latency_us=0.6,
                    overlap_exponent=2.0, iter_overhead_us=0.06)
    samples = synthetic(L40S, OPS, truth, spread=12)
    assert {s[2].path for s in samples} <= {"standard"}  # Ada: mma.sync tiles, no wgmma or TMA
    rep = calibrate(samples)
    assert rep.after.median_spearman > rep.before.median_spearman + 0.005
    assert rep.after.geomean_top1 > rep.before.geomean_top1
    assert rep.constants.tc_efficiency == pytest.approx(0.55, rel=0.05)


def test_calibrate_refuses_what_it_cannot_score_or_fit():
    with pytest.raises(AutooptError, match="measured_us"):
        calibrate([(H100, OPS[0], cal.plan_sweep(H100, OPS[0], top=1, spread=0)[0], 0.0)])
    with pytest.raises(AutooptError, match="held-out"):
        calibrate(synthetic(H100, OPS[:2], top=1, spread=0))
    with pytest.raises(AutooptError, match="unknown constants"):
        calibrate(synthetic(H100, OPS[:2]), names=["tc_efficiency", "warp_speed"])


def test_replay_on_the_real_h200_grid_recovers_from_constants_fitted_elsewhere():
    """Real timings: the committed H200 grid. Start as if the model had been fitted on another GPU
    (tc_efficiency x0.7, dram_efficiency x0.8): calibrating on a third of five shapes' configs lifts
    the held-out median rho and top-1 over that start."""
    grid = json.loads((ROOT / "benchmarks/results/h200_gemm_grid.json").read_text())
    shapes = ["16x4096x14336", "256x6144x4096", "256x4096x14336", "4096x4096x4096", "4096x28672x4096"]
    samples = grid_samples(grid, H200, shapes=shapes)[::3]
    start = replace(DEFAULT_CONSTANTS, tc_efficiency=DEFAULT_CONSTANTS.tc_efficiency * 0.7,
                    dram_efficiency=DEFAULT_CONSTANTS.dram_efficiency * 0.8)
    rep = calibrate(samples, start=start, max_per_shape=20)
    assert rep.n_shapes == 5 and rep.n_heldout > 200
    assert rep.after.median_spearman > rep.before.median_spearman + 0.01
    assert rep.after.geomean_top1 > rep.before.geomean_top1 + 0.02
    # the fit moves the perturbed constants back towards the H200's
    assert rep.constants.tc_efficiency > start.tc_efficiency * 1.2


def test_replay_of_a_real_h100_sweep_lifts_heldout_rho_over_the_h200_fitted_defaults():
    """Real timings on a GPU the defaults were not fitted on: the 576 rows of `autoopt calibrate --sweep`
    on an H100 (48 configs per shape, benchmarks/results/h100/calibrate_sweep_run1_rows.json)."""
    from autoopt.results.transfer import read_file

    rows = read_file(ROOT / "benchmarks/results/h100/calibrate_sweep_run1_rows.json")
    assert {r.env.device for r in rows} == {H100.device_fingerprint}
    samples = [(H100, r.op, r.config, r.us) for r in rows if r.label == "measured"]
    assert len(samples) == 576
    rep = calibrate(samples)
    assert rep.n_shapes == 12 and rep.n_heldout == 288
    assert rep.before.median_spearman == pytest.approx(0.947, abs=0.002)
    assert rep.after.median_spearman > rep.before.median_spearman + 0.015  # 0.947 -> 0.970
    assert rep.heldout_loss_after < rep.heldout_loss_before * 0.8


def test_the_h100_sweep_fit_is_adopted_only_where_it_picks_better_than_the_defaults():
    """The sweep's fit always lifts rho; calibrate adopts it only if it does not pick the held-out configs
    slower. Without the N = 128 wgmma price (``n128_wgmma_efficiency=1``) the defaults picked at 0.968 of
    the best and the fit at 0.960: kept (0.948 without the DRAM row-run term, where the fit won). With it
    the defaults pick at 0.976 (4096^2 x 28672 moves to 128x256 tiles) and so does the fit, whose rho is
    higher (0.948 -> 0.970): adopted."""
    from autoopt.results.transfer import read_file

    rows = read_file(ROOT / "benchmarks/results/h100/calibrate_sweep_run1_rows.json")
    samples = [(H100, r.op, r.config, r.us) for r in rows if r.label == "measured"]
    before_n128 = calibrate(samples, start=CostConstants(n128_wgmma_efficiency=1.0))
    assert before_n128.before.geomean_top1 == pytest.approx(0.968, abs=0.002) and not before_n128.better
    old = calibrate(samples, start=CostConstants(dram_run_bytes=0.0, n128_wgmma_efficiency=1.0))
    assert old.before.geomean_top1 == pytest.approx(0.948, abs=0.002) and old.better
    rep = calibrate(samples)
    assert rep.before.geomean_top1 == pytest.approx(0.976, abs=0.002)
    assert rep.after.geomean_top1 == pytest.approx(0.976, abs=0.002)
    assert rep.after.median_spearman > rep.before.median_spearman + 0.015 and rep.better


def test_constants_that_rank_no_better_are_not_written_unless_forced(cache):
    exact = cal.SampleSet(source="sweep", samples=tuple(synthetic(H100, OPS, DEFAULT_CONSTANTS, spread=4, noise=0.0)))
    done = cal.calibrate_device(H100, exact)
    assert not done.report.better and done.saved is None and "do not rank the held-out configs better" in done.not_saved
    assert rc.load(H100) is None
    forced = cal.calibrate_device(H100, exact, force=True)
    assert forced.saved is not None and rc.load(H100) is not None
    assert cal.calibrate_device(H100, exact, save=False, force=True).not_saved == "dry run"


# -- per-device constants files -------------------------------------------------------------------

def test_constants_round_trip_through_the_device_file(cache):
    fitted = replace(DEFAULT_CONSTANTS, tc_efficiency=0.7, launch_us=4.0)
    assert rc.load(H100) is None and rc.calibrated_constants(H100) is None
    path = rc.save(H100, fitted, fitted=["tc_efficiency", "launch_us"], calibration={"source": "test"})
    assert path == cache / "constants" / f"{H100.device_fingerprint}.json" and path.is_file()
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary left behind
    back = rc.load(H100)
    assert back is not None and back.constants == fitted and back.fitted == ("tc_efficiency", "launch_us")
    assert back.gpu == H100.name and back.calibration == {"source": "test"}
    assert back.changed() == {"tc_efficiency": (DEFAULT_CONSTANTS.tc_efficiency, 0.7),
                              "launch_us": (DEFAULT_CONSTANTS.launch_us, 4.0)}
    assert rc.calibrated_constants(H100) == fitted and rc.calibrated_constants(H200) is None
    assert rc.remove(H100) == path and not path.exists() and rc.calibrated_constants(H100) is None
    assert rc.remove(H100) is None


def test_a_constant_missing_from_the_file_keeps_its_default(cache):
    path = rc.save(H100, replace(DEFAULT_CONSTANTS, tc_efficiency=0.7))
    data = json.loads(path.read_text())
    del data["constants"]["launch_us"]  # as if a newer autoopt had added launch_us
    path.write_text(json.dumps(data))
    got = rc.read_file(path).constants
    assert got.tc_efficiency == 0.7 and got.launch_us == DEFAULT_CONSTANTS.launch_us


def test_the_cache_switched_off_keeps_no_constants(monkeypatch):
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", "off")
    rc.clear_cache()
    try:
        assert rc.path_for(H100) is None and rc.load(H100) is None and rc.calibrated_constants(H100) is None
        with pytest.raises(StoreError, match="off"):
            rc.save(H100, DEFAULT_CONSTANTS)
    finally:
        rc.clear_cache()


def _good(**changes):
    doc = {"format": rc.FORMAT, "version": rc.VERSION, "device": H100.device_fingerprint, "gpu": H100.name,
           "created_at": 1.0, "autoopt_version": "x", "fitted": ["tc_efficiency"],
           "constants": {"tc_efficiency": 0.7}, "calibration": {}}
    doc.update(changes)
    return json.dumps(doc)


BAD_FILES = {
    "urandom": None,  # a symlink to /dev/urandom: not a regular file
    "directory": None,
    "huge": None,
    "bad json": '{"format": "autoopt-cost-constants", ',
    "not utf-8": b"\xff\xfe{}",
    "a list": "[1, 2]",
    "unknown constant": _good(constants={"tc_efficiency": 0.7, "warp_speed": 9.0}),
    "newer version": _good(version=rc.VERSION + 1),
    "older version": _good(version=0),
    "another format": _good(format="autoopt-results"),
    "another device": _good(device="0123456789abcdef"),
    "fraction above 1": _good(constants={"tc_efficiency": 1.5}),
    "negative": _good(constants={"launch_us": -1.0}),
    "not a number": _good(constants={"launch_us": "fast"}),
    "a bool": _good(constants={"launch_us": True}),
    "no constants": _good(constants={}),
    "unknown fitted name": _good(fitted=["warp_speed"]),
}


def _plant(path: Path, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    content = BAD_FILES[what]
    if what == "urandom":
        os.symlink("/dev/urandom", path)
    elif what == "directory":
        path.mkdir()
    elif what == "huge":
        with path.open("wb") as fh:
            fh.truncate(rc.MAX_BYTES + 1)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        assert content is not None
        path.write_text(content)


@pytest.mark.parametrize("what", list(BAD_FILES))
def test_a_bad_constants_file_is_refused_by_the_reader_and_ignored_at_start_up(cache, what, caplog):
    path = rc.path_for(H100)
    assert path is not None
    _plant(path, what)
    with pytest.raises(StoreError) as err:
        rc.load(H100)
    assert str(path) in str(err.value)
    with caplog.at_level(logging.WARNING, logger="autoopt.results.constants"):
        assert rc.calibrated_constants(H100) is None
        rc.clear_cache()  # a new process: warned again, once
        assert rc.calibrated_constants(H100) is None
        assert rc.calibrated_constants(replace(H100)) is None  # another profile object of the device
    warnings = [r for r in caplog.records if "calibrated constants ignored" in r.getMessage()]
    assert len(warnings) == 2
    # rank() still works, with the defaults
    assert rank(H100, OPS[4], top=1).best.predicted_us == rank(H100, OPS[4], top=1, calibrated=False).best.predicted_us


def test_a_bad_device_argument_is_refused():
    with pytest.raises(StoreError, match="fingerprint"):
        rc.path_for("../../etc/passwd")


# -- the ranking uses them --------------------------------------------------------------------------

def test_rank_uses_the_devices_stored_constants_and_only_that_devices(cache):
    op = OpSpec(kind="gemm", shape=(4096, 4096, 4096), dtype="bf16")
    base = rank(H100, op, top=3)
    other = rank(H200, op, top=3)
    slow = replace(DEFAULT_CONSTANTS, tc_efficiency=0.4)
    rc.save(H100, slow, fitted=["tc_efficiency"])
    calibrated = rank(H100, op, top=3)
    assert calibrated.best.predicted_us > base.best.predicted_us * 1.5  # compute-bound: half the rate
    with using(slow):
        assert [c.predicted_us for c in rank(H100, op, top=3).candidates] == \
            [c.predicted_us for c in calibrated.candidates]
    assert rank(H200, op, top=3).to_dict()["candidates"] == other.to_dict()["candidates"]  # another device
    assert rank(H100, op, top=3, calibrated=False).to_dict()["candidates"] == base.to_dict()["candidates"]
    with using(DEFAULT_CONSTANTS):  # constants chosen explicitly win, even the defaults
        assert explicit()
        assert rank(H100, op, top=3).best.predicted_us == base.best.predicted_us
    assert not explicit()
    cfg = base.best.config
    assert predict_config(H100, op, cfg).us > predict_config(H100, op, cfg, calibrated=False).us * 1.5
    rc.remove(H100)
    assert rank(H100, op, top=3).best.predicted_us == base.best.predicted_us


def test_warm_rank_looks_the_constants_up_once_per_profile(cache, monkeypatch):
    calls = []
    real = rc._quiet_load
    monkeypatch.setattr(rc, "_quiet_load", lambda gpu: calls.append(gpu) or real(gpu))
    for _ in range(5):
        rank(H100, OPS[0], top=1)
    assert len(calls) == 1


# -- samples: the store and the sweep ---------------------------------------------------------------

def store_rows(gpu, samples):
    from autoopt.backend.registry import KERNELS

    return [keys.make_result(gpu, op, c, label="measured", kernel_module=KERNELS[c.kernel].module, us=us,
                             measured_at=1_750_000_000.0 + i) for i, (_, op, c, us) in enumerate(samples)]


def test_store_samples_take_this_devices_usable_measured_rows(cache):
    samples = synthetic(H100, OPS[:3], spread=6)
    rows = store_rows(H100, samples)
    with ResultStore(cache / "results.sqlite3") as st:
        st.put_many(rows)
        st.put_many(store_rows(H200, synthetic(H200, OPS[:1], spread=4)))  # another device: not taken
        bad = replace(rows[0].config, params={**rows[0].config.params, "BLOCK_M": 48})  # no template makes it
        st.put(replace(rows[0], config=bad))
        st.put(replace(rows[1], kernel_hash="0" * 64, config=replace(rows[1].config, params={
            **rows[1].config.params, "GROUP_M": 4})))  # stale: its kernel source changed
        st.put(replace(rows[2], measured_at=rows[2].measured_at + 5, us=rows[2].us * 2,
                       env=replace(rows[2].env, driver="other")))  # newer duplicate under another driver
        got = cal.store_samples(H100, store=st)
    assert len(got.samples) == len(samples)
    assert got.skipped == {"refused by today's templates": 1, "stale (kernel source changed or another triton)": 1,
                           "older measurement of the same config": 1}
    assert {(s[1], s[2].key()) for s in got.samples} == {(s[1], s[2].key()) for s in samples}
    assert dict((s[2].key(), s[3]) for s in got.samples if s[1] == OPS[0])[rows[2].config.key()] == rows[2].us * 2
    assert got.usable_shapes == 3 and got.to_dict()["rows"] == len(samples) + 3  # the H200's rows are not read


def test_too_few_samples_say_how_many_were_found_and_needed():
    few = cal.SampleSet(source="store", samples=tuple(synthetic(H100, OPS[:2], spread=20)), detail={"store": "x"})
    with pytest.raises(AutooptError, match=r"found \d+ measured samples over 2 shapes .* need at least 30 samples "
                                           r"over 3 shapes"):
        cal.check_enough(few)


def test_plan_sweep_starts_with_the_ranking_and_spreads_over_the_valid_space():
    op = OpSpec(kind="gemm", shape=(256, 6144, 4096), dtype="bf16")
    plan = cal.plan_sweep(H100, op)
    assert plan == cal.plan_sweep(H100, op)  # deterministic
    top = [c.config for c in rank(H100, op, top=cal.TOP, measured=False, calibrated=False).candidates]
    assert plan[:cal.TOP] == top
    assert len(plan) == cal.TOP + cal.SPREAD and len({c.key() for c in plan}) == len(plan)
    space = [c.config.key() for c in rank(H100, op, top=10**6, exhaustive=True, calibrated=False).candidates]
    pos = sorted(space.index(c.key()) for c in plan[cal.TOP:])
    assert pos[0] < len(space) * 0.1 and pos[-1] > len(space) * 0.9  # spans fast to slow
    # the seeded pick is shared across shapes whose spaces match (the same tiles and SPLIT_K choices,
    # which depend on M, N and K): most of one shape's spread is in another's
    other = cal.plan_sweep(H100, OpSpec(kind="gemm", shape=(256, 6144, 8192), dtype="bf16"))
    assert len({c.key() for c in plan[cal.TOP:]} & {c.key() for c in other[cal.TOP:]}) >= cal.SPREAD // 2


class _Fake:
    """A stand-in runner result."""

    def __init__(self, label, us=None):
        self.label, self.us, self.rel_err, self.reason, self.versions = label, us, 1e-3, "", {"torch": "fake"}


def test_sweep_times_each_shape_within_its_share_and_stores_every_row(cache, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(cal.time, "perf_counter", lambda: clock[0])

    def evaluate(op, config):
        clock[0] += 0.25  # a quarter second per config
        if config.params.get("num_stages") == 5:
            return _Fake("rejected")
        with using(TRUTH):
            return _Fake("measured", predict_config(H100, op, config).us)

    seen = []
    ops = cal.sweep_ops()[:4]
    got = cal.sweep_samples(H100, seconds=20, ops=ops, evaluate=evaluate, on_shape=lambda n, c: seen.append((n, c)))
    d = got.detail
    assert [n for n, _ in seen] == [n for n, _ in ops]
    assert all(c["evaluated"] == 20 for _, c in seen)  # 5 s each: an equal share of 20 s
    assert d["evaluated"] == 80 and d["measured"] + d["rejected"] == 80 and len(got.samples) == d["measured"]
    assert got.versions == {"torch": "fake"}
    with ResultStore(cache / "results.sqlite3") as st:
        assert st.count() == 80 == d["stored_rows"]
        assert len(st.rows(labels=["rejected"])) == d["rejected"]
    with pytest.raises(AutooptError, match="seconds"):
        cal.sweep_samples(H100, seconds=cal.MAX_SECONDS + 1, evaluate=evaluate)


@no_gpu_only
def test_sweep_without_a_cuda_gpu_is_a_backend_error():
    with pytest.raises(BackendError, match="CUDA GPU"):
        cal.sweep_samples(H100, seconds=1)


@pytest.mark.gpu
def test_a_short_real_sweep_measures_and_stores(cache):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA GPU and compiled Triton")
    from autoopt.hardware.detection import detect

    gpu = detect().gpu
    assert gpu is not None
    got = cal.sweep_samples(gpu, seconds=30, ops=cal.sweep_ops()[4:6], spread=4, precompile=False)
    assert len(got.samples) >= 8 and all(us > 0 for *_, us in got.samples)
    assert got.detail["stored_rows"] == got.detail["evaluated"] - got.detail["other"]
    assert got.versions.get("torch") and got.versions.get("triton")


# -- the command line ------------------------------------------------------------------------------

def autoopt(cache_dir, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOOPT_DISABLE_PLUGIN_AUTOLOAD": "1",
           "AUTOOPT_CACHE_DIR": str(cache_dir)}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-m", "autoopt", "calibrate", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def one_line_error(res, *needles):
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert res.stdout == "" and len(lines) == 1 and lines[0].startswith("autoopt: error: "), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@no_gpu_only
def test_cli_sweep_without_a_gpu_is_one_line_and_exit_2(tmp_path):
    one_line_error(autoopt(tmp_path, "--sweep"), "CUDA GPU")
    one_line_error(autoopt(tmp_path, "--sweep", "--profile", "h100-sxm", "--seconds", "30"), "CUDA GPU")


def test_cli_usage_errors(tmp_path):
    one_line_error(autoopt(tmp_path, "--profile", "h100-sxm"), "exactly one")
    one_line_error(autoopt(tmp_path, "--from-store", "--sweep"), "exactly one")
    one_line_error(autoopt(tmp_path, "--from-store", "--seconds", "10", "--profile", "h100-sxm"), "--seconds")
    one_line_error(autoopt(tmp_path, "--sweep", "--seconds", "900"), "--seconds")
    one_line_error(autoopt("off", "--from-store", "--profile", "h100-sxm"), "AUTOOPT_CACHE_DIR=off", "--dry-run")
    off = autoopt("off", "--show", "--profile", "h100-sxm")
    assert off.returncode == 0 and "off" in off.stdout


def test_cli_from_an_empty_store_says_what_it_found_and_needs(tmp_path):
    res = autoopt(tmp_path, "--from-store", "--profile", "h100-sxm")
    one_line_error(res, "found 0 measured samples over 0 shapes", "need at least 30 samples over 3 shapes")


def test_cli_from_a_store_fits_writes_and_reports_before_and_after(tmp_path):
    cache_dir = tmp_path / "cache"
    with ResultStore(cache_dir / "results.sqlite3") as st:
        st.put_many(store_rows(H100, synthetic(H100, OPS, spread=12)))
    res = autoopt(cache_dir, "--from-store", "--profile", "h100-sxm", "--format", "json", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["saved"] is None and not (cache_dir / "constants").exists()

    res = autoopt(cache_dir, "--from-store", "--profile", "h100-sxm", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    c = data["calibration"]
    assert data["device"]["fingerprint"] == H100.device_fingerprint and data["samples"]["source"] == "store"
    assert data["samples"]["samples"] == c["n_samples"] == 12 * 20 and c["n_shapes"] == 12
    assert c["heldout_after"]["median_spearman"] > c["heldout_before"]["median_spearman"]
    assert c["heldout_after"]["geomean_top1"] > c["heldout_before"]["geomean_top1"]
    assert c["constants"]["tc_efficiency"] == pytest.approx(TRUTH.tc_efficiency, rel=0.05)
    assert "torch" in data["versions"] and "triton" in data["versions"]
    path = Path(data["saved"])
    assert path == cache_dir / "constants" / f"{H100.device_fingerprint}.json"
    assert rc.read_file(path).constants == CostConstants.from_dict(c["constants"])

    shown = autoopt(cache_dir, "--show", "--profile", "h100-sxm")
    assert shown.returncode == 0 and "tc_efficiency" in shown.stdout and "held-out median rho" in shown.stdout

    table = autoopt(cache_dir, "--from-store", "--profile", "h100-sxm", "--dry-run")
    assert table.returncode == 0, table.stderr
    assert "before (default constants)" in table.stdout and "after (calibrated)" in table.stdout
    assert "256x6144x4096" in table.stdout and "not written: dry run" in table.stdout

    gone = autoopt(cache_dir, "--reset", "--profile", "h100-sxm")
    assert gone.returncode == 0 and "removed" in gone.stdout and not path.exists()


def test_cli_show_of_a_bad_file_is_one_line(tmp_path):
    folder = tmp_path / "constants"
    folder.mkdir()
    (folder / f"{H100.device_fingerprint}.json").write_text(_good(version=rc.VERSION + 1))
    one_line_error(autoopt(tmp_path, "--show", "--profile", "h100-sxm"), "newer autoopt")
