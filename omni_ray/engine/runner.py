"""Run one arm in this (fresh) interpreter: ``python -m omni_ray.engine.runner REQ.json OUT.json``.

The order matters and is the point of this module: set the environment, pin the process and bind
its memory *before* torch, vLLM or a peer engine is imported or started (vLLM's EngineCore and
workers, llama.cpp's llama-bench inherit all three), start the process-tree sampler, then load
the engine, run the workload and read the pinning back from every thread of every process of the
tree. Which engine runs (``omni_ray.engines``) is the request's business; nothing here knows.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from omni_ray.engines import PHASE_MARK, Session, load_engine
from omni_ray.engines.request import EngineRequest
from omni_ray.lifetime import die_with_parent
from omni_ray.measure.cpuload import NeighbourLoad
from omni_ray.measure.pinning import (affinity_tree, bind_slot_memory, normal_priority,
                                      pin_all_threads, violations)
from omni_ray.measure.sampler import TreeSampler, self_rss_anon_mb
from omni_ray.topology.sysfs import format_cpulist

# Kept importable from here for the developer probes (omni_ray.bench) that drive vLLM in-process.
from omni_ray.engines.vllm import (  # noqa: F401
    GREEDY, SERIAL_KERNELS, decode_regime, engine_env, engine_kwargs, run_workload,
    timed_generate)

__all__ = ["PHASE_MARK", "run", "serve", "engine_env", "engine_kwargs"]


class PinningReadback:
    """The pinning read back from every thread of the tree, merged over every call: at ready,
    while an engine's work runs in processes started later (llama-bench), and after the
    workload (a thread moved off the slot while measuring is a violation too). Each violation
    says when it was first seen."""

    def __init__(self, root_pid: int, cpus: list[int] | None) -> None:
        self.root_pid, self.cpus = root_pid, cpus
        self.threads = self.processes = 0
        self.allowed: set[int] = set()
        self.bad: dict[str, str] = {}  # violation -> "when: violation"
        self.when: list[str] = []

    def __call__(self, when: str = "run") -> None:
        tree = affinity_tree(self.root_pid)
        self.threads = max(self.threads, sum(len(t) for t in tree.values()))
        self.processes = max(self.processes, len(tree))
        self.allowed |= {c for t in tree.values() for cs in t.values() for c in cs}
        if self.cpus:
            for v in violations(tree, self.cpus):
                self.bad.setdefault(v, f"{when}: {v}")
        if when not in self.when:
            self.when.append(when)

    def into(self, pinning: dict) -> dict:
        return pinning | {"threads": self.threads, "processes": self.processes,
                          "allowed_cpus": sorted(self.allowed),
                          "violations": list(self.bad.values()), "read_back": self.when}


def wait_for_go(go_file: str, timeout_s: float) -> dict:
    """Replicas of one arm measure together: say "waiting" (the stage actor's status() reads
    it) and wait until ``go_file`` exists, which the actor writes once the coordinator has seen
    every replica waiting; after ``timeout_s`` go anyway, and say so in the figures."""
    print(f"{PHASE_MARK}waiting", flush=True)
    t0 = time.monotonic()
    while not os.path.exists(go_file) and time.monotonic() - t0 < timeout_s:
        time.sleep(0.02)
    went = os.path.exists(go_file)
    print(f"{PHASE_MARK}measuring", flush=True)
    return {"replica_wait_s": time.monotonic() - t0, "replica_go": went}


def run(req: EngineRequest) -> dict:
    """Everything after the environment is set; returns the result dict."""
    import psutil

    from omni_ray.models.build import resolve_model

    me = psutil.Process()
    ld_preload = os.environ.get("LD_PRELOAD", "")  # as it started: vLLM appends its libgomp later
    model_path = str(resolve_model(req.model))
    cpus = list(req.cpus) if req.cpus else None
    pinning: dict = {"requested_cpus": cpus, "node": req.node,
                     "priority": normal_priority()}  # before any thread of the engine starts
    if cpus:
        pinning["pinned_tids"] = len(pin_all_threads(cpus))
    if req.node is not None:
        pinning["membind"] = bind_slot_memory(req.node, cpus or (),
                                              simulated=req.simulated).to_dict()
    readback = PinningReadback(os.getpid(), cpus)
    engine = load_engine(req.engine)()
    # before the sampler and the engine: the probe's buffer is in no figure, its time in no
    # window (ready_s leaves it out); so is what an engine learns once per machine (vLLM: the
    # model class's facts, engines/vllm_modelinfo.py), or the first arm on a machine would
    # measure it and no other arm would
    probe_t0 = time.monotonic()
    probe = slot_probe(engine, req, model_path) if req.bandwidth_probe else None
    warm = getattr(engine, "warm_caches", None)
    caches = warm(req, model_path) if warm is not None else None
    if caches is not None:
        print(f"omni-ray engine caches: {caches}", flush=True)
    probe_s = time.monotonic() - probe_t0

    with TreeSampler(os.getpid()) as sampler:
        sampler.mark("start")
        session = Session(req, model_path, sampler, readback)
        facts = engine.load(session)
        sampler.mark("ready")
        m: dict = {}
        if engine.resident:  # the model is held by this tree now: what "ready" costs
            time.sleep(0.3)
            m.update(
                ready_s=time.time() - me.create_time() - probe_s,
                rss_anon_mb=self_rss_anon_mb(os.getpid()),
                rss_anon_tree_mb=sampler.settled_anon_mb(),
                peak_rss_anon_during_load_mb=sampler.peak_anon_mb("load_start", "ready"),
                engine_pids=sorted(p.pid for p in [me, *me.children(recursive=True)]))
        m.update(facts)
        if ld_preload:
            m["preloaded"] = preloaded(ld_preload)
        if req.go_file:  # a replica: loaded, it measures with the others (then says so)
            m.update(wait_for_go(req.go_file, req.go_timeout_s))
        else:
            session.phase("measuring")
        readback("ready")
        engine_facts = {k: v for k, v in m.items() if k not in START_FIGURES}
        if req.turns:
            m["turns"] = take_turns(engine, session, req)
            readback("end")
        elif req.workload is not None:
            neighbours = NeighbourLoad(os.getpid(), cpus or sorted(os.sched_getaffinity(0)))
            m["measured_from"] = time.time()  # wall clock: replicas' windows are compared
            m.update(engine.run(session))
            m["measured_to"] = time.time()
            m.update(neighbours.stop())
            m.update(speed_of_light(m, probe, req.workload))
            readback("end")  # a thread moved off the slot while measuring
        sampler.mark("end")
        m["peak_rss_anon_mb"] = sampler.peak_anon_mb(None, "end")
        shared = [run_shared(engine, session, k, wl, engine_facts, readback, probe)
                  for k, wl in enumerate(req.then, 1)]
        extra = engine.report()
        del engine
    out = {"status": "ok", "measurements": m, "pinning": readback.into(pinning),
           "memory": sampler.to_dict(), **extra}
    if caches is not None:
        out["engine_caches"] = caches
    if shared:
        out["shared"] = shared
    bad = out["pinning"]["violations"]
    if bad:  # measured off the slot: the figures are not the slot's
        out.update(status="failed", error=f"pinning: {len(bad)} thread(s) "
                   f"outside CPUs {format_cpulist(cpus)}: {bad[0]}")
    return out


def take_turns(engine, session: Session, req: EngineRequest) -> list[dict]:
    """One side of a pair (docs/compare.md): the workload once per turn, when the launcher
    says (``<turns_dir>/<k>.go``); each turn's figures go to ``<k>.done.json`` at once, so the
    launcher can start the other side's turn. The first turn warms up as the workload says, the
    later ones do not (the engine is warm). A turn's neighbour share counts the other side's
    idle engine too: its OpenMP threads spinning on this slot's CPUs would show there."""
    import dataclasses
    from pathlib import Path

    from omni_ray.results.store import write_json_atomic

    turns_dir = Path(req.turns_dir)
    cpus = list(req.cpus) if req.cpus else sorted(os.sched_getaffinity(0))
    out = []
    for k in range(req.turns):
        print(f"{PHASE_MARK}waiting", flush=True)
        go, deadline = turns_dir / f"{k}.go", time.monotonic() + req.go_timeout_s
        while not go.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"turn {k}: no go within {req.go_timeout_s:g} s")
            time.sleep(0.005)
        session.phase("measuring")
        neighbours = NeighbourLoad(os.getpid(), cpus)
        m = {"turn": k, "pid": os.getpid(), "measured_from": time.time()}
        m.update(engine.run(session))
        m["measured_to"] = time.time()
        m.update(neighbours.stop())
        write_json_atomic(turns_dir / f"{k}.done.json", m)
        out.append(m)
        if k == 0:
            wl = session.req.workload
            session.req = dataclasses.replace(session.req,
                                              workload=dataclasses.replace(wl, warmup=0))
    return out


def slot_probe(engine, req: EngineRequest, model_path: str) -> dict | None:
    """The slot's read bandwidth in the regime the arm's decode needs (``measure.bandwidth``):
    the weight bytes a token reads as the engine will hold them (``engine.weight_bytes``)
    against the LLC of the slot's CPUs. None for a pipeline stage (no one weight stream)."""
    from omni_ray.measure.bandwidth import probe_slot
    from omni_ray.measure.speed_of_light import probe_regime
    from omni_ray.topology.caches import detect_llc

    if req.inputs_path is not None or req.workload is None:
        return None
    print(f"{PHASE_MARK}probing", flush=True)
    try:  # a probe never fails an arm: it says why it has no figure
        weight_bytes = getattr(engine, "weight_bytes", None)
        wb = weight_bytes(req, model_path) if weight_bytes else None
        llc = detect_llc()
        llc_bytes = llc.bytes_for(list(req.cpus) if req.cpus else None) if llc else None
        probe = probe_slot(list(req.cpus) if req.cpus else None, probe_regime(wb, llc_bytes),
                           llc_bytes, cache_dir=req.probe_cache_dir,
                           memory_limit_mib=req.stage.memory_limit_mib)
    except Exception as exc:
        traceback.print_exc()
        probe = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    print(f"omni-ray bandwidth probe: {json.dumps({k: probe.get(k) for k in PROBE_LOG})}",
          flush=True)
    return probe


PROBE_LOG = ("regime", "size_bytes", "ceiling_gb_s", "kernel", "cached", "probe_s", "error")


def speed_of_light(m: dict, probe: dict | None, workload) -> dict:
    """The slot's probe (``sol_probe``, ``sol_bandwidth_gb_s``; a probe that failed with its
    error) and, beside a decode figure, its speed-of-light fields (``measure.speed_of_light``)."""
    from omni_ray.measure.speed_of_light import probe_record, sol_fields

    if probe is None:
        return {}
    out: dict = {"sol_probe": probe_record(probe)}
    if probe.get("ceiling_gb_s"):
        out["sol_bandwidth_gb_s"] = float(probe["ceiling_gb_s"])
    if m.get("decode_tok_s") is not None:
        out |= sol_fields(m, probe, getattr(workload, "batch", 1) or 1)
    return out


# What an engine start costs: measured once, in the record of the arm that started it; the
# arms sharing the start (EngineRequest.then) say whose it was instead of copying them.
START_FIGURES = ("ready_s", "import_s", "init_s", "rss_anon_mb", "rss_anon_tree_mb",
                 "peak_rss_anon_during_load_mb")


def run_shared(engine, session: Session, k: int, workload, engine_facts: dict,
               readback: PinningReadback, probe: dict | None = None) -> dict:
    """The ``k``-th arm sharing this engine start: its workload on the engine as the arms
    before it left it. Its measurements are the engine's facts (KV cache, pids; no start
    figures), its workload's figures and the tree's RssAnon peak while it ran (marks
    ``shared<k>_start`` / ``_end`` in the memory trace). A failure is its own."""
    import dataclasses

    session.req = dataclasses.replace(session.req, workload=workload, then=())
    session.phase("measuring")
    start, end = f"shared{k}_start", f"shared{k}_end"
    session.sampler.mark(start)
    cpus = list(session.req.cpus) if session.req.cpus else sorted(os.sched_getaffinity(0))
    neighbours = NeighbourLoad(os.getpid(), cpus)  # its own run's neighbours, as the first arm's
    m = dict(engine_facts, measured_from=time.time())
    try:
        m.update(engine.run(session))
    except Exception as exc:  # recorded; the next sharing arm still runs
        traceback.print_exc()
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                "measurements": m}
    m["measured_to"] = time.time()
    m.update(neighbours.stop())
    m.update(speed_of_light(m, probe, workload))
    readback(f"shared arm {k} end")
    session.sampler.mark(end)
    m["peak_rss_anon_mb"] = session.sampler.peak_anon_mb(start, end)
    return {"status": "ok", "measurements": m}


# What the dynamic loader reads once, when a process starts: set later, they change only the
# children (vLLM does set LD_PRELOAD for its EngineCore; an in-process engine never gets it). A
# stage env that sets one starts the runner again with it (exec_for_loader).
LOADER_VARS = ("LD_PRELOAD", "LD_LIBRARY_PATH")
# In a stage env value: the engine's Python prefix, e.g. {python_prefix}/lib/libiomp5.so for the
# Intel OpenMP runtime the intel-openmp wheel puts in the virtual environment.
PYTHON_PREFIX = "{python_prefix}"


def with_prefix(env: dict[str, str]) -> dict[str, str]:
    return {k: v.replace(PYTHON_PREFIX, sys.prefix) for k, v in env.items()}


def exec_for_loader(env: dict[str, str], argv: list[str]) -> None:
    """Start this process again (same pid, same module and arguments) with ``env``'s loader
    variables, when they differ from the ones it started with; else return."""
    if all(env.get(k, os.environ.get(k)) == os.environ.get(k) for k in LOADER_VARS):
        return
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    cmd = ([sys.executable, "-m", spec.name] if spec is not None and spec.name
           else [sys.executable, sys.argv[0]])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [*cmd, *argv], os.environ | env)


def preloaded(ld_preload: str) -> dict[str, str | None]:
    """Each LD_PRELOAD entry -> the file this process has mapped for it (None: not loaded)."""
    with open("/proc/self/maps") as f:
        mapped = {line.split()[-1] for line in f if "/" in line}
    out = {}
    for entry in (e for e in ld_preload.replace(" ", ":").split(":") if e):
        name = os.path.basename(entry)
        # the loader maps a symlink's target: libtcmalloc_minimal.so.4 -> ...so.4.5.10
        out[entry] = next((p for p in sorted(mapped) if os.path.basename(p) == name
                           or os.path.basename(p).startswith(name + ".")), None)
    return out


def serve(run_fn, argv: list[str] | None = None, adjust=None, typed: bool = True) -> None:
    """``REQ.json OUT.json``: run ``run_fn(req)`` in this fresh process, write its result
    atomically (a failure becomes a result too) and exit. The request is read back as an
    ``EngineRequest`` (``adjust`` may rewrite the plain data first); the environment its
    engine asks for is set before ``run_fn`` imports torch or vLLM. ``typed=False`` hands
    ``run_fn`` the plain data instead (a developer probe with fields of its own)."""
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()  # SIGKILLed when the stage actor that launched it dies
    req_path, out_path = argv
    try:
        with open(req_path) as f:
            data = json.load(f)
        if adjust is not None:
            data = adjust(data)
        req = EngineRequest.from_dict(data)
        env = with_prefix(load_engine(req.engine)().environment(req))
        exec_for_loader(env, argv)  # returns only when the loader already has what env asks
        os.environ.update(env)
        result = run_fn(req if typed else data)
        code = 0
    except BaseException as exc:  # recorded, then the launcher decides; nothing is lost
        traceback.print_exc()
        result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        code = 1
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, default=str)
    os.replace(tmp, out_path)
    sys.stdout.flush()
    # vLLM leaves non-daemon threads and atexit work behind; the result is on disk, so leave now.
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    serve(run, argv)


if __name__ == "__main__":
    main()
