"""Which arm runs when and on which slot: pure logic, no Ray.

Passes are interleaved: pass p runs the arms starting at arm (p-1) mod n, so no arm is always
first. A job goes to a free slot this arm has not used yet where there is one, so an arm's passes
land on different slots and a socket's effect is not mistaken for the arm's.

A slot is a slot resource on one Ray node (``SlotRef``): two Ray nodes with the same topology
advertise the same resource names and give twice the slots, each known by its node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from omni_ray.errors import UserError


@dataclasses.dataclass(frozen=True)
class SlotRef:
    """One slot of the cluster: the slot resource ``resource`` (``omni_slot_c1_n0s1``) on the
    Ray node ``node_id``. ``host`` and ``label`` (how displays name it) are not its identity."""

    node_id: str
    resource: str
    host: str = dataclasses.field(default="", compare=False)
    label: str = dataclasses.field(default="", compare=False)

    @property
    def name(self) -> str:
        """The slot's name on its node: ``n0s1``."""
        return self.resource.rsplit("_", 1)[1]

    @property
    def numa_node(self) -> int:
        return int(self.name[1:].split("s", 1)[0])


def node_matches(node: Mapping, selector: str) -> bool:
    """Whether a Ray node (a ``ray.nodes()`` entry) is the one ``selector`` names: a label
    ``key=value``, else its host name, its address or its node id."""
    key, eq, value = selector.partition("=")
    if eq:
        return (node.get("Labels") or {}).get(key) == value
    return selector in (node.get("NodeManagerHostname"), node.get("NodeManagerAddress"),
                        node.get("NodeID"))


def describe_node(node: Mapping) -> str:
    """How messages name a Ray node: host, address, node id (12 hex) and its own labels."""
    labels = {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}
    return (f"{node.get('NodeManagerHostname')} {node.get('NodeManagerAddress')} "
            f"id {str(node.get('NodeID'))[:12]} labels {labels}")


def slot_pool(nodes: Sequence[Mapping], prefix: str, *, numa_nodes: Sequence[int] | None = None,
              ray_nodes: Sequence[str] | None = None) -> list[SlotRef]:
    """The slots the alive Ray nodes advertise under ``prefix``, on the chosen NUMA nodes of the
    chosen Ray nodes (``ray_nodes``: selectors as ``node_matches`` reads them; a selector that
    names no alive node is a UserError). Ordered round-robin over the Ray nodes (each node's
    first slot, then each node's second, ...), so the first arms and ``max_slots`` spread over
    the nodes. Labels are the slot names on a single Ray node, else prefixed by the node."""
    alive = [n for n in nodes if n.get("Alive", True)]
    if ray_nodes is not None:
        for selector in ray_nodes:
            if not any(node_matches(n, selector) for n in alive):
                raise UserError(f"placement.ray_nodes: no alive Ray node matches {selector!r} "
                                f"(nodes: {'; '.join(map(describe_node, alive)) or 'none'})")
        alive = [n for n in alive if any(node_matches(n, s) for s in ray_nodes)]
    per_node: list[list[SlotRef]] = []
    for node in sorted(alive, key=lambda n: (str(n.get("NodeManagerHostname")), n["NodeID"])):
        refs = []
        for res, units in sorted((node.get("Resources") or {}).items()):
            if not res.startswith(prefix):
                continue
            ref = SlotRef(node["NodeID"], res, str(node.get("NodeManagerHostname") or ""))
            if numa_nodes is None or ref.numa_node in numa_nodes:
                refs.extend([ref] * int(units))
        if refs:
            per_node.append(refs)
    hosts = [refs[0].host for refs in per_node]
    unique_hosts = len(set(hosts)) == len(hosts)
    pool = []
    for depth in range(max((len(r) for r in per_node), default=0)):
        for refs in per_node:
            if depth < len(refs):
                ref = refs[depth]
                where = ref.host if unique_hosts else f"{ref.host}:{ref.node_id[:6]}"
                label = ref.name if len(per_node) == 1 else f"{where}/{ref.name}"
                pool.append(dataclasses.replace(ref, label=label))
    return pool


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


T = TypeVar("T")


def bundles(items: Sequence[T], key: Callable[[T], Hashable | None]) -> list[list[T]]:
    """``items`` with an equal ``key`` in one bundle, placed where its first one was, the
    others after it in their order; an item whose key is None alone. Arms whose stage
    configs are equal share one engine start this way, in the interleaved order."""
    out: list[list[T]] = []
    at: dict[Hashable, list[T]] = {}
    for item in items:
        k = key(item)
        if k is None:
            out.append([item])
        elif k in at:
            at[k].append(item)
        else:
            at[k] = [item]
            out.append(at[k])
    return out


def engine_key(sweep, arm) -> tuple | None:
    """What arms of one pass must have in common to share one engine start
    (``placement.share_engine``, default on): the same sweep, stage config, slot size and
    workload mode (one engine is built for one mode). None: a fresh process of its own
    (sharing off, a pipeline, replicas, or an engine other than vLLM, whose start is not what
    costs)."""
    if (not sweep.placement.share_engine or arm.stages or arm.replicas != 1
            or arm.stage.engine != "vllm"):
        return None
    return (sweep.name, arm.stage, arm.slot_cores, arm.workload.mode)


def pick_slot(free: Sequence[Hashable], used_by_arm: set) -> Hashable:
    """The first free slot this arm has not run on, else the first free slot."""
    for slot in free:
        if slot not in used_by_arm:
            return slot
    return free[0]


def replica_slots(pool: Sequence[SlotRef]) -> list[SlotRef]:
    """One slot on each NUMA node of each Ray node of ``pool`` (its first there): where an arm
    with ``placement.replicas: per_node`` runs its replicas at once."""
    chosen: dict[tuple[str, int], SlotRef] = {}
    for slot in pool:
        chosen.setdefault((slot.node_id, slot.numa_node), slot)
    return list(chosen.values())


class Scheduler:
    """Hands out (job, slot) pairs as slots come free; ``done(slot)`` gives a slot back.

    A Ray node lost mid-sweep (``drop_node``) takes its slots with it: its free slots go at
    once, its busy ones when they are given back, and none is handed out again. A job that
    never started (its node died as it was dispatched) goes back to the front (``requeue``).
    ``stranded``: jobs are waiting and no slot is left on any node."""

    def __init__(self, jobs: Sequence[Job], slots: Sequence[Hashable]) -> None:
        if not slots:
            raise ValueError("no slots to run on")
        self.pending = list(jobs)
        self.slots = list(slots)
        self.free = list(slots)
        self.used: dict[int, set] = {}
        self.lost_nodes: set[str] = set()

    def next(self) -> tuple[Job, Hashable] | None:
        if not self.pending or not self.free:
            return None
        job = self.pending.pop(0)
        slot = pick_slot(self.free, self.used.setdefault(job.arm_index, set()))
        self.free.remove(slot)
        self.used[job.arm_index].add(slot)
        return job, slot

    def done(self, slot: Hashable) -> None:
        if not self._lost(slot):
            self.free.append(slot)

    def requeue(self, job: Job) -> None:
        self.pending.insert(0, job)

    def drop_node(self, node_id: str) -> None:
        self.lost_nodes.add(node_id)
        self.free = [s for s in self.free if not self._lost(s)]

    def _lost(self, slot: Hashable) -> bool:
        return getattr(slot, "node_id", None) in self.lost_nodes

    @property
    def stranded(self) -> bool:
        return bool(self.pending) and all(self._lost(s) for s in self.slots)

    def drop_pending(self) -> list[Job]:
        dropped, self.pending = self.pending, []
        return dropped
