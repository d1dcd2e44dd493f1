"""The pair launcher's turn-taking against two stand-in engine processes (tiny Python scripts
that act as runner.take_turns does: wait for k.go, write k.done.json, exit after the last turn).
The side that finishes its last turn first must not end the pair while the other side's last
turn still runs."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import omni_ray.engine.pairs as pairs
from omni_ray.config import StageConfig, WorkloadConfig
from omni_ray.engines.request import EngineRequest

SIDE = """
import json, os, sys, time
d, n, turn_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
print("omni-ray phase: waiting", flush=True)
for k in range(n):
    while not os.path.exists(f"{d}/{k}.go"):
        time.sleep(0.002)
    t0 = time.time(); time.sleep(turn_s)
    json.dump({"turn": k, "measured_from": t0, "measured_to": time.time()},
              open(f"{d}/{k}.done.json.tmp", "w"))
    os.replace(f"{d}/{k}.done.json.tmp", f"{d}/{k}.done.json")
"""


def test_turns_alternate_and_the_last_turn_is_not_cut(tmp_path, monkeypatch):
    def fake_launch(req, workdir, name, *, timeout_s, warm_start, on_poll):
        import subprocess

        turn_s = 0.2 if name.endswith(".a") else 0.01  # b ends long before a's last turn
        with open(workdir / f"{name}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-c", SIDE, req.turns_dir, str(req.turns),
                                     str(turn_s)], stdout=log)
            on_poll(proc.pid)
            proc.wait()
        return {"status": "ok", "returncode": proc.returncode}

    monkeypatch.setattr(pairs, "launch_arm", fake_launch)
    req = EngineRequest(stage=StageConfig(model="tiny", kv_cache_mib=16),
                        workload=WorkloadConfig())
    out = pairs.launch_pair((req, req), tmp_path, "x", pairs=3, timeout_s=60)
    assert out["status"] == "ok", out.get("error")
    assert out["order"] == [[0, 0], [0, 1], [1, 1], [1, 0], [2, 0], [2, 1]]
    turns = {s: [json.loads((tmp_path / f"x.{s}.turns" / f"{k}.done.json").read_text())
                 for k in range(3)] for s in ("a", "b")}
    runs = sorted([(t["measured_from"], t["measured_to"], s) for s, ts in turns.items()
                   for t in ts])
    assert [s for *_, s in runs] == ["a", "b", "b", "a", "a", "b"]
    assert all(x[1] <= y[0] for x, y in zip(runs, runs[1:]))  # never two turns at once


def test_turn_order_alternates_who_goes_first():
    assert pairs.turn_order(2) == [(0, 0), (0, 1), (1, 1), (1, 0)]


def test_the_side_that_failed_is_named_not_the_one_ended_for_it(tmp_path, monkeypatch):
    """b dies in its first turn while the launcher waits for it; a, waiting for its next
    turn, is killed: the error names b."""
    def fake_launch(req, workdir, name, *, timeout_s, warm_start, on_poll):
        import subprocess

        script = SIDE if name.endswith(".a") else (
            "import sys, os, time\nprint('omni-ray phase: waiting', flush=True)\n"
            "d = sys.argv[1]\nwhile not os.path.exists(f'{d}/0.go'): time.sleep(0.002)\n"
            "sys.exit(3)\n")
        with open(workdir / f"{name}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-c", script, req.turns_dir, str(req.turns),
                                     "0.01"], stdout=log, start_new_session=True)
            on_poll(proc.pid)
            proc.wait()
        return ({"status": "ok"} if proc.returncode == 0 else
                {"status": "failed", "error": f"exit {proc.returncode}"})

    monkeypatch.setattr(pairs, "launch_arm", fake_launch)
    req = EngineRequest(stage=StageConfig(model="tiny", kv_cache_mib=16),
                        workload=WorkloadConfig())
    out = pairs.launch_pair((req, req), tmp_path, "x", pairs=3, timeout_s=60)
    assert out["status"] == "failed"
    assert out["error"].startswith("side b (tiny, vllm): exit 3"), out["error"]
    assert out["order"] == [[0, 0]]
