"""Every environment variable that vllm_omni reads, with what it does.

Values are read when asked for (not at import), so a test or a parent process can change them.
The off switches take "1", "true" or "yes" (any case) as on; anything else, or unset, is off.
"""

from __future__ import annotations

import os
from pathlib import Path

# Turns every vllm_omni runtime patch off (the cpu_int4 quantization method stays registered,
# since a checkpoint that names it cannot load without it).
VLLM_OMNI_DISABLE = "VLLM_OMNI_DISABLE"
# Per-patch off switches: VLLM_OMNI_DISABLE_AOT_CACHE, VLLM_OMNI_DISABLE_KV_BUDGET,
# VLLM_OMNI_DISABLE_INDUCTOR_CONFIG, VLLM_OMNI_DISABLE_RELEASE_MEMORY,
# VLLM_OMNI_DISABLE_CPU_ATTENTION, VLLM_OMNI_DISABLE_STEP_OVERHEAD,
# VLLM_OMNI_DISABLE_COMPILED_CALL (the suffix is the patch's name, upper-cased).
DISABLE_PREFIX = "VLLM_OMNI_DISABLE_"
# Runs cpu_int4 on torch's int4 kernels instead of vllm_omni's native ones (vllm_omni/ops/native.py).
VLLM_OMNI_DISABLE_NATIVE_INT4 = "VLLM_OMNI_DISABLE_NATIVE_INT4"
# Keeps the cpu_attention patch on its Python kernels instead of its C++ ones
# (vllm_omni/ops/csrc/cpu_attention.cpp), for comparison.
VLLM_OMNI_DISABLE_NATIVE_ATTENTION = "VLLM_OMNI_DISABLE_NATIVE_ATTENTION"
# Keeps cpu_int4's packed weights in torch's own allocations instead of vllm_omni's huge-page
# mappings (vllm_omni/ops/weight_arena.py).
VLLM_OMNI_DISABLE_WEIGHT_ARENA = "VLLM_OMNI_DISABLE_WEIGHT_ARENA"
# Which cpu_int4 kernel set to use: "amx", "avx512bf16", "avx512", "avx2" or "portable"
# (vllm_omni/ops/native.py);
# unset, empty or "auto": the best set the CPU runs. A set the CPU cannot run is refused with a
# warning. Lets an AVX-512 machine run and test the kernels an AVX2-only one gets.
VLLM_OMNI_INT4_ISA = "VLLM_OMNI_INT4_ISA"
# Where vllm_omni keeps what it builds (the native kernels); default ~/.cache/vllm_omni.
VLLM_OMNI_CACHE = "VLLM_OMNI_CACHE"
# vLLM's own: GiB of KV cache for every engine of the process tree (vllm/platforms/cpu.py).
# vllm_omni makes an explicit kv_cache_memory_bytes win over it and treats "" as unset.
VLLM_CPU_KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def patches_disabled() -> bool:
    return _truthy(VLLM_OMNI_DISABLE)


def patch_off_switch(patch_name: str) -> str:
    """The variable that switches one patch off."""
    return DISABLE_PREFIX + patch_name.upper()


def patch_disabled(patch_name: str) -> str | None:
    """The variable that disables ``patch_name`` here, or None when it may apply."""
    if patches_disabled():
        return VLLM_OMNI_DISABLE
    var = patch_off_switch(patch_name)
    return var if _truthy(var) else None


def native_int4_disabled() -> str | None:
    return VLLM_OMNI_DISABLE_NATIVE_INT4 if _truthy(VLLM_OMNI_DISABLE_NATIVE_INT4) else None


def native_attention_disabled() -> str | None:
    name = VLLM_OMNI_DISABLE_NATIVE_ATTENTION
    return name if _truthy(name) else None


def weight_arena_disabled() -> str | None:
    name = VLLM_OMNI_DISABLE_WEIGHT_ARENA
    return name if _truthy(name) else None


def cache_root() -> Path:
    value = os.environ.get(VLLM_OMNI_CACHE, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "vllm_omni"


def int4_isa() -> str | None:
    """The kernel set VLLM_OMNI_INT4_ISA names (lower-cased), or None for automatic."""
    value = os.environ.get(VLLM_OMNI_INT4_ISA, "").strip().lower()
    return None if value in ("", "auto") else value
