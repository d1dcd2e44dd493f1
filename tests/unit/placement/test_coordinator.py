"""The coordinator's record path with a broken display: the record is written, the sweep goes on."""

import json

from omni_ray.config import expand, sweep_from_dict
from omni_ray.placement.coordinator import Coordinator, Events, Task, plan_tasks


def test_a_broken_display_does_not_stop_the_sweep(tmp_path, capsys):
    def broken(*_args):
        raise TypeError("unsupported format string passed to NoneType.__format__")

    sweep = sweep_from_dict({"name": "s", "model": "tiny", "stage": {"kv_cache_mib": 32}})
    (arm,) = expand(sweep)
    coord = Coordinator(run_id="r", allow_busy=False, events=Events(on_record=broken))
    task = Task(sweep, arm, 1, tmp_path)
    coord.record_failure(task, "kv_cache_mib: too small")
    assert json.loads(task.record_path.read_text())["error"] == "kv_cache_mib: too small"
    assert "progress display failed (TypeError" in capsys.readouterr().err


def test_plan_groups_by_slot_pool_and_interleaves_passes(tmp_path):
    sweep = sweep_from_dict({"name": "s", "model": "tiny", "passes": 2,
                             "stage": {"kv_cache_mib": 32},
                             "matrix": {"batch": [1, 2], "slot_cores": [1, 2]}})
    groups = plan_tasks([(sweep, expand(sweep), tmp_path)], None)
    assert sorted(g.slot_cores for g in groups) == [1, 2]
    (one,) = [t for g, t in groups.items() if g.slot_cores == 1]
    assert [(t.arm.label, t.pass_no) for t in one] == [
        ("batch=1,slot_cores=1", 1), ("batch=2,slot_cores=1", 1),
        ("batch=2,slot_cores=1", 2), ("batch=1,slot_cores=1", 2)]


def test_replicas_swept_share_one_group_and_interleave(tmp_path):
    sweep = sweep_from_dict({"name": "s", "model": "tiny", "passes": 2,
                             "stage": {"kv_cache_mib": 32}, "placement": {"slot_cores": 1},
                             "matrix": {"replicas": ["per_node", 1]}})
    arms = expand(sweep)
    assert [(a.label, a.replicas) for a in arms] == [("replicas=per_node", "per_node"),
                                                     ("replicas=1", 1)]
    assert arms[0].id != arms[1].id
    (group, tasks), = plan_tasks([(sweep, arms, tmp_path)], None).items()
    assert group.replicas == "per_node"  # one arm at a time, 1 and per_node pass by pass
    assert [(t.arm.label, t.pass_no) for t in tasks] == [
        ("replicas=per_node", 1), ("replicas=1", 1), ("replicas=1", 2), ("replicas=per_node", 2)]


def test_one_replica_keeps_the_arm_id_it_had():
    from omni_ray.config.grid import arm_id

    sweep = sweep_from_dict({"name": "s", "model": "tiny", "stage": {"kv_cache_mib": 32}})
    (arm,) = expand(sweep)
    assert arm.id == arm_id("s", arm.stage, arm.workload, None)
    assert arm.id != arm_id("s", arm.stage, arm.workload, None, "per_node")


PIPE = {"name": "pipe", "model": "tiny", "placement": {"slot_cores": 2},
        "workload": {"prompt_len": 16, "output_len": 8},
        "stages": [{"kv_cache_mib": 16, "node": 0}, {"kv_cache_mib": 16}],
        "matrix": {"stages[1].node": [0, 1]}}


def _slot(ray_node: str, numa: int):
    from omni_ray.placement.schedule import SlotRef

    return SlotRef(ray_node, f"omni_slot_c1_n{numa}s0", label=f"{ray_node}/n{numa}s0")


def test_a_pipeline_naming_nodes_gets_a_slot_on_each_on_one_ray_node(tmp_path):
    from omni_ray.placement.coordinator import arm_nodes, pipeline_slots

    same, other = expand(sweep_from_dict(PIPE))
    assert (arm_nodes(same), arm_nodes(other)) == ([0], [0, 1])
    # a pipeline naming its nodes runs one arm at a time, as replicas do
    (group,) = plan_tasks([(sweep_from_dict(PIPE), [same, other], tmp_path)], None)
    assert group.replicas == "per_node"
    # ray node "a" has only NUMA node 0; "b" has both: the pipeline goes to "b"
    slots = [_slot("a", 0), _slot("b", 0), _slot("b", 1)]
    assert [s.label for s in pipeline_slots("f.yaml", other, slots)] == ["b/n0s0", "b/n1s0"]
    assert [s.label for s in pipeline_slots("f.yaml", same, slots)] == ["a/n0s0"]


def test_stages_on_a_missing_node_or_on_two_ray_nodes_are_refused_naming_the_stage():
    import pytest

    from omni_ray.errors import ConfigError
    from omni_ray.placement.coordinator import pipeline_slots

    other = expand(sweep_from_dict(PIPE))[1]
    with pytest.raises(ConfigError, match=r"^f\.yaml: stages\[1\]\.node: no Ray node has a slot "
                                          r"on NUMA node 1 \(nodes with slots: \[0\];.*got 1$"):
        pipeline_slots("f.yaml", other, [_slot("a", 0)])
    with pytest.raises(ConfigError, match=r"^f\.yaml: stages\[1\]\.node: NUMA nodes \[0, 1\] are "
                                          r"on different Ray nodes; .* got 1$"):
        pipeline_slots("f.yaml", other, [_slot("a", 0), _slot("b", 1)])


def test_replicated_arm_passes_count_as_running_while_they_run():
    class Recording:
        def __init__(self):
            self.values = []

        def set(self, value, tags):
            self.values.append((tags["sweep"], value))

    coord = Coordinator(run_id="r", allow_busy=False, events=Events())
    coord._arms_running = Recording()
    with coord._running_replicated("rep"):
        assert coord._arms_running.values == [("rep", 1)]
    assert coord._arms_running.values[-1] == ("rep", 0)
