"""What an engine start costs that is not the model's: vLLM's model-class facts are learnt once
per machine, before any arm's sampler starts, into a copy every arm's compile cache shares."""

from pathlib import Path

from omni_ray.engines import vllm_modelinfo


def test_model_class_facts_are_learnt_before_the_first_arm_measures(run_arm, tiny_model,
                                                                    tmp_path, monkeypatch):
    """Each arm has a compile cache (VLLM_CACHE_ROOT) of its own; without the shared
    ``modelinfos`` vLLM inspected the model class at every start in a subprocess (~6 s and
    ~410 MiB of RssAnon beside the engine, measured on the `small` shape). On a machine that has
    never learnt them (a fresh omni-ray cache), the first arm learns them before measuring; the
    engine of every arm reads them from the cache."""
    monkeypatch.setenv("OMNI_RAY_CACHE", str(tmp_path / "fresh-cache"))
    wl = {"prompt_len": 8, "output_len": 2, "batch": 1, "warmup": 0, "repeats": 1}
    debug = {"env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}
    logs = []
    for _ in range(2):
        result = run_arm(tiny_model, stage=debug, workload=wl)
        logs.append(Path(result["log_path"]).read_text(errors="replace"))
        assert "LlamaForCausalLM from cache" in logs[-1], result["log_path"]
        assert "miss. Loading model instead" not in logs[-1], result["log_path"]
    assert "omni-ray engine caches: learnt" in logs[0]
    assert "omni-ray engine caches: cached" in logs[1]
    assert not vllm_modelinfo.missing(tiny_model)
