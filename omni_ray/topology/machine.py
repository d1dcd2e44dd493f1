"""What a machine looks like to omni-ray: NUMA nodes, their physical cores and memory."""

from __future__ import annotations

from dataclasses import dataclass, field

# ISA flags the engine layer cares about (oneDNN / AMX kernels); other flags are not kept.
ISA_FLAGS = frozenset(
    {"avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"}
)


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its usable CPUs, grouped into physical cores (SMT siblings together)."""

    id: int
    cpus: tuple[int, ...]
    cores: tuple[tuple[int, ...], ...]  # sibling groups, ordered by their lowest CPU
    mem_total_mb: int  # MiB

    @property
    def num_cores(self) -> int:
        return len(self.cores)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "cpus": list(self.cpus),
            "cores": self.num_cores,
            "siblings": [list(core) for core in self.cores],
            "mem_total_mb": self.mem_total_mb,
        }


@dataclass(frozen=True)
class Topology:
    """The NUMA nodes, where they were read from (``"sysfs"``, ``"psutil"`` or ``"simulated"``:
    a tree of this machine's CPUs named by ``OMNI_RAY_SYSFS_ROOT``, kept in ``sysfs_root``), and
    the CPU."""

    nodes: tuple[NumaNode, ...]
    source: str
    cpu_model: str = ""
    flags: frozenset[str] = field(default_factory=frozenset)
    sysfs_root: str = ""

    @property
    def simulated(self) -> bool:
        return self.source == "simulated"

    def node(self, node_id: int) -> NumaNode:
        """The node with this id; ``KeyError`` if there is none."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)

    def to_dict(self) -> dict:
        out = {
            "source": self.source,
            "cpu_model": self.cpu_model,
            "flags": sorted(self.flags),
            "nodes": [node.to_dict() for node in self.nodes],
        }
        if self.sysfs_root:
            out["sysfs_root"] = self.sysfs_root
        return out
