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


# A measuring window shorter than this says nothing about neighbours: /proc/stat and a
# process's CPU times both count in clock ticks (10 ms), and the tiny models' windows are ~0.2 s.
NEIGHBOUR_MIN_WINDOW_S = 2.0


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of ``root``, its reaped children and its live descendants."""
    import psutil

    me = psutil.Process(root)
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass  # ended between the listing and the reading: its parent counts it when reaped
    return total


def neighbour_share(busy_s: float, own_cpu_s: float, window_s: float, n_cpus: int) -> float:
    """The share of ``n_cpus`` CPUs' time over ``window_s`` that something other than the
    engine tree used: their busy seconds less the tree's CPU seconds (pure)."""
    if window_s <= 0 or n_cpus <= 0:
        raise ValueError("neighbour_share: empty window or CPU set")
    return min(1.0, max(0.0, (busy_s - own_cpu_s) / (window_s * n_cpus)))


class NeighbourLoad:
    """Who else used the slot's CPUs while an engine measured: started before the measured run,
    ``stop()`` after it. The pre-flight sees only the moment an arm starts; a compile or a test
    that starts on the same CPUs a minute later is seen here. The engine tree is pinned to
    ``cpus``, so whatever else kept them busy is a neighbour (Ray's own daemons included:
    ``SLOT_MAX_AVG`` is their measured share)."""

    def __init__(self, root: int, cpus: Iterable[int], *,
                 reader: Callable[[], str] = read_proc_stat,
                 clock: Callable[[], float] = time.monotonic,
                 tree_cpu: Callable[[int], float] = tree_cpu_s) -> None:
        import os

        self.root, self.cpus, self.reader, self.clock = root, sorted(set(cpus)), reader, clock
        self.tree_cpu, self.tick = tree_cpu, os.sysconf("SC_CLK_TCK")
        self.stat, self.own, self.t0 = parse_proc_stat(reader()), tree_cpu(root), clock()

    def stop(self) -> dict:
        """``neighbour_cpu_frac`` (None when the window is too short to tell) and what it
        came from."""
        stat, own = parse_proc_stat(self.reader()), self.tree_cpu(self.root)
        window = self.clock() - self.t0
        busy_s = sum((stat[c][0] - self.stat[c][0]) for c in self.cpus if c in stat
                     and c in self.stat) / self.tick
        frac = (neighbour_share(busy_s, own - self.own, window, len(self.cpus))
                if window >= NEIGHBOUR_MIN_WINDOW_S else None)
        return {"neighbour_cpu_frac": None if frac is None else round(frac, 4),
                "neighbour_window_s": round(window, 3),
                "slot_busy_cpu_s": round(busy_s, 2), "engine_cpu_s": round(own - self.own, 2)}


def contended_during(measurements: dict, max_avg: float = SLOT_MAX_AVG) -> str | None:
    """Why a run's figures are not the slot's own (None when they are, or cannot be told)."""
    frac = measurements.get("neighbour_cpu_frac")
    if frac is None or frac <= max_avg:
        return None
    return (f"while it measured, something else used {frac:.0%} of the slot's CPU time "
            f"(> {max_avg:.0%}, over {measurements.get('neighbour_window_s', 0):g} s)")
