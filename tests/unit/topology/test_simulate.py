"""Simulated sockets: this machine's cores cut into virtual NUMA nodes, read back by detect()."""

import os

import pytest

from omni_ray.errors import UserError
from omni_ray.topology import detect, make_slots
from omni_ray.topology.detection import detect_simulated
from omni_ray.topology.machine import NumaNode, Topology
from omni_ray.topology.simulate import split_nodes, write_tree

TWO_CPUS = Topology((NumaNode(0, (0, 1), ((0,), (1,)), 24000),), "sysfs")
FOUR_SMT = Topology((NumaNode(0, (0, 1, 2, 3), ((0, 2), (1, 3)), 8000),), "sysfs")


def test_two_cpus_become_node_0_cpu_0_and_node_1_cpu_1():
    nodes = split_nodes(TWO_CPUS, 2)
    assert [(n.id, n.cpus, n.mem_total_mb) for n in nodes] == [(0, (0,), 12000),
                                                                (1, (1,), 12000)]


def test_siblings_stay_together():
    nodes = split_nodes(FOUR_SMT, 2)
    assert [n.cores for n in nodes] == [((0, 2),), ((1, 3),)]


@pytest.mark.parametrize("count", [0, 3])
def test_more_nodes_than_cores_is_a_user_error(count):
    with pytest.raises(UserError, match=rf"--simulate: must be between 1 and 2 .*got {count}"):
        split_nodes(TWO_CPUS, count)


@pytest.fixture
def this_machine_cpus(monkeypatch):
    monkeypatch.setattr("omni_ray.topology.detection.allowed_cpus",
                        lambda: frozenset({0, 1}))
    monkeypatch.setattr("omni_ray.topology.detection.cpu_features",
                        lambda: ("Test CPU", frozenset({"avx512f"})))


def test_the_env_var_makes_the_tree_this_machine(tmp_path, monkeypatch, this_machine_cpus):
    write_tree(tmp_path, split_nodes(TWO_CPUS, 2))
    monkeypatch.setenv("OMNI_RAY_SYSFS_ROOT", str(tmp_path))
    topo = detect()
    assert topo.simulated and topo.source == "simulated"
    assert topo.sysfs_root == str(tmp_path.resolve())
    assert topo.cpu_model == "Test CPU"  # this machine's CPU: the nodes are made of its CPUs
    assert [s.name for s in make_slots(topo, 1)] == ["n0s0", "n1s0"]
    assert topo.to_dict()["sysfs_root"] == str(tmp_path.resolve())


def test_one_raylet_tree_keeps_its_node_id(tmp_path, this_machine_cpus):
    write_tree(tmp_path, split_nodes(TWO_CPUS, 2)[1:])
    (node,) = detect_simulated(tmp_path).nodes
    assert (node.id, node.cpus) == (1, (1,))


def test_a_cpu_this_process_cannot_use_is_a_user_error(tmp_path, this_machine_cpus):
    write_tree(tmp_path, [NumaNode(0, (0,), ((0,),), 1), NumaNode(1, (7,), ((7,),), 1)])
    with pytest.raises(UserError, match=r"OMNI_RAY_SYSFS_ROOT=.*node 1 lists CPU\(s\) \[7\]"):
        detect_simulated(tmp_path)


def test_a_missing_tree_is_a_user_error_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_RAY_SYSFS_ROOT", str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match=r"^OMNI_RAY_SYSFS_ROOT=.*nowhere: .* is not a directory"):
        detect()


def test_blank_variable_is_the_host(monkeypatch):
    monkeypatch.setenv("OMNI_RAY_SYSFS_ROOT", " ")
    assert not detect().simulated
    assert os.environ["OMNI_RAY_SYSFS_ROOT"] == " "
