"""A developer's probe: where cpu_int4's many-row (prefill) branch loses to vLLM bf16's linear.

    python -m omni_ray.bench.int4_prefill --shape qwen2.5-0.5b --rows 128,512 --out results/int4_prefill/

For each distinct linear of the shape (q/k/v merged, o, gate/up merged, down, the head), with M
rows of x, times side by side in one process, interleaved repetition by repetition (median):

- ``onednn_bf16``: what vLLM bf16 runs, ``_C.onednn_mm`` on weights prepacked once at load;
- ``int4_dense``: cpu_int4's many-row branch as a model calls it (``cpu_int4_linear`` at
  threshold 0): the integer GEMM of the kernel set in use (``int4_gemm``);
- ``int4_gemm``: that GEMM called directly (the op's dispatch and bias handling aside);
- ``dequant_mm``: the op's branch from ``dequant_rows`` on in the sets without AMX bf16 tiles
  (``int4_dequant_mm``: W^T dequantized 256 output rows at a time, each chunk multiplied by
  torch's bf16 matmul);
- ``tile_mm``: the amx and avx512bf16 sets' branch from ``dequant_rows`` on (``int4_tile_mm``):
  the same product on AMX bf16 tiles or AVX512_BF16 registers fed by the dequantization itself
  (no W^T in memory, no torch.mm);
- ``dequant``: the dequantization of the whole weight to bf16 W^T (the kernel set in use);
- ``mm_plain``: ``torch.mm(x, W^T)`` on that plain bf16 W^T: ``dequant + mm_plain`` was the
  branch before the integer GEMM;
- ``chunked_<c>``: that earlier branch done in chunks of ``c`` output rows (dequantize a chunk,
  multiply it into its columns of y); ``--chunks`` lists the sizes (none by default).

Random weights (speed does not depend on values). ``VLLM_OMNI_INT4_ISA=avx2`` in the
environment measures the avx2 set (oneDNN keeps what the CPU has). ``--threads 1 --clock
thread`` times the caller's CPU time on one core: on a machine others load, what their
processes take of the core drops out (their share of caches and memory does not). Writes
``<out>/<UTC timestamp>.json`` with provenance; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from omni_ray.bench.common import save
from omni_ray.bench.int4_kernels import GROUP_SIZE, layer_shapes
from omni_ray.models.build import get_shape


def measure(shapes: list[tuple[int, int]], rows: list[int], reps: int,
            chunks: list[int], clock=time.perf_counter) -> list[dict]:
    import torch
    import vllm._custom_ops as ops

    from vllm_omni.ops import int4_linear, int4_pack, native

    kern, op = native.ops(), int4_linear.op()
    gen = torch.Generator().manual_seed(0)
    out = []
    for n, k in shapes:
        w = (torch.randn(n, k, generator=gen) * 0.02).bfloat16()
        packed, sz = int4_pack.quantize_and_pack(w, GROUP_SIZE)
        plain_w = int4_pack.dequantize(packed, sz, k)  # the same values as bf16 [N, K]
        handler = ops.create_onednn_mm(plain_w.t(), 32)
        wt = kern.int4_dequant_t(packed, sz, GROUP_SIZE, 0, n)
        for m in rows:
            x = torch.randn(m, k, generator=gen).bfloat16()
            fns = {"onednn_bf16": lambda: ops.onednn_mm(handler, x, None),
                   "dequant": lambda: kern.int4_dequant_t(packed, sz, GROUP_SIZE, 0, n),
                   "mm_plain": lambda: torch.mm(x, wt),
                   "int4_dense": lambda: op(x, packed, sz, GROUP_SIZE, 0),
                   "int4_gemm": lambda: kern.int4_gemm(x, packed, sz, GROUP_SIZE),
                   "dequant_mm": lambda: kern.int4_dequant_mm(x, packed, sz, GROUP_SIZE)}
            if hasattr(kern, "int4_tile_mm"):  # the amx and avx512bf16 sets'
                fns["tile_mm"] = lambda x=x: kern.int4_tile_mm(x, packed, sz, GROUP_SIZE)
            for c in chunks:
                fns[f"chunked_{c}"] = lambda c=c, x=x: _chunked(kern, x, packed, sz, n, c)
            ms: dict[str, list[float]] = {name: [] for name in fns}
            for fn in fns.values():
                fn()  # warm-up
            for _ in range(reps):
                for name, fn in fns.items():
                    t0 = clock()
                    fn()
                    ms[name].append((clock() - t0) * 1e3)
            med = {name: statistics.median(v) for name, v in ms.items()}
            out.append({"n": n, "k": k, "rows": m, "median_ms": med, "ms": ms,
                        "int4_dense_over_onednn": med["int4_dense"] / med["onednn_bf16"]})
    return out


def _chunked(kern, x, packed, sz, n: int, chunk: int):
    import torch

    y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
    for r in range(0, n, chunk):
        end = min(n, r + chunk)
        torch.mm(x, kern.int4_dequant_t(packed, sz, GROUP_SIZE, r, end), out=y[:, r:end])
    return y


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--rows", default="128,512", help="rows of x (prompt tokens), comma-separated")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--chunks", default="", help="output rows per chunk of the dequantizing "
                   "branch, comma-separated (multiples of 64)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="thread: the calling thread's CPU time (needs --threads 1; what other "
                   "processes take of the core is not counted, their share of caches and memory "
                   "is)")
    p.add_argument("--out", default="results/int4_prefill/")
    a = p.parse_args(argv)
    rows = [int(r) for r in a.rows.split(",") if r.strip()]
    chunks = [int(c) for c in a.chunks.split(",") if c.strip()]
    if not rows or min(rows) < 1 or a.reps < 1:
        p.error(f"--rows must be positive integers and --reps >= 1, got {a.rows!r}, {a.reps}")
    if any(c < 64 or c % 64 for c in chunks):
        p.error(f"--chunks must be multiples of 64, got {a.chunks!r}")
    if a.clock == "thread" and a.threads != 1:
        p.error("--clock thread needs --threads 1 (other threads' work is not the caller's "
                "CPU time)")
    import torch

    from vllm_omni.ops import native

    if a.threads:
        torch.set_num_threads(a.threads)
    clock = time.thread_time if a.clock == "thread" else time.perf_counter
    shapes = list(dict.fromkeys(layer_shapes(get_shape(a.shape))))
    body = {"shape": a.shape, "group_size": GROUP_SIZE, "kernel_set": native.kernel_set(),
            "threads": torch.get_num_threads(), "clock": a.clock,
            "records": measure(shapes, rows, a.reps, chunks, clock)}
    totals = {}
    counts = {s: layer_shapes(get_shape(a.shape)).count(s) for s in shapes}
    for r in body["records"]:  # a forward's worth: each shape times how often the model has it
        t = totals.setdefault(r["rows"], {})
        for name, v in r["median_ms"].items():
            t[name] = t.get(name, 0.0) + v * counts[(r["n"], r["k"])]
    body["forward_ms"] = totals
    path = save(a.out, "int4_prefill", body, [sys.executable, "-m", __spec__.name, *sys.argv[1:]])
    for m, t in totals.items():
        print(f"M={m}: a forward's linears " + ", ".join(f"{k} {v:.1f} ms" for k, v in t.items())
              + f"; int4_dense / onednn_bf16 {t['int4_dense'] / t['onednn_bf16']:.2f}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
