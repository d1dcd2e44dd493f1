"""Connecting to Ray and the slots its nodes advertise as custom resources.

A slot is a resource ``omni_slot_c<cores>_<slot name>`` (``c0`` for whole-node slots) with one
unit on each Ray node that has it; a stage actor asks for exactly one unit, so two stages never
share cores. A local Ray started on demand advertises the slots of this machine; on an existing
cluster each node advertises its own at ``ray start`` (``omni-ray topology --ray-resources``).

A local Ray is closed by default: its node address is 127.0.0.1, so the GCS, the raylet, the
workers and the dashboard and metrics agents listen on loopback only. ``listen=`` (an address
of this host) makes that the node address; Ray 2.60 then binds its servers on every interface
(it keeps to one only for loopback). The dashboard stays on 127.0.0.1 with its token either way.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

from omni_ray.errors import UserError
from omni_ray.topology import detect, make_slots

PREFIX = "omni_slot_"
NAMESPACE = "omni-ray"
LOOPBACK = "127.0.0.1"
# Ray 2.60 turns a node address of 127.0.0.1 into this host's routable address
# (services.resolve_ip_for_localhost) unless multi-node clusters are off, which Ray reads from
# this variable into ray_constants.ENABLE_RAY_CLUSTER when it is imported.
RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def resource_name(slot_cores: int | None, slot_name: str) -> str:
    return f"{PREFIX}c{slot_cores or 0}_{slot_name}"


def ray_resources(slot_sizes) -> dict[str, float]:
    """This machine's slot resources for every slot size a run needs."""
    topo = detect()
    return {resource_name(size, s.name): 1.0
            for size in slot_sizes for s in make_slots(topo, size)}


def is_loopback_address(address: str) -> bool:
    """Whether ``HOST:PORT`` names this host's loopback (Ray would turn it into the host's
    routable address, where a closed cluster does not listen)."""
    return address.rsplit(":", 1)[0].strip("[]") in (LOOPBACK, "localhost", "::1")


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """While a local Ray starts: keep its node address 127.0.0.1 instead of this host's.

    What it patches: ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` (read by
    ``services.get_node_ip_address``, which ``ray.init`` calls to resolve a loopback
    ``_node_ip_address``) and, for the processes Ray starts (gcs_server, raylet, agents,
    workers inherit it), the variable it comes from. Why: with a loopback node address every
    Ray server binds 127.0.0.1; with the routable one they bind all interfaces. Both are
    restored for this process once Ray is up (the node address is then Ray's own record).
    A driver joining a cluster on 127.0.0.1 needs it too: Ray resolves a loopback ``address``
    the same way. When it can go: when ``ray.init(_node_ip_address="127.0.0.1")`` keeps loopback by itself.
    """
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        raise RuntimeError("omni-ray: ray._private.ray_constants.ENABLE_RAY_CLUSTER is gone; "
                           "cannot keep the local Ray on loopback (placement/cluster.py)")
    saved_const, saved_env = ray_constants.ENABLE_RAY_CLUSTER, os.environ.get(RAY_CLUSTER_ENV)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[RAY_CLUSTER_ENV] = "0"
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_const
        if saved_env is None:
            os.environ.pop(RAY_CLUSTER_ENV, None)
        else:
            os.environ[RAY_CLUSTER_ENV] = saved_env


def connect(address: str | None, slot_sizes, listen: str | None = None):
    """Start a local Ray with this machine's slots, or join ``address``; returns the context.

    A local Ray listens on 127.0.0.1 only, or has ``listen`` (an address of this host) as its
    node address, reachable from other machines."""
    import ray

    if ray.is_initialized():
        return None
    # Stage actors run in Ray workers of this same interpreter (the .venv that has omni-ray);
    # on a cluster, omni-ray must be installed on every node.
    try:
        if address:
            joined = dict(address=address, namespace=NAMESPACE, log_to_driver=False)
            if not is_loopback_address(address):
                return ray.init(**joined)
            with loopback_node():  # a cluster closed on 127.0.0.1 (cluster up --simulate)
                return ray.init(**joined)
        local = dict(num_cpus=os.cpu_count(), resources=ray_resources(slot_sizes),
                     namespace=NAMESPACE, include_dashboard=True, dashboard_host=LOOPBACK,
                     log_to_driver=False)
        if listen:
            return ray.init(_node_ip_address=listen, **local)
        with loopback_node():
            return ray.init(_node_ip_address=LOOPBACK, **local)
    except ConnectionError as exc:
        # Ray reads RAY_AUTH_MODE when it is imported; an auth failure looks like a dead cluster.
        hint = ("" if os.environ.get("RAY_AUTH_MODE") == "token" else
                " (a cluster with token auth needs RAY_AUTH_MODE=token set before Ray is"
                " imported, and its token in ~/.ray/auth_token)")
        raise UserError(f"--address {address}: cannot connect to Ray: {exc}{hint}") from None


@contextlib.contextmanager
def session(address: str | None, slot_sizes, listen: str | None = None) -> Iterator[object]:
    """Ray for one run: ``connect`` on entry; on exit, stop the Ray this started (a local one;
    a cluster's driver only disconnects). A Ray the caller initialised is left as it is."""
    import ray

    owns = not ray.is_initialized()
    ctx = connect(address, slot_sizes, listen)
    try:
        yield ctx
    finally:
        if owns:
            ray.shutdown()


def session_dir() -> Path:
    """The connected Ray's session directory on this machine (its logs, its Prometheus
    service-discovery file, its Grafana provisioning)."""
    import ray

    node = ray._private.worker._global_node
    if node is None:
        raise RuntimeError("omni-ray: Ray is not connected; no session directory")
    return Path(node.get_session_dir_path())


def capacity(slot_cores: int | None) -> dict[str, int]:
    """Slot resource -> how many units the cluster has (one per node that advertises it)."""
    import ray

    prefix = resource_name(slot_cores, "")
    return {k: int(v) for k, v in sorted(ray.cluster_resources().items())
            if k.startswith(prefix)}


def require_capacity(slot_cores: int | None) -> dict[str, int]:
    cap = capacity(slot_cores)
    if not cap:
        need = json.dumps(ray_resources([slot_cores]))
        raise UserError(
            f"slot_cores: no Ray node advertises slots of {slot_cores or 'a whole node'} "
            f"core(s); start each node with: ray start ... --resources '{need}'")
    return cap


PROBE_TIMEOUT_S = 2.0


def node_loss(node: Mapping | None, probe_timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why a Ray node (its ``ray.nodes()`` entry, None when the cluster no longer lists it) is
    lost, or None while it looks alive.

    Ray's GCS declares a node dead only after its health checks have failed for a while (tens
    of seconds), while the stage actors on a killed raylet fail at once; so a node Ray still
    calls alive is also asked directly: a connection to its raylet's port that the host refuses
    says nothing listens there any more. A probe that times out proves nothing (a firewall,
    a slow network), and then Ray's word stands."""
    if node is None:
        return "no longer listed by the cluster"
    if not node.get("Alive", True):
        why = node.get("DeathReasonMessage") or node.get("DeathReason") or "no reason given"
        return f"dead in Ray's GCS: {why}"
    address, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not address or not port:
        return None
    try:
        with socket.create_connection((address, int(port)), timeout=probe_timeout_s):
            return None
    except ConnectionRefusedError:
        return f"its raylet at {address}:{port} refuses connections"
    except OSError:
        return None
