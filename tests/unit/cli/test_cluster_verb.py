"""``omni-ray cluster`` and ``topology --simulate``: bad input is one line and exit 2; nothing
starts a Ray here (tests/integration/test_nodes.py does)."""

import json

from omni_ray import cli
from omni_ray.placement import local_cluster
from omni_ray.topology.machine import NumaNode, Topology


def test_up_needs_simulate(user_error):
    assert user_error("cluster", "up").endswith("up: --simulate N is required (N raylets, one "
                                                "virtual NUMA node each, on this machine)")


def test_down_without_a_cluster_names_the_state_dir(user_error, tmp_path):
    assert user_error("cluster", "down", "--dir", tmp_path).endswith(
        f"no cluster is up with state in {tmp_path}")


def test_up_refuses_a_second_cluster_in_one_state_dir(user_error, tmp_path):
    (tmp_path / local_cluster.STATE_FILE).write_text(json.dumps(
        {"state_dir": str(tmp_path), "address": "127.0.0.1:1", "dashboard_url": "",
         "temp_dir": "/tmp/none", "token_path": "", "raylets": []}))
    assert "a cluster is already up with state in" in user_error(
        "cluster", "up", "--simulate", "2", "--dir", tmp_path)


def test_simulate_needs_write(user_error):
    assert user_error("topology", "--simulate", "2").endswith(
        "--simulate: needs --write DIR (where the tree goes)")


def test_simulate_writes_a_tree_the_variable_reads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("omni_ray.topology.detection.detect_host", lambda: Topology(
        (NumaNode(0, (0, 1), ((0,), (1,)), 2048),), "sysfs"))
    monkeypatch.setattr("omni_ray.topology.detection.allowed_cpus", lambda: frozenset({0, 1}))
    assert cli.main(["topology", "--simulate", "2", "--write", str(tmp_path / "t"),
                     "--slot-cores", "1"]) == 0
    out = capsys.readouterr().out
    assert f"OMNI_RAY_SYSFS_ROOT={tmp_path / 't'}" in out
    assert "n0s0: node 0, 1 cores, CPUs 0" in out and "n1s0: node 1, 1 cores, CPUs 1" in out


def test_each_raylet_advertises_its_own_node_slots():
    topo = Topology((NumaNode(1, (1,), ((1,),), 1024),), "simulated")
    assert local_cluster._resources(topo, (1, 2, None)) == {
        "omni_slot_c1_n1s0": 1, "omni_slot_c0_n1s0": 1}


def test_every_raylet_starts_on_loopback_with_ports_of_its_own():
    head = local_cluster.raylet_command("sim0", 1, {"omni_slot_c1_n0s0": 1}, "/tmp/omsim-x",
                                        "127.0.0.1:6390", (6390, 8270, 10001))
    node = local_cluster.raylet_command("sim1", 1, {}, "/tmp/omsim-x", "127.0.0.1:6390")
    for cmd in (head, node):
        assert cmd[1:4] == ["-m", "omni_ray.placement.local_cluster", "start"]
        assert "--node-ip-address=127.0.0.1" in cmd
        assert "--temp-dir=/tmp/omsim-x" in cmd
    assert {"--head", "--port=6390", "--dashboard-host=127.0.0.1", "--dashboard-port=8270",
            "--ray-client-server-port=10001"} <= set(head)
    assert "--address=127.0.0.1:6390" in node and "--head" not in node


def test_ray_start_keeps_a_loopback_node_address(monkeypatch):
    from ray._private import services

    monkeypatch.setattr(services, "resolve_ip_for_localhost", lambda host: "192.0.2.7")
    local_cluster.keep_loopback()
    assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert services.resolve_ip_for_localhost("localhost") == "192.0.2.7"  # only loopback kept


def test_a_driver_of_the_cluster_keeps_its_loopback_address():
    from omni_ray.placement import cluster

    env = local_cluster.LocalCluster("/s", "127.0.0.1:6390", "", "/tmp/x", "/s/t", ()).env()
    assert env[cluster.RAY_CLUSTER_ENV] == "0" and env["RAY_ADDRESS"] == "127.0.0.1:6390"
    assert cluster.is_loopback_address("127.0.0.1:6390")
    assert cluster.is_loopback_address("[::1]:6390")
    assert not cluster.is_loopback_address("10.1.2.3:6390")
