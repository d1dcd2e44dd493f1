"""--listen and --address on the sweep verb: bad input is one line naming the option, exit 2,
and nothing starts."""

import json

import pytest

from omni_ray.cli import main


@pytest.fixture
def sweep_file(tmp_path, monkeypatch):
    from omni_ray.placement import cluster

    def no_ray(*a, **k):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(cluster, "connect", no_ray)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(json.dumps({"name": "l", "model": "tiny", "stage": {"kv_cache_mib": 32}}))
    return cfg


@pytest.mark.parametrize("extra, message", [
    (["--listen", "not-an-ip"], "--listen not-an-ip: not an IP address"),
    (["--listen", "203.0.113.77"], "--listen 203.0.113.77: not an address of this host"),
    (["--listen", "127.0.0.1", "--address", "auto"], "--listen 127.0.0.1: only for a local Ray"),
])
def test_a_bad_listen_is_one_line_and_exit_2(sweep_file, tmp_path, capsys, extra, message):
    code = main(["sweep", str(sweep_file), "--out", str(tmp_path / "res"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "res").exists()
