"""Which arm runs when and on which slot: pure logic, no Ray.

Passes are interleaved: pass p runs the arms starting at arm (p-1) mod n, so no arm is always
first. A job goes to a free slot this arm has not used yet where there is one, so an arm's passes
land on different slots and a socket's effect is not mistaken for the arm's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Job:
    arm_index: int
    pass_no: int  # 1-based


def interleaved_jobs(n_arms: int, passes: int) -> list[Job]:
    jobs = []
    for p in range(1, passes + 1):
        start = (p - 1) % n_arms if n_arms else 0
        jobs.extend(Job((start + i) % n_arms, p) for i in range(n_arms))
    return jobs


def pick_slot(free: Sequence[str], used_by_arm: set[str]) -> str:
    """The first free slot this arm has not run on, else the first free slot."""
    for slot in free:
        if slot not in used_by_arm:
            return slot
    return free[0]


class Scheduler:
    """Hands out (job, slot) pairs as slots come free; ``done(slot)`` gives a slot back."""

    def __init__(self, jobs: Sequence[Job], slots: Sequence[str]) -> None:
        if not slots:
            raise ValueError("no slots to run on")
        self.pending = list(jobs)
        self.free = list(slots)
        self.used: dict[int, set[str]] = {}

    def next(self) -> tuple[Job, str] | None:
        if not self.pending or not self.free:
            return None
        job = self.pending.pop(0)
        slot = pick_slot(self.free, self.used.setdefault(job.arm_index, set()))
        self.free.remove(slot)
        self.used[job.arm_index].add(slot)
        return job, slot

    def done(self, slot: str) -> None:
        self.free.append(slot)

    def drop_pending(self) -> list[Job]:
        dropped, self.pending = self.pending, []
        return dropped
