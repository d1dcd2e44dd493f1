"""``--monitor``: a real Prometheus (the host's package) scrapes the sweep's own Ray through
Ray's service-discovery file and has series of the running arm's RSS, decode tokens/s of its
last window and KV tokens in use against the budget; it moves to the next
free port when its port is taken, lives in the run directory and stops with the sweep. While the
arm runs, headless Chromium opens what a person would: the Ray dashboard's Actors page (with the
token in Ray's cookie) and Prometheus' graph of the arm's RSS, screenshots kept in tmp_path."""

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
from pathlib import Path

import pytest

from omni_ray.monitor import prometheus

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prometheus") is None and
                       not prometheus.DEBIAN_BINARY.is_file(),
                       reason="no prometheus binary: apt-get install prometheus "
                              "(.ci/run installs it)"),
]

# Inside the sweep's process: once Prometheus is up, a thread asks it for the arm's RSS series
# until it has one; then it prints READY with the addresses a person would open, and the arm's
# end waits (bounded) until the test's browser has looked (the file argv[3] appears), so the
# dashboard and Prometheus are still there to be seen.
DRIVER = r"""
import json, os, sys, threading, time, urllib.parse, urllib.request
import omni_ray
from omni_ray import events

seen = {"rss": [], "lines": []}
done = threading.Event()

LIVE = ("ray_omni_stage_rss_anon_mb", "ray_omni_stage_rss_peak_mb",
        "ray_omni_stage_busy_fraction", "ray_omni_sweep_arms_running",
        "ray_omni_stage_decode_tok_s", "ray_omni_stage_kv_tokens_used",
        "ray_omni_stage_kv_tokens_budget")

def query(url, q):
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
                {"query": q}), timeout=5) as r:
            return json.loads(r.read())["data"]["result"]
    except OSError:
        return []

def ask(url, session):
    # each series asked again every round and its latest answer kept: the RSS series first
    # appears while the runner probes, before any engine is loaded (28 MiB), and READY must
    # report it as it is once the engine decodes
    live = {}
    while not done.is_set():
        for name in LIVE:
            live[name] = query(url, f'{name}{{SessionName="{session}"}}') or live.get(name)
        if all(live.values()):
            seen["rss"], seen["live"] = live[LIVE[0]], live
            print("READY " + json.dumps({k: seen[k] for k in ("dashboard", "graphs")}),
                  flush=True)
            return
        time.sleep(2)

def prometheus_sockets():
    import psutil
    return [[c.laddr.ip, c.laddr.port] for p in psutil.Process().children(recursive=True)
            if p.name() == "prometheus"
            for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]

def look(event):
    if isinstance(event, events.Started):
        seen["dashboard"] = event.dashboard_url
    if isinstance(event, events.Monitoring):
        seen["sockets"] = prometheus_sockets()
        seen["url"], seen["moved"], seen["graphs"] = event.url, event.moved, event.graphs
        session = urllib.parse.parse_qs(urllib.parse.urlparse(
            event.graphs["omni_stage_rss_anon_mb"]).query)["g0.expr"][0].split('"')[1]
        seen["session"] = session
        threading.Thread(target=ask, args=(event.url, session), daemon=True).start()
    if isinstance(event, events.ArmDone):
        deadline = time.monotonic() + 300
        while seen["rss"] and not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
            time.sleep(0.5)

cfg = {"name": "watched", "model": "tiny", "passes": 1, "placement": {"slot_cores": 1},
       "stage": {"kv_cache_mib": 32, "max_model_len": 512},
       "workload": {"prompt_len": 16, "output_len": 128, "warmup": 0, "repeats": 80}}
report = omni_ray.run_sweep(cfg, out=sys.argv[1], allow_busy=True, monitor=True,
                            monitor_port=int(sys.argv[2]), on_event=look)
done.set()
seen["status"] = [r["status"] for r in report.records]
seen["kv_cache_tokens"] = report.records[0]["measurements"].get("kv_cache_tokens")
seen["run_dir"] = str(report.out_dirs["watched"])
print(json.dumps(seen))
"""

# The Actors page lists actors by name once its table has loaded.
_ACTOR_JS = "document.body.innerText.includes('omni-stage:watched:')"
# Prometheus' graph tab (Debian's build serves the classic UI, drawn with SVG by Rickshaw) has
# drawn a line with this sweep's series in its legend.
_GRAPH_JS = ("document.querySelectorAll('.graph_area svg path').length > 0 && "
             "document.body.innerText.includes('sweep=\"watched\"')")
# Errors of other people's code, not of anything omni-ray serves, each for a stated reason:
FOREIGN_ERRORS = (
    # Ray's dashboard probes a Grafana and a Prometheus of its own configuration (it was given
    # none: ours starts after Ray, on the session's discovery file) and an events API it lacks.
    "/api/grafana_health: Failed to load resource",
    "/api/prometheus_health: Failed to load resource",
    "/api/v0/platform_events: Failed to load resource",
    # Debian's prometheus 2.42 package links the classic UI to Debian's popper.js 2, an ES
    # module loaded as a plain script: a SyntaxError on every page, the graph is unaffected.
    "popper.min.js",
)


def _own(errors: list[str]) -> list[str]:
    return [e for e in errors if not any(f in e for f in FOREIGN_ERRORS)]


def _look_as_a_person(ready: dict, token: str, workdir) -> dict:
    """The dashboard's Actors page (token in Ray's cookie) and the RSS graph, in Chromium."""
    from tests.integration.browser import Browser

    dashboard = ready["dashboard"]
    if not dashboard.startswith("http"):
        dashboard = f"http://{dashboard}"
    with Browser(workdir) as browser:
        actors = browser.open(f"{dashboard}/#/actors", until=_ACTOR_JS, timeout_s=90,
                              cookies={"ray-authentication-token": token},
                              screenshot="dashboard-actors.png")
        graph = browser.open(ready["graphs"]["omni_stage_rss_anon_mb"], until=_GRAPH_JS,
                             timeout_s=60, screenshot="prometheus-rss.png")
    return {"actors": actors, "graph": graph}


@pytest.fixture
def ray_env():
    tmp = tempfile.mkdtemp(prefix="omm-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # Ray exports its metrics every 2 s instead of 10: the window figures of the tiny arm's
    # repeats (some seconds of measuring) reach Prometheus while it still measures
    env |= {"RAY_TMPDIR": tmp, "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_metrics_report_interval_ms": "2000"}
    yield env
    shutil.rmtree(tmp, ignore_errors=True)


def test_prometheus_has_the_running_arms_rss_series(ray_env, tmp_path):
    looked = tmp_path / "looked"
    with socket.socket() as held:  # the asked-for port is taken: the next free one is used
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), str(taken),
                                 str(looked)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=ray_env, cwd=REPO)
        pages = None
        try:
            for line in proc.stdout:
                if line.startswith("READY "):
                    try:
                        pages = _look_as_a_person(json.loads(line[6:]),
                                                  ray_env["RAY_AUTH_TOKEN"], tmp_path)
                    finally:
                        looked.touch()
                    break
            out, err = proc.communicate(timeout=800)
        finally:
            if proc.poll() is None:
                proc.kill()
    run = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
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
    # every live stage series says where it runs; peak >= now; busy is a fraction
    live = {name: result[0] for name, result in seen["live"].items()}
    stage = {k: v for k, v in labels.items() if k in ("arm", "pass", "slot", "numa_node")}
    assert stage["pass"] == "1" and stage["numa_node"] == "0" and labels["ray_node"]
    for name in ("ray_omni_stage_rss_peak_mb", "ray_omni_stage_busy_fraction",
                 "ray_omni_stage_decode_tok_s", "ray_omni_stage_kv_tokens_used",
                 "ray_omni_stage_kv_tokens_budget"):
        assert {k: live[name]["metric"][k] for k in stage} == stage, name
    assert float(live["ray_omni_stage_rss_peak_mb"]["value"][1]) >= 50
    assert 0.0 <= float(live["ray_omni_stage_busy_fraction"]["value"][1]) <= 1.0
    # a decode window measured, and vLLM's KV in use within the budget it allocated (the
    # record's kv_cache_tokens), all while the arm ran (arms running: 1, below)
    value = {name: float(series["value"][1]) for name, series in live.items()}
    assert value["ray_omni_stage_decode_tok_s"] > 0
    assert value["ray_omni_stage_kv_tokens_budget"] == seen["kv_cache_tokens"]
    assert 0 <= value["ray_omni_stage_kv_tokens_used"] <= value["ray_omni_stage_kv_tokens_budget"]
    running = live["ray_omni_sweep_arms_running"]
    assert running["metric"]["sweep"] == "watched" and float(running["value"][1]) == 1
    # its data is in the run directory, and it stopped with the sweep
    assert (tmp_path / "watched").is_dir()
    assert any((p / "data").is_dir() for p in tmp_path.glob("watched/*/prometheus"))
    with pytest.raises(OSError):
        urllib.request.urlopen(seen["url"] + "/-/ready", timeout=3)
    # what a person opens while it runs: the stage actor by name, and the RSS graph drawn
    assert pages is not None, "the sweep never had an RSS series to show"
    actors, graph = pages["actors"], pages["graph"]
    assert actors.value is True, "the Actors page never listed omni-stage:watched:..."
    assert graph.value is True, f"Prometheus never drew the RSS graph ({graph.errors})"
    assert _own(actors.errors) == [] and _own(graph.errors) == [], (actors.errors, graph.errors)
    for page in (actors, graph):
        assert page.screenshot.read_bytes().startswith(b"\x89PNG")


# A sweep's process that starts Prometheus, says its pid, then waits to be killed.
KILLED_DRIVER = r"""
import socket, sys, time
from omni_ray.monitor.prometheus import Prometheus
session, data = sys.argv[1], sys.argv[2]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
prom = Prometheus(session, data, port=port).start()
print(prom.proc.pid, flush=True)
time.sleep(600)
"""


def test_prometheus_stops_when_the_sweep_is_sigkilled(tmp_path):
    import psutil

    session = tmp_path / "session_2026-01-01_00-00-00_000000_1"
    session.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, str(session),
                               str(tmp_path / "prometheus")], stdout=subprocess.PIPE, text=True)
    try:
        prom = psutil.Process(int(driver.stdout.readline()))
        assert prom.name() == "prometheus"
    finally:
        driver.kill()  # no stop(), no atexit: only the kernel can stop it now
        driver.wait()
    prom.wait(timeout=30)  # psutil.TimeoutExpired here: it outlived the sweep
