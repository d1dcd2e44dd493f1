"""``omni-ray quantize SRC DST``: write a cpu_int4 (W4A16) checkpoint that plain vLLM loads.

SRC is a Hugging Face model directory with safetensors weights, or a synthetic shape name
(``tiny``, ...) whose cached build is used. The work is done by
``vllm_omni.quantization.convert.quantize_checkpoint``, which tests call too.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from vllm_omni.quantization import grid

    parser.add_argument("src", help="source model directory (bf16 safetensors) or shape name")
    parser.add_argument("dst", help="output directory")
    parser.add_argument("--group-size", type=int, choices=grid.GROUP_SIZES,
                        default=grid.DEFAULT_GROUP_SIZE,
                        help="weights per scale/zero along K (default %(default)s)")
    parser.add_argument("--row-threshold", type=int, default=None,
                        help="rows from which a layer takes the int4 GEMM instead of the GEMV "
                             "(default: none written, each CPU takes its kernel set's measured "
                             "value, see int4_bench)")
    parser.add_argument("--dequant-rows", type=int, default=None,
                        help="rows from which a layer dequantizes for a bf16 matmul instead of "
                             "the int4 GEMM, 0: never (default: none written, each CPU takes its "
                             "kernel set's)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty DST")


def run(args: argparse.Namespace) -> int:
    from omni_ray.models.build import resolve_model
    from vllm_omni.quantization.convert import quantize_checkpoint

    src = resolve_model(args.src)
    res = quantize_checkpoint(src, args.dst, group_size=args.group_size,
                              row_threshold=args.row_threshold, dequant_rows=args.dequant_rows,
                              overwrite=args.overwrite)
    qc = res.record["quantization_config"]
    print(f"wrote {res.dst}: {len(res.quantized)} modules int4 (group {qc['group_size']}, "
          f"row_threshold {qc.get('row_threshold', 'per kernel set')}, "
          f"dequant_rows {qc.get('dequant_rows', 'per kernel set')}), "
          f"{len(res.ignored)} left bf16")
    for module, why in res.ignored.items():
        print(f"  bf16: {module}: {why}")
    return 0
