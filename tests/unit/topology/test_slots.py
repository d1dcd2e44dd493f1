import json

import pytest

from omni_ray.errors import UserError
from omni_ray.topology import NumaNode, Slot, Topology, detect, make_slots, unused_cores
from omni_ray.topology.sysfs import parse_cpulist

from .conftest import SYSFS_FIXTURES


@pytest.fixture(scope="module")
def xeon():
    return detect(SYSFS_FIXTURES / "xeon8480c_2s")


@pytest.fixture(scope="module")
def four_node():
    return detect(SYSFS_FIXTURES / "four_node")


def test_xeon_24_core_slots_keep_siblings_together(xeon):
    slots = make_slots(xeon, slot_cores=24)
    assert [slot.name for slot in slots] == ["n0s0", "n0s1", "n1s0", "n1s1"]
    for slot in slots:
        assert slot.num_cores == 24 and len(slot.cpus) == 48
        assert all((cpu + 112 in slot.cpus) for cpu in slot.cpus if cpu < 112)
    assert slots[0].cpus == parse_cpulist("0-23,112-135")
    assert slots[3].cpus == parse_cpulist("80-103,192-215")


def test_xeon_leftover_cores_are_reported_unused(xeon):
    unused = unused_cores(xeon, make_slots(xeon, slot_cores=24))
    assert sorted(unused) == [0, 1]
    assert len(unused[0]) == 8
    assert sorted(cpu for core in unused[0] for cpu in core) == list(
        parse_cpulist("48-55,160-167")
    )


def test_whole_node_slots_by_default(xeon):
    slots = make_slots(xeon)
    assert [(slot.name, slot.num_cores) for slot in slots] == [("n0s0", 56), ("n1s0", 56)]
    assert slots[1].cpus == xeon.nodes[1].cpus
    assert unused_cores(xeon, slots) == {}


def test_slot_of_a_whole_socket(xeon):
    assert [slot.num_cores for slot in make_slots(xeon, slot_cores=56)] == [56, 56]


def test_this_machine_gives_two_one_core_slots():
    topo = detect(SYSFS_FIXTURES / "this_machine")
    slots = make_slots(topo, slot_cores=1)
    assert [(slot.name, slot.cpus) for slot in slots] == [("n0s0", (0,)), ("n0s1", (1,))]


def test_chosen_nodes_only(four_node):
    slots = make_slots(four_node, slot_cores=4, nodes=[3, 1])
    assert [slot.name for slot in slots] == ["n1s0", "n1s1", "n3s0", "n3s1"]
    assert slots[0].cpus == parse_cpulist("8-11,40-43")


def test_a_core_with_an_offline_sibling_still_counts_as_one_core():
    topo = detect(SYSFS_FIXTURES / "cpu_offline")
    slots = make_slots(topo, slot_cores=2)
    assert [slot.cpus for slot in slots] == [(0, 1, 4), (2, 3, 6, 7)]
    assert [slot.num_cores for slot in slots] == [2, 2]


def test_to_dict_is_json(xeon):
    data = json.loads(json.dumps(make_slots(xeon, slot_cores=24)[1].to_dict()))
    assert data == {
        "name": "n0s1",
        "node": 0,
        "index": 1,
        "cpus": list(parse_cpulist("24-47,136-159")),
        "cores": 24,
    }


def test_slot_without_cores_counts_cpus():
    assert Slot(node=0, index=0, cpus=(4, 5)).num_cores == 2


@pytest.mark.parametrize("slot_cores", [0, -1, 57, True, 2.5])
def test_bad_slot_cores(xeon, slot_cores):
    match = rf"^slot_cores: must be between 1 and 56 \(cores of node 0\), got {slot_cores!r}$"
    with pytest.raises(UserError, match=match):
        make_slots(xeon, slot_cores=slot_cores)


def test_slot_cores_bound_is_the_smallest_chosen_node():
    big = NumaNode(0, tuple(range(4)), tuple((cpu,) for cpu in range(4)), 1024)
    small = NumaNode(1, (4, 5), ((4,), (5,)), 1024)
    topo = Topology((big, small), source="sysfs")
    with pytest.raises(UserError, match=r"between 1 and 2 \(cores of node 1\), got 3"):
        make_slots(topo, slot_cores=3)
    assert len(make_slots(topo, slot_cores=3, nodes=[0])) == 1


def test_unknown_node(xeon):
    with pytest.raises(UserError, match=r"^nodes: no NUMA node 2 \(this machine has \[0, 1\]\)$"):
        make_slots(xeon, nodes=[0, 2])


def test_no_nodes(xeon):
    with pytest.raises(UserError, match=r"^nodes: must name at least one NUMA node"):
        make_slots(xeon, nodes=[])
