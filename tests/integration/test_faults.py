"""Faults in a sweep on a real local Ray and real vLLM engines (tiny model): each becomes a
record with its cause, the other arms complete, finished records stay as they were, and
``resume`` runs exactly the arm passes that are not recorded ok.

One run of three sweeps (one pool of one-core slots) holds every fault, so the engine starts stay
few: an engine SIGKILLed mid-arm, its stage actor killed (``ray.kill``) mid-arm, a thread moved
off the slot while the engine runs, an engine over ``stage.memory_limit_mib``, an arm past its
``timeout_s``; and one arm that just runs. The faults are made from outside, as they come: the
test finds the engine by its request file (its own tmp_path, so only processes this test
started) and acts once the engine has logged that it is loading, never after a guessed sleep.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import psutil
import pytest

import omni_ray
from omni_ray.config import expand, sweep_from_dict
from omni_ray.placement.cluster import NAMESPACE
from omni_ray.topology import allowed_cpus
from tests.integration.sweeps import (ARM_TIMEOUT_S, needs_two_slots, phase_seen, sweep,
                                     wait_for)

pytestmark = [pytest.mark.integration, needs_two_slots]

OOM_LIMIT_MIB = 200  # the tiny engine's tree holds ~480 MiB once ready; imports pass 200


def engine_of(run_root: Path, name: str) -> psutil.Process | None:
    """The engine process of arm pass ``name`` under ``run_root`` (its request file's path is on
    its command line), or None before it starts."""
    for req in run_root.glob(f"*/logs/{name}.request.json"):
        for p in psutil.process_iter(["cmdline"]):
            if str(req) in (p.info["cmdline"] or []):
                return p
    return None


def log_of(run_root: Path, name: str) -> Path | None:
    return next(iter(run_root.glob(f"*/logs/{name}.log")), None)


def loading(run_root: Path, name: str) -> bool:
    log = log_of(run_root, name)
    return log is not None and phase_seen(log, "loading")


class Faults:
    """Makes each fault once its engine is loading, on a thread beside the sweep."""

    def __init__(self, root: Path, kill_engine: str, kill_actor: str, move_thread: str):
        self.root, self.done = root / "faults", threading.Event()
        self.plan = {kill_engine: self._kill_engine, kill_actor: self._kill_actor,
                     move_thread: self._move_threads}
        self.made: dict[str, object] = {}
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(name, act), daemon=True)
                        for name, act in self.plan.items()]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        for t in self.threads:
            t.join(timeout=30)

    def _run(self, name, act):
        try:
            while not self.done.is_set():
                if loading(self.root, name):
                    self.made[name] = act(name)
                    return
                self.done.wait(0.1)
        except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
            self.errors.append(exc)

    def _kill_engine(self, name):
        proc = engine_of(self.root, name)
        proc.kill()
        return proc.pid

    def _kill_actor(self, name):
        import ray

        (actor,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith(f"omni-stage:faults:{name.split('.')[0]}:p1:")]
        ray.kill(ray.get_actor(actor, namespace=NAMESPACE))
        return actor

    def _move_threads(self, name):
        """Keep moving every thread of the engine to CPUs outside its slot until its record is
        written (vLLM pins its OpenMP threads once, while loading; this moves them again)."""
        proc = engine_of(self.root, name)
        slot = set(json.loads(next(self.root.glob(f"*/logs/{name}.request.json")).read_text())
                   ["cpus"])
        off = sorted(allowed_cpus() - slot)
        moved = 0
        while not self.done.is_set() and not list(self.root.glob(f"*/{name}.json")):
            with contextlib.suppress(psutil.Error, OSError):
                for t in proc.threads():
                    with contextlib.suppress(OSError):
                        psutil.Process(t.id).cpu_affinity(off)
                        moved += 1
            self.done.wait(0.05)
        return off, moved


def by_arm(records, arms):
    return {label: r for r in records for label, a in arms.items() if r["arm"]["id"] == a.id}


@pytest.mark.timeout(4 * ARM_TIMEOUT_S)  # two runs of two rounds of arms, at worst
def test_faults_are_records_the_rest_completes_and_resume_runs_what_is_missing(local_ray,
                                                                              tmp_path):
    import ray

    faults = sweep("faults", matrix={"kv_cache_mib": [32, 40, 48, 56]})
    oom = sweep("oom", stage={"memory_limit_mib": OOM_LIMIT_MIB})
    slow = sweep("slow", timeout_s=3)  # an engine needs more than 3 s to import vLLM
    arms = {a.label: a for a in expand(sweep_from_dict(faults))}
    killed, dead_actor, moved, ok = (f"{arms[f'kv_cache_mib={m}'].id}.p1"
                                     for m in (32, 40, 48, 56))

    with Faults(tmp_path, killed, dead_actor, moved) as made:
        first = omni_ray.run_sweep([faults, oom, slow], out=tmp_path, allow_busy=True)
    assert not made.errors, made.errors
    assert set(made.made) == {killed, dead_actor, moved}, made.made
    run_dir = first.out_dirs["faults"]
    recs = by_arm(first.records, arms)
    assert len(first.records) == 6 and first.failed == 5

    # the others complete
    assert recs["kv_cache_mib=56"]["status"] == "ok", recs["kv_cache_mib=56"]["error"]
    # an engine SIGKILLed mid-arm
    r = recs["kv_cache_mib=32"]
    assert r["status"] == "failed" and "killed by SIGKILL" in r["error"], r["error"]
    assert "omni-ray phase: loading" in r["stderr_tail"]
    # its stage actor killed mid-arm: the actor-died path, with the engine log's tail
    r = recs["kv_cache_mib=40"]
    assert r["status"] == "failed" and r["error"].startswith("stage actor died: "), r["error"]
    assert "omni-ray phase: loading" in r["stderr_tail"]
    # a thread moved off the slot while the engine ran
    r = recs["kv_cache_mib=48"]
    assert r["status"] == "failed" and r["error"].startswith("pinning: "), r["error"]
    assert r["pinning"]["violations"] and set(r["pinning"]["allowed_cpus"]) - set(
        r["slot"]["slot"]["cpus"])
    # over its memory limit: out of memory, with the peak the launcher saw
    (r,) = [x for x in first.records if x["arm"]["sweep"] == "oom"]
    assert r["status"] == "failed" and r["error"].startswith("out of memory: "), r["error"]
    assert r["memory_limit"]["exceeded"] and r["memory_limit"]["limit_mib"] == OOM_LIMIT_MIB
    assert r["measurements"]["peak_rss_anon_mb"] > OOM_LIMIT_MIB
    # past its timeout_s
    (r,) = [x for x in first.records if x["arm"]["sweep"] == "slow"]
    assert r["status"] == "timeout" and "timeout_s=3" in r["error"]

    # no stage actor of the run outlives it, and Ray is still up (asked of this test's Ray:
    # the state API without an address finds every Ray of the host)
    def no_stage_actor_alive():
        return not [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith("omni-stage:")]
    wait_for(no_stage_actor_alive, 60, "stage actors still alive after the sweep")
    assert ray.is_initialized()

    before = {p.name: p.read_bytes() for p in run_dir.glob("*.p1.json")}
    assert len(before) == 4
    second = omni_ray.run_sweep([faults, oom, slow], out=tmp_path, resume=True, allow_busy=True)
    assert second.out_dirs == first.out_dirs
    # exactly what was missing ran: every pass but the one recorded ok
    assert second.skipped == 1 and len(second.records) == 5
    after = by_arm(second.records, arms)
    assert {label: r["status"] for label, r in after.items()} == {
        "kv_cache_mib=32": "ok", "kv_cache_mib=40": "ok", "kv_cache_mib=48": "ok"}
    assert sorted(r["status"] for r in second.records if r["arm"]["sweep"] != "faults") == [
        "failed", "timeout"]  # what the config makes fail, fails again
    # the finished record is as it was; every failure is kept, unchanged, beside its rerun
    assert (run_dir / f"{ok}.json").read_bytes() == before[f"{ok}.json"]
    for name in (killed, dead_actor, moved):
        now = json.loads((run_dir / f"{name}.json").read_text())
        (earlier,) = now["attempts"]
        assert earlier["status"] == "failed" and earlier["run_id"] == first.run_id
        assert (run_dir / earlier["file"]).read_bytes() == before[f"{name}.json"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["arms"]) == {a.id for a in arms.values()}
