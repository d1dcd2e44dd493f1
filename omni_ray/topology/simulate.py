"""Simulated sockets: this machine's cores cut into virtual NUMA nodes, written as a sysfs tree.

``OMNI_RAY_SYSFS_ROOT=DIR`` then makes ``detect()`` return those nodes (``detection.py``). On a
2-core machine with one NUMA node, ``split_nodes(host, 2)`` gives virtual node 0 = CPU 0 and
virtual node 1 = CPU 1. Pinning, its read-back and per-node records are real; the memory of a
node the kernel does not have cannot be bound, and the record says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omni_ray.errors import UserError
from omni_ray.topology.detection import CPU_DIR, NODE_DIR
from omni_ray.topology.machine import NumaNode, Topology
from omni_ray.topology.sysfs import format_cpulist


def split_nodes(host: Topology, count: int) -> list[NumaNode]:
    """``count`` virtual nodes (ids 0..count-1) of equal whole cores, in CPU order, each with an
    equal share of the memory; cores left over are unused."""
    cores = sorted((core for node in host.nodes for core in node.cores), key=min)
    per = len(cores) // count if count > 0 else 0
    if per < 1:
        raise UserError(f"--simulate: must be between 1 and {len(cores)} (this machine's "
                        f"cores), got {count}")
    mem_mb = sum(node.mem_total_mb for node in host.nodes) // count
    nodes = []
    for k in range(count):
        mine = tuple(cores[k * per:(k + 1) * per])
        nodes.append(NumaNode(k, tuple(sorted(c for core in mine for c in core)), mine, mem_mb))
    return nodes


def write_tree(root: str | Path, nodes: Sequence[NumaNode]) -> Path:
    """Write the sysfs files ``detect`` reads for ``nodes`` under ``root``; returns ``root``.

    Each virtual node is its own package (a socket); a CPU's siblings are its core's CPUs."""
    root = Path(root)
    cpu_dir, node_dir = root / CPU_DIR, root / NODE_DIR
    cpu_dir.mkdir(parents=True, exist_ok=True)
    node_dir.mkdir(parents=True, exist_ok=True)
    every = sorted(c for node in nodes for c in node.cpus)
    (cpu_dir / "online").write_text(format_cpulist(every) + "\n")
    for node in nodes:
        nd = node_dir / f"node{node.id}"
        nd.mkdir(exist_ok=True)
        (nd / "cpulist").write_text(format_cpulist(node.cpus) + "\n")
        (nd / "meminfo").write_text(f"Node {node.id} MemTotal: {node.mem_total_mb * 1024} kB\n")
        for core_id, core in enumerate(node.cores):
            for cpu in core:
                topo = cpu_dir / f"cpu{cpu}" / "topology"
                topo.mkdir(parents=True, exist_ok=True)
                (topo / "thread_siblings_list").write_text(format_cpulist(core) + "\n")
                (topo / "core_id").write_text(f"{core_id}\n")
                (topo / "physical_package_id").write_text(f"{node.id}\n")
    return root
