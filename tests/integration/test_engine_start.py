"""What an engine start costs that is not the model's: vLLM's model-class facts come from
omni-ray's shared cache, not from a subprocess that imports vLLM again."""

from pathlib import Path

from omni_ray import envs


def test_model_class_facts_come_from_the_shared_cache(run_arm, tiny_model):
    """Each arm has a compile cache (VLLM_CACHE_ROOT) of its own; without the shared
    ``modelinfos`` in it, vLLM inspected the model class in a subprocess at every start (~5 s
    and ~410 MiB of RssAnon in the engine's tree, measured on the `small` shape)."""
    wl = {"prompt_len": 8, "output_len": 2, "batch": 1, "warmup": 0, "repeats": 1}
    debug = {"env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}
    run_arm(tiny_model, workload=wl)  # fills the shared cache if no test did before
    shared = envs.cache_dir() / "vllm-modelinfos"
    assert [p.name for p in shared.glob("*LlamaForCausalLM.json")], sorted(shared.iterdir())
    second = run_arm(tiny_model, stage=debug, workload=wl)
    log = Path(second["log_path"]).read_text(errors="replace")
    assert "LlamaForCausalLM from cache" in log, second["log_path"]
    assert "miss. Loading model instead" not in log, second["log_path"]
