"""The stage actor: holds one slot, pinned there, and runs one arm's engine in a fresh process.

The actor pins every one of its threads to the slot's CPUs and binds its memory to the slot's
node before it starts anything, so the engine process it launches (and vLLM's EngineCore and
workers under it) inherit both; the engine runner pins again and reads the result back from
every thread of its tree. One actor per arm and pass, named for the dashboard.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

import ray

from omni_ray.engine.launch import EngineLog, launch_arm
from omni_ray.engine.pairs import launch_pair
from omni_ray.engine.pipeline import launch_pipeline
from omni_ray.engines.request import EngineRequest
from omni_ray.measure.cpuload import (SLOT_MAX_AVG, busy_between, check_idle, parse_proc_stat,
                                      read_proc_stat)
from omni_ray.measure.pinning import bind_slot_memory, pin_all_threads
from omni_ray.measure.sampler import tree_rss
from omni_ray.topology import detect, make_slots

# The coordinator's tags, then the actor's own: where the slot is.
METRIC_TAGS = ("sweep", "arm", "pass", "slot", "numa_node", "ray_node")


def actor_name(sweep: str, arm_id: str, pass_no: int, slot: str) -> str:
    return f"omni-stage:{sweep}:{arm_id}:p{pass_no}:{slot}"


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=2)
class StageActor:
    def __init__(self, slot_name: str, slot_cores: int | None, tags: dict[str, str]) -> None:
        from ray.util.metrics import Gauge

        self.topology = detect()
        by_name = {s.name: s for s in make_slots(self.topology, slot_cores)}
        self.slot = by_name[slot_name]
        self.tags = tags | {"numa_node": str(self.slot.node),
                            "ray_node": ray.get_runtime_context().get_node_id()[:12]}
        pin_all_threads(self.slot.cpus)
        self.membind = bind_slot_memory(self.slot.node, self.slot.cpus,
                                        simulated=self.topology.simulated).to_dict()

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, tag_keys=METRIC_TAGS)

        self._rss = gauge("omni_stage_rss_anon_mb", "RssAnon of the stage's engine tree (MiB)")
        self._peak = gauge("omni_stage_rss_peak_mb",
                           "highest RssAnon of the engine tree so far in this arm (MiB)")
        self._busy = gauge("omni_stage_busy_fraction",
                           "busy fraction of the slot's CPUs since the last reading (0..1)")
        # the engine's progress lines (engine/launch.live_figures), by figure
        self._live = {
            "decode_tok_s": gauge("omni_stage_decode_tok_s",
                                  "decode (serving: output) tokens/s of the last window"),
            "prefill_tok_s": gauge("omni_stage_prefill_tok_s",
                                   "prefill (serving: prompt) tokens/s of the last window"),
            "kv_tokens_used": gauge("omni_stage_kv_tokens_used",
                                    "KV cache tokens in use (vLLM's own stats)"),
            "kv_tokens_budget": gauge("omni_stage_kv_tokens_budget",
                                      "KV cache tokens the engine allocated"),
        }
        self._said: set[str] = set()  # the live figures the engine has said in this arm
        self._last_poll = 0.0
        self._engine_pids: tuple[int, ...] = ()
        self._rss_now: float | None = None
        self._rss_peak = 0.0
        self._stat: dict | None = None
        self._log: EngineLog | None = None
        self._go_file: Path | None = None

    def where(self) -> dict:
        """Where this arm runs: the Ray node (id, host), the NUMA node and slot, the memory
        binding, and the topology they come from (``source: simulated`` for simulated sockets)."""
        return {"host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id(),
                "numa_node": self.slot.node, "simulated": self.topology.simulated,
                "actor_pid": os.getpid(), "slot": self.slot.to_dict(), "membind": self.membind,
                "topology": self.topology.to_dict()}

    def _poll(self, *pids: int) -> None:
        """Every launcher poll: the running engine processes (a pipeline's stages: several)."""
        self._engine_pids = pids
        now = time.monotonic()
        if now - self._last_poll >= 1.0:
            self._last_poll = now
            self._tail()
            self._rss_now = sum(tree_rss(pid)[0] for pid in pids)
            self._rss_peak = max(self._rss_peak, self._rss_now)
            self._rss.set(self._rss_now, tags=self.tags)
            self._peak.set(self._rss_peak, tags=self.tags)
            stat = parse_proc_stat(read_proc_stat())
            if self._stat is not None:
                busy = busy_between(self._stat, stat, self.slot.cpus)
                self._busy.set(sum(busy.values()) / len(busy), tags=self.tags)
            self._stat = stat

    def _tail(self) -> None:
        """The engine log's new lines: its phase, and its progress lines' figures into the
        live gauges (called by the run's poll and by status())."""
        if self._log is None:
            return
        for fig, value in self._log.read().items():
            self._live[fig].set(value, tags=self.tags)
            self._said.add(fig)

    def status(self) -> dict:
        """The running arm's phase (from the runner's phase lines in its log) and RSS now."""
        self._tail()
        return {"phase": self._log.phase if self._log else "starting", "rss_mb": self._rss_now}

    def preflight(self, window_s: float = 0.5) -> dict:
        return check_idle(self.slot.cpus, window_s, max_avg=SLOT_MAX_AVG).to_dict()

    def run(self, req: EngineRequest, workdir: str, name: str, timeout_s: float,
            warm_start: bool, barrier: bool = False) -> dict:
        # the bandwidth probe's cache: this run's, this sitting's (a --resume probes again)
        sitting = ray.get_runtime_context().get_job_id()
        req = dataclasses.replace(req, cpus=tuple(self.slot.cpus), node=self.slot.node,
                                  simulated=self.topology.simulated,
                                  probe_cache_dir=str(Path(workdir) / "bandwidth" / sitting))
        if barrier:  # a replica: measure when go() says every one is ready
            self._go_file = Path(workdir) / f"{name}.go"
            req = dataclasses.replace(req, go_file=str(self._go_file), go_timeout_s=timeout_s)
        log = f"{name}.s{len(req.stages) - 1}.log" if req.stages else f"{name}.log"  # last stage
        self._log = EngineLog(Path(workdir) / log)
        self._rss_peak, self._stat, self._said = 0.0, None, set()
        if req.stages:  # a pipeline: one engine per stage, on its share of this slot's CPUs
            result = launch_pipeline(req, Path(workdir), name, timeout_s=timeout_s,
                                     on_poll=self._poll)
        else:
            result = launch_arm(req, Path(workdir), name, timeout_s=timeout_s,
                                warm_start=warm_start, on_poll=self._poll)
        self._tail()  # the last window's lines
        m = result.get("measurements") or {}
        for fig in ("decode_tok_s", "prefill_tok_s"):  # an engine that said no window
            if fig not in self._said and m.get(fig) is not None:  # (llama-bench): its end
                self._live[fig].set(m[fig], tags=self.tags)
        self._engine_pids = ()
        return result

    def run_pair(self, reqs: tuple[EngineRequest, EngineRequest], workdir: str, name: str,
                 timeout_s: float, pairs: int) -> dict:
        """A paired comparison (engine/pairs.py): both arms' engines on this slot, in turns."""
        reqs = tuple(dataclasses.replace(r, cpus=tuple(self.slot.cpus), node=self.slot.node,
                                         simulated=self.topology.simulated) for r in reqs)
        self._log = EngineLog(Path(workdir) / f"{name}.a.log")
        self._rss_peak, self._stat, self._said = 0.0, None, set()
        result = launch_pair(reqs, Path(workdir), name, pairs=pairs, timeout_s=timeout_s,
                             on_poll=self._poll)
        self._engine_pids = ()
        return result

    def go(self) -> None:
        """Let a replica's engine, waiting after load, start its workload (``runner.wait_for_go``)."""
        if self._go_file is not None:
            self._go_file.parent.mkdir(parents=True, exist_ok=True)
            self._go_file.touch()

    def stop(self) -> None:
        """Kill the running engines' process groups (Ctrl-C of the sweep)."""
        import signal

        for pid in self._engine_pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
