"""The second raylet of a simulated 2-node cluster killed mid-sweep (every process of it, by pid,
as a host that loses power): the arm running there is recorded failed naming the lost node,
with its engine log's tail; no arm goes to that node again; the sweep finishes on the node left
with its records intact, and ``resume`` runs exactly the pass that is missing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from omni_ray.placement import local_cluster
from tests.integration.sweeps import (ARM_TIMEOUT_S, cluster_sweep, driver_records,
                                     driver_stderr, phase_seen, simulated_cluster, start_driver,
                                     wait_for)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(4 * ARM_TIMEOUT_S)]


def loading_on(results: Path, cpus: list[int]) -> str | None:
    """An arm pass (``<arm-id>.p<n>``) not yet recorded whose engine runs on ``cpus`` and has
    logged that it is loading, or None."""
    for req in results.glob("*/*/logs/*.request.json"):
        name = req.name.removesuffix(".request.json")
        if (json.loads(req.read_text())["cpus"] == cpus and phase_seen(
                req.with_name(f"{name}.log"), "loading")
                and not (req.parent.parent / f"{name}.json").exists()):
            return name
    return None


def test_a_raylet_lost_mid_sweep_fails_its_arm_the_rest_finish_and_resume_completes(
        tiny_model, tmp_path):
    # four arms: two start at once, one on each raylet; when sim1's is killed while loading,
    # arms are still waiting (node 0 would have to run two whole arms meanwhile otherwise)
    cfg = cluster_sweep(tmp_path, "lose", tiny_model, matrix={"kv_cache_mib": [32, 40, 48, 56]})
    with simulated_cluster(tmp_path / "cluster") as cluster:
        (sim1,) = [r for r in cluster.raylets if r["label"] == "sim1"]
        driver = start_driver(cluster, tmp_path, [cfg])
        try:
            def victim():
                assert driver.poll() is None, driver_stderr(tmp_path)
                return loading_on(tmp_path / "res", sim1["cpus"])

            lost = wait_for(victim, ARM_TIMEOUT_S, "an arm loading on raylet sim1", every_s=0.5)
            t_kill = time.time()
            assert local_cluster.kill_raylet(cluster, "sim1")
            assert local_cluster.raylet_processes(cluster, "sim1") == []
            records = driver_records(driver, tmp_path, 3 * ARM_TIMEOUT_S)
        finally:
            if driver.poll() is None:  # the test failed first: the driver is ours to end
                driver.kill()
                driver.wait()

        by_name = {f"{r['arm']['id']}.p{r['pass']}": r for r in records}
        assert len(by_name) == 4
        # the arm on the lost node: failed, the node named, its engine log's tail kept
        failed = by_name.pop(lost)
        assert failed["status"] == "failed", failed["error"]
        assert failed["error"].startswith("Ray node lost ("), failed["error"]
        assert "'omni.raylet': 'sim1'" in failed["error"]
        assert failed["slot"]["node_id"][:12] in failed["error"]
        assert "omni-ray phase: loading" in failed["stderr_tail"]
        # the sweep finished on the node left, and nothing went to the lost one after it died
        assert [r["error"] for r in by_name.values() if r["status"] != "ok"] == []
        after = [r for r in by_name.values() if r["timing"]["dispatched"] > t_kill]
        assert after and {r["slot"]["numa_node"] for r in after} == {0}
        assert "Ray node lost" in driver_stderr(tmp_path)

        (run_dir,) = (tmp_path / "res" / "lose").iterdir()
        before = {p.name: p.read_bytes() for p in run_dir.glob("*.p1.json")}
        resumed = driver_records(start_driver(cluster, tmp_path, [cfg], resume=True), tmp_path,
                                 2 * ARM_TIMEOUT_S)
    # exactly what was missing ran, on the node left; the rest is as it was
    (again,) = resumed
    assert f"{again['arm']['id']}.p1" == lost and again["status"] == "ok", again["error"]
    assert again["slot"]["numa_node"] == 0
    for name in by_name:
        assert (run_dir / f"{name}.json").read_bytes() == before[f"{name}.json"]
    (earlier,) = again["attempts"]
    assert earlier["status"] == "failed" and earlier["error"] == failed["error"]
    assert (run_dir / earlier["file"]).read_bytes() == before[f"{lost}.json"]
