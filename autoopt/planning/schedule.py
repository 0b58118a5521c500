"""Scheduler for independent workloads over the accelerators of one machine.

Each :class:`Job` needs ``memory_bytes`` on one device and brings ``work`` (any
additive load unit: predicted seconds, FLOPs). Strategies place jobs on
:class:`Slot` s (a device's capacity, its memory in use and its relative speed)
and deduct memory as they go; a job that fits nowhere is reported unplaced,
never squeezed in:

- ``round_robin``: devices in turn, skipping one without room.
- ``load_balanced``: biggest job first, to the device whose finish time
  ``(load + work) / speed`` would be lowest among those with room.
- ``priority``: highest priority first (ties: bigger first), each to the fastest
  device with room, so urgent jobs get the best hardware.

:func:`auto_migrate` proposes moves from devices whose memory utilisation is over
a threshold (largest jobs first, the fewest moves) to devices with room, never
filling a target past the threshold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoopt._log import get_logger
from autoopt.errors import AutooptError
from autoopt.hardware.profile import HardwareProfile

__all__ = [
    "STRATEGIES",
    "Assignment",
    "Job",
    "Migration",
    "Schedule",
    "Slot",
    "auto_migrate",
    "schedule",
    "slots_of",
]

log = get_logger(__name__)
STRATEGIES = ("round_robin", "load_balanced", "priority")


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """An independent workload: memory it holds on its device, work it brings, its priority."""

    name: str
    memory_bytes: int
    work: float = 1.0
    priority: int = 0

    def __post_init__(self) -> None:
        if self.memory_bytes < 0 or self.work < 0:
            raise AutooptError(f"job {self.name!r}: memory and work must not be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """One device as the scheduler sees it."""

    device: int
    name: str
    capacity_bytes: int
    used_bytes: int = 0
    load: float = 0.0
    #: relative speed (e.g. memory bandwidth in GB/s for decode-bound jobs).
    speed: float = 1.0

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    @property
    def utilization(self) -> float:
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "name": self.name, "capacity_bytes": self.capacity_bytes,
                "used_bytes": self.used_bytes, "free_bytes": self.free_bytes, "load": self.load,
                "speed": self.speed, "utilization": round(self.utilization, 4)}


def slots_of(profile: HardwareProfile, *, reserve_bytes: int = 0) -> tuple[Slot, ...]:
    """A slot per GPU: capacity = total memory less ``reserve_bytes``; speed = memory bandwidth."""
    out = []
    for g in profile.gpus:
        if not g.memory_total_bytes:
            continue
        out.append(Slot(device=g.index, name=g.name, capacity_bytes=max(0, g.memory_total_bytes - reserve_bytes),
                        speed=g.bandwidth_gbs or 1.0))
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    job: str
    device: int

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "device": self.device}


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """Where each job went, what is left on each device, and what did not fit."""

    strategy: str
    assignments: tuple[Assignment, ...]
    slots: tuple[Slot, ...]
    unplaced: tuple[str, ...] = ()
    jobs: tuple[Job, ...] = field(default_factory=tuple)

    def device_of(self, job: str) -> int | None:
        return next((a.device for a in self.assignments if a.job == job), None)

    @property
    def makespan(self) -> float:
        """Finish time of the slowest device: load / speed."""
        return max((s.load / s.speed for s in self.slots if s.speed), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "assignments": [a.to_dict() for a in self.assignments],
                "slots": [s.to_dict() for s in self.slots], "unplaced": list(self.unplaced),
                "makespan": self.makespan}


def _place(slots: list[Slot], k: int, job: Job) -> None:
    s = slots[k]
    slots[k] = replace(s, used_bytes=s.used_bytes + job.memory_bytes, load=s.load + job.work)


def schedule(jobs: Iterable[Job], slots: Sequence[Slot], *, strategy: str = "load_balanced") -> Schedule:
    """Place ``jobs`` on ``slots`` with ``strategy`` (see module docstring)."""
    if strategy not in STRATEGIES:
        raise AutooptError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    jobs = tuple(jobs)
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise AutooptError("job names must be unique")
    cur = list(slots)
    if not cur:
        return Schedule(strategy=strategy, assignments=(), slots=(), unplaced=tuple(names), jobs=jobs)
    out: list[Assignment] = []
    unplaced: list[str] = []
    if strategy == "round_robin":
        nxt = 0
        for job in jobs:
            for step in range(len(cur)):
                k = (nxt + step) % len(cur)
                if cur[k].free_bytes >= job.memory_bytes:
                    _place(cur, k, job)
                    out.append(Assignment(job=job.name, device=cur[k].device))
                    nxt = k + 1
                    break
            else:
                unplaced.append(job.name)
    elif strategy == "load_balanced":
        for job in sorted(jobs, key=lambda j: (-j.work, -j.memory_bytes, j.name)):
            fit = [k for k, s in enumerate(cur) if s.free_bytes >= job.memory_bytes]
            if not fit:
                unplaced.append(job.name)
                continue
            k = min(fit, key=lambda k: ((cur[k].load + job.work) / cur[k].speed, cur[k].utilization, k))
            _place(cur, k, job)
            out.append(Assignment(job=job.name, device=cur[k].device))
    else:  # priority
        for job in sorted(jobs, key=lambda j: (-j.priority, -j.memory_bytes, j.name)):
            fit = [k for k, s in enumerate(cur) if s.free_bytes >= job.memory_bytes]
            if not fit:
                unplaced.append(job.name)
                continue
            k = min(fit, key=lambda k: (-cur[k].speed, cur[k].load / cur[k].speed, k))
            _place(cur, k, job)
            out.append(Assignment(job=job.name, device=cur[k].device))
    return Schedule(strategy=strategy, assignments=tuple(out), slots=tuple(cur), unplaced=tuple(unplaced), jobs=jobs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    job: str
    source: int
    target: int
    memory_bytes: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "from": self.source, "to": self.target, "memory_bytes": self.memory_bytes,
                "reason": self.reason}


def auto_migrate(sched: Schedule, *, threshold: float = 0.9) -> tuple[tuple[Migration, ...], Schedule]:
    """Moves that bring over-threshold devices under it, and the schedule after them.

    From each device above ``threshold`` (memory used / capacity), jobs are moved
    largest first until it is under, each to the device with the most free memory
    that stays at or below ``threshold`` after taking it. A job no target can take
    stays where it is.
    """
    if not 0 < threshold <= 1:
        raise AutooptError(f"threshold must be in (0, 1], got {threshold}")
    jobs = {j.name: j for j in sched.jobs}
    slots = {s.device: s for s in sched.slots}
    where = {a.job: a.device for a in sched.assignments}
    moves: list[Migration] = []
    for src in sorted(slots, key=lambda d: -slots[d].utilization):
        if slots[src].utilization <= threshold:
            continue
        # Largest jobs first bring the device under in the fewest moves.
        for name in sorted((n for n, d in where.items() if d == src), key=lambda n: -jobs[n].memory_bytes):
            s = slots[src]
            if s.utilization <= threshold:
                break
            job = jobs[name]
            targets = [t for t in slots.values() if t.device != src
                       and t.used_bytes + job.memory_bytes <= threshold * t.capacity_bytes]
            if not targets:
                continue
            t = max(targets, key=lambda t: (t.free_bytes, t.speed, -t.device))
            slots[src] = replace(s, used_bytes=s.used_bytes - job.memory_bytes, load=s.load - job.work)
            slots[t.device] = replace(t, used_bytes=t.used_bytes + job.memory_bytes, load=t.load + job.work)
            where[name] = t.device
            moves.append(Migration(job=name, source=src, target=t.device, memory_bytes=job.memory_bytes,
                                   reason=f"device {src} at {s.utilization:.0%} > {threshold:.0%}; device "
                                          f"{t.device} stays at {slots[t.device].utilization:.0%}"))
    after = Schedule(strategy=sched.strategy, assignments=tuple(Assignment(job=n, device=d) for n, d in where.items()),
                     slots=tuple(slots[s.device] for s in sched.slots), unplaced=sched.unplaced, jobs=sched.jobs)
    return tuple(moves), after
