"""Each vllm_omni patch, proven on real vLLM: it changes what it claims, and stops if disabled.

Every case runs a fresh engine process on a synthetic model (in-process vLLM unless the case is
about vLLM's own multiprocessing), so the plugin entry point, not this test, applies the patches.
"""

from __future__ import annotations

import pytest

from omni_ray.engine.budget import kv_bytes_per_token

pytestmark = pytest.mark.integration
MiB, GiB = 1 << 20, 1 << 30


def kv_tokens(result) -> int:
    return result["measurements"]["kv_cache_tokens"]


def test_explicit_kv_budget_wins_over_the_environment(run_arm, tiny_model):
    per_token = kv_bytes_per_token(tiny_model)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    on = run_arm(tiny_model, stage={"kv_cache_mib": 64, "env": env})
    off = run_arm(tiny_model, stage={"kv_cache_mib": 64, "env": env,
                                     "disable_patches": ["kv_budget"]})
    assert kv_tokens(on) == 64 * MiB // per_token
    assert on["log"]["kv_explicit_kept"] >= 1
    assert kv_tokens(off) == GiB // per_token  # stock vLLM: the variable wins
    assert on["patch_report"]["kv_budget"]["applied"] is True
    assert off["patch_report"]["kv_budget"] == {
        "applied": False, "reason": "disabled by VLLM_OMNI_DISABLE_KV_BUDGET=1",
        "target": "vllm.platforms.cpu.CpuPlatform.check_and_update_config"}


def test_empty_kvcache_space_is_treated_as_unset(run_arm, tiny_model):
    empty = {"VLLM_CPU_KVCACHE_SPACE": ""}
    on = run_arm(tiny_model, stage={"kv_cache_mib": 32, "env": empty})
    assert kv_tokens(on) == 32 * MiB // kv_bytes_per_token(tiny_model)
    off = run_arm(tiny_model, stage={"kv_cache_mib": 32, "env": empty,
                                     "disable_patches": ["kv_budget"]}, expect="failed")
    assert "invalid literal for int()" in off["stderr_tail"]


def test_kv_budget_patch_in_vllm_multiprocessing_mode(run_arm, tiny_model):
    """vLLM's default mode: EngineCore is a child process, and the budget still holds."""
    r = run_arm(tiny_model, stage={"kv_cache_mib": 48, "multiprocessing": True,
                                   "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
                workload={"prompt_len": 8, "output_len": 4, "batch": 1, "warmup": 0,
                          "repeats": 1})
    assert kv_tokens(r) == 48 * MiB // kv_bytes_per_token(tiny_model)
    assert len(r["measurements"]["engine_pids"]) > 1
    # The release-memory patch ran inside the EngineCore child, i.e. the plugin loaded there.
    trim_pids = {e["pid"] for e in r["log"]["malloc_trim"]}
    assert trim_pids and trim_pids.isdisjoint({r["measurements"]["engine_pids"][0]})
    # and decode attention took the short path there, once (in the one worker process)
    assert r["log"]["cpu_attention_short_path"] == 1, r["log_path"]


@pytest.mark.timeout(1800)  # four compiled engine starts
def test_aot_compile_cache_loads_on_a_warm_start(run_arm, tiny_model, tmp_path):
    cache = tmp_path / "vllm-cache"
    compiled = {"enforce_eager": False}
    wl = {"prompt_len": 16, "output_len": 8, "batch": 1, "warmup": 0, "repeats": 1}
    cold = run_arm(tiny_model, stage=compiled, workload=wl, cache_dir=cache)
    warm = run_arm(tiny_model, stage=compiled, workload=wl, cache_dir=cache)
    # without the patch the key lacks its CPU factor: the first stock engine compiles, and the
    # second fails to load what the first saved
    stock_cold = run_arm(tiny_model, stage=compiled | {"disable_patches": ["aot_cache"]},
                         workload=wl, cache_dir=cache)
    stock = run_arm(tiny_model, stage=compiled | {"disable_patches": ["aot_cache"]},
                    workload=wl, cache_dir=cache)
    assert stock_cold["log"]["aot_loaded"] == 0
    no_replay = run_arm(tiny_model, stage=compiled | {"disable_patches": ["compiled_call"]},
                        workload=wl, cache_dir=cache)
    # torch's AVX2 kernels on the same machine: inductor generates other code, so the artifact
    # above is not this one's (loading it once aborted the process: aot_cache.py)
    other_isa = run_arm(tiny_model, stage=compiled | {"env": {"ATEN_CPU_CAPABILITY": "avx2"}},
                        workload=wl, cache_dir=cache)
    assert other_isa["status"] == "ok", other_isa.get("error")
    assert other_isa["log"]["aot_loaded"] == 0 and other_isa["log"]["aot_load_failed"] == 0
    assert cold["log"]["aot_loaded"] == 0
    assert warm["log"]["aot_loaded"] >= 1 and warm["log"]["aot_load_failed"] == 0
    assert stock["log"]["aot_load_failed"] >= 1 and stock["log"]["aot_loaded"] == 0
    # compiled_call replays the model's forward, freshly compiled or loaded, unless disabled
    assert [r["log"]["compiled_call_replay"] for r in (cold, warm, stock, no_replay)] == [
        1, 1, 1, 0], warm["log_path"]
    # The loaded artifact computes what the compiled one did, replayed or not.
    m = [r["measurements"] for r in (cold, warm, stock, no_replay)]
    assert m[0]["output_token_ids"] and len({tuple(x["output_token_ids"]) for x in m}) == 1
    print(f"\nengine init: cold {m[0]['init_s']:.1f} s, warm with patch {m[1]['init_s']:.1f} s, "
          f"warm without {m[2]['init_s']:.1f} s")
    # How much faster a warm start is, is a figure, not a test on a shared machine: the
    # patches_ab benchmark measures it (configs/patches_ab.yaml); here the load itself is asserted.


def test_release_memory_after_load(run_arm, small_model):
    """The drop is measured by the patch around malloc_trim itself. The settled RssAnon after
    warm-up is not asserted: later allocations reuse the heap, and on `small` the settled A/B
    is within run-to-run noise (see configs/patches_ab.yaml's results)."""
    on = run_arm(small_model)
    off = run_arm(small_model, stage={"disable_patches": ["release_memory"]})
    load = [e for e in on["log"]["malloc_trim"] if e["step"] == "load_model"]
    assert len(load) == 1 and load[0]["released_mb"] > 4, on["log"]["malloc_trim"]
    assert load[0]["after_mb"] < load[0]["before_mb"]
    assert off["log"]["malloc_trim"] == []
    assert off["patch_report"]["release_memory"]["applied"] is False
    print(f"\nsmall: released {load[0]['released_mb']} MiB at load; settled RssAnon "
          f"{on['measurements']['rss_anon_tree_mb']:.1f} MiB with the patch, "
          f"{off['measurements']['rss_anon_tree_mb']:.1f} MiB without")


def test_cpu_attention_short_path_computes_what_vllm_does(run_arm, tiny_model):
    """Decode attention through vllm_omni's short path and through vLLM's own: the same
    greedy tokens, and only the patched engine says it took the short path."""
    wl = {"prompt_len": 24, "output_len": 48, "batch": 2, "warmup": 0, "repeats": 1}
    native = run_arm(tiny_model, workload=wl)  # omni-ray passes layer names as str
    on = run_arm(tiny_model, workload=wl, stage={"env": {"VLLM_USE_LAYERNAME": "1"}})
    off = run_arm(tiny_model, workload=wl, stage={"disable_patches": ["cpu_attention"]})
    assert on["patch_report"]["cpu_attention"]["applied"] is True
    assert off["patch_report"]["cpu_attention"]["reason"] == (
        "disabled by VLLM_OMNI_DISABLE_CPU_ATTENTION=1")
    # layer names as vLLM's LayerName objects: the Python kernels; as strings: the C++ ones
    assert on["log"]["cpu_attention_short_path"] == 1 and on["log"]["cpu_attention_native"] == 0
    assert native["log"]["cpu_attention_native"] == 1, native["log_path"]
    # the metadata pushed before each forward: the C++ ops ran without taking the GIL
    assert native["log"]["cpu_attention_no_gil"] == 1, native["log_path"]
    assert on["log"]["cpu_attention_no_gil"] == 0
    assert off["log"]["cpu_attention_short_path"] == 0
    ids = on["measurements"]["output_token_ids"]
    assert ids and ids == off["measurements"]["output_token_ids"]
    assert native["measurements"]["output_token_ids"] == ids


def test_step_overhead_short_paths_decode_what_vllm_does(run_arm, tiny_model):
    """Greedy decode with vllm_omni's per-step short paths and with vLLM's own: the same tokens,
    and only the patched engine says its sampler took the native argmax."""
    wl = {"prompt_len": 24, "output_len": 48, "batch": 2, "warmup": 0, "repeats": 1}
    on = run_arm(tiny_model, workload=wl)
    off = run_arm(tiny_model, workload=wl, stage={"disable_patches": ["step_overhead"]})
    assert on["patch_report"]["step_overhead"]["applied"] is True
    assert off["patch_report"]["step_overhead"]["reason"] == (
        "disabled by VLLM_OMNI_DISABLE_STEP_OVERHEAD=1")
    assert on["log"]["greedy_argmax"] == 1, on["log_path"]
    assert off["log"]["greedy_argmax"] == 0
    ids = on["measurements"]["output_token_ids"]
    assert ids and ids == off["measurements"]["output_token_ids"]
