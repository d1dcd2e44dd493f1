from omni_ray.placement.schedule import Job, Scheduler, interleaved_jobs, pick_slot


def test_pass_p_starts_at_arm_p_minus_1():
    jobs = interleaved_jobs(3, 3)
    firsts = [jobs[i].arm_index for i in (0, 3, 6)]
    assert firsts == [0, 1, 2]
    assert [j.arm_index for j in jobs[3:6]] == [1, 2, 0]
    assert {(j.arm_index, j.pass_no) for j in jobs} == {(a, p) for a in range(3) for p in (1, 2, 3)}


def test_passes_land_on_different_slots_when_they_can():
    s = Scheduler(interleaved_jobs(1, 2), ["n0s0", "n0s1"])
    (j1, a), = [s.next()]
    s.done(a)  # a is free again, and first in line would be n0s1 anyway; prefer the unused one
    j2, b = s.next()
    assert (j1.pass_no, j2.pass_no) == (1, 2) and a != b


def test_pick_slot_falls_back_to_a_used_slot():
    assert pick_slot(["n0s0"], {"n0s0"}) == "n0s0"
    assert pick_slot(["n0s0", "n0s1"], {"n0s0"}) == "n0s1"


def test_n_slots_run_n_jobs_at_once():
    s = Scheduler(interleaved_jobs(4, 1), ["a", "b"])
    got = [s.next(), s.next(), s.next()]
    assert got[2] is None and {got[0][1], got[1][1]} == {"a", "b"}
    s.done("a")
    assert s.next() == (Job(2, 1), "a")


# --- slots identified by Ray node ---------------------------------------------------------

import pytest  # noqa: E402

from omni_ray.errors import UserError  # noqa: E402
from omni_ray.placement.schedule import SlotRef, node_matches, slot_pool  # noqa: E402

PREFIX = "omni_slot_c1_"


def ray_node(node_id, host="h", *slots, labels=None, alive=True, address="10.0.0.1"):
    """A ``ray.nodes()`` entry advertising ``slots`` (names like n0s0) of 1 core."""
    return {"NodeID": node_id, "Alive": alive, "NodeManagerHostname": host,
            "NodeManagerAddress": address, "Labels": {"ray.io/node-id": node_id, **(labels or {})},
            "Resources": {"CPU": 2.0, "omni_slot_c2_n0s0": 1.0,
                          **{PREFIX + s: 1.0 for s in slots}}}


def test_slot_identity_is_the_ray_node_and_the_resource():
    a, b = SlotRef("aaa", PREFIX + "n0s1", "h", "x"), SlotRef("bbb", PREFIX + "n0s1", "h", "x")
    assert a != b and a == SlotRef("aaa", PREFIX + "n0s1", "other", "y")
    assert (a.name, a.numa_node) == ("n0s1", 0)
    assert SlotRef("c", PREFIX + "n12s3").numa_node == 12


def test_two_ray_nodes_with_the_same_topology_give_twice_the_slots():
    nodes = [ray_node("aaaaaa11", "h", "n0s0", "n0s1"), ray_node("bbbbbb22", "h", "n0s0", "n0s1")]
    pool = slot_pool(nodes, PREFIX)
    assert len(pool) == 4 and len(set(pool)) == 4
    # round-robin over the Ray nodes, so the first arms spread over both
    assert [(s.node_id, s.name) for s in pool] == [
        ("aaaaaa11", "n0s0"), ("bbbbbb22", "n0s0"), ("aaaaaa11", "n0s1"), ("bbbbbb22", "n0s1")]
    # one host, two raylets: the label names the node id too
    assert [s.label for s in pool[:2]] == ["h:aaaaaa/n0s0", "h:bbbbbb/n0s0"]


def test_labels_are_slot_names_on_one_node_and_host_names_across_hosts():
    assert [s.label for s in slot_pool([ray_node("a", "h", "n0s0", "n1s0")], PREFIX)] == [
        "n0s0", "n1s0"]
    pool = slot_pool([ray_node("a", "h1", "n0s0"), ray_node("b", "h2", "n0s0")], PREFIX)
    assert [s.label for s in pool] == ["h1/n0s0", "h2/n0s0"]


def test_schedule_with_two_identical_nodes_runs_on_both_at_once():
    pool = slot_pool([ray_node("a", "h", "n0s0"), ray_node("b", "h", "n0s0")], PREFIX)
    s = Scheduler(interleaved_jobs(4, 1), pool)
    first, second, third = s.next(), s.next(), s.next()
    assert third is None and {first[1].node_id, second[1].node_id} == {"a", "b"}
    s.done(second[1])
    assert s.next() == (Job(2, 1), second[1])


def test_an_arms_passes_go_to_the_other_node_when_it_can():
    pool = slot_pool([ray_node("a", "h", "n0s0"), ray_node("b", "h", "n0s0")], PREFIX)
    s = Scheduler(interleaved_jobs(1, 2), pool)
    (_, first) = s.next()
    s.done(first)
    (_, second) = s.next()
    assert first.node_id != second.node_id


def test_numa_nodes_and_dead_nodes_are_left_out():
    nodes = [ray_node("a", "h", "n0s0", "n1s0"), ray_node("b", "h", "n1s0", alive=False)]
    assert [(s.node_id, s.name) for s in slot_pool(nodes, PREFIX, numa_nodes=(1,))] == [
        ("a", "n1s0")]


def test_ray_nodes_select_by_label_host_address_or_id():
    a = ray_node("a1", "h1", "n0s0", labels={"omni.raylet": "sim0"}, address="10.0.0.1")
    b = ray_node("b2", "h2", "n0s0", labels={"omni.raylet": "sim1"}, address="10.0.0.2")
    assert node_matches(a, "omni.raylet=sim0") and not node_matches(b, "omni.raylet=sim0")
    for selector in ("h2", "10.0.0.2", "b2", "omni.raylet=sim1"):
        assert [s.node_id for s in slot_pool([a, b], PREFIX, ray_nodes=[selector])] == ["b2"]


def test_a_selector_naming_no_ray_node_is_a_user_error():
    with pytest.raises(UserError, match=r"placement.ray_nodes: no alive Ray node matches "
                                        r"'gpu=yes' \(nodes: h 10.0.0.1 id a labels \{\}\)"):
        slot_pool([ray_node("a", "h", "n0s0")], PREFIX, ray_nodes=["gpu=yes"])


def test_replicas_take_one_slot_on_each_numa_node_of_each_ray_node():
    from omni_ray.placement.schedule import replica_slots

    pool = slot_pool([ray_node("a", "h", "n0s0", "n0s1", "n1s0"), ray_node("b", "h", "n0s0")],
                     PREFIX)
    assert [(s.node_id, s.name) for s in replica_slots(pool)] == [
        ("a", "n0s0"), ("b", "n0s0"), ("a", "n1s0")]
