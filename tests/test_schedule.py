"""Scheduler: strategies deduct memory, never overfill; auto-migrate relieves hot devices."""

from __future__ import annotations

from _recommend_hw import H100, nvlink_box

from autoopt.planning.schedule import Job, Schedule, Slot, auto_migrate, schedule, slots_of

GB = 10**9


def slots(*caps, speeds=None):
    speeds = speeds or [1.0] * len(caps)
    return [Slot(device=i, name=f"gpu{i}", capacity_bytes=c * GB, speed=s)
            for i, (c, s) in enumerate(zip(caps, speeds, strict=True))]


def test_round_robin_cycles_and_skips_full_devices():
    s = schedule([Job(name=f"j{i}", memory_bytes=30 * GB) for i in range(4)], slots(80, 40), strategy="round_robin")
    # j0 -> 0, j1 -> 1, j2 -> 0 (device 1 has 10 GB left), j3: 20 GB left on 0, 10 on 1 -> unplaced
    assert [s.device_of(f"j{i}") for i in range(4)] == [0, 1, 0, None]
    assert s.unplaced == ("j3",)
    assert [x.used_bytes for x in s.slots] == [60 * GB, 30 * GB]


def test_load_balanced_weighs_device_speed():
    jobs = [Job(name=f"j{i}", memory_bytes=GB, work=1.0) for i in range(6)]
    s = schedule(jobs, slots(80, 80, speeds=[2.0, 1.0]), strategy="load_balanced")
    assert [x.load for x in s.slots] == [4.0, 2.0]


def test_priority_gives_urgent_jobs_the_fastest_device():
    jobs = [Job(name="low", memory_bytes=50 * GB, priority=0), Job(name="high", memory_bytes=50 * GB, priority=9)]
    s = schedule(jobs, slots(80, 80, speeds=[1.0, 3.0]), strategy="priority")
    assert s.device_of("high") == 1 and s.device_of("low") == 0


def test_no_strategy_overfills_a_device():
    jobs = [Job(name=f"j{i}", memory_bytes=(7 + i) * GB, work=i) for i in range(12)]
    for strategy in ("round_robin", "load_balanced", "priority"):
        s = schedule(jobs, slots(40, 30, 20), strategy=strategy)
        assert all(x.used_bytes <= x.capacity_bytes for x in s.slots)
        placed = {a.job for a in s.assignments}
        assert placed | set(s.unplaced) == {j.name for j in jobs}


def test_auto_migrate_moves_from_hot_to_cool_without_overfilling():
    hot = [Slot(device=0, name="g0", capacity_bytes=80 * GB), Slot(device=1, name="g1", capacity_bytes=80 * GB)]
    # both jobs packed onto device 0 (the only slot offered), then device 1 joins empty
    packed = schedule([Job(name="a", memory_bytes=50 * GB), Job(name="b", memory_bytes=25 * GB)], hot[:1])
    packed = Schedule(strategy=packed.strategy, assignments=packed.assignments, slots=(*packed.slots, hot[1]),
                      jobs=packed.jobs)
    moves, after = auto_migrate(packed, threshold=0.8)  # 75/80 = 94 % > 80 %
    assert [(m.job, m.source, m.target) for m in moves] == [("a", 0, 1)]
    assert all(x.utilization <= 0.8 for x in after.slots)


def test_auto_migrate_leaves_a_job_no_target_can_take():
    full = [Slot(device=0, name="g0", capacity_bytes=80 * GB), Slot(device=1, name="g1", capacity_bytes=80 * GB,
                                                                     used_bytes=60 * GB)]
    packed = schedule([Job(name="a", memory_bytes=76 * GB)], full)
    moves, after = auto_migrate(packed, threshold=0.9)
    assert moves == () and after.device_of("a") == 0


def test_slots_from_a_profile_use_memory_and_bandwidth():
    s = slots_of(nvlink_box(H100, 2, "2x"), reserve_bytes=GB)
    assert [(x.capacity_bytes, x.speed) for x in s] == [(H100.memory_total_bytes - GB, 3350.0)] * 2
