"""Pure parsers for the sysfs, procfs and cgroup text the topology is read from (no file I/O)."""

from __future__ import annotations

import re

_MEMINFO_LINE = re.compile(r"^Node\s+(\d+)\s+(\S+):\s+(\d+)(?:\s+kB)?\s*$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)``, sorted and unique; blank -> ``()``.

    The kernel's list format, used by ``node*/cpulist``, ``thread_siblings_list``,
    ``core_cpus_list``, ``cpu/online``, ``cpu/possible`` and cgroup v2 ``cpuset.cpus.effective``.
    Raises ``ValueError`` naming the bad item.
    """
    cpus: set[int] = set()
    for item in text.strip().split(","):
        item = item.strip()
        if not item:
            continue
        first, sep, last = item.partition("-")
        try:
            lo, hi = int(first), int(last) if sep else int(first)
        except ValueError:
            raise ValueError(f"not a CPU list item: {item!r}") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"not a CPU range: {item!r}")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: tuple[int, ...] | list[int]) -> str:
    """The inverse of ``parse_cpulist``: ``(0, 1, 2, 8)`` -> ``"0-2,8"``."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in ordered + [None]:
        if start is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(ranges)


def parse_node_meminfo(text: str) -> dict[str, int]:
    """``node*/meminfo`` -> ``{"MemTotal": 24000000, ...}``: values in kB (page counts as is)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        match = _MEMINFO_LINE.match(line.strip())
        if match:
            fields[match.group(2)] = int(match.group(3))
    return fields


def parse_mem_total_mb(text: str) -> int:
    """``node*/meminfo`` -> its MemTotal in MiB. Raises ``ValueError`` when MemTotal is missing."""
    fields = parse_node_meminfo(text)
    if "MemTotal" not in fields:
        raise ValueError("no 'Node N MemTotal: ... kB' line")
    return fields["MemTotal"] // 1024


def parse_cgroup_v2_path(text: str) -> str | None:
    """``/proc/self/cgroup`` -> the cgroup v2 path (the ``0::/path`` line), or None on v1 only."""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "" and path.startswith("/"):
            return path.strip()
    return None


_SIZE = re.compile(r"^(\d+)\s*([KMG]?)B?$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_cache_size(text: str) -> int:
    """``cpu*/cache/index*/size`` -> bytes: ``"32768K"`` -> 33554432 (K, M, G are binary)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"not a cache size: {text.strip()!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]
