"""The slot's bandwidth probe (measure/bandwidth.py): a real one small enough for a unit test,
its cache per (host, CPUs, regime, buffer), and the ways it declines without raising."""

import json
import os
import sys

import pytest

from omni_ray.measure import bandwidth
from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND

MiB = 1 << 20


def test_a_cache_probe_runs_on_the_given_cpus_and_is_cached(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))[:1]
    llc = 4 * MiB  # a 1 MiB cache probe: a second or two, mostly the torch import
    got = bandwidth.probe_slot(cpus, CACHE_RESIDENT, llc, cache_dir=tmp_path)
    assert "error" not in got, got
    assert got["ceiling_gb_s"] > 0 and got["cached"] is False
    assert got["regime"] == CACHE_RESIDENT and got["size_bytes"] == MiB
    assert got["cpus"] == cpus and got["threads"] == 1
    assert got["kernel"] in ("sum_bf16", "sum_fp32", "copy")
    assert got["repeats"] == bandwidth.SWEEP_REPEATS[CACHE_RESIDENT]
    again = bandwidth.probe_slot(cpus, CACHE_RESIDENT, llc, cache_dir=tmp_path)
    assert again["cached"] is True and again["ceiling_gb_s"] == got["ceiling_gb_s"]


def test_the_cache_is_keyed_by_cpus_regime_and_size(tmp_path):
    a = bandwidth.cache_path(tmp_path, [0, 1], DRAM_BOUND, 1 << 30)
    assert a != bandwidth.cache_path(tmp_path, [1], DRAM_BOUND, 1 << 30)
    assert a != bandwidth.cache_path(tmp_path, [0, 1], CACHE_RESIDENT, 1 << 30)
    assert a != bandwidth.cache_path(tmp_path, [0, 1], DRAM_BOUND, 2 << 30)


def test_a_cached_probe_is_read_back_without_running(tmp_path, monkeypatch):
    path = bandwidth.cache_path(tmp_path, [0], DRAM_BOUND, 1 << 30)
    path.write_text(json.dumps({"regime": DRAM_BOUND, "ceiling_gb_s": 33.0}))
    monkeypatch.setattr(bandwidth, "probe_command", lambda *a: pytest.fail("probed again"))
    got = bandwidth.probe_slot([0], DRAM_BOUND, 32 * MiB, cache_dir=tmp_path)
    assert got == {"regime": DRAM_BOUND, "ceiling_gb_s": 33.0, "cached": True}


def test_a_failing_probe_is_an_error_not_an_exception(tmp_path, monkeypatch):
    monkeypatch.setattr(bandwidth, "probe_command",
                        lambda *a: [sys.executable, "-c", "raise SystemExit('no torch here')"])
    got = bandwidth.probe_slot([0], CACHE_RESIDENT, 4 * MiB, cache_dir=tmp_path)
    assert got["error"] == "the probe exited with 1: no torch here"
    assert "ceiling_gb_s" not in got and not list(tmp_path.iterdir())  # nothing cached


def test_a_buffer_over_half_the_memory_limit_is_not_allocated():
    got = bandwidth.probe_slot([0], DRAM_BOUND, 32 * MiB, memory_limit_mib=1500)
    assert got["error"].startswith("skipped: the probe's 1024 MiB buffer")
    assert "memory_limit_mib=1500" in got["error"]


def test_no_cache_probe_without_an_llc():
    got = bandwidth.probe_slot([0], CACHE_RESIDENT, None)
    assert got["error"] == f"no {CACHE_RESIDENT} probe without the LLC size"


def test_a_probe_that_prints_no_json_is_an_error(monkeypatch):
    monkeypatch.setattr(bandwidth, "probe_command",
                        lambda *a: [sys.executable, "-c", "print('hello')"])
    got = bandwidth.probe_slot([0], CACHE_RESIDENT, 4 * MiB)
    assert got["error"] == "the probe printed no JSON: 'hello\\n'"
