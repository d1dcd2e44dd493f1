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
