import json
import re

import pytest

from omni_ray.monitor import METRICS
from omni_ray.monitor.grafana import DASHBOARD, install, main
from omni_ray.monitor.prometheus import exported_name


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_every_omni_ray_metric_has_a_panel_and_every_panel_a_known_metric():
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bray_omni_\w+", e)}
    assert used == {exported_name(m) for m in METRICS}


def test_panels_use_the_datasource_variable_not_a_fixed_uid():
    d = dashboard()
    assert any(v["name"] == "datasource" and v["type"] == "datasource"
               for v in d["templating"]["list"])
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])


def test_install_copies_into_rays_provisioned_dashboards(tmp_path):
    folder = tmp_path / "metrics" / "grafana" / "dashboards"
    folder.mkdir(parents=True)
    copy = install(tmp_path)
    assert copy.parent == folder and json.loads(copy.read_text()) == dashboard()


def test_install_into_a_directory_that_is_no_session_says_so(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="not a Ray session's Grafana dashboards"):
        install(tmp_path)
    assert main([str(tmp_path)]) == 2
    assert "not a Ray session's Grafana dashboards folder" in capsys.readouterr().err
