"""``omni-ray topology``: the NUMA nodes found and the slots that would be made from them."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--sysfs-root",
        metavar="DIR",
        help="read a captured tree (DIR/devices/system/{node,cpu}) instead of this machine",
    )
    parser.add_argument(
        "--slot-cores",
        type=int,
        metavar="N",
        help="physical cores per slot (default: one slot per whole node)",
    )
    parser.add_argument(
        "--simulate",
        type=int,
        metavar="N",
        help="cut this machine's cores into N virtual NUMA nodes (simulated sockets); "
        "with --write DIR, write them as a sysfs tree for OMNI_RAY_SYSFS_ROOT=DIR",
    )
    parser.add_argument("--write", metavar="DIR", help="where --simulate writes its tree")
    parser.add_argument(
        "--ray-resources",
        action="store_true",
        help="print the slots as the JSON that `ray start --resources` takes on this node",
    )


def run(args: argparse.Namespace) -> int:
    from omni_ray.errors import UserError
    from omni_ray.topology import detect, make_slots, unused_cores

    if args.write and args.simulate is None:
        raise UserError("--write: only with --simulate N")
    if args.simulate is not None:
        from omni_ray.topology.detection import detect_host, detect_simulated
        from omni_ray.topology.simulate import split_nodes, write_tree

        if not args.write:
            raise UserError("--simulate: needs --write DIR (where the tree goes)")
        root = write_tree(args.write, split_nodes(detect_host(), args.simulate))
        print(f"wrote {args.simulate} simulated NUMA node(s) to {root}; use them with "
              f"OMNI_RAY_SYSFS_ROOT={root}")
        topology = detect_simulated(root)
    else:
        topology = detect(args.sysfs_root)
    slots = make_slots(topology, args.slot_cores)
    unused = unused_cores(topology, slots)
    if args.ray_resources:
        from omni_ray.placement.cluster import resource_name

        print(json.dumps({resource_name(args.slot_cores, s.name): 1 for s in slots}))
    elif args.json:
        report = topology.to_dict()
        report["slots"] = [slot.to_dict() for slot in slots]
        report["unused"] = [
            {"node": node, "cores": len(cores), "cpus": sorted(c for core in cores for c in core)}
            for node, cores in unused.items()
        ]
        print(json.dumps(report, indent=2))
    else:
        print(_text(topology, slots, unused))
    return 0


def _text(topology, slots, unused) -> str:
    from omni_ray.topology import format_cpulist

    lines = [
        f"source: {topology.source}",
        f"cpu:    {topology.cpu_model or '(unknown)'}",
        f"flags:  {' '.join(sorted(topology.flags)) or '(none known)'}",
    ]
    for node in topology.nodes:
        lines.append(
            f"node {node.id}: {node.num_cores} cores, {len(node.cpus)} CPUs "
            f"({format_cpulist(node.cpus)}), {node.mem_total_mb} MiB"
        )
    lines.append(f"slots: {len(slots)}")
    for slot in slots:
        lines.append(
            f"  {slot.name}: node {slot.node}, {slot.num_cores} cores, "
            f"CPUs {format_cpulist(slot.cpus)}"
        )
    for node, cores in unused.items():
        cpus = [cpu for core in cores for cpu in core]
        lines.append(f"unused: node {node}: {len(cores)} cores (CPUs {format_cpulist(cpus)})")
    return "\n".join(lines)
