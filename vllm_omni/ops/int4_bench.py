"""Microbenchmark behind cpu_int4's ``row_threshold``: the op's few-row vs many-row branch.

    python -m vllm_omni.ops.int4_bench [--shapes 2048x2048,6144x2048] [--rows 1,2,4,...]

For each weight shape [N, K] and row count it times the op's two branches (and plain bf16
``F.linear`` for reference) and prints the smallest row count from which the many-row branch
is at least as fast as the few-row one on every shape: the value to use as ``row_threshold`` on
this machine. With a native kernel set the branches are the int4 GEMV and the int4 GEMM (same
bits, so only speed is at stake); with the Python kernels, torch's int4 GEMM and dequantize +
bf16 matmul. Timings are medians of short repeats; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from vllm_omni.ops import int4_linear, int4_pack
from vllm_omni.quantization import grid


def _median_us(fn, repeats: int, min_time_s: float = 0.05) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        count = 0
        while True:
            fn()
            count += 1
            dt = time.perf_counter() - t0
            if dt >= min_time_s / repeats or count >= 200:
                break
        samples.append(dt / count * 1e6)
    return statistics.median(samples)


def measure(shapes: list[tuple[int, int]], rows: list[int], group_size: int = 128,
            repeats: int = 5, activation_bits: int = 16) -> list[dict]:
    """One record per (shape, rows): few_us (the op below its threshold), many_us (at or above
    it), bf16_us; ``activation_bits`` 8: W4A8."""
    op = int4_linear.op()
    out = []
    gen = torch.Generator().manual_seed(0)
    for n, k in shapes:
        w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
        qw = grid.quantize(w, group_size)
        packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
        for r in rows:
            x = torch.randn(r, k, generator=gen).to(torch.bfloat16)
            rec = {"n": n, "k": k, "rows": r,
                   "few_us": _median_us(lambda: op(x, packed, sz, group_size, 1 << 30, None,
                                                   activation_bits), repeats),
                   "many_us": _median_us(lambda: op(x, packed, sz, group_size, 0, None,
                                                    activation_bits), repeats),
                   "bf16_us": _median_us(lambda: F.linear(x, w), repeats)}
            out.append(rec)
    return out


def threshold(records: list[dict]) -> int | None:
    """Smallest row count from which the many-row branch wins on every shape (and stays won)."""
    rows = sorted({r["rows"] for r in records})
    for i, r in enumerate(rows):
        later = [x for x in records if x["rows"] >= rows[i]]
        if all(x["many_us"] <= x["few_us"] for x in later):
            return r
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="2048x2048,6144x2048,2048x6144",
                   help="comma-separated NxK weight shapes")
    p.add_argument("--rows", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--group-size", type=int, default=grid.DEFAULT_GROUP_SIZE)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--activation-bits", type=int, choices=(16, 8), default=16,
                   help="8: W4A8 (cpu_int4_a8)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    rows = [int(v) for v in a.rows.split(",")]
    recs = measure(shapes, rows, a.group_size, a.repeats, a.activation_bits)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"group {a.group_size}, activation bits {a.activation_bits}")
    print(f"{'N x K':>12} {'rows':>5} {'few us':>10} {'many us':>10} {'bf16 us':>10}")
    for r in recs:
        print(f"{r['n']:>5} x {r['k']:<5} {r['rows']:>5} {r['few_us']:>10.1f} "
              f"{r['many_us']:>10.1f} {r['bf16_us']:>10.1f}")
    print(f"row_threshold: {threshold(recs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
