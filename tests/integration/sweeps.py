"""What the sweep tests share: a small sweep on the tiny model, and this machine's slots."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from omni_ray.topology import local_slots

ONE_CORE = local_slots(1)  # this machine's one-core slots, as a sweep cuts them
needs_two_slots = pytest.mark.skipif(
    len(ONE_CORE) < 2, reason=f"needs two one-core slots, this machine has {len(ONE_CORE)}")


# A bound, not an expectation: a tiny engine is ready in 10-40 s on an idle core, and took
# 170-270 s on a core that other users' engines kept at 100 % (this shared 2-core machine).
ARM_TIMEOUT_S = 600


def sweep(name: str, **fields) -> dict:
    base = {"name": name, "model": "tiny", "passes": 1, "timeout_s": ARM_TIMEOUT_S,
            "placement": {"slot_cores": 1},
            "stage": {"kv_cache_mib": 32, "max_model_len": 256},
            "workload": {"prompt_len": 16, "output_len": 8, "warmup": 0, "repeats": 1}}
    for key, value in fields.items():
        base[key] = base[key] | value if isinstance(value, dict) and key in base else value
    return base


def wait_for(condition: Callable[[], object], timeout_s: float, what: str,
             every_s: float = 0.1):
    """``condition()``'s first true value, asked every ``every_s``; fails naming ``what`` after
    ``timeout_s``. The one way these tests wait: on a condition, with a bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)


def phase_seen(log: Path, phase: str) -> bool:
    """The engine runner has logged ``omni-ray phase: <phase>`` (engine/launch.PHASE_MARK)."""
    from omni_ray.engine.launch import PHASE_MARK

    return log.exists() and f"{PHASE_MARK}{phase}" in log.read_text(errors="replace")


# --- sweeps on a simulated cluster of several raylets (local_cluster) ----------------------

@contextlib.contextmanager
def simulated_cluster(state: Path):
    """Two raylets of this machine's cores (their own temp dir, ports and token; stopped by
    pid, and every process of theirs is gone afterwards)."""
    from omni_ray.placement import local_cluster
    from omni_ray.topology.detection import detect_host

    cores = sum(n.num_cores for n in detect_host().nodes)
    if cores < 2:
        pytest.skip(f"two simulated sockets need 2 cores, this machine gives {cores}")
    cluster = local_cluster.up(2, state, slot_sizes=(1,))
    try:
        listening = _listening(cluster)  # closed by default: loopback only
        assert listening and all(_loopback(a) for a in listening), listening
        yield cluster
    finally:
        local_cluster.down(state)
        assert local_cluster.cluster_processes(cluster.temp_dir,
                                               int(cluster.address.rsplit(":", 1)[1])) == []


def _listening(cluster) -> set[str]:
    """The addresses the cluster's processes (GCS, raylets, agents) listen on."""
    import psutil

    from omni_ray.placement import local_cluster

    port = int(cluster.address.rsplit(":", 1)[1])
    out = set()
    for proc in local_cluster.cluster_processes(cluster.temp_dir, port):
        try:
            out |= {c.laddr.ip for c in proc.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return out


def _loopback(address: str) -> bool:
    """127.0.0.1, also as gcs_server and the raylet show it (IPv4-mapped IPv6)."""
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def cluster_sweep(tmp_path: Path, name: str, model: Path, **extra) -> Path:
    """A sweep file of 1-core slots on ``model`` (a path: the driver has a cache of its own)."""
    cfg = {"name": name, "model": str(model), "passes": 1, "timeout_s": ARM_TIMEOUT_S,
           "placement": {"slot_cores": 1, **extra.pop("placement", {})},
           "stage": {"kv_cache_mib": 32, "max_model_len": 256},
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 0, "repeats": 1}, **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


# The driver joins the simulated cluster (and says the node addresses Ray lists); the engines
# run in its raylets.
DRIVER = ("import json, sys, ray, omni_ray\n"
          "from omni_ray.placement.cluster import connect\n"
          "connect(sys.argv[1], ())\n"
          "addresses = sorted({n['NodeManagerAddress'] for n in ray.nodes()})\n"
          "r = omni_ray.run_sweep(sys.argv[4:], address=sys.argv[1], out=sys.argv[2],"
          " resume=sys.argv[3] == 'resume', allow_busy=True, busy_wait_s=0)\n"
          "print(json.dumps({'records': r.records, 'addresses': addresses}))")


def start_driver(cluster, tmp_path: Path, sweeps: list[Path],
                 resume: bool = False) -> subprocess.Popen:
    """A run of ``sweeps`` on ``cluster`` into ``tmp_path/res``, from a driver process with its
    own cache dir (its own host lock); its stderr goes to ``tmp_path/driver.err``."""
    env = {**os.environ, **cluster.env(), "OMNI_RAY_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_AUTH_TOKEN", None)
    with open(tmp_path / "driver.err", "a") as err:
        return subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address,
                                 str(tmp_path / "res"), "resume" if resume else "new",
                                 *map(str, sweeps)], stdout=subprocess.PIPE, stderr=err,
                                text=True, env=env)


def driver_stderr(tmp_path: Path) -> str:
    return (tmp_path / "driver.err").read_text(errors="replace")[-3000:]


def driver_records(driver: subprocess.Popen, tmp_path: Path, timeout: float) -> list[dict]:
    """The records the driver's run wrote; it must end well (failed arms are records)."""
    try:
        out, _ = driver.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.communicate()
        raise
    assert driver.returncode == 0, driver_stderr(tmp_path)
    out = json.loads(out.strip().splitlines()[-1])
    assert out["addresses"] == ["127.0.0.1"]  # the cluster is closed: loopback only
    return out["records"]
