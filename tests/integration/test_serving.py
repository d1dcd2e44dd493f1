"""Serving on real vLLM (tiny model): two load points and an SLO search on one engine start."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_ray.engine.launch import live_figures
from omni_ray.workload.serving import percentile

# engine starts take minutes when the machine is loaded
pytestmark = pytest.mark.timeout(900)

N = 16
SLO_TTFT_MS = 50.0


def test_two_rates_and_a_search_on_one_engine_start(tiny_model, run_arm):
    result = run_arm(tiny_model, timeout_s=840, stage={"max_num_seqs": 4}, workload={
        "mode": "serving", "request_rate": [4, "inf"], "num_requests": N, "warmup_requests": 2,
        "prompt_len": 16, "prompt_len_max": 48, "output_len": 8, "output_len_max": 24,
        "percentiles": [50, 90, 99], "slo": {"ttft_ms": SLO_TTFT_MS}, "detokenize": False,
        "search": {"percentile": 90, "low": 1, "high": 1000, "steps": 3}})
    m = result["measurements"]
    assert m["ready_s"] > 0 and m["kv_cache_tokens"] > 0  # the one start, recorded once
    # while it served, its log said each second's output tokens/s and KV in use (live gauges)
    live = live_figures(Path(result["log_path"]).read_text(errors="replace"))
    assert live["kv_tokens_budget"] == m["kv_cache_tokens"]
    assert live["decode_tok_s"] >= 0 and 0 <= live["kv_tokens_used"] <= m["kv_cache_tokens"]
    low, flood = m["serving"]
    assert (low["request_rate"], flood["request_rate"]) == (4.0, "inf")
    for point in (low, flood):
        s = point["samples"]
        # one sample per request sent, every one completed with the tokens it asked for
        assert point["num_requests"] == N == point["completed"] == len(s["ttft_ms"])
        assert point["failed"] == 0 and s["error"] is None
        assert all(8 <= t <= 24 for t in s["output_tokens"])
        assert all(16 <= p <= 48 for p in s["prompt_len"])
        assert sum(s["output_tokens"]) == point["total_output_tokens"]
        # the percentiles follow from the samples kept
        for name in ("ttft_ms", "e2e_ms", "tpot_ms"):
            for p in (50, 90, 99):
                assert point[name][f"p{p}"] == pytest.approx(percentile(s[name], p), abs=2e-3)
        itls = [x for row in s["itl_ms"] for x in row]
        assert point["itl_ms"]["p99"] == pytest.approx(percentile(itls, 99), abs=2e-3)
        assert point["good_requests"] == sum(t <= SLO_TTFT_MS for t in s["ttft_ms"])
        kv = point["kv_cache"]
        assert kv["budget_tokens"] == m["kv_cache_tokens"]
        assert kv["peak_usage"] is None or 0 < kv["peak_usage"] <= 1
        assert point["peak_rss_anon_mb"] > 0 and point["cpu"]["engine_core_s"] > 0
    # all at once, 4 sequences at a time: the queued requests wait for their first token
    assert flood["ttft_ms"]["p90"] > 2 * low["ttft_ms"]["p90"], (low["ttft_ms"], flood["ttft_ms"])
    assert flood["kv_cache"]["peak_running"] <= 4

    # the search: each probe's verdict is its p90 TTFT against the SLO, and the bracket
    # is the last rate that met it and the lowest that did not
    found = m["serving_search"]
    probes = found["probes"]
    for pr in probes:
        assert pr["meets_slo"] == (pr["ttft_ms"]["p90"] <= SLO_TTFT_MS), pr["ttft_ms"]
    met = [pr["request_rate"] for pr in probes if pr["meets_slo"]]
    failed = [pr["request_rate"] for pr in probes if not pr["meets_slo"]]
    assert found["capacity"] == (max(met) if met else None)
    assert found["bracket"] == [max(met) if met else None, min(failed) if failed else None]
    if met and failed:  # bisected: 2 ends + 3 midpoints, the bracket 1000^(1/8) wide
        assert len(probes) == 5 and min(failed) / max(met) == pytest.approx(1000 ** 0.125)


DURATION_S = 2.0


def _overlap_peak(s) -> int:
    """The most requests in flight at once, from the samples: at each request's send, those
    sent no later whose last token had not come yet (itself included)."""
    spans = [(t, t + e / 1e3) for t, e in zip(s["sent_s"], s["e2e_ms"])]
    return max(sum(a <= t < b for a, b in spans) for t, _ in spans)


def test_closed_loop_users_for_a_duration_and_a_search_over_users(tiny_model, run_arm):
    result = run_arm(tiny_model, timeout_s=840, stage={"max_num_seqs": 4}, workload={
        "mode": "serving", "users": [1, 3], "duration_s": DURATION_S, "warmup_requests": 2,
        "prompt_len": 16, "output_len": 8, "percentiles": [90], "detokenize": False,
        "slo": {"ttft_ms": SLO_TTFT_MS},
        "search": {"over": "users", "percentile": 90, "low": 1, "high": 16, "steps": 2}})
    m = result["measurements"]
    one, three = m["serving"]
    assert (one["users"], three["users"]) == (1, 3)
    for point in (one, three):
        s = point["samples"]
        assert point["ends_by"] == "duration_s" and point["duration_limit_s"] == DURATION_S
        # nothing sent after the duration; whatever was in flight then ran to its end
        assert max(s["sent_s"]) < DURATION_S
        assert point["num_requests"] == point["completed"] == len(s["sent_s"]) > point["users"]
        assert point["failed"] == 0 and s["output_tokens"] == [8] * point["num_requests"]
    # one user: each request is sent once the one before it has its last token
    s = one["samples"]
    for i in range(len(s["sent_s"]) - 1):
        assert s["sent_s"][i + 1] >= s["sent_s"][i] + s["e2e_ms"][i] / 1e3 - 2e-6, i
    assert _overlap_peak(one["samples"]) == 1
    assert _overlap_peak(three["samples"]) == 3

    found = m["serving_search"]
    assert found["over"] == "users"
    for pr in found["probes"]:
        assert isinstance(pr["users"], int) and pr["ends_by"] == "duration_s"
        assert pr["meets_slo"] == (pr["ttft_ms"]["p90"] <= SLO_TTFT_MS), pr["ttft_ms"]
    met = [pr["users"] for pr in found["probes"] if pr["meets_slo"]]
    failed = [pr["users"] for pr in found["probes"] if not pr["meets_slo"]]
    assert found["capacity"] == (max(met) if met else None) == m.get("capacity_users")
    assert found["bracket"] == [max(met) if met else None, min(failed) if failed else None]
