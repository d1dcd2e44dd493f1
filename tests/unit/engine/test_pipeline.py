"""The pipeline launcher's pure parts: each stage's request, and the arm's figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from omni_ray.config.schema import PipelineStage, StageConfig, WorkloadConfig
from omni_ray.engine.pipeline import (stage_figures, stage_requests, summarise,
                                      summarise_serving)
from omni_ray.engines.request import EngineRequest

WL = WorkloadConfig(prompt_len=16, output_len=8)


def _req(cpus=(0, 1, 2), node=0, stage1_node=None, window=None) -> EngineRequest:
    tiny = StageConfig(model="tiny", kv_cache_mib=16)
    return EngineRequest(stage=tiny, workload=WL, cpus=cpus, node=node,
                         stages=(PipelineStage(stage=tiny, cores=1),
                                 PipelineStage(stage=tiny, node=stage1_node, window=window)))


def test_each_stage_gets_its_cpus_and_feeds_the_next(tmp_path: Path):
    r0, r1 = stage_requests(_req(), tmp_path, "x")
    assert (r0.cpus, r1.cpus) == ((0,), (1, 2))
    assert r0.outputs_path == r1.inputs_path == str(tmp_path / "x.s1.in.json")
    assert r1.outputs_path is None
    assert (r0.workload.prompt_len, r1.workload.prompt_len) == (16, 8)  # stage 1 reads 8 ids
    assert (r0.window, r0.out_window, r1.window) == (None, None, None)


def test_a_window_streams_the_edge_into_the_stage_that_names_it(tmp_path: Path):
    r0, r1 = stage_requests(_req(window=4), tmp_path, "x")
    assert (r0.window, r0.out_window, r1.window, r1.out_window) == (None, 4, 4, None)


def test_a_stage_on_another_node_runs_on_that_node_s_slot(tmp_path: Path):
    req = dataclasses.replace(_req(stage1_node=1), node_cpus=((1, (4, 5)),))
    r0, r1 = stage_requests(EngineRequest.from_dict(req.to_dict()), tmp_path, "x")
    assert (r0.node, r0.cpus, r1.node, r1.cpus) == (0, (0,), 1, (4, 5))  # all of node 1's slot


def test_a_stage_on_a_node_the_arm_has_no_slot_on_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match=r"stage 1: node 1 has no slot of this arm "
                                         r"\(slots on nodes \[0\]\)"):
        stage_requests(_req(stage1_node=1), tmp_path, "x")


def _ok(gen: float, t_in: float, t_out: float, rss: float) -> dict:
    return {"status": "ok", "measurements": {
        "generate_s": gen, "input_at": t_in, "output_at": t_out, "first_token_at": t_in + 0.5,
        "rss_anon_tree_mb": rss, "ready_s": 3.0, "output_token_ids": [[1, 2]]},
        "pinning": {"threads": 4, "processes": 1, "allowed_cpus": [0], "violations": []}}


def test_summary_times_the_pipeline_end_to_end_and_names_the_bottleneck(tmp_path: Path):
    reqs = stage_requests(_req(), tmp_path, "x")
    out = summarise(reqs, [_ok(4.0, 100.0, 104.0, 50.0), _ok(1.0, 104.1, 105.1, 20.0)], 71.0)
    m = out["measurements"]
    assert out["status"] == "ok"
    assert m["pipeline_e2e_s"] == pytest.approx(5.1)
    assert m["last_stage_first_token_s"] == pytest.approx(4.6)
    assert m["rss_anon_tree_mb"] == 70.0 and m["bottleneck_stage"] == 0
    assert out["pinning"]["threads"] == 8
    assert out["edges"] == [{"from": 0, "to": 1, "window": None,
                             "first_chunk_s": pytest.approx(4.1), "from_done_s": 4.0,
                             "overlap_s": pytest.approx(-0.1)}]


def test_a_streamed_edge_records_when_its_first_chunk_arrived(tmp_path: Path):
    reqs = stage_requests(_req(window=4), tmp_path, "x")
    out = summarise(reqs, [_ok(4.0, 100.0, 104.0, 50.0), _ok(2.0, 102.0, 105.0, 20.0)], 71.0)
    (edge,) = out["edges"]
    assert edge["window"] == 4 and edge["first_chunk_s"] == 2.0 and edge["overlap_s"] == 2.0
    assert out["measurements"]["last_stage_first_token_s"] == pytest.approx(2.5)


def test_the_stage_that_failed_on_its_own_is_named(tmp_path: Path):
    reqs = stage_requests(_req(), tmp_path, "x")
    told = {"status": "failed", "error": "RuntimeError: no input: stage 1 failed"}
    own = {"status": "failed", "error": "ValueError: KV cache too small"}
    out = summarise(reqs, [told, own], 0.0)
    assert out["status"] == "failed"
    assert out["error"] == "stage 1 (tiny): ValueError: KV cache too small"


# A serving pipeline (docs/pipelines.md, "Serving").

SERVING = WorkloadConfig(mode="serving", prompt_len=16, output_len=8, percentiles=(90,))


def _serving_req(window=None) -> EngineRequest:
    return dataclasses.replace(_req(window=window), workload=SERVING)


def test_serving_stages_read_inboxes_in_a_ring(tmp_path: Path):
    r0, r1 = stage_requests(_serving_req(window=4), tmp_path, "x")
    assert r0.inputs_path == r1.outputs_path == str(tmp_path / "x.s0.in.jsonl")
    assert r0.outputs_path == r1.inputs_path == str(tmp_path / "x.s1.in.jsonl")
    assert (r0.stage_index, r1.stage_index, r0.stage_count) == (0, 1, 2)
    assert (r0.out_window, r1.window) == (4, 4)
    assert r0.workload == SERVING and r1.workload.prompt_len == 8 and r1.workload.mode == "serving"


def _trace(rows: dict) -> dict:
    """A stage's trace, column-wise, from ``{id: (in, first, out, done)}``."""
    ids = list(rows)
    return {"id": ids, **{c: [rows[r][k] for r in ids]
                          for k, c in enumerate(("in", "first", "out", "done"))},
            "token_ids": [[1] for _ in ids]}


# stage 0 took 1 s of each request (first token after 0.2 s), handed it on as it finished;
# stage 1 read it 2 ms later and took 0.5 s more
S0 = _trace({"warm.0": (0.0, 0.1, 0.5, 0.5),
             "load0.0": (10.0, 10.2, 11.0, 11.0), "load0.1": (20.0, 20.2, 21.0, 21.0)})
S1 = _trace({"warm.0": (0.502, 0.6, 0.6, 0.9),
             "load0.0": (11.002, 11.1, 11.1, 11.502), "load0.1": (21.002, 21.3, 21.3, 21.502)})


def test_stage_figures_time_each_stage_s_side_of_a_load_point_s_requests():
    s0, s1 = stage_figures("load0", [S0, S1], (90,))
    assert s0["requests"] == s1["requests"] == 2  # the warm-up is not load0's
    assert s0["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s0["e2e_ms"]["median"] == pytest.approx(1000.0)
    assert "handover_ms" not in s0
    assert s1["handover_ms"]["mean"] == pytest.approx(2.0)
    assert s1["ttft_ms"]["p90"] == pytest.approx(98 + 0.9 * (298 - 98))
    assert s1["e2e_ms"]["mean"] == pytest.approx(500.0)


def _serving_ok(trace: dict, **m) -> dict:
    return {"status": "ok", "measurements": {
        "ready_s": 3.0, "rss_anon_tree_mb": 40.0, "serving_trace": trace, **m},
        "pinning": {"threads": 4, "processes": 2, "allowed_cpus": [0], "violations": []}}


def test_a_serving_pipeline_s_load_points_are_stage_0_s_with_each_stage_s_side(tmp_path: Path):
    reqs = stage_requests(_serving_req(), tmp_path, "x")
    point = {"label": "load0", "request_rate": 1.0, "ttft_ms": {"p90": 1300.0},
             "kv_cache": {"peak_usage": 0.1}, "cpu": {"wall_s": 20.0}, "peak_rss_anon_mb": 41.0}
    probe = dict(point, label="load1", meets_slo=True)
    search = {"capacity": 1.0, "probes": [probe]}
    out = summarise_serving(reqs, [
        _serving_ok(S0, serving=[point], serving_search=search, capacity_req_s=1.0),
        _serving_ok(S1, kv_cache={"peak_usage": 0.3})], 90.0)
    assert out["status"] == "ok"
    m = out["measurements"]
    (p,) = m["serving"]
    # the pipeline's figures stay where single-stage serving keeps them; stage 0's own
    # engine figures move under its entry
    assert p["ttft_ms"] == {"p90": 1300.0} and "kv_cache" not in p and "cpu" not in p
    s0, s1 = p["stages"]
    assert s0["kv_cache"] == {"peak_usage": 0.1} and s0["peak_rss_anon_mb"] == 41.0
    assert s1["handover_ms"]["mean"] == pytest.approx(2.0)
    assert m["serving_search"]["probes"][0]["stages"][0]["requests"] == 0  # load1: none traced
    assert m["capacity_req_s"] == 1.0
    assert (m["rss_anon_tree_mb"], m["pipeline_peak_rss_anon_mb"], m["ready_s"]) == (80.0, 90.0,
                                                                                    3.0)
    assert "serving_trace" not in m and out["stages"][1]["kv_cache"] == {"peak_usage": 0.3}
    assert out["stages"][1]["serving_trace"]["id"][1] == "load0.0"
    assert out["edges"] == [{"from": 0, "to": 1, "window": None}]
    assert out["pinning"]["processes"] == 4


def test_a_serving_pipeline_names_the_stage_that_failed(tmp_path: Path):
    reqs = stage_requests(_serving_req(), tmp_path, "x")
    told = {"status": "failed", "error": "RuntimeError: no input: stage 1 failed"}
    own = {"status": "failed", "error": "ValueError: KV cache too small"}
    out = summarise_serving(reqs, [told, own], 0.0)
    assert (out["status"], out["error"]) == ("failed",
                                             "stage 1 (tiny): ValueError: KV cache too small")
