"""The decode speed of light: the weight bytes a token reads, and the bound they give.

A decode step of a dense model reads every weight once (the head included; a tied embedding is
read once, as the head, plus one row per token for the lookup, which is ignored here), whatever
the batch: ``batch * bandwidth / bytes_per_token`` bounds decode tokens/s. The KV cache read
per step (a few MB at short contexts) is ignored too, which makes the bound slightly generous.

The bound depends on where the weights are read from (``omni_ray.measure.regime``): weights
that fit in the last-level cache are read at cache speed, the rest at DRAM speed. So there are
two probes (``omni_ray.measure.bandwidth``), each a read over a buffer sized for its regime:
one several times the LLC (DRAM), one a quarter of it (the copy's source and destination fit
together: cache). A figure's fraction is taken against its own regime's probe
(``regime_bound``, ``sol_fields``), which the row names, and a fraction over 100 % carries the
reason (``percent_text``).

Pure arithmetic: no torch, no vLLM; a ``Shape`` is only read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND, regime

if TYPE_CHECKING:
    from omni_ray.models.shapes import Shape

GiB = 1 << 30
MiB = 1 << 20
# The DRAM probe's buffer: this many times the LLC, and at least DRAM_PROBE_MIN_BYTES.
DRAM_PROBE_LLC_MULTIPLE = 8
DRAM_PROBE_MIN_BYTES = GiB
# The cache probe's buffer: the LLC divided by this (the copy needs two buffers in cache).
CACHE_PROBE_LLC_DIVISOR = 4
# cpu_int4 quantized at load (a bf16 checkpoint, ``quantization: cpu_int4``): vllm_omni's
# defaults (vllm_omni.quantization.grid.DEFAULT_GROUP_SIZE, cpu_int4.N_MULTIPLE; a unit test
# checks they agree), copied so this module imports neither torch nor vLLM.
INT4_GROUP_SIZE = 128
INT4_N_MULTIPLE = 16


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


def int4_linear_bytes(n: int, k: int, group_size: int = INT4_GROUP_SIZE) -> int:
    """cpu_int4: packed nibbles (K/2 bytes a row) + bf16 scale and zero per group of K."""
    return n * k // 2 + n * (k // group_size) * 2 * 2


def bytes_per_token(shape: Shape, kind: str, group_size: int = INT4_GROUP_SIZE) -> dict[str, int]:
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


def fraction(tok_s: float | None, bytes_token: int | None, bandwidth_gb_s: float | None,
             batch: int = 1) -> float | None:
    """Achieved decode tok/s over the bandwidth bound (GB = 1e9 bytes); ``batch`` rows share
    one read of the weights a step."""
    if not tok_s or not bytes_token or not bandwidth_gb_s:
        return None
    return tok_s * bytes_token / (batch * bandwidth_gb_s * 1e9)


def probe_sizes(llc_bytes: int | None) -> dict[str, int]:
    """Buffer bytes of each regime's probe (DRAM only when the LLC is unknown)."""
    if not llc_bytes:
        return {DRAM_BOUND: DRAM_PROBE_MIN_BYTES}
    return {DRAM_BOUND: max(DRAM_PROBE_MIN_BYTES, DRAM_PROBE_LLC_MULTIPLE * llc_bytes),
            CACHE_RESIDENT: llc_bytes // CACHE_PROBE_LLC_DIVISOR}


def probe_regime(weight_bytes: int | None, llc_bytes: int | None) -> str:
    """The probe a decode figure is compared with: its regime's, the DRAM probe when the regime
    is unknown (no LLC read: ``percent_text`` says so)."""
    return regime(weight_bytes, llc_bytes) or DRAM_BOUND


def probe_name(regime_label: str, probe: dict) -> str:
    """``"DRAM probe (2048 MiB buffer)"``: what a fraction was taken against."""
    where = "DRAM" if regime_label == DRAM_BOUND else "cache"
    size = probe.get("size_bytes")
    return f"{where} probe ({size / MiB:g} MiB buffer)" if size else f"{where} probe"


def over_reason(regime_label: str | None = None, bytes_token: int | None = None,
                llc_bytes: int | None = None) -> str:
    """Why a fraction of the speed of light can pass 100 % in this regime."""
    if regime_label == DRAM_BOUND and bytes_token and llc_bytes:
        return (f"the weights are {bytes_token / llc_bytes:.1f}x the LLC, so part of each "
                "token's bytes are still served from cache") if bytes_token < 4 * llc_bytes \
            else "the engine streamed faster than the one-kernel DRAM probe"
    if regime_label == CACHE_RESIDENT:
        return "the one-kernel cache probe is slower than the engine's reads from cache"
    return "no regime (LLC unknown): compared with the DRAM probe"


def percent_text(frac: float | None, regime_label: str | None = None,
                 bytes_token: int | None = None, llc_bytes: int | None = None,
                 against: str | None = None) -> str:
    """``"87 %"`` (``against``: ``"87 % of DRAM probe (1024 MiB buffer)"``); above 100 % the
    number comes with why it can be (never a bare 112 %)."""
    if frac is None:
        return "-"
    text = f"{frac * 100:.0f} %" + (f" of {against}" if against else "")
    if frac <= 1:
        return text
    return f"{text} (over 100 %: {over_reason(regime_label, bytes_token, llc_bytes)})"


def regime_bound(tok_s: float | None, bytes_token: int, llc_bytes: int | None,
                 probes: dict[str, dict] | None, batch: int = 1) -> dict:
    """The speed-of-light row of one decode figure, against its own regime's probe.

    ``probes``: regime label -> a ``measure_bandwidth`` result (``ceiling_gb_s``,
    ``size_bytes``). Without the regime's probe there is no bound (None), never the other's.
    """
    label = regime(bytes_token, llc_bytes)
    probe = (probes or {}).get(label or DRAM_BOUND)
    bw = probe.get("ceiling_gb_s") if probe else None
    frac = fraction(tok_s, bytes_token, bw, batch) if bw else None
    return {"regime": label, "llc_bytes": llc_bytes, "bytes_per_token": bytes_token,
            "bandwidth_gb_s": bw,
            "bandwidth_probe": probe_name(label or DRAM_BOUND, probe) if probe else None,
            "bound_tok_s": batch * bw * 1e9 / bytes_token if bw else None,
            "decode_tok_s": tok_s, "fraction": frac,
            "fraction_text": percent_text(frac, label, bytes_token, llc_bytes),
            "achieved_gb_s": tok_s * bytes_token / batch / 1e9 if tok_s else None}


def sol_fields(measurements: dict, probe: dict | None, batch: int = 1) -> dict:
    """The speed-of-light fields of one decode figure's record, from its measurements (the
    engine's ``decode_tok_s`` and ``describe``'s regime fields) and the slot's probe
    (``bandwidth.probe_slot``'s dict). Empty without a decode figure, bytes or probe; a probe
    of another regime gives the bandwidth but no fraction (never the wrong bound)."""
    tok_s = measurements.get("decode_tok_s")
    wb = measurements.get("decode_weight_bytes_per_token")
    if not tok_s or not wb or not probe or not probe.get("ceiling_gb_s"):
        return {}
    llc = measurements.get("llc_bytes")
    label = regime(wb, llc)
    bw = float(probe["ceiling_gb_s"])
    same = probe.get("regime") == (label or DRAM_BOUND)
    bound = batch * bw * 1e9 / wb if same else None
    frac = tok_s / bound if bound else None
    name = probe_name(probe.get("regime") or DRAM_BOUND, probe)
    return {"weight_bytes_per_token": wb, "sol_bandwidth_gb_s": bw,
            "sol_probe": probe_record(probe),
            "decode_sol_tok_s": bound, "decode_sol_frac": frac,
            "decode_sol_text": percent_text(frac, label, wb, llc, against=name) if same else
            f"- (the probe is the {probe.get('regime')} one, the figure {label or 'unknown'})"}


# What a record keeps of the probe (the samples stay in the probe's cache file).
PROBE_FIELDS = ("regime", "size_bytes", "kernel", "cpus", "threads", "repeats", "probe_s",
                "probed_at", "cached", "neighbour_cpu_frac", "error")


def probe_record(probe: dict) -> dict:
    """What a record keeps of a probe (``PROBE_FIELDS``), with its ``name`` when it measured."""
    out = {k: probe.get(k) for k in PROBE_FIELDS if k in probe}
    if probe.get("ceiling_gb_s"):
        out["name"] = probe_name(probe.get("regime") or DRAM_BOUND, probe)
    return out
