"""The CPU caches, from sysfs: ``cpu*/cache/index*/{level,type,size,shared_cpu_list}``.

Not py-cpuinfo: on AMD hosts it reports a 1 MiB L3 (it reads the L2 of one core, or CPUID
leaf 0x80000006, whose L3 field is per-CCX or zero), where sysfs gives the kernel's view: on
this project's EPYC Zen 5 VM, one 32 MiB L3 shared by CPUs 0-1. The reading is file I/O over a
sysfs root (a captured tree in tests); the parsing is ``sysfs.parse_cache_size`` and
``sysfs.parse_cpulist``, and ``last_level_cache`` is pure.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from omni_ray.topology.sysfs import format_cpulist, parse_cache_size, parse_cpulist

SYSFS_ROOT = Path("/sys")
_CPU = re.compile(r"cpu(\d+)")
_INDEX = re.compile(r"index(\d+)")


@dataclasses.dataclass(frozen=True)
class Cache:
    level: int
    type: str                     # "Data", "Instruction" or "Unified"
    size_bytes: int               # one instance
    shared_cpus: tuple[int, ...]  # the CPUs that share this instance


@dataclasses.dataclass(frozen=True)
class LastLevelCache:
    """The highest cache level that holds data: its instances and the CPUs sharing each."""

    level: int
    size_bytes: int                          # one instance
    instances: tuple[tuple[int, ...], ...]   # shared_cpu_list of each instance, sorted

    def bytes_for(self, cpus: tuple[int, ...] | list[int] | None = None) -> int:
        """Bytes of LLC the given CPUs reach together (every instance when ``cpus`` is None)."""
        if cpus is None:
            return self.size_bytes * len(self.instances)
        wanted = set(cpus)
        return self.size_bytes * sum(1 for inst in self.instances if wanted & set(inst))

    def to_dict(self) -> dict:
        return {"level": self.level, "size_bytes": self.size_bytes,
                "instances": [format_cpulist(i) for i in self.instances],
                "total_bytes": self.bytes_for(), "source": "sysfs"}

    def describe(self) -> str:
        """``"32 MiB L3 x1 (CPUs 0-1)"``."""
        mib = self.size_bytes / (1 << 20)
        cpus = "; ".join(format_cpulist(i) for i in self.instances[:4])
        more = ", ..." if len(self.instances) > 4 else ""
        return f"{mib:g} MiB L{self.level} x{len(self.instances)} (CPUs {cpus}{more})"


def read_caches(sysfs_root: str | os.PathLike[str] | None = None) -> list[Cache]:
    """Every cache instance seen by any online CPU under ``sysfs_root`` (default /sys), once.

    Entries that cannot be read or parsed are skipped: a missing cache directory (some VMs
    expose none) gives ``[]``."""
    cpu_dir = Path(sysfs_root or SYSFS_ROOT) / "devices/system/cpu"
    seen: dict[tuple[int, str, tuple[int, ...]], Cache] = {}
    try:
        cpus = [p for p in cpu_dir.iterdir() if _CPU.fullmatch(p.name)]
    except OSError:
        return []
    for cpu in cpus:
        try:
            indexes = [p for p in (cpu / "cache").iterdir() if _INDEX.fullmatch(p.name)]
        except OSError:
            continue
        for index in indexes:
            try:
                level = int((index / "level").read_text())
                kind = (index / "type").read_text().strip()
                size = parse_cache_size((index / "size").read_text())
                shared = parse_cpulist((index / "shared_cpu_list").read_text())
            except (OSError, ValueError):
                continue
            key = (level, kind, shared)
            seen.setdefault(key, Cache(level, kind, size, shared))
    return sorted(seen.values(), key=lambda c: (c.level, c.type, c.shared_cpus))


def last_level_cache(caches: list[Cache]) -> LastLevelCache | None:
    """The highest data-holding level; None when there are no caches."""
    data = [c for c in caches if c.type in ("Data", "Unified")]
    if not data:
        return None
    level = max(c.level for c in data)
    top = [c for c in data if c.level == level]
    return LastLevelCache(level, max(c.size_bytes for c in top),
                          tuple(sorted(c.shared_cpus for c in top)))


def detect_llc(sysfs_root: str | os.PathLike[str] | None = None) -> LastLevelCache | None:
    return last_level_cache(read_caches(sysfs_root))
