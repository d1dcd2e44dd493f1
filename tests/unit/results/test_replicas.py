"""One arm spanning sockets: replicas' results summed into the arm's."""

import pytest

from omni_ray.results.replicas import aggregate, overlap


def replica(decode, prefill, rss, start=0.0, end=10.0, status="ok", **more):
    return {"status": status, "wall_s": end,
            "measurements": {"decode_tok_s": decode, "prefill_tok_s": prefill,
                             "rss_anon_tree_mb": rss, "peak_rss_anon_mb": rss + 100,
                             "ttft_s": 0.01 * decode, "measured_from": start,
                             "measured_to": end, "decode_regime": "cache-resident", **more},
            "pinning": {"requested_cpus": [0], "violations": []}}


def test_throughput_and_rss_are_summed_and_kept_per_replica():
    out = aggregate([replica(100.0, 1000.0, 480.0), replica(90.0, 900.0, 500.0)])
    m = out["measurements"]
    assert out["status"] == "ok" and m["replicas"] == 2
    assert m["decode_tok_s"] == 190.0 and m["decode_tok_s_replicas"] == [100.0, 90.0]
    assert m["prefill_tok_s"] == 1900.0 and m["prefill_tok_s_replicas"] == [1000.0, 900.0]
    assert m["rss_anon_tree_mb"] == 980.0 and m["rss_anon_tree_mb_replicas"] == [480.0, 500.0]
    assert m["peak_rss_anon_mb"] == 1180.0
    assert m["ttft_s"] == 1.0  # the slowest replica's
    assert m["decode_regime"] == "cache-resident"
    assert m["replica_overlap"] == 1.0


def test_overlap_is_the_shared_share_of_the_windows():
    assert overlap([(0.0, 10.0), (5.0, 15.0)]) == pytest.approx(0.5)
    assert overlap([(0.0, 10.0), (10.0, 20.0)]) == 0.0
    assert overlap([(0.0, 10.0), None]) is None


def test_a_failed_replica_fails_the_arm_naming_it_and_sums_nothing():
    bad = {"status": "timeout", "error": "arm exceeded 600 s", "measurements": {},
           "stderr_tail": "tail"}
    out = aggregate([replica(100.0, 1000.0, 480.0), bad])
    assert out["status"] == "timeout"
    assert out["error"] == "replica 1 of 2: arm exceeded 600 s"
    assert out["measurements"]["decode_tok_s"] is None
    assert out["measurements"]["decode_tok_s_replicas"] == [100.0, None]


def test_violations_of_every_replica_are_kept():
    a, b = replica(1.0, 1.0, 1.0), replica(1.0, 1.0, 1.0)
    b["pinning"]["violations"] = ["pid 1 tid 2: allowed on CPUs 0-1"]
    out = aggregate([a, b])
    assert out["pinning"]["violations"] == ["pid 1 tid 2: allowed on CPUs 0-1"]
    assert len(out["pinning"]["replicas"]) == 2


def test_the_speed_of_light_of_replicas_is_the_sum_of_their_slots():
    sol = {"decode_weight_bytes_per_token": 205_000_000, "llc_bytes": 32 << 20,
           "decode_regime": "DRAM-bound"}
    out = aggregate([
        replica(80.0, 1000.0, 480.0, sol_bandwidth_gb_s=20.0, decode_sol_tok_s=100.0,
                sol_probe={"name": "DRAM probe (1024 MiB buffer)"}, **sol),
        replica(90.0, 900.0, 500.0, sol_bandwidth_gb_s=25.0, decode_sol_tok_s=120.0,
                sol_probe={"name": "DRAM probe (1024 MiB buffer)"}, **sol)])
    m = out["measurements"]
    assert m["sol_bandwidth_gb_s"] == 45.0 and m["decode_sol_tok_s"] == 220.0
    assert m["decode_sol_frac"] == pytest.approx(170 / 220)
    assert m["decode_sol_text"] == "77 % of the replicas' probes summed"
    assert len(m["sol_probe_replicas"]) == 2
    assert m["decode_weight_bytes_per_token"] == 205_000_000
