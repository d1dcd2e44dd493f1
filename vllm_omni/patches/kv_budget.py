"""Explicit KV cache budget on CPU.

Patches: classmethod ``vllm.platforms.cpu.CpuPlatform.check_and_update_config``.
Why: it overwrites ``cache_config.kv_cache_memory_bytes`` with ``VLLM_CPU_KVCACHE_SPACE`` GiB
whenever that variable is set, so a budget passed to ``LLM(kv_cache_memory_bytes=...)`` is
silently ignored; and an empty ``VLLM_CPU_KVCACHE_SPACE`` crashes ``vllm.envs`` on ``int('')``.
Fix: remember the explicit value, call the original, put the explicit value back; drop an empty
variable from the environment (children inherit the fix).
Remove when: with VLLM_CPU_KVCACHE_SPACE=1 and VLLM_OMNI_DISABLE_KV_BUDGET=1, an explicit
64 MiB budget gives the KV token count of 64 MiB.
"""

from __future__ import annotations

import logging
import os

from vllm_omni import envs, events

NAME = "kv_budget"
TARGET = "vllm.platforms.cpu.CpuPlatform.check_and_update_config"

logger = logging.getLogger("vllm.omni")
# What the engine log says when the patch wins (omni_ray.engine.launch counts the
# kv_explicit_kept event logged with it, not this wording).
KEPT_LOG = "vllm_omni: keeping explicit kv_cache_memory_bytes=%d over %s=%s"


def find_target():
    from vllm.platforms.cpu import CpuPlatform

    attr = CpuPlatform.__dict__.get("check_and_update_config")
    if not isinstance(attr, classmethod):
        raise LookupError("CpuPlatform.check_and_update_config is not a classmethod here")
    return attr.__func__


def drop_empty_kvcache_space() -> None:
    if os.environ.get(envs.VLLM_CPU_KVCACHE_SPACE, None) == "":
        del os.environ[envs.VLLM_CPU_KVCACHE_SPACE]
        logger.info("vllm_omni: %s was empty; treated as unset", envs.VLLM_CPU_KVCACHE_SPACE)


def apply(original) -> None:
    import functools

    from vllm.platforms.cpu import CpuPlatform

    from vllm_omni.patches import mark

    drop_empty_kvcache_space()

    @functools.wraps(original)
    def check_and_update_config(cls, vllm_config) -> None:
        drop_empty_kvcache_space()
        cache_config = vllm_config.cache_config
        explicit = cache_config.kv_cache_memory_bytes
        original(cls, vllm_config)
        if explicit is not None and cache_config.kv_cache_memory_bytes != explicit:
            value = os.environ.get(envs.VLLM_CPU_KVCACHE_SPACE)
            events.emit("kv_explicit_kept", KEPT_LOG, explicit, envs.VLLM_CPU_KVCACHE_SPACE,
                        value, bytes=explicit, variable=envs.VLLM_CPU_KVCACHE_SPACE,
                        value=value)
            cache_config.kv_cache_memory_bytes = explicit

    CpuPlatform.check_and_update_config = classmethod(mark(check_and_update_config, NAME))
