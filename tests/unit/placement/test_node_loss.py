"""A Ray node lost mid-sweep, and stage actors that die, in the coordinator: Ray is a fake here
(``ray.nodes()``, refs that are ready or not, actors that answer), so each fault is made at a
known point. tests/integration/test_node_loss.py kills a real raylet."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import ray.exceptions

from omni_ray.config import expand, sweep_from_dict
from omni_ray.errors import UserError
from omni_ray.placement import coordinator
from omni_ray.placement.cluster import node_loss
from omni_ray.placement.coordinator import Coordinator, Events, Task
from omni_ray.placement.schedule import Job, Scheduler, SlotRef, slot_pool

RES = "omni_slot_c1_n0s0"
OK = {"status": "ok", "measurements": {"decode_tok_s": 10.0}}


class Ref:
    def __init__(self, value=None, error=None, ready=True):
        self.value, self.error, self.ready = value, error, ready


class FakeRay:
    """What the coordinator asks of Ray; ``on_wait`` runs at every ``ray.wait`` (a fault)."""

    exceptions = ray.exceptions

    def __init__(self, nodes):
        self.node_list, self.on_wait = nodes, lambda: None

    def nodes(self):
        return self.node_list

    def get(self, ref, timeout=None):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs, num_returns=1, timeout=None):
        self.on_wait()
        ready = [r for r in refs if r.ready][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def kill(self, actor):
        pass


def node(node_id, host):
    return {"NodeID": node_id, "Alive": True, "NodeManagerHostname": host,
            "NodeManagerAddress": "", "Labels": {}, "Resources": {RES: 1.0}}


class FakeActor:
    def __init__(self, slot, run):
        def answers(value):
            return SimpleNamespace(remote=lambda *a, **k: Ref(value))

        self.preflight = answers({"ok": True, "message": ""})
        self.where = answers({"node_id": slot.node_id, "numa_node": slot.numa_node})
        self.status = answers({"phase": "loading", "rss_mb": None})
        self.go = answers(None)
        self.run = SimpleNamespace(remote=lambda *a, **k: run)


@pytest.fixture
def world(monkeypatch, tmp_path):
    """Nodes A (host ha) and B (host hb), one slot each; ``runs[node_id]`` is the ref an arm
    dispatched there gets; ``dispatched`` lists (arm pass, node id)."""
    fake = FakeRay([node("A" * 12, "ha"), node("B" * 12, "hb")])
    w = SimpleNamespace(ray=fake, runs={}, dispatched=[])

    def stage_actor(task, slot, slot_cores, suffix=""):
        w.dispatched.append((task.name + suffix, slot.node_id))
        return FakeActor(slot, w.runs[slot.node_id + suffix])

    monkeypatch.setattr(coordinator, "ray", fake)
    monkeypatch.setattr(coordinator, "_stage_actor", stage_actor)
    monkeypatch.setattr(coordinator, "require_capacity", lambda cores: {})
    monkeypatch.setattr(coordinator, "NODE_POLL_S", 0.0)
    return w


def tasks(tmp_path, n):
    sweep = sweep_from_dict({"name": "s", "model": "tiny", "placement": {"slot_cores": 1},
                             "matrix": {"kv_cache_mib": [32, 40, 48][:n]}})
    return [Task(sweep, arm, 1, tmp_path) for arm in expand(sweep)]


def engine_log(task_name, tmp_path, text="omni-ray phase: loading\nweights 3/7\n"):
    (tmp_path / "logs").mkdir(exist_ok=True)
    (tmp_path / "logs" / f"{task_name}.log").write_text(text)


def group():
    return coordinator.GroupKey(1, None, None)


def test_a_lost_node_fails_its_arm_takes_no_more_and_the_rest_run_on_the_node_left(world,
                                                                                   tmp_path):
    a, b = "A" * 12, "B" * 12
    world.runs = {a: Ref(OK), b: Ref(ready=False)}  # B's arm would run for ever

    def lose_b():
        world.ray.node_list[1] |= {"Alive": False, "DeathReasonMessage": "raylet killed"}

    world.ray.on_wait = lose_b
    todo = tasks(tmp_path, 3)
    engine_log(todo[1].name, tmp_path)
    coord = Coordinator(run_id="r", allow_busy=False, events=Events())
    coord.run_group(todo, group())

    assert world.dispatched == [(todo[0].name, a), (todo[1].name, b), (todo[2].name, a)]
    recs = {r["arm"]["id"]: r for r in coord.records}
    assert [recs[t.arm.id]["status"] for t in todo] == ["ok", "failed", "ok"]
    lost = recs[todo[1].arm.id]
    assert lost["error"] == (f"Ray node lost (hb  id {b} labels {{}}): dead in Ray's GCS: "
                             "raylet killed; the arm's stage actor and engine were on it")
    assert "weights 3/7" in lost["stderr_tail"]
    assert (tmp_path / f"{todo[1].name}.json").exists()


def test_no_node_left_ends_the_sweep_with_the_cause(world, tmp_path):
    world.ray.node_list = [node("B" * 12, "hb")]
    world.runs = {"B" * 12: Ref(ready=False)}

    def lose_b():
        world.ray.node_list[0]["Alive"] = False

    world.ray.on_wait = lose_b
    todo = tasks(tmp_path, 2)
    coord = Coordinator(run_id="r", allow_busy=False, events=Events())
    with pytest.raises(UserError, match=r"no Ray node left to run on \(Ray node lost \(hb .*"
                                        r"1 arm pass\(es\) not run; .* --resume"):
        coord.run_group(todo, group())
    (rec,) = coord.records  # the arm that ran there is recorded, the other never started
    assert rec["status"] == "failed" and rec["error"].startswith("Ray node lost (hb ")


def test_an_arm_whose_actor_dies_as_it_is_dispatched_runs_again_on_a_slot_left(world, tmp_path):
    a, b = "A" * 12, "B" * 12
    world.runs = {a: Ref(OK)}
    dead = FakeActor(SlotRef(b, RES), None)
    dead.preflight = SimpleNamespace(
        remote=lambda: Ref(error=ray.exceptions.ActorUnschedulableError("node died")))
    make = coordinator._stage_actor

    def stage_actor(task, slot, slot_cores, suffix=""):
        if slot.node_id == b:
            world.ray.node_list[1]["Alive"] = False
            return dead
        return make(task, slot, slot_cores, suffix)

    coordinator._stage_actor = stage_actor  # undone with the rest by the fixture's monkeypatch
    todo = tasks(tmp_path, 2)
    coord = Coordinator(run_id="r", allow_busy=False, events=Events())
    coord.run_group(todo, group())
    assert [r["status"] for r in coord.records] == ["ok", "ok"]
    assert [n for _t, n in world.dispatched] == [a, a]
    assert list(coord.lost) == [b]


def test_a_replica_whose_actor_dies_keeps_its_engine_log_tail(world, tmp_path):
    a, b = "A" * 12, "B" * 12
    world.runs = {a + ":r0": Ref(OK),
                  b + ":r1": Ref(error=ray.exceptions.ActorDiedError())}
    (task,) = tasks(tmp_path, 1)
    engine_log(f"{task.name}.r1", tmp_path, "omni-ray phase: loading\nSegmentation fault\n")
    coord = Coordinator(run_id="r", allow_busy=False, events=Events())
    coord._run_replicas(task, slot_pool(world.ray.nodes(), "omni_slot_c1_"), 1)

    (rec,) = coord.records
    assert rec["status"] == "failed"
    assert rec["error"] == ("replica 1 of 2: stage actor died: The actor died unexpectedly "
                            "before finishing this task.")
    assert "Segmentation fault" in rec["stderr_tail"]
    assert rec["replicas"][1]["log_path"] == str(tmp_path / "logs" / f"{task.name}.r1.log")
    assert rec["replicas"][0]["status"] == "ok"


# --- the scheduler and the node probe, pure ------------------------------------------------

def test_a_dropped_node_gives_no_slot_again():
    a0, a1, b0 = SlotRef("a", RES), SlotRef("a", "omni_slot_c1_n0s1"), SlotRef("b", RES)
    s = Scheduler([Job(i, 1) for i in range(4)], [a0, b0, a1])
    (_j, first), (_k, second) = s.next(), s.next()
    assert (first, second) == (a0, b0)
    s.drop_node("a")
    assert s.free == [] and not s.stranded  # b0 is busy, not lost
    s.done(a0)
    assert s.next() is None  # a0's node is lost: it is not given back
    s.requeue(Job(9, 1))
    s.done(b0)
    assert s.next() == (Job(9, 1), b0)
    s.drop_node("b")
    assert s.stranded


def test_node_loss_reads_ray_and_asks_a_raylet_that_ray_calls_alive():
    assert node_loss(None) == "no longer listed by the cluster"
    assert node_loss({"Alive": False, "DeathReasonMessage": "health check failed"}) == (
        "dead in Ray's GCS: health check failed")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        alive = {"Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port}
        assert node_loss(alive) is None
    # the port is closed now: nothing listens, the host says so
    assert node_loss(alive) == f"its raylet at 127.0.0.1:{port} refuses connections"
    assert node_loss({"Alive": True, "NodeManagerAddress": ""}) is None
