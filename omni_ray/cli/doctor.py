"""omni-ray doctor: versions, whether each vllm_omni patch is applied here and why not, and which
kernels cpu_int4 runs on (which of vllm_omni's native kernel sets, or its Python fallback, and why)."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from omni_ray import api

    info = api.doctor()
    ok = info["ok"]
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
    changed = info["upstream_changed"]
    print(f"upstream     {len(changed)} replicated vLLM/torch functions changed"
          + (f": {', '.join(changed)} (python -m vllm_omni.patches.upstream check)"
             if changed else ""))
    return 0 if ok else 1
