"""Replicas of one arm wait, loaded, for the go file before measuring (runner.wait_for_go)."""

from omni_ray.engine.runner import wait_for_go


def test_goes_when_the_file_is_there(tmp_path, capsys):
    go = tmp_path / "arm.p1.r0.go"
    go.touch()
    out = wait_for_go(str(go), timeout_s=5)
    assert out["replica_go"] is True and out["replica_wait_s"] < 5
    assert capsys.readouterr().out.splitlines() == ["omni-ray phase: waiting",
                                                    "omni-ray phase: measuring"]


def test_goes_anyway_after_the_timeout_and_says_so(tmp_path):
    out = wait_for_go(str(tmp_path / "never.go"), timeout_s=0.1)
    assert out["replica_go"] is False and out["replica_wait_s"] >= 0.1
