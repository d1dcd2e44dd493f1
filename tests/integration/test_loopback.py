"""A local sweep's Ray is closed by default: its node address, its Prometheus targets and every
socket its processes listen on are loopback. The sweep runs in its own interpreter with its own
Ray temp dir and token (nothing in ~/.ray), and looks at the Ray it started while an arm runs."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile

import pytest

from omni_ray.topology.addresses import is_loopback

pytestmark = pytest.mark.integration

# Runs inside the sweep's process: when the arm starts, record what that Ray shows.
DRIVER = r"""
import json, os, sys
from pathlib import Path
import psutil, ray
import omni_ray
from omni_ray import events

seen = {}
progress = []
def look(event):
    if isinstance(event, events.ArmProgress):
        progress.append([event.slot, event.phase, event.rss_mb])
    if not isinstance(event, events.ArmStarted) or seen:
        return
    seen["nodes"] = [n["NodeManagerAddress"] for n in ray.nodes()]
    (sd,) = Path(os.environ["RAY_TMPDIR"]).glob("ray/session_2*/prom_metrics_service_discovery.json")
    seen["targets"] = [t for group in json.loads(sd.read_text()) for t in group["targets"]]
    me = psutil.Process()
    seen["listening"] = []
    for p in [me] + me.children(recursive=True):
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:
            continue
        seen["listening"] += [[p.name(), c.laddr.ip, c.laddr.port] for c in conns
                              if c.status == psutil.CONN_LISTEN]

# long enough to be seen measuring: the coordinator asks for phase and RSS every 2 s, and
# tiny's engine now loads in about that (a shorter arm was seen only probing)
cfg = {"name": "closed", "model": "tiny", "passes": 1, "placement": {"slot_cores": 1},
       "stage": {"kv_cache_mib": 32, "max_model_len": 512},
       "workload": {"prompt_len": 16, "output_len": 128, "warmup": 0, "repeats": 40}}
report = omni_ray.run_sweep(cfg, out=sys.argv[1], allow_busy=True, on_event=look)
seen["status"] = [r["status"] for r in report.records]
seen["progress"] = progress
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """One sweep, in its own interpreter with its own Ray temp dir (short: Ray's socket paths
    must fit 107 bytes) and token; what it saw, for every test of the module."""
    tmp = tempfile.mkdtemp(prefix="omr-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_TMPDIR": tmp, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    try:
        run = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path_factory.mktemp("res"))],
                             capture_output=True, text=True, timeout=600, env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["status"] == ["ok"]
    return out


def test_a_local_sweeps_ray_listens_on_loopback_only(seen):
    assert seen["nodes"] == ["127.0.0.1"]
    hosts = [t.rsplit(":", 1)[0] for t in seen["targets"]]
    assert hosts and all(h == "127.0.0.1" for h in hosts), seen["targets"]
    names = {name for name, _ip, _port in seen["listening"]}
    assert {"gcs_server", "raylet"} <= names, seen["listening"]
    wide = [entry for entry in seen["listening"] if not is_loopback(entry[1])]
    assert wide == [], wide


def test_the_sweep_reports_each_running_arms_phase_and_rss(seen):
    progress = seen["progress"]
    phases = [phase for _slot, phase, _rss in progress]
    # probing: the slot's bandwidth probe, before the engine loads (measure/bandwidth.py)
    order = {"starting": 0, "probing": 1, "loading": 2, "measuring": 3}
    assert set(phases) <= set(order) and "loading" in phases, phases
    # phases only move forward, and the engine tree's RSS was read while it ran
    assert [order[p] for p in phases] == sorted(order[p] for p in phases)
    assert any(rss and rss > 50 for _slot, _phase, rss in progress), progress
