"""An arm on another arm's engine start measures its own run's neighbours: a process outside
the engine's tree burning the slot's CPU while the arm runs marks that arm, as it would the
first arm (before, a shared arm never carried the during-the-run measure)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types

from omni_ray.config import StageConfig, WorkloadConfig
from omni_ray.engine.runner import run_shared
from omni_ray.engines.request import EngineRequest
from omni_ray.measure.cpuload import contended_during


class Sampler:
    def mark(self, label: str) -> None:
        pass

    def peak_anon_mb(self, start=None, end=None) -> float:
        return 1.0


def test_a_shared_arm_counts_a_neighbour_on_its_cpus():
    cpu = sorted(os.sched_getaffinity(0))[0]
    burn = "import time\nt = time.time()\nwhile time.time() - t < 2.5: pass\n"

    class Engine:  # while it runs, a process outside its tree burns its CPU for 2.5 s
        def run(self, session):
            subprocess.run(["sh", "-c", f"taskset -c {cpu} {sys.executable} -c '{burn}' "
                                         "> /dev/null 2>&1 &"], check=True)
            time.sleep(2.6)
            return {"decode_tok_s": 1.0}

    req = EngineRequest(stage=StageConfig(model="tiny", kv_cache_mib=16),
                        workload=WorkloadConfig(), cpus=(cpu,))
    session = types.SimpleNamespace(req=req, sampler=Sampler(), phase=lambda name: None)
    out = run_shared(Engine(), session, 1, WorkloadConfig(prompt_len=8), {}, lambda w: None)
    m = out["measurements"]
    assert out["status"] == "ok" and m["neighbour_cpu_frac"] is not None
    assert m["neighbour_cpu_frac"] > 0.5 and contended_during(m) is not None
