"""Inductor settings the user passed are kept on CPU.

Patches: classmethod ``vllm.platforms.cpu.CpuPlatform.check_and_update_config``.
Why: for a compiled model it ``update``s ``compilation_config.inductor_compile_config`` with its
own ``dce``, ``size_asserts``, ``nan_asserts``, ``epilogue_fusion`` and ``cpp.dynamic_threads``,
so the same keys passed in ``LLM(compilation_config=...)`` are silently replaced. The one that
matters is ``cpp.dynamic_threads=True``: it makes every generated kernel (norms, RoPE, SiLU,
residual adds) open an OpenMP region even for one decode token, and a region costs more on two
cores than the kernel's work. omni-ray's ``stage.serial_kernels`` asks for
``cpp.dynamic_threads=False, cpp.threads=1`` and needs the request to survive.
Fix: remember the keys present before the platform's update, call the original, put back those
whose value it changed. Keys nobody passed get the platform's values as before.
Remove when: with VLLM_OMNI_DISABLE_INDUCTOR_CONFIG=1, ``cpp.dynamic_threads=False`` passed in
``inductor_compile_config`` is still False after ``EngineArgs.create_engine_config()``.
"""

from __future__ import annotations

import logging

from vllm_omni import events
from vllm_omni.patches.kv_budget import TARGET, find_target  # the same classmethod, wrapped twice

NAME = "inductor_config"
__all__ = ["NAME", "TARGET", "apply", "find_target"]

logger = logging.getLogger("vllm.omni")


def apply(original) -> None:
    import functools

    from vllm.platforms.cpu import CpuPlatform

    from vllm_omni.patches import mark

    @functools.wraps(original)
    def check_and_update_config(cls, vllm_config) -> None:
        inductor = vllm_config.compilation_config.inductor_compile_config
        passed = dict(inductor)
        original(cls, vllm_config)
        inductor = vllm_config.compilation_config.inductor_compile_config
        for key, value in passed.items():
            if key in inductor and inductor[key] != value:
                events.emit("inductor_config_kept",
                            "vllm_omni: keeping inductor_compile_config[%r]=%r over the CPU "
                            "platform's %r", key, value, inductor[key], key=key, value=value,
                            platform_value=inductor[key])
                inductor[key] = value

    CpuPlatform.check_and_update_config = classmethod(mark(check_and_update_config, NAME))
