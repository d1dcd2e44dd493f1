"""The aot_cache patch keys vLLM's AOT artifacts on the CPU too: an artifact generated for other
instructions (ATEN_CPU_CAPABILITY, another CPU sharing the cache) is never loaded."""

import pytest
import torch

pytestmark = pytest.mark.native  # imports vLLM

AVX512 = {"avx2", "fma", "avx512f", "avx512bw"}


def test_the_cpu_factor_names_the_capability_and_the_flags():
    from vllm_omni.patches import aot_cache

    a = aot_cache.cpu_factor("AVX512", AVX512)
    assert a == aot_cache.cpu_factor("AVX512", set(sorted(AVX512, reverse=True)))
    assert a.startswith("vllm_omni-cpu:AVX512:")
    assert aot_cache.cpu_factor("AVX2", AVX512) != a  # ATEN_CPU_CAPABILITY=avx2, same machine
    assert aot_cache.cpu_factor("AVX512", AVX512 | {"amx_tile"}) != a  # another CPU
    assert aot_cache.cpu_factor() == aot_cache.cpu_factor(
        torch.backends.cpu.get_cpu_capability(), None)


def test_apply_appends_the_factor_to_vllms_key_once(monkeypatch):
    from vllm.compilation import caching

    from vllm_omni.patches import aot_cache

    monkeypatch.setattr(torch.compiler, "load_compiled_function", lambda *a, **k: None)
    monkeypatch.setattr(caching, "aot_compile_hash_factors", lambda cfg: ["env", "config"])
    aot_cache.apply(torch.compiler.load_compiled_function)
    aot_cache.apply(torch.compiler.load_compiled_function)  # twice, as in every vLLM process
    assert caching.aot_compile_hash_factors(None) == ["env", "config", aot_cache.cpu_factor()]
