"""One sweep, three engines (vLLM, llama.cpp, transformers) on the tiny model, on a real local
Ray: every record carries the same metric names and the pinning read back from its tree.

llama.cpp is built once into the cache the tests share (the sweep's prepare step builds it,
with a progress line, when it is missing); skipped only where the build tools are missing."""

from __future__ import annotations

import shutil

import pytest

import omni_ray

pytestmark = pytest.mark.integration

# What every engine reports, with the meaning vLLM's records give them (omni_ray.engines).
SHARED = ("ttft_s", "prefill_tok_s", "decode_ms_per_token", "decode_tok_s", "decode_regime",
          "rss_anon_tree_mb", "peak_rss_anon_mb", "engine_pids")


@pytest.fixture(scope="module")
def llamacpp_buildable():
    from omni_ray.peers import llamacpp

    if not llamacpp.is_built() and not (shutil.which("cmake") and shutil.which("c++")):
        pytest.skip("llama.cpp is not built and cmake or a C++ compiler is missing")


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from omni_ray.placement.cluster import connect

    connect(None, [1, None])
    yield
    ray.shutdown()


@pytest.mark.timeout(1800)
def test_one_sweep_runs_vllm_llamacpp_and_transformers_arms(llamacpp_buildable, local_ray,
                                                            tmp_path):
    cfg = {"name": "engines", "model": "tiny", "passes": 1, "timeout_s": 400,
           "placement": {"slot_cores": 1}, "stage": {"max_model_len": 256},
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 1, "repeats": 2,
                        "detokenize": False},
           "zip": [{"engine": ["vllm", "llamacpp", "transformers"],
                    "kv_cache_mib": [32, None, None]}]}
    report = omni_ray.run_sweep(cfg, out=tmp_path, allow_busy=True)
    recs = {r["config"]["stage"]["engine"]: r for r in report.records}
    assert sorted(recs) == ["llamacpp", "transformers", "vllm"]
    assert all(r["status"] == "ok" for r in recs.values()), \
        {e: (r.get("error"), r.get("stderr_tail")) for e, r in recs.items()}
    for engine, r in recs.items():
        m, slot = r["measurements"], r["slot"]["slot"]
        missing = [k for k in SHARED if m.get(k) is None]
        assert missing == [], (engine, missing)
        assert m["decode_tok_s"] > 0 and m["prefill_tok_s"] > 0 and m["rss_anon_tree_mb"] > 0
        assert r["pinning"]["violations"] == [] and r["pinning"]["threads"] >= 1
        assert r["pinning"]["allowed_cpus"] == slot["cpus"] and len(slot["cpus"]) == 1
    # llama-bench ran as a child of the pinned runner, and its threads were read back
    assert recs["llamacpp"]["pinning"]["processes"] >= 2
    assert recs["llamacpp"]["engine_report"]["llamacpp"]["runs"][1]["n_depth"] == 16
    # the arm's bf16 GGUF was converted for it (the test's own cache): the record says how
    (conv,) = recs["llamacpp"]["engine_report"]["llamacpp"]["gguf_build"]
    assert conv["step"] == "convert" and conv["type"] == "bf16" and conv["peak_rss_bytes"] > 0
    # llama.cpp at its best: -fa on and off tried (one thread: the slot has one CPU), the figure
    # is the fastest setting's and the record names it
    llama = recs["llamacpp"]["measurements"]
    tried = llama["llamacpp_tried"]["decode"]
    assert sorted(t["setting"]["flash_attn"] for t in tried) == ["off", "on"]
    best = max(tried, key=lambda t: t["avg_ts"])["setting"]
    assert llama["llamacpp_setting"] == f"-fa {best['flash_attn']} -t {best['threads']}"
    assert recs["vllm"]["measurements"]["kv_cache_tokens"] > 0
    summary = report.summaries["engines"]
    assert set(summary["arms"]) == {a.id for a in report.arms}
    for entry in summary["arms"].values():
        assert entry["metrics"]["decode_tok_s"]["median"] > 0
