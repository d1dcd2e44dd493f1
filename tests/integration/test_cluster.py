"""An existing Ray cluster (`ray start --head` advertising this node's slots): a sweep joins it
with ``address=``, and `ray job submit -- omni-ray sweep ...` runs one through the job API."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from omni_ray.topology import allowed_cpus, local_slots

pytestmark = pytest.mark.integration
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ray 2.60 authenticates clusters made by `ray start` only when every side says so and a token
# exists (the README's cluster recipe does the same). Ray reads RAY_AUTH_MODE once, when it is
# imported, and this pytest process imported it while collecting; so every side of the cluster,
# the joining sweep included, is its own process started with the variables set, as from a
# shell. The token comes from the environment (never ~/.ray/auth_token, a user's), and the
# cluster lives in its own temp dir (short: Ray's socket paths must fit 107 bytes).
def _env() -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_TMPDIR": tempfile.mkdtemp(prefix="omc-", dir="/tmp")}


ENV = _env()


def _stop(temp_dir: str) -> None:
    """Stop the cluster this module started, and nothing else: every process whose command line
    names its temp dir (`ray stop` would stop every Ray on the host, a user's too)."""
    ours = [p for p in psutil.process_iter(["cmdline"])
            if any(temp_dir in arg for arg in (p.info["cmdline"] or []))]
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(ours, timeout=20)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


@pytest.fixture(scope="module")
def head():
    slots = subprocess.run([sys.executable, "-m", "omni_ray.cli", "topology", "--slot-cores",
                            "1", "--ray-resources"], capture_output=True, text=True, check=True)
    port, dash = free_port(), free_port()
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}",
                        f"--num-cpus={len(allowed_cpus())}",  # this machine's, as a sweep's Ray
                        f"--resources={slots.stdout.strip()}", "--include-dashboard=true",
                        "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                        # its own agent port: Ray's default, 52365, is another Ray's on a host
                        # that already runs one (its job agent then never comes up)
                        f"--dashboard-agent-listen-port={free_port()}",
                        f"--temp-dir={ENV['RAY_TMPDIR']}", "--disable-usage-stats"],
                       check=True, capture_output=True, timeout=120, env=ENV)
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}"
    finally:
        _stop(ENV["RAY_TMPDIR"])
        shutil.rmtree(ENV["RAY_TMPDIR"], ignore_errors=True)


def sweep_file(tmp_path: Path, name: str) -> Path:
    cfg = {"name": name, "model": "tiny", "passes": 1, "placement": {"slot_cores": 1},
           "stage": {"kv_cache_mib": 32, "max_model_len": 256},
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 0, "repeats": 1}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_sweep_joins_an_existing_cluster(head, tmp_path):
    address, _ = head
    code = ("import json, sys, omni_ray\n"
            "r = omni_ray.run_sweep(sys.argv[1], address=sys.argv[2], out=sys.argv[3],"
            " allow_busy=True)\n"
            "print(json.dumps(r.records))")
    run = subprocess.run([sys.executable, "-c", code, str(sweep_file(tmp_path, "joined")),
                          address, str(tmp_path)], capture_output=True, text=True, timeout=400,
                         env=ENV)
    assert run.returncode == 0, run.stderr[-3000:]
    (rec,) = json.loads(run.stdout.strip().splitlines()[-1])
    assert rec["status"] == "ok", rec.get("error")
    assert rec["slot"]["slot"]["name"] in {s.name for s in local_slots(1)}


def test_ray_job_submit_runs_a_sweep(head, tmp_path):
    address, dashboard = head
    out = tmp_path / "res"
    cmd = [RAY, "job", "submit", "--address", dashboard, "--", sys.executable, "-m",
           "omni_ray.cli", "sweep", str(sweep_file(tmp_path, "submitted")), "--address", "auto",
           "--out", str(out), "--allow-busy"]
    deadline = time.monotonic() + 120
    while True:  # the head's job agent comes up some seconds after `ray start` returns
        job = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=ENV)
        if "No available agent to submit job" not in job.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    (rec_path,) = out.glob("submitted/*/*.p1.json")
    assert json.loads(rec_path.read_text())["status"] == "ok"
