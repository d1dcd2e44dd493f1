"""The decode speed of light: memory read bandwidth of the cores used, and weight bytes per token.

A decode step of a dense model at batch 1 reads every weight once (the head included; a tied
embedding is read once, as the head, plus one row per token for the lookup, which is ignored
here), so ``bandwidth / bytes_per_token`` bounds decode tokens/s. The KV cache read per step
(a few MB at short contexts) is ignored too, which makes the bound slightly generous.

The bound depends on where the weights are read from (``omni_ray.measure.regime``): weights
that fit in the last-level cache are read at cache speed, the rest at DRAM speed. So there are
two probes, each a read over a buffer sized for its regime: one several times the LLC (DRAM),
one a quarter of it (the copy's source and destination fit together: cache). A figure's
fraction is taken against its own regime's probe (``regime_bound``), which the row names, and a
fraction over 100 % carries the reason (``percent_text``).

``python -m omni_ray.bench.speed_of_light --cpus 0,1 [--regimes]`` pins itself, measures and
prints JSON. Importing this module imports neither torch nor vLLM (the byte counts are pure
arithmetic).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND, regime
from omni_ray.models.shapes import Shape

GiB = 1 << 30
MiB = 1 << 20
# The DRAM probe's buffer: this many times the LLC, and at least DRAM_PROBE_MIN_BYTES.
DRAM_PROBE_LLC_MULTIPLE = 8
DRAM_PROBE_MIN_BYTES = GiB
# The cache probe's buffer: the LLC divided by this (the copy needs two buffers in cache).
CACHE_PROBE_LLC_DIVISOR = 4


def linear_shapes(shape: Shape) -> dict[str, tuple[int, int]]:
    """[N, K] of every weight a decode step reads through a matmul, the output head included."""
    h, d, i = shape.hidden_size, shape.head_dim, shape.intermediate_size
    out: dict[str, tuple[int, int]] = {}
    for layer in range(shape.num_layers):
        p = f"layers.{layer}."
        out |= {p + "q_proj": (shape.num_heads * d, h), p + "k_proj": (shape.num_kv_heads * d, h),
                p + "v_proj": (shape.num_kv_heads * d, h), p + "o_proj": (h, shape.num_heads * d),
                p + "gate_proj": (i, h), p + "up_proj": (i, h), p + "down_proj": (h, i)}
    out["lm_head"] = (shape.vocab_size, h)
    return out


def norm_params(shape: Shape) -> int:
    return shape.hidden_size * (2 * shape.num_layers + 1)


def int4_linear_bytes(n: int, k: int, group_size: int) -> int:
    """cpu_int4: packed nibbles (K/2 bytes a row) + bf16 scale and zero per group of K."""
    return n * k // 2 + n * (k // group_size) * 2 * 2


def bytes_per_token(shape: Shape, kind: str, group_size: int = 128) -> dict[str, int]:
    """Weight bytes one decode token reads: {"linear": ..., "head": ..., "norms": ..., "total"}.

    ``kind``: "bf16" (2 bytes a parameter) or "int4" (cpu_int4 with ``group_size``).
    """
    if kind not in ("bf16", "int4"):
        raise ValueError(f"kind must be 'bf16' or 'int4', got {kind!r}")
    shapes = linear_shapes(shape)

    def size(n: int, k: int) -> int:
        return 2 * n * k if kind == "bf16" else int4_linear_bytes(n, k, group_size)

    head = size(*shapes.pop("lm_head"))
    linear = sum(size(n, k) for n, k in shapes.values())
    norms = 2 * norm_params(shape)
    return {"linear": linear, "head": head, "norms": norms, "total": linear + head + norms}


def fraction(tok_s: float | None, bytes_token: int, bandwidth_gb_s: float) -> float | None:
    """Achieved decode tok/s over the bandwidth bound (GB = 1e9 bytes)."""
    if not tok_s or not bandwidth_gb_s:
        return None
    return tok_s * bytes_token / (bandwidth_gb_s * 1e9)


def probe_sizes(llc_bytes: int | None) -> dict[str, int]:
    """Buffer bytes of each regime's probe (DRAM only when the LLC is unknown)."""
    if not llc_bytes:
        return {DRAM_BOUND: DRAM_PROBE_MIN_BYTES}
    return {DRAM_BOUND: max(DRAM_PROBE_MIN_BYTES, DRAM_PROBE_LLC_MULTIPLE * llc_bytes),
            CACHE_RESIDENT: llc_bytes // CACHE_PROBE_LLC_DIVISOR}


def probe_name(regime_label: str, probe: dict) -> str:
    """``"DRAM probe (2048 MiB buffer)"``: what a fraction was taken against."""
    where = "DRAM" if regime_label == DRAM_BOUND else "cache"
    size = probe.get("size_bytes")
    return f"{where} probe ({size / MiB:g} MiB buffer)" if size else f"{where} probe"


def percent_text(frac: float | None, regime_label: str | None = None,
                 bytes_token: int | None = None, llc_bytes: int | None = None) -> str:
    """``"87 %"``; above 100 % the number comes with why it can be (never a bare 112 %)."""
    if frac is None:
        return "-"
    text = f"{frac * 100:.0f} %"
    if frac <= 1:
        return text
    if regime_label == DRAM_BOUND and bytes_token and llc_bytes:
        why = (f"the weights are {bytes_token / llc_bytes:.1f}x the LLC, so part of each "
               "token's bytes are still served from cache") if bytes_token < 4 * llc_bytes \
            else "the engine streamed faster than the one-kernel DRAM probe"
    elif regime_label == CACHE_RESIDENT:
        why = "the one-kernel cache probe is slower than the engine's reads from cache"
    else:
        why = "no regime (LLC unknown): compared with the DRAM probe"
    return f"{text} (over 100 %: {why})"


def regime_bound(tok_s: float | None, bytes_token: int, llc_bytes: int | None,
                 probes: dict[str, dict] | None) -> dict:
    """The speed-of-light row of one decode figure, against its own regime's probe.

    ``probes``: regime label -> a ``measure_bandwidth`` result (``ceiling_gb_s``,
    ``size_bytes``). Without the regime's probe there is no bound (None), never the other's.
    """
    label = regime(bytes_token, llc_bytes)
    probe = (probes or {}).get(label or DRAM_BOUND)
    bw = probe.get("ceiling_gb_s") if probe else None
    frac = fraction(tok_s, bytes_token, bw) if bw else None
    return {"regime": label, "llc_bytes": llc_bytes, "bytes_per_token": bytes_token,
            "bandwidth_gb_s": bw,
            "bandwidth_probe": probe_name(label or DRAM_BOUND, probe) if probe else None,
            "bound_tok_s": bw * 1e9 / bytes_token if bw else None, "decode_tok_s": tok_s,
            "fraction": frac, "fraction_text": percent_text(frac, label, bytes_token, llc_bytes),
            "achieved_gb_s": tok_s * bytes_token / 1e9 if tok_s else None}


# ---------------------------------------------------------------------------- measurement


def _best_seconds(fn, repeats: int) -> tuple[float, list[float]]:
    fn()  # first touch / warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def measure_bandwidth(cpus: list[int], size_bytes: int = GiB, repeats: int = 5) -> dict:
    """Read bandwidth with ``len(cpus)`` torch threads on ``cpus``: best of ``repeats``.

    Three kernels: sum of a bf16 tensor, sum of an fp32 tensor (both read-only), and a copy
    (counted as read + write bytes). ``read_gb_s`` is the best read-only figure; ``ceiling_gb_s``
    the best of all three, the most generous ceiling, which fractions are computed against (so
    they are conservative: a real read-only stream may not reach it).
    """
    os.sched_setaffinity(0, set(cpus))
    import torch

    torch.set_num_threads(len(cpus))
    out: dict = {"cpus": cpus, "threads": torch.get_num_threads(), "size_bytes": size_bytes,
                 "repeats": repeats, "unit": "GB/s (1e9 bytes)"}
    a = torch.ones(size_bytes // 2, dtype=torch.bfloat16)
    best, times = _best_seconds(lambda: a.sum(), repeats)
    out["sum_bf16_gb_s"] = size_bytes / best / 1e9
    out["sum_bf16_times_s"] = times
    a = None  # free the buffer before the next one is allocated
    f = torch.ones(size_bytes // 4, dtype=torch.float32)
    best, times = _best_seconds(lambda: f.sum(), repeats)
    out["sum_fp32_gb_s"] = size_bytes / best / 1e9
    out["sum_fp32_times_s"] = times
    dst = torch.empty_like(f)
    best, times = _best_seconds(lambda: dst.copy_(f), repeats)
    out["copy_gb_s"] = 2 * size_bytes / best / 1e9
    out["copy_times_s"] = times
    out["read_gb_s"] = max(out["sum_bf16_gb_s"], out["sum_fp32_gb_s"])
    out["ceiling_gb_s"] = max(out["read_gb_s"], out["copy_gb_s"])
    return out


def measure_regimes(cpus: list[int], llc_bytes: int | None, repeats: int = 5) -> dict:
    """One probe per regime (``probe_sizes``); the cache probe repeats 10x more (it is short)."""
    out = {}
    for label, size in probe_sizes(llc_bytes).items():
        out[label] = measure_bandwidth(cpus, size, repeats * (10 if label == CACHE_RESIDENT
                                                              else 1))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="memory read bandwidth on the given CPUs (JSON)")
    p.add_argument("--cpus", default="0,1")
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--regimes", action="store_true",
                   help="also probe each regime (DRAM: a buffer several times the LLC; cache: "
                        "a quarter of it), the LLC read from sysfs; under 'regimes'")
    a = p.parse_args(argv)
    cpus = [int(c) for c in a.cpus.split(",") if c.strip()]
    os.environ.setdefault("OMP_NUM_THREADS", str(len(cpus)))
    out = measure_bandwidth(cpus, a.size_mib << 20, a.repeats)
    if a.regimes:
        from omni_ray.topology.caches import detect_llc

        llc = detect_llc()
        llc_bytes = llc.bytes_for(cpus) if llc else None
        out["llc"] = llc.to_dict() | {"bytes_for_cpus": llc_bytes} if llc else None
        out["regimes"] = measure_regimes(cpus, llc_bytes, a.repeats)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
