"""How busy the target CPUs are, from two /proc/stat samples: the benchmark pre-flight.

A benchmark on cores that something else is using measures the something else. ``check_idle``
refuses when the target cores are busy above an average (default 5 %) or any one core is above a
ceiling (default 50 %); the caller decides whether an override flag lets it go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from omni_ray.errors import UserError
from omni_ray.topology.sysfs import format_cpulist

_PROC_STAT = "/proc/stat"
# The average a sweep slot's cores may show before an arm starts there. Higher than check_idle's
# default because omni-ray's own machinery runs on every core during a sweep and is no neighbour:
# measured on a 2-core VM on one CPU while the other slot's engine started, in jiffies of 2 s:
# the kernel's kdamond 2-3.5 %, Ray's dashboard agent ~2.5 %, raylet and GCS ~1.5 %, the
# pre-flight actor itself ~1.5 %; together above 5 % for over 30 s, which once refused a fresh
# machine's smoke demo. A real neighbour (a compile, a benchmark) uses far more than 15 %.
SLOT_MAX_AVG = 0.15


def read_proc_stat() -> str:
    with open(_PROC_STAT) as f:
        return f.read()


def parse_proc_stat(text: str) -> dict[int, tuple[int, int]]:
    """cpu index -> (busy jiffies, total jiffies) from /proc/stat text.

    total = user+nice+system+idle+iowait+irq+softirq+steal (guest time is already inside user
    and nice, so it is not added again); busy = total - idle - iowait."""
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        nums = [int(v) for v in values[:8]] + [0] * (8 - len(values[:8]))
        total = sum(nums)
        idle = nums[3] + nums[4]
        out[int(name[3:])] = (total - idle, total)
    return out


def busy_between(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                 cpus: Iterable[int]) -> dict[int, float]:
    """Busy fraction (0..1) per CPU between two ``parse_proc_stat`` results."""
    cpus = sorted(set(cpus))
    missing = [c for c in cpus if c not in before or c not in after]
    if missing:
        raise UserError(f"CPUs {format_cpulist(missing)} are not in /proc/stat "
                        f"(offline or do not exist; present: {format_cpulist(sorted(after))})")
    out: dict[int, float] = {}
    for c in cpus:
        d_busy = after[c][0] - before[c][0]
        d_total = after[c][1] - before[c][1]
        out[c] = min(1.0, max(0.0, d_busy / d_total)) if d_total > 0 else 0.0
    return out


def cpu_busy(cpus: Iterable[int], window_s: float = 0.5, *,
             reader: Callable[[], str] = read_proc_stat,
             sleep: Callable[[float], None] = time.sleep) -> dict[int, float]:
    """Busy fraction per CPU over ``window_s`` seconds (``reader``, ``sleep``: for tests)."""
    cpus = list(cpus)
    if not cpus:
        raise ValueError("cpu_busy: empty CPU set")
    before = parse_proc_stat(reader())
    sleep(window_s)
    after = parse_proc_stat(reader())
    return busy_between(before, after, cpus)


@dataclass(frozen=True)
class LoadCheck:
    """Pre-flight result: ``ok`` false means "refuse to benchmark on these CPUs"."""

    ok: bool
    per_cpu: dict[int, float]
    message: str
    window_s: float = 0.0
    max_avg: float = 0.05
    max_one: float = 0.5
    avg: float = field(default=0.0)

    def __bool__(self) -> bool:
        return self.ok

    def to_dict(self) -> dict:
        return {"ok": self.ok, "message": self.message, "window_s": self.window_s,
                "max_avg": self.max_avg, "max_one": self.max_one, "avg": round(self.avg, 4),
                "per_cpu": {str(c): round(v, 4) for c, v in sorted(self.per_cpu.items())}}


def judge(per_cpu: dict[int, float], *, max_avg: float = 0.05, max_one: float = 0.5,
          window_s: float = 0.0) -> LoadCheck:
    """Apply the thresholds to busy fractions (pure; ``check_idle`` measures then calls this)."""
    if not per_cpu:
        raise ValueError("judge: no CPUs")
    avg = sum(per_cpu.values()) / len(per_cpu)
    busiest = max(per_cpu, key=per_cpu.__getitem__)
    cpus = format_cpulist(sorted(per_cpu))
    problems = []
    if avg > max_avg:
        problems.append(f"average {avg:.1%} > {max_avg:.0%}")
    if per_cpu[busiest] > max_one:
        problems.append(f"cpu{busiest} at {per_cpu[busiest]:.1%} > {max_one:.0%}")
    if problems:
        message = (f"CPUs {cpus} are in use by something else: {'; '.join(problems)} "
                   f"(over {window_s:g} s)")
    else:
        message = (f"CPUs {cpus} idle: average {avg:.1%}, busiest cpu{busiest} "
                   f"{per_cpu[busiest]:.1%} (over {window_s:g} s)")
    return LoadCheck(not problems, dict(per_cpu), message, window_s, max_avg, max_one, avg)


def check_idle(cpus: Iterable[int], window_s: float = 0.5, max_avg: float = 0.05,
               max_one: float = 0.5, *, reader: Callable[[], str] = read_proc_stat,
               sleep: Callable[[float], None] = time.sleep) -> LoadCheck:
    """Measure ``cpus`` for ``window_s`` and judge them (see module docstring)."""
    per_cpu = cpu_busy(cpus, window_s, reader=reader, sleep=sleep)
    return judge(per_cpu, max_avg=max_avg, max_one=max_one, window_s=window_s)
