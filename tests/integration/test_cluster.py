"""An existing Ray cluster (`ray start --head` advertising this node's slots): a sweep joins it
with ``address=``, and `ray job submit -- omni-ray sweep ...` runs one through the job API."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import omni_ray

pytestmark = pytest.mark.integration
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head():
    # Ray 2.60 authenticates clusters made by `ray start` only when every side says so and a
    # token exists (the README's cluster recipe does the same).
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "token")
    subprocess.run([RAY, "get-auth-token", "--generate"], check=True, capture_output=True)
    slots = subprocess.run([sys.executable, "-m", "omni_ray.cli", "topology", "--slot-cores",
                            "1", "--ray-resources"], capture_output=True, text=True, check=True)
    port, dash = free_port(), free_port()
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2",
                    f"--resources={slots.stdout.strip()}", "--include-dashboard=true",
                    "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                    "--disable-usage-stats"], check=True, capture_output=True, timeout=120)
    yield f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}"
    subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
    mp.undo()


def sweep_file(tmp_path: Path, name: str) -> Path:
    cfg = {"name": name, "model": "tiny", "passes": 1, "placement": {"slot_cores": 1},
           "stage": {"kv_cache_mib": 32, "max_model_len": 256},
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 0, "repeats": 1}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_sweep_joins_an_existing_cluster(head, tmp_path):
    import ray

    address, _ = head
    report = omni_ray.run_sweep(str(sweep_file(tmp_path, "joined")), address=address,
                                out=tmp_path, allow_busy=True)
    ray.shutdown()
    (rec,) = report.records
    assert rec["status"] == "ok", rec.get("error")
    assert rec["slot"]["slot"]["name"] in ("n0s0", "n0s1")


def test_ray_job_submit_runs_a_sweep(head, tmp_path):
    address, dashboard = head
    out = tmp_path / "res"
    job = subprocess.run(
        [RAY, "job", "submit", "--address", dashboard, "--", sys.executable, "-m",
         "omni_ray.cli", "sweep", str(sweep_file(tmp_path, "submitted")), "--address", "auto",
         "--out", str(out), "--allow-busy"],
        capture_output=True, text=True, timeout=400)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    (rec_path,) = out.glob("submitted/*/*.p1.json")
    assert json.loads(rec_path.read_text())["status"] == "ok"
