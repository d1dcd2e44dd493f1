"""``omni-ray cluster up --simulate N`` / ``cluster down``: a Ray cluster of N raylets on this
machine, raylet k holding simulated NUMA node k (``placement/local_cluster.py``)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("up", "down"), help="start or stop the cluster")
    p.add_argument("--simulate", type=int, metavar="N",
                   help="up: N raylets, each one virtual NUMA node of this machine's cores "
                   "(required for up: the only kind of cluster this verb makes)")
    p.add_argument("--dir", metavar="DIR", default=None,
                   help="state directory: token, sysfs trees, cluster.json, env "
                   "(default: ~/.cache/omni-ray/cluster)")
    p.add_argument("--slot-cores", type=int, action="append", metavar="N",
                   help="slot sizes each raylet advertises, repeatable (default: 1 core and "
                   "the whole node)")


def run(args: argparse.Namespace) -> int:
    from omni_ray.errors import UserError
    from omni_ray.placement import local_cluster

    if args.action == "down":
        stopped = local_cluster.down(args.dir)
        print(f"cluster down: stopped {stopped} process(es)")
        return 0
    if args.simulate is None:
        raise UserError("up: --simulate N is required (N raylets, one virtual NUMA "
                        "node each, on this machine)")
    sizes = tuple(args.slot_cores) + (None,) if args.slot_cores else (1, None)
    cluster = local_cluster.up(args.simulate, args.dir, sizes)
    for r in cluster.raylets:
        print(f"raylet {r['label']}: NUMA node(s) {r['numa_nodes']}, CPUs {r['cpus']}, "
              f"num_cpus {r['num_cpus']}, label {local_cluster.LABEL}={r['label']}")
    print(f"address: {cluster.address}   dashboard: {cluster.dashboard_url}")
    print(f"join it:  source {cluster.state_dir}/env && "
          "omni-ray sweep FILE --address $RAY_ADDRESS")
    print(f"stop it:  omni-ray cluster down{' --dir ' + args.dir if args.dir else ''}")
    return 0
