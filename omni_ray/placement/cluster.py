"""Connecting to Ray and the slots its nodes advertise as custom resources.

A slot is a resource ``omni_slot_c<cores>_<slot name>`` (``c0`` for whole-node slots) with one
unit on each Ray node that has it; a stage actor asks for exactly one unit, so two stages never
share cores. A local Ray started on demand advertises the slots of this machine; on an existing
cluster each node advertises its own at ``ray start`` (``omni-ray topology --ray-resources``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

from omni_ray.errors import UserError
from omni_ray.topology import detect, make_slots

PREFIX = "omni_slot_"
NAMESPACE = "omni-ray"


def resource_name(slot_cores: int | None, slot_name: str) -> str:
    return f"{PREFIX}c{slot_cores or 0}_{slot_name}"


def ray_resources(slot_sizes) -> dict[str, float]:
    """This machine's slot resources for every slot size a run needs."""
    topo = detect()
    return {resource_name(size, s.name): 1.0
            for size in slot_sizes for s in make_slots(topo, size)}


def connect(address: str | None, slot_sizes):
    """Start a local Ray with this machine's slots, or join ``address``; returns the context."""
    import ray

    if ray.is_initialized():
        return None
    # Stage actors run in Ray workers of this same interpreter (the .venv that has omni-ray);
    # on a cluster, omni-ray must be installed on every node.
    try:
        if address:
            return ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        return ray.init(num_cpus=os.cpu_count(), resources=ray_resources(slot_sizes),
                        namespace=NAMESPACE, include_dashboard=True, dashboard_host="127.0.0.1",
                        log_to_driver=False)
    except ConnectionError as exc:
        # Ray reads RAY_AUTH_MODE when it is imported; an auth failure looks like a dead cluster.
        hint = ("" if os.environ.get("RAY_AUTH_MODE") == "token" else
                " (a cluster with token auth needs RAY_AUTH_MODE=token set before Ray is"
                " imported, and its token in ~/.ray/auth_token)")
        raise UserError(f"--address {address}: cannot connect to Ray: {exc}{hint}") from None


@contextlib.contextmanager
def session(address: str | None, slot_sizes) -> Iterator[object]:
    """Ray for one run: ``connect`` on entry; on exit, stop the Ray this started (a local one;
    a cluster's driver only disconnects). A Ray the caller initialised is left as it is."""
    import ray

    owns = not ray.is_initialized()
    ctx = connect(address, slot_sizes)
    try:
        yield ctx
    finally:
        if owns:
            ray.shutdown()


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
