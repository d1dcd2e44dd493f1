"""``--monitor``: a real Prometheus (the host's package) scrapes the sweep's own Ray through
Ray's service-discovery file and has a series of the running arm's RSS; it moves to the next
free port when its port is taken, lives in the run directory and stops with the sweep."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request

import pytest

from omni_ray.monitor import prometheus

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prometheus") is None and
                       not prometheus.DEBIAN_BINARY.is_file(),
                       reason="no prometheus binary: apt-get install prometheus "
                              "(.ci/run installs it)"),
]

# Inside the sweep's process: once Prometheus is up, a thread asks it for the arm's RSS series
# until it has one (or the arm is over).
DRIVER = r"""
import json, sys, threading, time, urllib.parse, urllib.request
import omni_ray
from omni_ray import events

seen = {"rss": [], "lines": []}
done = threading.Event()

def ask(url, session):
    q = f'ray_omni_stage_rss_anon_mb{{SessionName="{session}"}}'
    while not done.is_set():
        try:
            with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
                    {"query": q}), timeout=5) as r:
                result = json.loads(r.read())["data"]["result"]
        except OSError:
            result = []
        if result:
            seen["rss"] = result
            return
        time.sleep(2)

def prometheus_sockets():
    import psutil
    return [[c.laddr.ip, c.laddr.port] for p in psutil.Process().children(recursive=True)
            if p.name() == "prometheus"
            for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]

def look(event):
    if isinstance(event, events.Monitoring):
        seen["sockets"] = prometheus_sockets()
        seen["url"], seen["moved"], seen["graphs"] = event.url, event.moved, event.graphs
        session = urllib.parse.parse_qs(urllib.parse.urlparse(
            event.graphs["omni_stage_rss_anon_mb"]).query)["g0.expr"][0].split('"')[1]
        seen["session"] = session
        threading.Thread(target=ask, args=(event.url, session), daemon=True).start()
    if isinstance(event, events.ArmDone):
        time.sleep(1)

cfg = {"name": "watched", "model": "tiny", "passes": 1, "placement": {"slot_cores": 1},
       "stage": {"kv_cache_mib": 32, "max_model_len": 512},
       "workload": {"prompt_len": 16, "output_len": 128, "warmup": 0, "repeats": 3}}
report = omni_ray.run_sweep(cfg, out=sys.argv[1], allow_busy=True, monitor=True,
                            monitor_port=int(sys.argv[2]), on_event=look)
done.set()
seen["status"] = [r["status"] for r in report.records]
seen["run_dir"] = str(report.out_dirs["watched"])
print(json.dumps(seen))
"""


@pytest.fixture
def ray_env():
    tmp = tempfile.mkdtemp(prefix="omm-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_TMPDIR": tmp, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    yield env
    shutil.rmtree(tmp, ignore_errors=True)


def test_prometheus_has_the_running_arms_rss_series(ray_env, tmp_path):
    with socket.socket() as held:  # the asked-for port is taken: the next free one is used
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        run = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), str(taken)],
                             capture_output=True, text=True, timeout=800, env=ray_env)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["status"] == ["ok"]
    port = seen["url"].rsplit(":", 1)[1]
    assert seen["moved"] == f"port {taken} is in use, Prometheus is on {port}"
    assert seen["url"].startswith("http://127.0.0.1:") and not seen["url"].endswith(f":{taken}")
    assert seen["sockets"] == [["127.0.0.1", int(port)]]  # loopback only
    (series,) = seen["rss"]
    labels = series["metric"]
    assert labels["__name__"] == "ray_omni_stage_rss_anon_mb"
    assert labels["sweep"] == "watched" and labels["SessionName"] == seen["session"]
    assert float(series["value"][1]) > 50  # MiB: an engine tree, not a placeholder
    # its data is in the run directory, and it stopped with the sweep
    assert (tmp_path / "watched").is_dir()
    assert any((p / "data").is_dir() for p in tmp_path.glob("watched/*/prometheus"))
    with pytest.raises(OSError):
        urllib.request.urlopen(seen["url"] + "/-/ready", timeout=3)
