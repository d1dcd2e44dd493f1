"""AOT compile cache load on CPU.

Patches: ``torch.compiler.load_compiled_function`` (torch offers no hook for this).
Why: vLLM's ``_try_load_aot_compiled_fn`` (vllm/compilation/decorators.py) calls
``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)``; on CPU that object is a plain
function without the method, so every load raises AttributeError, is logged as "Compiling model
again due to a load failure" and the model is compiled from scratch on every start.
Fix: give the loaded function a no-op ``finalize_loading`` when it has none. The artifact is then
used as loaded, which vLLM's own GPU path does after its finalisation step.
Remove when: a warm compiled start of the pinned vLLM on CPU logs "Directly load AOT compilation"
with this patch disabled (VLLM_OMNI_DISABLE_AOT_CACHE=1).
"""

from __future__ import annotations

import functools

NAME = "aot_cache"
TARGET = "torch.compiler.load_compiled_function"


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
    return fn


def _noop_finalize_loading(vllm_config) -> None:  # noqa: ARG001 - signature of vLLM's method
    """Nothing to finalise: the artifact torch loaded is already callable."""


def apply(original) -> None:
    import torch.compiler

    from vllm_omni.patches import mark

    @functools.wraps(original)
    def load_compiled_function(*args, **kwargs):
        loaded = original(*args, **kwargs)
        artifacts = getattr(loaded, "_artifacts", None)
        compiled = getattr(artifacts, "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = _noop_finalize_loading
        return loaded

    torch.compiler.load_compiled_function = mark(load_compiled_function, NAME)
