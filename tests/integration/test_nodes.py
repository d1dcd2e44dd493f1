"""Several Ray nodes and simulated sockets on this one machine: `cluster up --simulate 2` gives
two raylets, raylet k holding virtual NUMA node k; a 4-arm sweep runs on both at once, and
``placement.ray_nodes`` keeps a sweep to one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_ray.placement import local_cluster
from tests.integration.sweeps import (cluster_sweep, driver_records, simulated_cluster,
                                     start_driver)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def sim_cluster(tmp_path_factory):
    with simulated_cluster(tmp_path_factory.mktemp("simcluster")) as cluster:
        yield cluster


def _run_sweeps(cluster, tmp_path: Path, sweeps: list[Path], timeout: float) -> list[dict]:
    return driver_records(start_driver(cluster, tmp_path, sweeps), tmp_path, timeout)


def _overlap(a: dict, b: dict) -> bool:
    return (a["timing"]["dispatched"] < b["timing"]["ended"]
            and b["timing"]["dispatched"] < a["timing"]["ended"])


def test_a_sweep_runs_on_both_ray_nodes_and_both_numa_nodes_at_once(sim_cluster, tiny_model,
                                                                     tmp_path):
    spread = cluster_sweep(tmp_path, "spread", tiny_model,
                           matrix={"batch": [1, 2], "kv_cache_mib": [32, 48]})
    only1 = cluster_sweep(tmp_path, "only_sim1", tiny_model,
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
    spanning = cluster_sweep(tmp_path, "spanning", tiny_model,
                             placement={"replicas": "per_node"},
                             workload={"prompt_len": 16, "output_len": 64, "warmup": 1,
                                       "repeats": 2})
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
