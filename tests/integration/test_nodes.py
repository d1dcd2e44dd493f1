"""Several Ray nodes and simulated sockets on this one machine: `cluster up --simulate 2` gives
two raylets, raylet k holding virtual NUMA node k; a 4-arm sweep runs on both at once, and
``placement.ray_nodes`` keeps a sweep to one of them."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_ray.placement import local_cluster
from omni_ray.topology.detection import detect_host

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def sim_cluster(tmp_path_factory):
    """Two raylets of this machine's cores (its own temp dir, ports and token; stopped by pid)."""
    cores = sum(n.num_cores for n in detect_host().nodes)
    if cores < 2:
        pytest.skip(f"two simulated sockets need 2 cores, this machine gives {cores}")
    state = tmp_path_factory.mktemp("simcluster")
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


def _sweep(tmp_path: Path, name: str, model: Path, **extra) -> Path:
    cfg = {"name": name, "model": str(model), "passes": 1, "timeout_s": 600,
           "placement": {"slot_cores": 1, **extra.pop("placement", {})},
           "stage": {"kv_cache_mib": 32, "max_model_len": 256},
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 0, "repeats": 1}, **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


# The driver joins the simulated cluster (and says the node addresses Ray lists); the engines
# run in its raylets.
DRIVER = ("import json, sys, ray, omni_ray\n"
          "ray.init(address=sys.argv[1], namespace='omni-ray', log_to_driver=False)\n"
          "addresses = sorted({n['NodeManagerAddress'] for n in ray.nodes()})\n"
          "r = omni_ray.run_sweep(sys.argv[3:], out=sys.argv[2],"
          " allow_busy=True, busy_wait_s=0)\n"
          "print(json.dumps({'records': r.records, 'addresses': addresses}))")


def _run_sweeps(cluster, tmp_path: Path, sweeps: list[Path], timeout: float) -> list[dict]:
    """The records of one run of ``sweeps`` on ``cluster``, from a driver with its own cache
    dir (its own host lock). The cluster is closed: Ray lists its nodes on 127.0.0.1 only."""
    env = {**os.environ, **cluster.env(), "OMNI_RAY_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_AUTH_TOKEN", None)
    run = subprocess.run([sys.executable, "-c", DRIVER, cluster.address, str(tmp_path / "res"),
                          *map(str, sweeps)], capture_output=True, text=True, timeout=timeout,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["addresses"] == ["127.0.0.1"]
    return out["records"]


def _overlap(a: dict, b: dict) -> bool:
    return (a["timing"]["dispatched"] < b["timing"]["ended"]
            and b["timing"]["dispatched"] < a["timing"]["ended"])


def test_a_sweep_runs_on_both_ray_nodes_and_both_numa_nodes_at_once(sim_cluster, tiny_model,
                                                                     tmp_path):
    spread = _sweep(tmp_path, "spread", tiny_model,
                    matrix={"batch": [1, 2], "kv_cache_mib": [32, 48]})
    only1 = _sweep(tmp_path, "only_sim1", tiny_model,
                   placement={"ray_nodes": [f"{local_cluster.LABEL}=sim1"]})
    records = _run_sweeps(sim_cluster, tmp_path, [spread, only1], timeout=1700)
    assert [r["error"] for r in records if r["status"] != "ok"] == []
    by_sweep = {"spread": [], "only_sim1": []}
    for rec in records:
        by_sweep[rec["arm"]["sweep"]].append(rec)
    assert len(by_sweep["spread"]) == 4 and len(by_sweep["only_sim1"]) == 1

    cpus_of = {r["numa_nodes"][0]: r["cpus"] for r in sim_cluster.raylets}
    for rec in records:
        where = rec["slot"]
        # the record names the Ray node, the host and the (simulated) NUMA node
        assert where["node_id"] and where["host"] and where["simulated"] is True
        assert where["topology"]["source"] == "simulated"
        numa = where["numa_node"]
        assert rec["pinning"]["requested_cpus"] == cpus_of[numa]
        assert rec["pinning"]["violations"] == []
        for membind in (where["membind"], rec["pinning"]["membind"]):
            assert membind["ok"] or membind["reason"] == f"not bound (node {numa} is simulated)"

    spread_recs = by_sweep["spread"]
    assert len({r["slot"]["node_id"] for r in spread_recs}) == 2
    assert {r["slot"]["numa_node"] for r in spread_recs} == {0, 1}
    assert any(_overlap(a, b) for a in spread_recs for b in spread_recs
               if a["slot"]["node_id"] != b["slot"]["node_id"]
               and a["slot"]["numa_node"] != b["slot"]["numa_node"])
    # a Ray node chosen by its label: the arm ran there only
    (chosen,) = by_sweep["only_sim1"]
    assert chosen["slot"]["numa_node"] == 1
    sim1 = {r["slot"]["node_id"] for r in spread_recs if r["slot"]["numa_node"] == 1}
    assert {chosen["slot"]["node_id"]} == sim1


def test_one_arm_spans_both_sockets_with_replicas(sim_cluster, tiny_model, tmp_path):
    # a warm engine and enough tokens that decode (by difference) has a figure on a busy host
    spanning = _sweep(tmp_path, "spanning", tiny_model, placement={"replicas": "per_node"},
                      workload={"prompt_len": 16, "output_len": 64, "warmup": 1, "repeats": 2})
    (rec,) = _run_sweeps(sim_cluster, tmp_path, [spanning], timeout=1000)
    assert rec["status"] == "ok", rec.get("error")
    m, replicas = rec["measurements"], rec["replicas"]
    assert m["replicas"] == 2 and len(replicas) == 2
    assert len({r["slot"]["node_id"] for r in replicas}) == 2
    assert {r["slot"]["numa_node"] for r in replicas} == {0, 1}
    assert "decode_tok_s" in m, (m, [r["measurements"] for r in replicas])
    assert m["decode_tok_s"] == sum(r["measurements"]["decode_tok_s"] for r in replicas)
    assert m["rss_anon_tree_mb"] == sum(r["measurements"]["rss_anon_tree_mb"] for r in replicas)
    # released together after both loaded: their measuring windows overlap
    assert all(r["measurements"]["replica_go"] for r in replicas)
    assert m["replica_overlap"] > 0
