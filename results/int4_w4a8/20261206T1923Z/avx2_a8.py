"""The avx2 kernel set on this AVX-512 CPU (as an AVX2-only CPU would run it): W4A16 against
W4A8 and bf16 F.linear, 0.5B and 3B layer shapes, best of 5 timings of 3 calls each."""
import time

import torch
import torch.nn.functional as F

from vllm_omni.ops import int4_pack, native
from vllm_omni.quantization import grid

ops = native.ops("avx2")
SHAPES = {"0.5B": [(1152, 896), (896, 896), (9728, 896), (896, 4864)],
          "3B": [(2560, 2048), (2048, 2048), (22016, 2048), (2048, 11008)]}


def best_ms(fn, calls=3, tries=5):
    fn()
    out = []
    for _ in range(tries):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e3)
    return min(out)


for model, shapes in SHAPES.items():
    for rows in (1, 128, 512):
        tot = {"a16": 0.0, "a8": 0.0, "bf16": 0.0}
        for n, k in shapes:
            w = torch.randn(n, k).bfloat16()
            qw = grid.quantize(w, 128)
            p, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
            x = torch.randn(rows, k).bfloat16()
            mul = ops.int4_gemv if rows == 1 else ops.int4_gemm
            tot["a16"] += best_ms(lambda: mul(x, p, sz, 128, 16))
            tot["a8"] += best_ms(lambda: mul(x, p, sz, 128, 8))
            tot["bf16"] += best_ms(lambda: F.linear(x, w))
        print(f"{model} rows {rows}: avx2 W4A16 {tot['a16']:.2f} ms, avx2 W4A8 {tot['a8']:.2f} ms, "
              f"bf16 F.linear {tot['bf16']:.2f} ms | W4A16/W4A8 {tot['a16'] / tot['a8']:.2f}")
