"""A Ray cluster of several raylets on this one machine, each a simulated socket of its own.

``up(count)`` cuts this machine's cores into ``count`` virtual NUMA nodes
(``topology/simulate.py``), writes one sysfs tree per raylet holding its node alone, and starts
``ray start --head`` for node 0 and ``ray start --address`` for each other node: every raylet
has its own ``OMNI_RAY_SYSFS_ROOT`` (its stage actors and engines inherit it), advertises its own
slots and ``num_cpus`` and carries the label ``omni.raylet=sim<k>``. On a 2-CPU machine,
``up(2)`` gives two Ray nodes: one with virtual node 0 = CPU 0, one with virtual node 1 = CPU 1.

It is a simulation and says so: the records' topology has ``source: simulated`` and memory
binding to a node the kernel lacks is recorded "not bound (node N is simulated)". It is closed
like the local Ray of a sweep (``placement/cluster.py``): every raylet's node address is
127.0.0.1 (``ray start --node-ip-address``, kept as given by ``keep_loopback``), so the GCS, the
raylets, the workers and the dashboard and metrics agents listen on loopback only. Token auth is
on, with a token of its own (never the user's ``~/.ray/auth_token``), in the state directory.

``down`` stops exactly the processes of that cluster (those naming its temp dir or its GCS
address, and their children), never another Ray on the host (``ray stop`` would stop them all).
``kill_raylet`` kills one raylet's processes alone (a lost node, for the fault tests).
Used by ``omni-ray cluster up|down`` and by the integration tests' fixture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from omni_ray import envs
from omni_ray.errors import UserError
from omni_ray.placement.cluster import LOOPBACK, RAY_CLUSTER_ENV
from omni_ray.topology import make_slots
from omni_ray.topology.detection import detect_host, detect_simulated
from omni_ray.topology.simulate import split_nodes, write_tree

STATE_FILE = "cluster.json"
LABEL = "omni.raylet"
START_TIMEOUT_S = 180


def default_dir() -> Path:
    return envs.cache_dir() / "cluster"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def ray_start_cli() -> list[str]:
    """``ray start`` of this interpreter's Ray, with its node address kept on loopback (this
    module's ``main``)."""
    return [sys.executable, "-m", "omni_ray.placement.local_cluster", "start"]


def keep_loopback() -> None:
    """In a ``ray start`` process: keep a node address of 127.0.0.1 as given.

    What it patches: ``ray._private.services.resolve_ip_for_localhost``, which ``ray start``
    calls on ``--node-ip-address`` and which turns 127.0.0.1 into this host's routable address.
    Why: with a loopback node address Ray binds its servers on 127.0.0.1, with the routable one
    on every interface; the variable the local Ray uses instead (``cluster.loopback_node``) also
    makes ``ray start --address`` refuse to add a node. When it can go: when ``ray start
    --node-ip-address=127.0.0.1`` keeps loopback by itself.
    """
    from ray._private import services

    resolve = getattr(services, "resolve_ip_for_localhost", None)
    if resolve is None:
        raise RuntimeError("omni-ray: ray._private.services.resolve_ip_for_localhost is gone; "
                           "cannot keep the cluster on loopback (placement/local_cluster.py)")
    services.resolve_ip_for_localhost = lambda host: host if host == LOOPBACK else resolve(host)


def raylet_command(label: str, num_cpus: int, resources: dict[str, int], temp_dir: str,
                   gcs: str, head_ports: tuple[int, int, int] | None = None) -> list[str]:
    """The ``ray start`` of one raylet on 127.0.0.1: the head (with ``head_ports``: the GCS,
    dashboard and Ray client ports) or a node joining ``gcs``. Every port is a free one."""
    cmd = [*ray_start_cli(), f"--node-ip-address={LOOPBACK}", f"--num-cpus={num_cpus}",
           f"--resources={json.dumps(resources)}", "--labels", f"{LABEL}={label}",
           f"--dashboard-agent-listen-port={free_port()}",
           f"--metrics-export-port={free_port()}", f"--temp-dir={temp_dir}",
           "--disable-usage-stats"]
    if head_ports is None:
        return cmd + [f"--address={gcs}"]
    port, dash, client = head_ports
    return cmd + ["--head", f"--port={port}", "--include-dashboard=true",
                  f"--dashboard-host={LOOPBACK}", f"--dashboard-port={dash}",
                  f"--ray-client-server-port={client}"]


@dataclasses.dataclass(frozen=True)
class LocalCluster:
    """What ``up`` started: where to reach it and how to authenticate, and its raylets."""

    state_dir: str
    address: str          # the GCS, HOST:PORT, for ``--address`` / ``run_sweep(address=)``
    dashboard_url: str
    temp_dir: str
    token_path: str
    raylets: tuple[dict, ...]  # label, sysfs_root, num_cpus, resources, numa_nodes

    def env(self) -> dict[str, str]:
        """The variables a driver (``omni-ray sweep --address``, ``ray status``) needs to join
        this cluster: its token, its address, and Ray told to keep that address on loopback
        (``cluster.loopback_node``'s variable)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path,
                "RAY_ADDRESS": self.address, RAY_CLUSTER_ENV: "0"}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _resources(topology, slot_sizes: Sequence[int | None]) -> dict[str, int]:
    from omni_ray.placement.cluster import resource_name

    out: dict[str, int] = {}
    for size in slot_sizes:
        if size is not None and size > min(n.num_cores for n in topology.nodes):
            continue  # this raylet's node has too few cores for slots of this size
        out.update({resource_name(size, s.name): 1 for s in make_slots(topology, size)})
    return out


def _start(cmd: list[str], env: dict[str, str], what: str) -> None:
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"omni-ray cluster: `ray start` for {what} failed "
                           f"(exit {run.returncode}):\n{tail}")


def read_state(state_dir: str | os.PathLike | None = None) -> LocalCluster | None:
    path = Path(state_dir or default_dir()) / STATE_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    data["raylets"] = tuple(data["raylets"])
    return LocalCluster(**data)


def up(count: int, state_dir: str | os.PathLike | None = None,
       slot_sizes: Sequence[int | None] = (1, None)) -> LocalCluster:
    """Start ``count`` raylets on this machine, raylet k holding virtual NUMA node k; returns
    the cluster (also written to ``state_dir/cluster.json`` for ``down``)."""
    state = Path(state_dir or default_dir()).resolve()
    if read_state(state) is not None:
        raise UserError(f"a cluster is already up with state in {state} "
                        "(omni-ray cluster down first)")
    nodes = split_nodes(detect_host(), count)
    state.mkdir(parents=True, exist_ok=True)
    token = state / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    # Ray's socket paths must fit 107 bytes: a short temp dir under /tmp
    temp_dir = tempfile.mkdtemp(prefix="omsim-", dir="/tmp")
    port, dash = free_port(), free_port()
    cluster = LocalCluster(str(state), f"{LOOPBACK}:{port}", f"http://{LOOPBACK}:{dash}",
                           temp_dir, str(token), ())
    base_env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    base_env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    raylets = []
    try:
        for node in nodes:
            root = write_tree(state / f"raylet{node.id}", [node])
            topology = detect_simulated(root)
            resources = _resources(topology, slot_sizes)
            label = f"sim{node.id}"
            head = (port, dash, free_port()) if node.id == nodes[0].id else None
            cmd = raylet_command(label, len(node.cpus), resources, temp_dir, cluster.address,
                                 head)
            env = base_env | {envs.OMNI_RAY_SYSFS_ROOT: str(root)}
            _start(cmd, env, f"raylet {label}")
            raylets.append({"label": label, "sysfs_root": str(root), "num_cpus": len(node.cpus),
                            "cpus": list(node.cpus), "numa_nodes": [node.id],
                            "resources": resources})
            cluster = dataclasses.replace(cluster, raylets=tuple(raylets))
            (state / STATE_FILE).write_text(json.dumps(cluster.to_dict(), indent=2))
    except BaseException:
        stop_processes(temp_dir, port)
        shutil.rmtree(temp_dir, ignore_errors=True)
        (state / STATE_FILE).unlink(missing_ok=True)
        raise
    (state / "env").write_text("".join(f"export {k}={v}\n" for k, v in cluster.env().items()))
    return cluster


def cluster_processes(temp_dir: str, port: int) -> list:
    """The processes of the cluster with this temp dir and GCS port, with their children."""
    import psutil

    gcs = f":{port}"
    ours = {}
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        if any(temp_dir in a or (a.startswith("--address=") and a.endswith(gcs)) for a in args):
            ours[proc.pid] = proc
    for proc in list(ours.values()):
        with contextlib.suppress(psutil.Error):
            for child in proc.children(recursive=True):
                ours.setdefault(child.pid, child)
    ours.pop(os.getpid(), None)
    return list(ours.values())


def raylet_processes(cluster: LocalCluster, label: str) -> list:
    """The processes of raylet ``label`` (``sim1``) of ``cluster``: the raylet, its agents,
    its Ray workers and the engines they started. Each raylet started with its own
    ``OMNI_RAY_SYSFS_ROOT``, which every one of them inherits."""
    import psutil

    (root,) = [r["sysfs_root"] for r in cluster.raylets if r["label"] == label]
    out = []
    for proc in cluster_processes(cluster.temp_dir, int(cluster.address.rsplit(":", 1)[1])):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(envs.OMNI_RAY_SYSFS_ROOT) == root:
                out.append(proc)
    return out


def kill_raylet(cluster: LocalCluster, label: str) -> list[int]:
    """SIGKILL every process of raylet ``label``, as a host that loses power: the node dies
    with its running arms, the rest of the cluster stays up. Returns the pids killed."""
    import psutil

    procs = raylet_processes(cluster, label)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)
    return [p.pid for p in procs]


def stop_processes(temp_dir: str, port: int, timeout_s: float = 20.0) -> int:
    """Terminate the cluster's processes (by pid), kill what outlives ``timeout_s``."""
    import psutil

    procs = cluster_processes(temp_dir, port)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def down(state_dir: str | os.PathLike | None = None) -> int:
    """Stop the cluster ``up`` started with this state directory; returns how many processes
    were stopped. No cluster there is a UserError."""
    cluster = read_state(state_dir)
    state = Path(state_dir or default_dir())
    if cluster is None:
        raise UserError(f"no cluster is up with state in {state}")
    port = int(cluster.address.rsplit(":", 1)[1])
    stopped = stop_processes(cluster.temp_dir, port)
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    (state / STATE_FILE).unlink(missing_ok=True)
    (state / "env").unlink(missing_ok=True)
    return stopped


def main(argv: list[str] | None = None) -> None:
    """``python -m omni_ray.placement.local_cluster start ARGS``: ``ray start ARGS`` with its
    node address kept on loopback."""
    from ray.scripts.scripts import main as ray_main

    keep_loopback()
    sys.argv = ["ray", *(sys.argv[1:] if argv is None else argv)]
    ray_main()


if __name__ == "__main__":
    main()
