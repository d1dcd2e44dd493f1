"""Detecting the topology: sysfs first, then psutil and the affinity mask as one node.

The live machine (no ``sysfs_root``) honours this process's allowed CPUs and its cgroup v2
cpuset; a captured tree (``sysfs_root`` given) describes another machine, so it does not.
Offline CPUs are dropped either way.

Simulated sockets: with ``OMNI_RAY_SYSFS_ROOT`` set (``envs.py``), ``detect()`` reads that tree
instead of /sys, as this machine's topology: its CPUs must be CPUs this process may run on
(pinning to them is real), the CPU model and flags are this machine's, and the topology says
``source="simulated"`` with the tree it came from. Only the memory binding cannot follow a node
the kernel lacks (``measure/pinning.bind_slot_memory`` says so in the record).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from omni_ray import envs
from omni_ray.errors import UserError
from omni_ray.topology.machine import ISA_FLAGS, NumaNode, Topology
from omni_ray.topology.sysfs import parse_cgroup_v2_path, parse_cpulist, parse_mem_total_mb

SYSFS_ROOT = Path("/sys")
PROC_CGROUP = Path("/proc/self/cgroup")
NODE_DIR = "devices/system/node"
CPU_DIR = "devices/system/cpu"

_NODE_NAME = re.compile(r"node(\d+)")
# py-cpuinfo spells some flags both ways; keep the kernel's spelling
_FLAG_ALIASES = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16"}


def detect(sysfs_root: str | os.PathLike[str] | None = None) -> Topology:
    """The NUMA topology of this machine, or of the captured sysfs tree at ``sysfs_root``.

    Without ``sysfs_root``, ``OMNI_RAY_SYSFS_ROOT`` (when set) makes this machine's topology the
    simulated one of that tree (``detect_simulated``)."""
    if sysfs_root is None and envs.sysfs_root() is not None:
        return detect_simulated(envs.sysfs_root())
    if sysfs_root is not None:
        root = Path(sysfs_root)
        _check_captured(root)
        nodes = _read_nodes(root, allowed=None)
        if not nodes:
            raise UserError(f"sysfs_root: no NUMA node with online CPUs under {root / NODE_DIR}")
        return Topology(nodes, source="sysfs")
    return detect_host()


def detect_host() -> Topology:
    """This machine as its kernel shows it, whatever ``OMNI_RAY_SYSFS_ROOT`` says."""
    allowed = allowed_cpus()
    nodes = _read_nodes(SYSFS_ROOT, allowed) if (SYSFS_ROOT / NODE_DIR).is_dir() else ()
    model, flags = cpu_features()
    if nodes:
        return Topology(nodes, "sysfs", model, flags)
    return Topology((_psutil_node(allowed),), "psutil", model, flags)


def detect_simulated(sysfs_root: str | os.PathLike[str]) -> Topology:
    """The tree at ``sysfs_root`` as this machine's topology: simulated sockets of real CPUs.

    Raises UserError naming ``OMNI_RAY_SYSFS_ROOT`` when the tree is not one, or lists a CPU this
    process may not run on (pinning to it would fail)."""
    root = Path(sysfs_root)
    try:
        _check_captured(root)
        nodes = _read_nodes(root, allowed=None)
    except UserError as exc:
        raise UserError(f"{envs.OMNI_RAY_SYSFS_ROOT}={root}: "
                        f"{str(exc).removeprefix('sysfs_root: ')}") from None
    if not nodes:
        raise UserError(f"{envs.OMNI_RAY_SYSFS_ROOT}={root}: no NUMA node with online CPUs "
                        f"under {root / NODE_DIR}")
    allowed = allowed_cpus()
    for node in nodes:
        outside = sorted(set(node.cpus) - allowed)
        if outside:
            raise UserError(
                f"{envs.OMNI_RAY_SYSFS_ROOT}={root}: node {node.id} lists CPU(s) {outside} this "
                f"process may not run on (allowed: {sorted(allowed)}); a simulated node is made "
                "of this machine's own CPUs")
    model, flags = cpu_features()
    return Topology(nodes, "simulated", model, flags, sysfs_root=str(root.resolve()))


def kernel_node_cpus(node_id: int) -> frozenset[int] | None:
    """The CPUs the running kernel puts on NUMA node ``node_id`` (from the real /sys), or None
    when the kernel has no such node."""
    path = SYSFS_ROOT / NODE_DIR / f"node{node_id}" / "cpulist"
    text = _read_text(path)
    if text is None:
        return None
    try:
        return frozenset(parse_cpulist(text))
    except ValueError:
        return None


def allowed_cpus() -> frozenset[int]:
    """CPUs this process may run on: its affinity mask, narrowed by the cgroup v2 cpuset."""
    allowed = frozenset(os.sched_getaffinity(0))
    cpuset = _cgroup_cpuset()
    if cpuset and allowed & cpuset:
        return allowed & cpuset
    return allowed


@functools.cache
def cpu_features() -> tuple[str, frozenset[str]]:
    """The CPU model and which of ``ISA_FLAGS`` it has, from py-cpuinfo (slow: read once)."""
    import cpuinfo

    info = cpuinfo.get_cpu_info()
    flags = {_FLAG_ALIASES.get(flag, flag) for flag in info.get("flags", ())}
    return info.get("brand_raw", ""), frozenset(flags & ISA_FLAGS)


def _check_captured(root: Path) -> None:
    if not root.is_dir():
        raise UserError(f"sysfs_root: {root} is not a directory")
    for sub in (NODE_DIR, CPU_DIR):
        if not (root / sub).is_dir():
            raise UserError(f"sysfs_root: {root} has no {sub} (expected a captured /sys tree)")


def _read_nodes(root: Path, allowed: frozenset[int] | None) -> tuple[NumaNode, ...]:
    """Nodes with at least one online (and allowed) CPU, ordered by id."""
    cpu_dir = root / CPU_DIR
    online = _read_cpulist(cpu_dir / "online")
    node_ids = sorted(
        int(m.group(1))
        for m in (_NODE_NAME.fullmatch(p.name) for p in (root / NODE_DIR).iterdir())
        if m
    )
    nodes = []
    for node_id in node_ids:
        node_dir = root / NODE_DIR / f"node{node_id}"
        cpus = tuple(
            cpu
            for cpu in _read_cpulist(node_dir / "cpulist") or ()
            if (online is None or cpu in online) and (allowed is None or cpu in allowed)
        )
        if cpus:
            mem_mb = _parse(node_dir / "meminfo", parse_mem_total_mb)
            nodes.append(NumaNode(node_id, cpus, _cores(cpu_dir, cpus), mem_mb))
    return tuple(nodes)


def _cores(cpu_dir: Path, cpus: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Group ``cpus`` into physical cores: by sibling list, else (package, core id), else alone."""
    groups: dict[object, list[int]] = {}
    for cpu in cpus:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        siblings = _read_cpulist(topo / "thread_siblings_list")
        if siblings is None:
            siblings = _read_cpulist(topo / "core_cpus_list")
        package, core = _read_text(topo / "physical_package_id"), _read_text(topo / "core_id")
        if siblings:
            key: object = frozenset(siblings)
        elif package is not None and core is not None:
            key = (package.strip(), core.strip())
        else:
            key = cpu
        groups.setdefault(key, []).append(cpu)
    return tuple(sorted(tuple(group) for group in groups.values()))


def _psutil_node(allowed: frozenset[int]) -> NumaNode:
    """One node holding every allowed CPU, with the machine's memory from psutil."""
    import psutil

    cpus = tuple(sorted(allowed))
    mem_mb = psutil.virtual_memory().total // 2**20
    return NumaNode(0, cpus, _cores(SYSFS_ROOT / CPU_DIR, cpus), mem_mb)


def _cgroup_cpuset() -> frozenset[int] | None:
    """The effective cpuset of this process's cgroup v2 (nearest ancestor that has one)."""
    text = _read_text(PROC_CGROUP)
    path = parse_cgroup_v2_path(text) if text else None
    if path is None:
        return None
    cgroup = SYSFS_ROOT / "fs/cgroup" / path.lstrip("/")
    for directory in (cgroup, *cgroup.parents):
        cpus = _read_cpulist(directory / "cpuset.cpus.effective")
        if cpus:
            return frozenset(cpus)
        if directory == SYSFS_ROOT / "fs/cgroup":
            break
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _read_cpulist(path: Path) -> tuple[int, ...] | None:
    """The CPU list in ``path``, or None when the file is absent."""
    return None if not path.exists() else _parse(path, parse_cpulist)


def _parse(path: Path, parser):
    """``parser(path's text)``; a missing or malformed file is a UserError naming the file."""
    text = _read_text(path)
    if text is None:
        raise UserError(f"{path}: missing")
    try:
        return parser(text)
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from None
