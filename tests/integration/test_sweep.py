"""Sweeps end to end on a real local Ray and real vLLM engines (tiny synthetic model)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

import omni_ray
from omni_ray.engine.budget import kv_bytes_per_token
from omni_ray.models.build import ensure_model
from omni_ray.topology import local_slots
from tests.integration.sweeps import (ARM_TIMEOUT_S, ONE_CORE, needs_two_slots, sweep,
                                     wait_for)

pytestmark = pytest.mark.integration
MiB = 1 << 20


def overlaps(a: dict, b: dict) -> bool:
    return a["timing"]["dispatched"] < b["timing"]["ended"] and \
        b["timing"]["dispatched"] < a["timing"]["ended"]


@needs_two_slots
@pytest.mark.timeout(2 * ARM_TIMEOUT_S + 600)  # two rounds of arms on a two-slot machine
def test_four_arms_on_the_one_core_slots(local_ray, tmp_path):
    cfg = sweep("four", matrix={"kv_cache_mib": [32, 64], "multiprocessing": [False, True]})
    report = omni_ray.run_sweep(cfg, out=tmp_path, allow_busy=True)
    recs = report.records
    assert len(recs) == 4 and report.failed == 0, [r.get("error") for r in recs]
    per_token = kv_bytes_per_token(ensure_model("tiny"))
    for r in recs:
        m, slot = r["measurements"], r["slot"]["slot"]
        assert m["kv_cache_tokens"] == r["config"]["stage"]["kv_cache_mib"] * MiB // per_token
        # every thread of every process of the stage's tree stayed on the slot's one core
        assert r["pinning"]["violations"] == []
        assert r["pinning"]["allowed_cpus"] == slot["cpus"]
        if r["config"]["stage"]["multiprocessing"]:  # EngineCore child: the tree sees it
            assert len(m["engine_pids"]) > 1
            assert m["rss_anon_tree_mb"] > m["rss_anon_mb"] + 100
    used = {r["slot"]["slot"]["name"] for r in recs}
    assert len(used) >= 2 and used <= {s.name for s in ONE_CORE}
    # two at a time: some pair ran at overlapping times, on different cores
    pairs = [(a, b) for i, a in enumerate(recs) for b in recs[i + 1:] if overlaps(a, b)]
    assert pairs and all(a["slot"]["slot"]["cpus"] != b["slot"]["slot"]["cpus"] for a, b in pairs)
    out = report.out_dirs["four"]
    assert sorted(p.name for p in out.glob("*.p1.json")) == sorted(
        f"{a.id}.p1.json" for a in report.arms)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["arms"]) == {a.id for a in report.arms}
    assert (out / "summary.md").read_text().count("SINGLE PASS") >= 4


def test_impossible_budgets_fail_as_records_and_the_rest_runs(local_ray, tmp_path):
    cfg = sweep("budgets", stage={"max_model_len": 2048},
                workload={"prompt_len": 16, "output_len": 8},
                matrix={"kv_cache_mib": [1, 64, 10_000_000]})
    report = omni_ray.run_sweep(cfg, out=tmp_path, allow_busy=True)
    by_mib = {r["config"]["stage"]["kv_cache_mib"]: r for r in report.records}
    assert by_mib[64]["status"] == "ok"
    assert by_mib[1]["status"] == "failed"
    assert "fewer than one sequence of max_model_len=2048" in by_mib[1]["error"]
    assert by_mib[10_000_000]["status"] == "failed"
    assert "more than the node's available memory" in by_mib[10_000_000]["error"]
    assert report.failed == 2


def test_a_busy_slot_is_refused_or_run_marked_contended(local_ray, tmp_path):
    node = local_slots(None)[0]  # a whole node's slot; one of its CPUs is made busy
    busy_cpu = node.cpus[-1]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                           preexec_fn=lambda: os.sched_setaffinity(0, {busy_cpu}))
    try:
        cfg = sweep("busy", placement={"slot_cores": None, "nodes": [node.node]})
        refused = omni_ray.run_sweep(cfg, out=tmp_path, busy_wait_s=1.0)
        # the refusal names the slot's CPUs (and the busiest one, which on a shared machine may
        # be busy with something besides the hog)
        assert refused.records == [] and f"slot {node.name} is busy" in refused.refused
        ran = omni_ray.run_sweep(cfg, out=tmp_path, allow_busy=True, busy_wait_s=1.0)
    finally:
        hog.kill()
    (rec,) = ran.records
    assert rec["status"] == "ok" and rec["contended"] is True
    summary = ran.summaries["busy"]
    assert "CONTENDED" in json.dumps(summary)


def test_dry_run_starts_nothing(tmp_path):
    cfg = tmp_path / "dry.yaml"
    cfg.write_text("name: dry\nmodel: tiny\nstage: {kv_cache_mib: 32}\n"
                   "matrix: {batch: [1, 2, 4]}\n")
    out = subprocess.run([sys.executable, "-m", "omni_ray.cli", "sweep", str(cfg), "--dry-run",
                          "--out", str(tmp_path / "res")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("batch=") == 3 and "nothing was started" in out.stdout
    assert not (tmp_path / "res").exists()


def engines_under(root) -> list[int]:
    """Pids of engine processes whose request file is under ``root`` (a test's own tmp_path)."""
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any(str(root) in arg for arg in (p.info["cmdline"] or []))
            and "omni_ray.engine.runner" in (p.info["cmdline"] or [])]


@pytest.mark.timeout(3 * ARM_TIMEOUT_S)  # the first record, then the resumed arms
def test_interrupted_run_resumes_without_losing_a_result(local_ray, tmp_path):
    cfg = tmp_path / "resume.yaml"
    # Four KV budgets, so each arm starts its own engine and the sweep outlasts the interrupt.
    cfg.write_text(json.dumps(sweep("resume", matrix={"kv_cache_mib": [32, 40, 48, 56]})))
    res = tmp_path / "res"
    # A shell that starts this suite in the background (`cmd &`, nohup) makes SIGINT ignored for
    # every child, and Python then installs no KeyboardInterrupt handler, so the sweep ran on to
    # the end. Ctrl-C is what is tested: the child turns it back on before the CLI starts.
    boot = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from omni_ray.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", boot, "sweep", str(cfg),
                             "--out", str(res), "--allow-busy"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: list(res.glob("resume/*/*.p1.json")), ARM_TIMEOUT_S,
                 "the first arm's record", every_s=0.5)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # only the CLI this test started, by its pid
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in out, out[-3000:]
    # Ctrl-C ended the running engines too: none of this test's is left
    wait_for(lambda: not engines_under(res), 30, "engines left after Ctrl-C")
    first = {p.name: p.read_bytes() for p in res.glob("resume/*/*.p1.json")}
    assert 1 <= len(first) < 4
    report = omni_ray.run_sweep(str(cfg), out=res, resume=True, allow_busy=True)
    assert report.skipped == sum(json.loads(b)["status"] == "ok" for b in first.values())
    final = {p.name: p.read_bytes() for p in res.glob("resume/*/*.p1.json")}
    assert len(final) == 4
    for name, data in first.items():  # nothing finished before the interrupt was lost or redone
        if json.loads(data)["status"] == "ok":
            assert final[name] == data


@pytest.mark.timeout(3 * ARM_TIMEOUT_S)  # one shared start, then two fresh ones
def test_offline_arms_differing_in_workload_share_one_engine_start(local_ray, tmp_path):
    axis = {"prompt_len": [8, 16]}
    shared = omni_ray.run_sweep(sweep("share", matrix=axis), out=tmp_path / "on",
                                allow_busy=True)
    fresh = omni_ray.run_sweep(sweep("share", matrix=axis, placement={
        "share_engine": False, "bandwidth_probe": False}), out=tmp_path / "off", allow_busy=True)
    for report in (shared, fresh):
        assert len(report.records) == 2 and report.failed == 0, \
            [r.get("error") for r in report.records]
    first, second = sorted(shared.records, key=lambda r: r["shared_engine"]["position"])
    # one engine process served both arms: the same pids, one start recorded, by the first
    assert first["measurements"]["engine_pids"] == second["measurements"]["engine_pids"]
    assert first["measurements"]["ready_s"] > 0 and "ready_s" not in second["measurements"]
    assert second["shared_engine"]["started_by"] == first["arm"]["id"]
    assert first["log_path"] == second["log_path"]
    assert {r["config"]["workload"]["prompt_len"] for r in shared.records} == {8, 16}
    # without sharing: a fresh process each, and the tokens are the shared engine's
    a, b = fresh.records
    assert set(a["measurements"]["engine_pids"]).isdisjoint(b["measurements"]["engine_pids"])
    assert all(r["shared_engine"] is None and r["measurements"]["ready_s"] > 0
               for r in fresh.records)
    tokens = {r["arm"]["id"]: r["measurements"]["output_token_ids"] for r in fresh.records}
    for r in shared.records:
        assert r["measurements"]["output_token_ids"] == tokens[r["arm"]["id"]], r["arm"]["label"]
        assert len(r["measurements"]["output_token_ids"]) == 8
    # the slot's bandwidth, probed once on its CPUs before the engine loaded, gives each
    # decode figure its speed of light; the tiny model fits in any LLC: the cache probe
    for r in shared.records:
        m = r["measurements"]
        assert m["sol_bandwidth_gb_s"] > 0 and m["sol_probe"]["cpus"] == r["slot"]["slot"]["cpus"]
        assert m["sol_probe"]["regime"] == "cache-resident"
        if m["decode_tok_s"] is not None:  # none when contention made t(n) <= t(1)
            assert m["decode_regime"] == "cache-resident"
            assert m["weight_bytes_per_token"] == m["decode_weight_bytes_per_token"] > 0
            assert m["decode_sol_tok_s"] > 0 and m["decode_sol_frac"] == pytest.approx(
                m["decode_tok_s"] / m["decode_sol_tok_s"])
    assert first["measurements"]["sol_probe"] == second["measurements"]["sol_probe"]
    assert "| decode % of SoL |" in (shared.out_dirs["share"] / "summary.md").read_text()
    assert all("sol_bandwidth_gb_s" not in r["measurements"] for r in fresh.records)  # off
