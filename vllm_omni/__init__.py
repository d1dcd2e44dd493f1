"""vllm_omni: changes stock vLLM's CPU behaviour at import, never by editing vLLM.

``register()`` is vLLM's ``vllm.general_plugins`` entry point (see pyproject.toml), so vLLM calls
it in the main process, the EngineCore process and every worker. It is safe to call again.
"""

from __future__ import annotations

__all__ = ["register", "patch_report", "kernel_report"]


def register() -> None:
    """Apply the runtime patches and register the cpu_int4 quantization method (idempotent)."""
    from vllm_omni import patches

    patches.apply_all()
    _register_quantization()


def _register_quantization() -> None:
    try:
        from vllm_omni.quantization import cpu_int4
    except ImportError:  # the method is not built yet in this tree
        return
    cpu_int4.register()


def patch_report() -> dict[str, dict[str, object]]:
    """For each patch: ``{"applied": bool, "reason": str, "target": str}`` in this process."""
    from vllm_omni import patches

    return {s.name: {"applied": s.applied, "reason": s.reason, "target": s.target}
            for s in patches.report()}


def kernel_report() -> dict[str, object]:
    """Which cpu_int4 kernels this process runs: the native set (or "python") and why, and what
    the vllm_omni ops dispatch to (None before cpu_int4 registered them)."""
    from vllm_omni.ops import int4_linear, native

    st = native.load()
    return {"int4_kernel_set": native.kernel_set(), "int4_reason": st.reason,
            "int4_op_kernels": int4_linear.kernels()}
