import json
import socket
import urllib.parse

import pytest

from omni_ray.cli import main
from omni_ray.errors import UserError
from omni_ray.monitor import METRICS, prometheus
from omni_ray.monitor.prometheus import Prometheus, config, find_prometheus, free_port


@pytest.fixture
def no_prometheus(monkeypatch, tmp_path):
    monkeypatch.setattr(prometheus.shutil, "which", lambda name: None)
    monkeypatch.setattr(prometheus, "DEBIAN_BINARY", tmp_path / "absent")


def test_without_prometheus_the_error_says_how_to_install_it(no_prometheus):
    with pytest.raises(UserError, match=r"^--monitor: prometheus is not installed; install "
                                        r"Debian's package: apt-get install prometheus"):
        find_prometheus()


def test_monitor_without_prometheus_exits_2_before_ray_starts(no_prometheus, monkeypatch,
                                                              tmp_path, capsys):
    from omni_ray.placement import cluster

    def no_ray(*a, **k):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(cluster, "connect", no_ray)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(json.dumps({"name": "m", "model": "tiny", "stage": {"kv_cache_mib": 32}}))
    code = main(["sweep", str(cfg), "--monitor", "--out", str(tmp_path / "res")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "apt-get install prometheus" in err[0], err
    assert not (tmp_path / "res").exists()


def test_a_bad_monitor_port_names_the_option(tmp_path, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(json.dumps({"name": "m", "model": "tiny", "stage": {"kv_cache_mib": 32}}))
    assert main(["sweep", str(cfg), "--monitor", "--monitor-port", "70000"]) == 2
    assert "--monitor-port: must be 1..65535, got 70000" in capsys.readouterr().err


def test_a_port_in_use_moves_to_the_next_free_one():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert free_port(taken) > taken


def test_the_config_scrapes_rays_own_service_discovery(tmp_path):
    cfg = config(tmp_path / "prom_metrics_service_discovery.json")
    (job,) = cfg["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == [
        str(tmp_path / "prom_metrics_service_discovery.json")]


def test_graph_links_select_this_ray_session(tmp_path):
    session = tmp_path / "session_2026-12-05_23-30-51_803_1"
    prom = Prometheus(session, tmp_path / "p", port=free_port(19090), binary="/bin/true")
    url = urllib.parse.urlparse(prom.graphs["omni_stage_rss_anon_mb"])
    (expr,) = urllib.parse.parse_qs(url.query)["g0.expr"]
    assert url.netloc == f"127.0.0.1:{prom.port}"
    assert expr == f'ray_omni_stage_rss_anon_mb{{SessionName="{session.name}"}}'
    assert set(prom.graphs) == set(METRICS) >= {
        "omni_stage_rss_anon_mb", "omni_stage_rss_peak_mb", "omni_stage_busy_fraction",
        "omni_stage_decode_tok_s", "omni_sweep_arms_done", "omni_sweep_arms_running"}


def test_exported_names_follow_rays_prometheus_naming():
    assert prometheus.exported_name("omni_stage_rss_anon_mb") == "ray_omni_stage_rss_anon_mb"
    assert prometheus.exported_name("omni_sweep_arms_done") == "ray_omni_sweep_arms_done_total"


def test_a_prometheus_that_exits_at_once_names_its_log(tmp_path):
    prom = Prometheus(tmp_path / "session_x", tmp_path / "p", port=free_port(19190),
                      binary="/bin/false")
    with pytest.raises(RuntimeError, match=r"prometheus exited with 1; see .*/p/prometheus.log"):
        prom.start(ready_timeout_s=10)
    cfg = json.loads((tmp_path / "p" / "prometheus.yml").read_text())
    assert cfg["scrape_configs"][0]["file_sd_configs"][0]["files"] == [
        str(tmp_path / "session_x" / "prom_metrics_service_discovery.json")]
