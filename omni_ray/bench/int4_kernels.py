"""The int4 kernels alone: one decode step's weight stream, and the dense-branch crossover.

    python -m omni_ray.bench.int4_kernels --shape qwen2.5-0.5b --out results/int4_kernels/

1. Stream: every linear of the shape (q/k/v merged, gate/up merged, the head) as its own
   cpu_int4 g128 weight, so nothing is reused from cache. One batch-1 GEMM per weight in layer
   order is one decode step's weight reads. Timed per pass (median of ``--passes``, kernels
   interleaved pass by pass): torch's ``_weight_int4pack_mm_for_cpu`` (where torch's build reads
   vllm_omni's layout), the GEMV of every vector kernel set this CPU runs (``native-avx512``,
   ``native-avx2``; the portable set is left out, it is scalar), the best set's with the other
   weight prefetch mode (non-temporal instead of into L2; ``set_weight_prefetch``), and again on
   a copy of the weights in vllm_omni's weight arena (``native-<set>-huge``: huge pages, where
   the engine keeps them; the others read torch's allocations), there with W4A8's x
   (``native-<set>-huge-a8``: cpu_int4_a8), and there reading one, two or four blocks of weights
   at a time (``native-<set>-huge-1stream``, ``-2stream``, ``-4stream``: ``set_gemv_streams``;
   the others read as many as the set does by default, its ``kGemvStreams``).
2. Crossover: ``vllm_omni.ops.int4_bench.measure`` on the shape's distinct layer shapes; the
   smallest row count from which the many-row branch (the int4 GEMM) wins on every shape is
   what the kernel set in use should take as ``row_threshold`` on this machine
   (``cpu_int4.ROW_THRESHOLD_BY_SET``, else ``DEFAULT_ROW_THRESHOLD``).

Weights are random codes (the speed does not depend on their values). Writes
``<out>/<UTC timestamp>.json`` with provenance; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from omni_ray.bench.common import save, spread_pct
from omni_ray.models.build import get_shape

GROUP_SIZE = 128
THRESHOLD_ROWS = (1, 2, 4, 8, 16, 24, 32, 64)


def layer_shapes(shape) -> list[tuple[int, int]]:
    """[N, K] of every linear of one decode step, in order."""
    h, i = shape.hidden_size, shape.intermediate_size
    head_dim = h // shape.num_heads
    qkv = h + 2 * shape.num_kv_heads * head_dim
    per_layer = [(qkv, h), (h, h), (2 * i, h), (h, i)]
    return per_layer * shape.num_layers + [(shape.vocab_size, h)]


def stream(shapes: list[tuple[int, int]], passes: int) -> dict:
    import torch

    from vllm_omni.ops import int4_pack, native, weight_arena

    status = native.load()
    if not status.available:
        raise SystemExit(f"int4_kernels: native kernels unavailable: {status.reason}")
    gen = torch.Generator().manual_seed(0)
    weights, total = [], 0
    for n, k in shapes:
        codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
        packed = int4_pack.pack(codes)
        sz = int4_pack.scales_and_zeros(
            torch.rand(n, k // GROUP_SIZE, generator=gen).bfloat16() * 0.01,
            torch.rand(n, k // GROUP_SIZE, generator=gen).bfloat16() * 0.01)
        weights.append((k, packed, sz))
        total += packed.numel() + sz.numel() * sz.element_size()
    xs = {k: torch.randn(1, k, generator=gen).bfloat16() for k in {k for k, _, _ in weights}}
    huge = [(k, weight_arena.copy(p), weight_arena.copy(s)) for k, p, s in weights]
    best = status.kernel_set
    # name -> (the kernel set, its (weight prefetch, GEMV streams) for the pass, the weights,
    # the kernel); "default" streams: the set's own (kGemvStreams, read back here)
    kernels, default = {}, {}
    if int4_pack.torch_reads_pack():
        kernels["torch"] = (None, (None, None), weights, lambda k, p, s: (
            torch.ops.aten._weight_int4pack_mm_for_cpu(xs[k], p, GROUP_SIZE, s)))
    for ks in native.runnable():
        if not native.load_set(ks.name).available:
            continue
        ops = native.ops(ks.name)
        default[ks.name] = ops.set_gemv_streams(1)  # returns the set's default
        ops.set_gemv_streams(default[ks.name])
        if ks.name != "portable":
            gemv = ops.int4_gemv
            kernels[f"native-{ks.name}"] = (ks.name, ("l2", "default"), weights,
                                            lambda k, p, s, g=gemv: g(xs[k], p, s, GROUP_SIZE))
    gemv = native.ops(best).int4_gemv
    kernels[f"native-{best}-nta"] = (best, ("nta", "default"), weights,
                                     lambda k, p, s: gemv(xs[k], p, s, GROUP_SIZE))
    kernels[f"native-{best}-huge"] = (best, ("l2", "default"), huge,
                                      lambda k, p, s: gemv(xs[k], p, s, GROUP_SIZE))
    kernels[f"native-{best}-huge-a8"] = (best, ("l2", "default"), huge,
                                         lambda k, p, s: gemv(xs[k], p, s, GROUP_SIZE, 8))
    for n in (1, 2, 4):
        kernels[f"native-{best}-huge-{n}stream"] = (best, ("l2", n), huge,
                                                    lambda k, p, s: gemv(xs[k], p, s, GROUP_SIZE))
    ms = {name: [] for name in kernels}
    try:
        for _ in range(passes + 1):  # the first pass warms up and is dropped
            for name, (kset, (prefetch, streams), ws, fn) in kernels.items():
                if kset:
                    native.ops(kset).set_weight_prefetch(prefetch)
                    native.ops(kset).set_gemv_streams(
                        default[kset] if streams == "default" else streams)
                t0 = time.perf_counter()
                for k, p, s in ws:
                    fn(k, p, s)
                ms[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        for kset in {v[0] for v in kernels.values()} - {None}:
            native.ops(kset).set_weight_prefetch("l2")
            native.ops(kset).set_gemv_streams(default[kset])
    out = {"bytes_per_pass": total, "linears": len(weights), "kernel_set": best,
           "threads": torch.get_num_threads(), "gemv_streams_default": default, "kernels": {}}
    for name, vals in ms.items():
        vals = vals[1:]
        med = statistics.median(vals)
        out["kernels"][name] = {"ms_per_pass": vals, "median_ms": med,
                                "spread_pct": spread_pct(vals), "gb_s": total / med / 1e6}
    return out


def crossover(shapes: list[tuple[int, int]]) -> dict:
    from vllm_omni.ops import int4_bench

    distinct = list(dict.fromkeys(shapes))
    records = int4_bench.measure(distinct, list(THRESHOLD_ROWS), GROUP_SIZE)
    return {"shapes": distinct, "records": records, "row_threshold": int4_bench.threshold(records)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--out", default="results/int4_kernels/")
    p.add_argument("--no-crossover", action="store_true", help="the weight stream only")
    a = p.parse_args(argv)
    shapes = layer_shapes(get_shape(a.shape))
    body = {"shape": a.shape, "group_size": GROUP_SIZE, "stream": stream(shapes, a.passes),
            "crossover": None if a.no_crossover else crossover(shapes)}
    path = save(a.out, "int4_kernels", body, [sys.executable, "-m", __spec__.name, *sys.argv[1:]])
    for name, k in body["stream"]["kernels"].items():
        print(f"{name:<16} {k['median_ms']:7.2f} ms per pass ({k['gb_s']:.1f} GB/s, "
              f"spread {k['spread_pct']:.1f} %)")
    if body["crossover"]:
        print(f"row_threshold: {body['crossover']['row_threshold']}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
