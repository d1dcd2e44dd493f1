"""Slots: sets of whole physical cores on one NUMA node, one engine pinned to each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omni_ray.errors import UserError
from omni_ray.topology.detection import detect
from omni_ray.topology.machine import NumaNode, Topology


@dataclass(frozen=True)
class Slot:
    """``slot.cpus`` on node ``slot.node``; ``index`` counts the slots within that node."""

    node: int
    index: int
    cpus: tuple[int, ...]
    cores: tuple[tuple[int, ...], ...] = ()  # sibling groups; empty: each CPU is its own core

    @property
    def name(self) -> str:
        return f"n{self.node}s{self.index}"

    @property
    def num_cores(self) -> int:
        return len(self.cores) if self.cores else len(self.cpus)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "node": self.node,
            "index": self.index,
            "cpus": list(self.cpus),
            "cores": self.num_cores,
        }


def make_slots(
    topology: Topology, slot_cores: int | None = None, nodes: Sequence[int] | None = None
) -> list[Slot]:
    """Split each of ``nodes`` (default: all) into slots of exactly ``slot_cores`` physical cores.

    SMT siblings stay in the same slot. ``slot_cores=None`` makes one slot per whole node.
    Cores left over after the last full slot are unused (see ``unused_cores``).
    """
    chosen = _chosen_nodes(topology, nodes)
    if slot_cores is None:
        return [Slot(node.id, 0, node.cpus, node.cores) for node in chosen]
    _check_slot_cores(slot_cores, chosen)
    slots = []
    for node in chosen:
        for index in range(node.num_cores // slot_cores):
            cores = node.cores[index * slot_cores : (index + 1) * slot_cores]
            cpus = tuple(sorted(cpu for core in cores for cpu in core))
            slots.append(Slot(node.id, index, cpus, cores))
    return slots


def local_slots(slot_cores: int | None, nodes: Sequence[int] | None = None) -> list[Slot]:
    """The slots of this machine (its detected topology), as ``make_slots`` cuts them."""
    return make_slots(detect(), slot_cores, nodes)


def unused_cores(
    topology: Topology, slots: Sequence[Slot]
) -> dict[int, tuple[tuple[int, ...], ...]]:
    """For each node that has slots, the cores no slot uses (too few to fill another slot)."""
    used = {cpu for slot in slots for cpu in slot.cpus}
    unused = {}
    for node_id in dict.fromkeys(slot.node for slot in slots):
        left = tuple(core for core in topology.node(node_id).cores if used.isdisjoint(core))
        if left:
            unused[node_id] = left
    return unused


def _chosen_nodes(topology: Topology, nodes: Sequence[int] | None) -> list[NumaNode]:
    if nodes is None:
        return list(topology.nodes)
    known = [node.id for node in topology.nodes]
    if not nodes:
        raise UserError(f"nodes: must name at least one NUMA node {known}, got {list(nodes)}")
    for node_id in nodes:
        if node_id not in known:
            raise UserError(f"nodes: no NUMA node {node_id!r} (this machine has {known})")
    return [node for node in topology.nodes if node.id in nodes]


def _check_slot_cores(slot_cores: int, nodes: list[NumaNode]) -> None:
    smallest = min(nodes, key=lambda node: node.num_cores)
    valid = isinstance(slot_cores, int) and not isinstance(slot_cores, bool)
    if not valid or not 1 <= slot_cores <= smallest.num_cores:
        raise UserError(
            f"slot_cores: must be between 1 and {smallest.num_cores} "
            f"(cores of node {smallest.id}), got {slot_cores!r}"
        )
