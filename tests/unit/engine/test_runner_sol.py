"""The runner's bandwidth probe: the regime the engine's weight bytes need, on the slot's CPUs,
and the speed-of-light fields it puts beside a decode figure (no engine, no real probe)."""

import pytest

from omni_ray.engine import runner
from omni_ray.engines.request import EngineRequest
from omni_ray.measure import bandwidth
from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND
from omni_ray.topology import caches

from tests.unit.engine.test_runner_regime import FIXTURES

MiB = 1 << 20


class FakeEngine:
    def __init__(self, weight_bytes):
        self.wb = weight_bytes

    def weight_bytes(self, req, model_path):
        return self.wb


def request(**more):
    stage = {"memory_limit_mib": 8192, "kv_cache_mib": 64}
    return EngineRequest.from_dict({"model": "tiny", "stage": stage, "workload": {"batch": 2},
                                    "cpus": [0, 1], "bandwidth_probe": True,
                                    "probe_cache_dir": "/c", **more})


@pytest.mark.parametrize("wb,label", [(4 * MiB, CACHE_RESIDENT), (205_000_000, DRAM_BOUND)])
def test_the_probe_is_the_regime_the_weights_need(monkeypatch, capsys, wb, label):
    monkeypatch.setattr(caches, "SYSFS_ROOT", FIXTURES / "caches_epyc_zen5_2c")
    calls = []

    def probe_slot(cpus, lab, llc, **kw):
        calls.append((cpus, lab, llc, kw))
        return {"regime": lab, "ceiling_gb_s": 40.0, "size_bytes": 1}

    monkeypatch.setattr(bandwidth, "probe_slot", probe_slot)
    got = runner.slot_probe(FakeEngine(wb), request(), "/m")
    assert got["regime"] == label
    assert calls == [([0, 1], label, 32 * MiB, {"cache_dir": "/c", "memory_limit_mib": 8192})]
    out = capsys.readouterr().out
    assert "omni-ray phase: probing" in out and "omni-ray bandwidth probe: " in out


def test_no_probe_for_a_pipeline_stage(monkeypatch):
    monkeypatch.setattr(bandwidth, "probe_slot", lambda *a, **k: pytest.fail("probed"))
    assert runner.slot_probe(FakeEngine(1), request(inputs_path="/in"), "/m") is None


def test_the_fields_follow_the_workload_s_batch():
    m = {"decode_tok_s": 340.0, "decode_weight_bytes_per_token": 205_000_000,
         "llc_bytes": 32 * MiB, "decode_regime": DRAM_BOUND}
    probe = {"regime": DRAM_BOUND, "ceiling_gb_s": 40.0, "size_bytes": 1 << 30}
    got = runner.speed_of_light(m, probe, request().workload)
    assert got["decode_sol_tok_s"] == pytest.approx(2 * 40e9 / 205e6)
    assert got["sol_bandwidth_gb_s"] == 40.0 and got["weight_bytes_per_token"] == 205_000_000


def test_a_failed_probe_is_recorded_beside_the_figure():
    m = {"decode_tok_s": 340.0, "decode_weight_bytes_per_token": 205_000_000}
    got = runner.speed_of_light(m, {"regime": DRAM_BOUND, "error": "timeout"}, None)
    assert got == {"sol_probe": {"regime": DRAM_BOUND, "error": "timeout"}}
    assert runner.speed_of_light(m, None, None) == {}


def test_without_a_decode_figure_the_probe_is_still_recorded():
    probe = {"regime": DRAM_BOUND, "ceiling_gb_s": 40.0, "size_bytes": 1 << 30}
    got = runner.speed_of_light({"decode_tok_s": None}, probe, None)
    assert got == {"sol_bandwidth_gb_s": 40.0, "sol_probe": {
        "regime": DRAM_BOUND, "size_bytes": 1 << 30, "name": "DRAM probe (1024 MiB buffer)"}}


def test_a_probe_that_raises_does_not_fail_the_arm(monkeypatch):
    class Broken:
        def weight_bytes(self, req, model_path):
            raise OSError("no GGUF")

    got = runner.slot_probe(Broken(), request(), "/m")
    assert got == {"error": "OSError: no GGUF"}
