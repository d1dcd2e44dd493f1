"""The engine launcher's pure parts and its failure paths (a fake engine command, no vLLM)."""

import signal

from omni_ray.engine import launch
from omni_ray.engine.runner import engine_env, engine_kwargs

LOG = """\
(EngineCore pid=4242) INFO 12-02 [kv_cache_utils.py:1] CPU KV cache size: 65,536 tokens, Max...
(MainProcess pid=4241) INFO 12-02 [kv_budget.py:1] vllm_omni: keeping explicit kv_cache_memory_bytes=1
(EngineCore pid=4242) INFO 12-02 [release_memory.py:60] vllm_omni: malloc_trim after load_model: RssAnon 790.0 -> 773.9 MiB (released 16.1)
(MainProcess pid=1) WARNING [decorators.py:1] Compiling model again due to a load failure from x
"""


def test_scan_log_finds_kv_trim_and_aot_markers():
    out = launch.scan_log(LOG)
    assert out["kv_cache_tokens_logged"] == [65536]
    assert out["kv_explicit_kept"] == 1
    assert out["aot_load_failed"] == 1 and out["aot_loaded"] == 0
    assert out["malloc_trim"] == [{"pid": 4242, "step": "load_model", "before_mb": 790.0,
                                   "after_mb": 773.9, "released_mb": 16.1}]


def test_death_causes_name_the_signal():
    assert "SIGKILL (out of memory, or killed)" in launch._death_cause(-signal.SIGKILL)
    assert "exited with code 3" in launch._death_cause(3)


def test_engine_env_pins_threads_and_switches_patches():
    env = engine_env({"stage": {"multiprocessing": False, "disable_patches": ["kv_budget"],
                                "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
                      "cpus": [2, 3], "compile_cache_dir": "/c"})
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"
    assert env["VLLM_OMNI_DISABLE_KV_BUDGET"] == "1"
    assert env["VLLM_CACHE_ROOT"] == "/c" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_engine_kwargs_turn_mib_into_bytes_and_pass_engine_args_through():
    kw = engine_kwargs({"model_path": "/m", "stage": {
        "kv_cache_mib": 64, "quantization": "cpu_int4", "engine_args": {"block_size": 32}}})
    assert kw["kv_cache_memory_bytes"] == 64 << 20 and kw["quantization"] == "cpu_int4"
    assert kw["block_size"] == 32 and kw["enable_prefix_caching"] is False


def test_cpp_wrapper_sets_inductor_and_plain_layer_names_for_compiled_stages_only():
    compiled = {"model_path": "/m", "stage": {
        "kv_cache_mib": 64, "enforce_eager": False, "cpp_wrapper": True,
        "engine_args": {"compilation_config": {"inductor_compile_config": {"dce": False},
                                               "mode": 3}}}}
    kw = engine_kwargs(compiled)
    assert kw["compilation_config"] == {"mode": 3, "inductor_compile_config": {
        "dce": False, "cpp_wrapper": True}}
    assert engine_env(compiled)["VLLM_USE_LAYERNAME"] == "0"
    bare_mode = dict(compiled, stage=dict(compiled["stage"], engine_args={"compilation_config": 3}))
    assert engine_kwargs(bare_mode)["compilation_config"] == {
        "mode": 3, "inductor_compile_config": {"cpp_wrapper": True}}
    eager = dict(compiled, stage=dict(compiled["stage"], enforce_eager=True))
    assert engine_env(eager)["VLLM_USE_LAYERNAME"] == "0"  # the default, for the C++ attention
    vllm_names = dict(eager, stage=dict(eager["stage"], env={"VLLM_USE_LAYERNAME": "1"}))
    assert engine_env(vllm_names)["VLLM_USE_LAYERNAME"] == "1"
    assert "cpp_wrapper" not in engine_kwargs(eager)["compilation_config"].get(
        "inductor_compile_config", {})
    off = dict(compiled, stage=dict(compiled["stage"], cpp_wrapper=False))
    assert engine_kwargs(off)["compilation_config"]["inductor_compile_config"] == {"dce": False}


def test_serial_kernels_turn_off_inductor_threads_for_compiled_stages_only():
    stage = {"kv_cache_mib": 64, "enforce_eager": False, "serial_kernels": True,
             "engine_args": {"compilation_config": {"inductor_compile_config": {"dce": False}}}}
    kw = engine_kwargs({"model_path": "/m", "stage": stage})
    assert kw["compilation_config"]["inductor_compile_config"] == {
        "dce": False, "cpp.dynamic_threads": False, "cpp.threads": 1}
    both = engine_kwargs({"model_path": "/m", "stage": dict(stage, cpp_wrapper=True)})
    assert both["compilation_config"]["inductor_compile_config"] == {
        "dce": False, "cpp_wrapper": True, "cpp.dynamic_threads": False, "cpp.threads": 1}
    eager = engine_kwargs({"model_path": "/m", "stage": dict(stage, enforce_eager=True)})
    assert eager["compilation_config"]["inductor_compile_config"] == {"dce": False}


def _fake_engine(monkeypatch, code: str):
    import sys

    monkeypatch.setattr(launch.sys, "executable", sys.executable)
    real_popen = launch.subprocess.Popen

    def popen(cmd, **kw):
        return real_popen([sys.executable, "-c", code, *cmd[3:]], **kw)

    monkeypatch.setattr(launch.subprocess, "Popen", popen)


def test_an_engine_that_dies_without_a_result_is_a_failed_result(monkeypatch, tmp_path):
    _fake_engine(monkeypatch, "import os, signal; print('loading...'); "
                              "os.kill(os.getpid(), signal.SIGKILL)")
    r = launch.run_engine({"stage": {}}, tmp_path, "x", timeout_s=30)
    assert r["status"] == "failed" and "SIGKILL" in r["error"]
    assert "loading..." in r["stderr_tail"]


def test_an_engine_past_its_timeout_is_killed(monkeypatch, tmp_path):
    _fake_engine(monkeypatch, "import time; time.sleep(60)")
    r = launch.run_engine({"stage": {}}, tmp_path, "x", timeout_s=1)
    assert r["status"] == "timeout" and "timeout_s=1" in r["error"] and r["wall_s"] < 10
