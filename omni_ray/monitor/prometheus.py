"""A Prometheus for one sweep: bound to 127.0.0.1, its data in the run directory, stopped with
the sweep, scraping every target Ray lists in ``<session>/prom_metrics_service_discovery.json``.

The binary is the host's (Debian: ``apt-get install prometheus``); nothing is downloaded at run
time. Ray exports a ``ray.util.metrics`` metric ``x`` as ``ray_x``, with a ``SessionName``
label: the graph links select this Ray's session, so another Ray on the same machine (whose
metrics port a default may share) never mixes into them.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from omni_ray.errors import UserError
from omni_ray.lifetime import die_with_parent

DEFAULT_PORT = 9090
DEBIAN_BINARY = Path("/usr/bin/prometheus")  # where Debian's package puts it, if not on PATH
SD_FILE = "prom_metrics_service_discovery.json"
SCRAPE_S = 2  # the engine's RSS gauge moves every second; a 2 s scrape keeps its shape
# omni-ray's metrics (ray.util.metrics names) and their kinds: the stage actor's gauges and the
# coordinator's counter
METRICS = {"omni_stage_rss_anon_mb": "gauge", "omni_stage_rss_peak_mb": "gauge",
           "omni_stage_busy_fraction": "gauge", "omni_stage_decode_tok_s": "gauge",
           "omni_stage_prefill_tok_s": "gauge", "omni_stage_kv_tokens_used": "gauge",
           "omni_stage_kv_tokens_budget": "gauge",
           "omni_sweep_arms_done": "counter", "omni_sweep_arms_running": "gauge"}
INSTALL_HINT = ("--monitor: prometheus is not installed; install Debian's package: "
                "apt-get install prometheus (nothing is downloaded at run time)")


def find_prometheus() -> str:
    """The prometheus binary on PATH (or Debian's /usr/bin/prometheus), else a UserError."""
    found = shutil.which("prometheus") or (
        str(DEBIAN_BINARY) if DEBIAN_BINARY.is_file() else None)
    if not found:
        raise UserError(INSTALL_HINT)
    return found


def free_port(start: int = DEFAULT_PORT, host: str = "127.0.0.1", tries: int = 100) -> int:
    """``start`` if nothing listens there on ``host``, else the next free port above it."""
    for port in range(start, start + tries):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise UserError(f"--monitor: no free port in {start}..{start + tries - 1} on {host}")


def exported_name(metric: str) -> str:
    """What Prometheus calls a ``ray.util.metrics`` metric: Ray 2.60 prefixes ``ray_``, and its
    OpenTelemetry exporter suffixes a counter with ``_total`` (checked on a live Ray)."""
    return f"ray_{metric}" + ("_total" if METRICS.get(metric) == "counter" else "")


def config(sd_file: Path) -> dict:
    """prometheus.yml (JSON is YAML): Ray's own service discovery as the only scrape source."""
    return {"global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [{"job_name": "ray",
                                "file_sd_configs": [{"files": [str(sd_file)],
                                                     "refresh_interval": f"{SCRAPE_S}s"}]}]}


class Prometheus:
    """``with Prometheus(session_dir, data_dir) as prom:`` runs one; ``prom.graphs`` links each
    omni-ray metric of this Ray session to its graph."""

    def __init__(self, session_dir: str | Path, data_dir: str | Path, *,
                 port: int = DEFAULT_PORT, binary: str | None = None) -> None:
        self.binary = binary or find_prometheus()
        self.session_dir, self.data_dir = Path(session_dir), Path(data_dir)
        self.session = self.session_dir.name
        self.wanted_port = port
        self.port = free_port(port)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def moved(self) -> str | None:
        """Why the port is not the one asked for, or None."""
        if self.port == self.wanted_port:
            return None
        return f"port {self.wanted_port} is in use, Prometheus is on {self.port}"

    def selector(self, metric: str) -> str:
        return f'{exported_name(metric)}{{SessionName="{self.session}"}}'

    def graph_url(self, metric: str, range_input: str = "10m") -> str:
        query = urllib.parse.urlencode({"g0.expr": self.selector(metric), "g0.tab": "0",
                                        "g0.range_input": range_input})
        return f"{self.url}/graph?{query}"

    @property
    def graphs(self) -> dict[str, str]:
        return {m: self.graph_url(m) for m in METRICS}

    def start(self, ready_timeout_s: float = 60.0) -> "Prometheus":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "prometheus.yml"
        cfg.write_text(json.dumps(config(self.session_dir / SD_FILE), indent=1))
        log = open(self.data_dir / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.data_dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C of the sweep reaches it through stop() only
            preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))  # and a SIGKILL
        log.close()
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see "
                                   f"{self.data_dir / 'prometheus.log'}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"prometheus not ready within {ready_timeout_s:g} s; see "
                           f"{self.data_dir / 'prometheus.log'}")

    def stop(self) -> None:
        """SIGTERM (it flushes its head block), SIGKILL after 15 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def query(self, promql: str) -> list[dict]:
        """An instant query's result vector (for tests and checks)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query {promql!r}: {body}")
        return body["data"]["result"]
