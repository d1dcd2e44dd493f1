"""A 2-stage pipeline on real vLLM (issue #26): a "small" thinker feeds a "tiny" talker, each in
its own engine process on its own CPU of a 2-CPU slot, without Ray (the stage actor calls the
same ``launch_pipeline``)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from omni_ray.config.schema import PipelineStage, StageConfig, WorkloadConfig
from omni_ray.engine.launch import launch_arm
from omni_ray.engine.pipeline import launch_pipeline
from omni_ray.engines.request import EngineRequest

pytestmark = pytest.mark.integration

CPUS = (0, 1)
WORKLOAD = WorkloadConfig(prompt_len=16, output_len=8, batch=1, warmup=1, repeats=1,
                          detokenize=False)


def stage(model: str, kv: int, **kw) -> PipelineStage:
    return PipelineStage(stage=StageConfig(model=model, kv_cache_mib=kv, max_model_len=128, **kw),
                         cores=1)


@pytest.fixture(autouse=True)
def two_cpus():
    if not set(CPUS) <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")


@pytest.mark.timeout(1200)
def test_last_stage_tokens_equal_the_stages_run_by_hand(tmp_path):
    req = EngineRequest(stage=StageConfig(model="small", kv_cache_mib=32, max_model_len=128),
                        workload=WORKLOAD, cpus=CPUS, node=0,
                        stages=(stage("small", 32), stage("tiny", 16)))
    res = launch_pipeline(req, tmp_path, "pipe", timeout_s=600)
    assert res["status"] == "ok", (res.get("error"), res.get("stderr_tail"))
    s0, s1 = res["stages"]
    # each stage's threads read back on its own CPU
    assert s0["cpus"] == [0] and s0["pinning"]["allowed_cpus"] == [0]
    assert s1["cpus"] == [1] and s1["pinning"]["allowed_cpus"] == [1]
    assert s0["pinning"]["violations"] == [] == s1["pinning"]["violations"]
    # two budgets, two token counts, each within its budget
    assert s0["kv_cache_tokens"] != s1["kv_cache_tokens"]
    for s in (s0, s1):
        assert 0 < s["kv_cache_tokens"] <= s["kv_cache_tokens_budget"]
        assert s["decode_tok_s"] > 0 and s["prefill_tok_s"] > 0 and s["rss_anon_tree_mb"] > 0
    m = res["measurements"]
    assert m["pipeline_e2e_s"] > 0 and m["last_stage_first_token_s"] > 0
    assert m["rss_anon_tree_mb"] == pytest.approx(s0["rss_anon_tree_mb"] + s1["rss_anon_tree_mb"])
    assert m["pipeline_peak_rss_anon_mb"] >= 0.9 * m["rss_anon_tree_mb"]
    assert m["bottleneck_stage"] in (0, 1)

    # by hand: stage 0 on the pipeline's prompts, its ids % tiny's vocab (2048) into stage 1
    prompts = json.loads((tmp_path / "pipe.s0.in.json").read_text())["token_ids"]
    hand = tmp_path / "hand"
    hand.mkdir()
    (hand / "a.in.json").write_text(json.dumps({"token_ids": prompts}))
    a = launch_arm(EngineRequest(stage=req.stages[0].stage, workload=WORKLOAD, cpus=(0,),
                                 inputs_path=str(hand / "a.in.json"),
                                 outputs_path=str(hand / "a.out.json")),
                   hand, "a", timeout_s=600)
    assert a["status"] == "ok", a.get("stderr_tail")
    thinker = a["measurements"]["output_token_ids"]
    assert thinker == s0["output_token_ids"]
    (hand / "b.in.json").write_text(json.dumps(
        {"token_ids": [[t % 2048 for t in row] for row in thinker]}))
    b = launch_arm(EngineRequest(stage=req.stages[1].stage, cpus=(1,),
                                 workload=WORKLOAD.__class__(**{**WORKLOAD.to_dict(),
                                                                "prompt_len": 8}),
                                 inputs_path=str(hand / "b.in.json")),
                   hand, "b", timeout_s=600)
    assert b["status"] == "ok", b.get("stderr_tail")
    assert b["measurements"]["output_token_ids"] == s1["output_token_ids"] == m["output_token_ids"]
    assert max(max(row) for row in thinker) >= 0  # ids of small's 32000-token vocabulary


def by_hand(stage: StageConfig, cpus: tuple[int, ...], prompts: list[list[int]],
            output_len: int, where, name: str) -> list[list[int]]:
    """One stage run alone, all its input at once: its output ids."""
    (where / f"{name}.in.json").write_text(json.dumps({"token_ids": prompts, "final": True}))
    wl = dataclasses.replace(WORKLOAD, prompt_len=len(prompts[0]), output_len=output_len)
    res = launch_arm(EngineRequest(stage=stage, cpus=cpus, workload=wl,
                                   inputs_path=str(where / f"{name}.in.json")),
                     where, name, timeout_s=600)
    assert res["status"] == "ok", res.get("stderr_tail")
    return res["measurements"]["output_token_ids"]


@pytest.mark.timeout(1200)
def test_a_streamed_edge_starts_the_next_stage_early_and_keeps_its_rule(tmp_path):
    # window 8 of 16 tokens: the talker reads the thinker's output in 2 chunks and writes 8
    # tokens after each, on the prompt c1 o1 c2 (engines/handover.py)
    wl = dataclasses.replace(WORKLOAD, output_len=16)
    talker = PipelineStage(stage=StageConfig(model="tiny", kv_cache_mib=16, max_model_len=128),
                           cores=1, window=8)
    req = EngineRequest(stage=StageConfig(model="small", kv_cache_mib=32, max_model_len=128),
                        workload=wl, cpus=CPUS, node=0, stages=(stage("small", 32), talker))
    res = launch_pipeline(req, tmp_path, "pipe", timeout_s=600)
    assert res["status"] == "ok", (res.get("error"), res.get("stderr_tail"))
    s0, s1 = res["stages"]
    # the thinker wrote each chunk as it had it; the talker had its first chunk after it was
    # written and while the thinker still generated (the record's wall-clock times, one host)
    (edge,) = res["edges"]
    assert edge["window"] == 8 and len(s1["chunk_at"]) == 2 == len(s0["sent_at"])
    assert all(sent <= got for sent, got in zip(s0["sent_at"], s1["chunk_at"]))
    assert s0["sent_at"][0] <= s1["input_at"] < s0["output_at"]
    assert edge["overlap_s"] > 0 and s1["first_token_at"] < s0["output_at"]

    # by hand, one engine run per chunk under the same rule
    thinker = s0["output_token_ids"]
    assert [len(row) for row in thinker] == [16]
    c1, c2 = ([[t % 2048 for t in row[a:a + 8]] for row in thinker] for a in (0, 8))
    o1 = by_hand(talker.stage, (1,), c1, 8, tmp_path, "o1")
    o2 = by_hand(talker.stage, (1,), [a + b + c for a, b, c in zip(c1, o1, c2)], 8, tmp_path,
                 "o2")
    assert s1["output_token_ids"] == [a + b for a, b in zip(o1, o2)]
    assert res["measurements"]["output_token_ids"] == s1["output_token_ids"]


@pytest.mark.timeout(900)
def test_a_stage_that_fails_to_start_fails_the_arm_naming_it(tmp_path):
    # 1 MiB of KV holds about 1024 tiny tokens, less than one 2048-token sequence: vLLM refuses
    bad = PipelineStage(stage=StageConfig(model="tiny", kv_cache_mib=1, max_model_len=2048),
                        cores=1)
    req = EngineRequest(stage=StageConfig(model="tiny", kv_cache_mib=16, max_model_len=128),
                        workload=WORKLOAD, cpus=CPUS, node=0,
                        stages=(stage("tiny", 16), bad))
    res = launch_pipeline(req, tmp_path, "pipe", timeout_s=400)
    assert res["status"] == "failed"
    assert res["error"].startswith("stage 1 (tiny): "), res["error"]
    assert res["stages"][0]["status"] == "failed"  # told to give up, not left to time out
    assert "no input: stage 1 failed" in res["stages"][0]["error"]


@pytest.mark.timeout(1800)
def test_a_pipeline_sweep_on_ray_records_each_stage_and_goes_on_past_a_failed_arm(tmp_path):
    import ray

    import omni_ray
    from omni_ray.placement.cluster import connect

    cfg = {"name": "pipe", "model": "tiny", "passes": 1, "timeout_s": 600,
           "placement": {"slot_cores": 2},
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 1, "detokenize": False},
           "stages": [{"kv_cache_mib": 16, "max_model_len": 128, "cores": 1},
                      {"kv_cache_mib": 16, "max_model_len": 128}],
           # the second arm's talker cannot hold one 2048-token sequence in 1 MiB
           "zip": [{"stages[1].kv_cache_mib": [16, 1], "stages[1].max_model_len": [128, 2048]}]}
    connect(None, [2])
    try:
        report = omni_ray.run_sweep(cfg, out=tmp_path, allow_busy=True)
    finally:
        ray.shutdown()
    ok, bad = sorted(report.records, key=lambda r: r["config"]["stages"][1]["kv_cache_mib"],
                     reverse=True)
    assert ok["status"] == "ok", (ok.get("error"), ok.get("stderr_tail"))
    assert [s["pinning"]["allowed_cpus"] for s in ok["stages"]] == [[c] for c in
                                                                      ok["slot"]["slot"]["cpus"]]
    assert ok["measurements"]["pipeline_e2e_s"] > 0
    assert bad["status"] == "failed" and bad["error"].startswith("stage 1 (tiny): ")


@pytest.mark.timeout(1800)
def test_a_stage_on_another_simulated_node_runs_on_that_node(tmp_path, monkeypatch):
    """Two simulated sockets of this machine (OMNI_RAY_SYSFS_ROOT), one Ray node: the talker
    names node 1, so the arm holds a slot on each node, and each stage's threads read back on
    its own node's CPU; its memory is bound there, or recorded not bound (a simulated node)."""
    import ray

    import omni_ray
    from omni_ray.errors import ConfigError
    from omni_ray.placement.cluster import connect
    from omni_ray.topology.detection import detect_host
    from omni_ray.topology.simulate import split_nodes, write_tree

    nodes = split_nodes(detect_host(), 2)
    monkeypatch.setenv("OMNI_RAY_SYSFS_ROOT", str(write_tree(tmp_path / "sys", nodes)))
    stages = [{"kv_cache_mib": 16, "max_model_len": 128, "node": 0},
              {"kv_cache_mib": 16, "max_model_len": 128, "node": 1, "window": 4}]
    cfg = {"name": "sockets", "model": "tiny", "passes": 1, "timeout_s": 600,
           "placement": {"slot_cores": 1}, "stages": stages,
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 1, "detokenize": False}}
    connect(None, [1])
    try:
        report = omni_ray.run_sweep(cfg, out=tmp_path / "res", allow_busy=True)
        missing = cfg | {"name": "missing", "stages": [stages[0], stages[1] | {"node": 3}]}
        with pytest.raises(ConfigError, match=r"^<dict>: stages\[1\]\.node: no Ray node has a "
                                              r"slot on NUMA node 3 .*got 3$"):
            omni_ray.run_sweep(missing, out=tmp_path / "res", allow_busy=True)
    finally:
        ray.shutdown()
    (rec,) = report.records
    assert rec["status"] == "ok", (rec.get("error"), rec.get("stderr_tail"))
    s0, s1 = rec["stages"]
    assert s0["pinning"]["allowed_cpus"] == list(nodes[0].cpus) == s0["cpus"]
    assert s1["pinning"]["allowed_cpus"] == list(nodes[1].cpus) == s1["cpus"]
    assert [s["pinning"]["membind"]["node"] for s in (s0, s1)] == [0, 1]
    for s in (s0, s1):
        bind = s["pinning"]["membind"]
        assert bind["ok"] or bind["reason"] == f"not bound (node {bind['node']} is simulated)"
    assert [w["numa_node"] for w in rec["slot"]["slots"]] == [0, 1]
    assert rec["edges"][0]["window"] == 4 and len(s1["chunk_at"]) == 2


# Serving on a pipeline (docs/pipelines.md, "Serving"): one request in the pipeline at a time
# (max_concurrency 1), so each stage generates every request alone, as the by-hand run does.
N_SERVED = 4
SERVING = WorkloadConfig(mode="serving", request_rate=(4,), max_concurrency=1,
                         num_requests=N_SERVED, warmup_requests=1, prompt_len=16, output_len=8,
                         percentiles=(50, 90), detokenize=False)


def _by_id(trace: dict, key: str) -> dict:
    return dict(zip(trace["id"], trace[key]))


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("window", [None, 4], ids=["whole", "streamed"])
def test_a_serving_workload_runs_through_the_stages_and_is_timed_on_the_last(tmp_path, window):
    from omni_ray.workload.serving import percentile

    talker = PipelineStage(stage=StageConfig(model="tiny", kv_cache_mib=16, max_model_len=128),
                           cores=1, window=window)
    req = EngineRequest(stage=StageConfig(model="small", kv_cache_mib=32, max_model_len=128),
                        workload=SERVING, cpus=CPUS, node=0,
                        stages=(stage("small", 32), talker))
    res = launch_pipeline(req, tmp_path, "serve", timeout_s=600)
    assert res["status"] == "ok", (res.get("error"), res.get("stderr_tail"))
    s0, s1 = res["stages"]
    assert s0["pinning"]["allowed_cpus"] == [0] and s1["pinning"]["allowed_cpus"] == [1]
    (point,) = res["measurements"]["serving"]
    s = point["samples"]
    assert point["completed"] == N_SERVED and point["failed"] == 0 and s["error"] is None
    assert s["output_tokens"] == [8] * N_SERVED  # the last stage's tokens came back
    for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for p in (50, 90):
            assert point[name][f"p{p}"] == pytest.approx(percentile(s[name], p), abs=2e-3)

    # every request went through both stages: the talker read the thinker's output ids mapped
    # id % 2048 (its vocabulary) and wrote its 8 tokens
    t0, t1 = s0["serving_trace"], s1["serving_trace"]
    ids = [f"load0.{i}" for i in range(N_SERVED)]
    out0, in1, out1 = _by_id(t0, "token_ids"), _by_id(t1, "input_ids"), _by_id(t1, "token_ids")
    for rid in ids:
        assert len(out0[rid]) == 8 and len(out1[rid]) == 8
        assert in1[rid] == [t % 2048 for t in out0[rid]]
    # the pipeline's first token is the talker's: after the thinker had the request's output
    # (whole) or its first window
    handed, start = _by_id(t0, "out"), _by_id(t0, "in")
    for i, rid in enumerate(ids):
        assert s["ttft_ms"][i] >= (handed[rid] - start[rid]) * 1e3
    st0, st1 = point["stages"]
    assert st0["requests"] == st1["requests"] == N_SERVED
    assert st0["kv_cache"]["budget_tokens"] > 0 and st0["cpu"]["engine_core_s"] > 0
    assert 0 <= st1["handover_ms"]["median"] < 1000
    assert point["ttft_ms"]["median"] > st0["ttft_ms"]["median"]
    if window:  # the talker started on the first window while the thinker still generated
        first1 = _by_id(t1, "first")
        assert any(first1[rid] < _by_id(t0, "done")[rid] for rid in ids)

    # by hand, the first request: the talker alone on the thinker's output, by the same rule
    c = [[t % 2048 for t in out0[ids[0]]]]
    if window is None:
        hand = by_hand(talker.stage, (1,), c, 8, tmp_path, "h")
    else:
        o1 = by_hand(talker.stage, (1,), [c[0][:4]], 4, tmp_path, "h1")
        o2 = by_hand(talker.stage, (1,), [c[0][:4] + o1[0] + c[0][4:]], 4, tmp_path, "h2")
        hand = [o1[0] + o2[0]]
    assert hand == [out1[ids[0]]]


@pytest.mark.timeout(900)
def test_a_serving_stage_that_fails_to_start_fails_the_arm_naming_it(tmp_path):
    # 1 MiB of KV holds about 1024 tiny tokens, less than one 2048-token sequence: vLLM refuses
    bad = PipelineStage(stage=StageConfig(model="tiny", kv_cache_mib=1, max_model_len=2048),
                        cores=1)
    req = EngineRequest(stage=StageConfig(model="tiny", kv_cache_mib=16, max_model_len=128),
                        workload=SERVING, cpus=CPUS, node=0, stages=(stage("tiny", 16), bad))
    res = launch_pipeline(req, tmp_path, "pipe", timeout_s=400)
    assert res["status"] == "failed"
    assert res["error"].startswith("stage 1 (tiny): "), res["error"]
    assert res["stages"][0]["status"] == "failed"  # told to give up, not left to time out
    assert "no input: stage 1 failed" in res["stages"][0]["error"]


@pytest.mark.timeout(1800)
def test_a_serving_pipeline_sweep_on_ray_records_the_pipeline_s_load_points(tmp_path):
    import ray

    import omni_ray
    from omni_ray.placement.cluster import connect

    cfg = {"name": "pipeserve", "model": "tiny", "passes": 1, "timeout_s": 600,
           "placement": {"slot_cores": 2},
           "workload": {"mode": "serving", "request_rate": [4, "inf"], "num_requests": 4,
                        "warmup_requests": 1, "prompt_len": 16, "output_len": 8,
                        "percentiles": [90], "slo": {"ttft_ms": 10000}, "detokenize": False},
           "stages": [{"kv_cache_mib": 16, "max_model_len": 128, "cores": 1},
                      {"kv_cache_mib": 16, "max_model_len": 128}]}
    connect(None, [2])
    try:
        report = omni_ray.run_sweep(cfg, out=tmp_path, allow_busy=True)
    finally:
        ray.shutdown()
    (rec,) = report.records
    assert rec["status"] == "ok", (rec.get("error"), rec.get("stderr_tail"))
    assert [s["pinning"]["allowed_cpus"] for s in rec["stages"]] == [
        [c] for c in rec["slot"]["slot"]["cpus"]]
    m = rec["measurements"]
    assert [p["request_rate"] for p in m["serving"]] == [4.0, "inf"]
    for point in m["serving"]:
        assert point["completed"] == 4 and point["good_requests"] == 4
        assert [s["requests"] for s in point["stages"]] == [4, 4]
    summary = (report.out_dirs["pipeserve"] / "summary.md").read_text()
    assert "## Serving load points" in summary
