"""AOT compile cache load on CPU.

Patches: ``torch.compiler.load_compiled_function`` (torch offers no hook for this).
Why: vLLM's ``_try_load_aot_compiled_fn`` (vllm/compilation/decorators.py) calls
``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)``; on CPU that object is a plain
function without the method, so every load raises AttributeError, is logged as "Compiling model
again due to a load failure" and the model is compiled from scratch on every start.
Fix: give the loaded function a no-op ``finalize_loading`` when it has none. The artifact is then
used as loaded, which vLLM's own GPU path does after its finalisation step.

Also patches: ``vllm.compilation.caching.aot_compile_hash_factors``, the key of the artifact's
directory. vLLM keys it on its config and environment, not on the CPU the code was generated for:
inductor writes kernels for the instructions torch reports (``ATEN_CPU_CAPABILITY`` lowers them),
and an artifact compiled under ``ATEN_CPU_CAPABILITY=avx2`` and then loaded by a default process
on the same AVX-512 machine aborted it with glibc's "corrupted size vs. prev_size" (seen here,
AMD EPYC family 26, loading a compiled cpu_int4 qwen2.5-0.5b engine). A cache directory shared by
machines with different CPUs (a home on NFS) would do the same. Stock vLLM never loads its CPU
artifacts, so only this patch exposes it: the key gets one more factor, torch's CPU capability
and a digest of the CPU's flags (:func:`cpu_factor`), and such an artifact is compiled anew.
Remove when: a warm compiled start of the pinned vLLM on CPU logs "Directly load AOT compilation"
with this patch disabled (VLLM_OMNI_DISABLE_AOT_CACHE=1), and vLLM's key covers the CPU.
"""

from __future__ import annotations

import functools
import hashlib

NAME = "aot_cache"
TARGET = "torch.compiler.load_compiled_function"
KEY_TARGET = "vllm.compilation.caching.aot_compile_hash_factors"


def find_target():
    import torch.compiler

    fn = getattr(torch.compiler, "load_compiled_function", None)
    if fn is None:
        raise LookupError("torch.compiler has no load_compiled_function")
    # The vLLM side this patch serves: if vLLM no longer calls finalize_loading, the patch is moot.
    import inspect

    from vllm.compilation import decorators

    if "finalize_loading" not in inspect.getsource(decorators._try_load_aot_compiled_fn):
        raise LookupError("vllm's _try_load_aot_compiled_fn no longer calls finalize_loading")
    # Loading artifacts is only safe with the CPU in their key (see the module docstring).
    from vllm.compilation import caching

    if not callable(getattr(caching, "aot_compile_hash_factors", None)):
        raise LookupError(f"{KEY_TARGET} is gone: cannot key artifacts on the CPU")
    return fn


def cpu_factor(capability: str | None = None, flags: set[str] | None = None) -> str:
    """The artifact key's CPU factor: torch's CPU capability (what inductor generates code for)
    and a digest of the CPU's flags (another CPU may differ in what the capability leaves out)."""
    import torch

    from vllm_omni.ops import native

    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    flags = native.cpu_flags() if flags is None else flags
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]
    return f"vllm_omni-cpu:{capability}:{digest}"


def _noop_finalize_loading(vllm_config) -> None:  # noqa: ARG001 - signature of vLLM's method
    """Nothing to finalise: the artifact torch loaded is already callable."""


def apply(original) -> None:
    import torch.compiler

    from vllm_omni.patches import is_marked, mark

    @functools.wraps(original)
    def load_compiled_function(*args, **kwargs):
        loaded = original(*args, **kwargs)
        artifacts = getattr(loaded, "_artifacts", None)
        compiled = getattr(artifacts, "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = _noop_finalize_loading
        return loaded

    torch.compiler.load_compiled_function = mark(load_compiled_function, NAME)

    from vllm.compilation import caching

    factors = caching.aot_compile_hash_factors
    if not is_marked(factors, NAME):  # applied twice: wrap vLLM's function once

        @functools.wraps(factors)
        def aot_compile_hash_factors(vllm_config):
            return [*factors(vllm_config), cpu_factor()]

        caching.aot_compile_hash_factors = mark(aot_compile_hash_factors, NAME)
