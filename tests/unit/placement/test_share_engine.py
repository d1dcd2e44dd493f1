"""Arms whose stage configs are equal share one engine start (placement.share_engine): which
arm passes go together, and how one engine's result becomes one record per arm."""

from __future__ import annotations

import pytest

from omni_ray.config import expand, sweep_from_dict
from omni_ray.engines.request import EngineRequest
from omni_ray.errors import ConfigError
from omni_ray.placement.coordinator import Task, plan_tasks, share_key, split_shared
from omni_ray.placement.schedule import bundles


def _tasks(tmp_path, **fields):
    base = {"name": "s", "model": "tiny", "passes": 2, "stage": {"kv_cache_mib": 32},
            "placement": {"slot_cores": 1}}
    sweep = sweep_from_dict(base | fields)
    (tasks,) = plan_tasks([(sweep, expand(sweep), tmp_path)], None).values()
    return tasks


def _labels(groups):
    return [[(t.arm.label, t.pass_no) for t in b] for b in groups]


def test_bundles_keep_the_first_ones_place_and_the_order():
    assert bundles([1, 2, 3, 4, 5, 6], lambda x: None if x == 5 else x % 2) == [
        [1, 3], [2, 4, 6], [5]]
    assert bundles([], lambda x: x) == []


def test_arms_differing_only_in_workload_share_per_pass(tmp_path):
    tasks = _tasks(tmp_path, matrix={"kv_cache_mib": [32, 64], "prompt_len": [8, 16]})
    assert _labels(bundles(tasks, share_key)) == [
        [("kv_cache_mib=32,prompt_len=8", 1), ("kv_cache_mib=32,prompt_len=16", 1)],
        [("kv_cache_mib=64,prompt_len=8", 1), ("kv_cache_mib=64,prompt_len=16", 1)],
        # pass 2 starts at the second arm (interleaved): its bundle leads, the first follows
        [("kv_cache_mib=32,prompt_len=16", 2), ("kv_cache_mib=32,prompt_len=8", 2)],
        [("kv_cache_mib=64,prompt_len=8", 2), ("kv_cache_mib=64,prompt_len=16", 2)]]


@pytest.mark.parametrize("fields", [
    {"placement": {"slot_cores": 1, "share_engine": False}},  # turned off: today's way
    {"stage": {"engine": "transformers"}},  # its start is not vLLM's 20-40 s
])
def test_no_sharing_when_off_or_not_vllm(tmp_path, fields):
    tasks = _tasks(tmp_path, matrix={"prompt_len": [8, 16]}, **fields)
    assert len(tasks) == 4 and all(len(b) == 1 for b in bundles(tasks, share_key))


def test_serving_and_offline_arms_never_share(tmp_path):
    sweep = sweep_from_dict({"name": "s", "model": "tiny", "stage": {"kv_cache_mib": 32}})
    (arm,) = expand(sweep)
    serving = sweep_from_dict({"name": "s", "model": "tiny", "stage": {"kv_cache_mib": 32},
                               "workload": {"mode": "serving"}})
    (sarm,) = expand(serving)
    assert share_key(Task(sweep, arm, 1, tmp_path)) != share_key(Task(serving, sarm, 1, tmp_path))


def test_one_result_per_arm_saying_whose_start_it_shares(tmp_path):
    tasks = _tasks(tmp_path, passes=1, matrix={"prompt_len": [8, 16, 32]})
    result = {"status": "ok", "measurements": {"ready_s": 9.0, "decode_tok_s": 1.0},
              "pinning": {"violations": []}, "memory": {"peak": 1}, "log_path": "x.log",
              "wall_s": 20.0, "shared": [
                  {"status": "ok", "measurements": {"decode_tok_s": 2.0}},
                  {"status": "failed", "error": "boom", "measurements": {}}]}
    first, second, third = split_shared(tasks, result)
    assert "shared" not in first and first["measurements"]["ready_s"] == 9.0
    assert second["measurements"] == {"decode_tok_s": 2.0} and second["memory"] == {"peak": 1}
    assert second["log_path"] == "x.log" and (third["status"], third["error"]) == ("failed", "boom")
    ids = [t.arm.id for t in tasks]
    for k, res in enumerate((first, second, third)):
        assert res["shared_engine"] == {"started_by": ids[0], "arms": ids, "position": k,
                                        "started_by_label": tasks[0].arm.label}
    assert split_shared(tasks[:1], {"status": "ok"}) == [{"status": "ok"}]  # alone: as before


def test_an_engine_that_died_fails_the_arms_it_never_reached(tmp_path):
    tasks = _tasks(tmp_path, passes=1, matrix={"prompt_len": [8, 16]})
    _, second = split_shared(tasks, {"status": "failed", "error": "engine process killed"})
    assert second["status"] == "failed"
    assert second["error"].endswith("ended before this arm ran: engine process killed")


def test_a_pinning_violation_fails_every_arm_of_the_start(tmp_path):
    tasks = _tasks(tmp_path, passes=1, matrix={"prompt_len": [8, 16]})
    bad = {"status": "failed", "error": "pinning: 1 thread(s) outside CPUs 0",
           "pinning": {"violations": ["tid 7 on 1"]}, "measurements": {},
           "shared": [{"status": "ok", "measurements": {}}]}
    _, second = split_shared(tasks, bad)
    assert (second["status"], second["error"]) == ("failed", "pinning: 1 thread(s) outside CPUs 0")


def test_the_request_carries_the_sharing_workloads(tmp_path):
    a, b = (t.arm for t in _tasks(tmp_path, passes=1, matrix={"prompt_len": [8, 16]}))
    req = EngineRequest(stage=a.stage, workload=a.workload, then=(b.workload,))
    back = EngineRequest.from_dict(req.to_dict())
    assert back == req and back.then[0].prompt_len == 16
    serving = sweep_from_dict({"name": "s", "model": "tiny", "stage": {"kv_cache_mib": 32},
                               "workload": {"mode": "serving"}})
    with pytest.raises(ConfigError, match=r"then\[0\]\.mode: must be the first workload's"):
        EngineRequest(stage=a.stage, workload=a.workload, then=(expand(serving)[0].workload,))
