"""The metrics a report shows: title, unit, which direction is better, the compare band, and
how a figure is rounded for a person to read."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str                 # the key in record["measurements"]
    title: str                # a column header, without the unit
    unit: str                 # "s", "MiB", "tok/s", "tokens", "ms"
    higher_is_better: bool
    band_pct: float           # compare: a change inside this band is "same"
    better: str = "faster"    # the verdict word when it improves ...
    worse: str = "slower"     # ... and when it regresses

    @property
    def header(self) -> str:
        return f"{self.title} ({self.unit})"


def _memory(name: str, title: str, band: float) -> Metric:
    return Metric(name, title, "MiB", False, band, better="smaller", worse="larger")


# In the order a table shows them: the headline figures first.
METRICS: tuple[Metric, ...] = (
    Metric("decode_tok_s", "decode", "tok/s", True, 6.0),
    # decode tok/s over the slot's speed of light (docs/sizes.md#speed-of-light-per-regime);
    # summary.md names the probe and regime, and says why above 1
    Metric("decode_sol_frac", "decode / speed of light", "fraction", True, 6.0,
           better="closer", worse="further"),
    # a pipeline's (docs/pipelines.md): its last stage's decode, end to end, first token
    Metric("last_stage_decode_tok_s", "last stage decode", "tok/s", True, 6.0),
    Metric("pipeline_e2e_s", "pipeline e2e", "s", False, 6.0),
    Metric("last_stage_first_token_s", "last stage first token", "s", False, 6.0),
    _memory("pipeline_peak_rss_anon_mb", "pipeline peak RssAnon", 2.0),
    Metric("prefill_tok_s", "prefill", "tok/s", True, 6.0),
    Metric("ttft_s", "TTFT", "s", False, 6.0),
    Metric("decode_ms_per_token", "decode step", "ms", False, 6.0),
    _memory("rss_anon_tree_mb", "RssAnon", 1.5),
    _memory("peak_rss_anon_mb", "peak RssAnon", 2.0),
    _memory("peak_rss_anon_during_load_mb", "peak RssAnon in load", 2.0),
    _memory("rss_anon_at_context_mb", "RssAnon at context", 1.5),
    Metric("ready_s", "ready", "s", False, 12.0),
    Metric("init_s", "init", "s", False, 12.0),
    Metric("import_s", "import", "s", False, 5.0),
    Metric("kv_cache_tokens", "KV cache", "tokens", True, 5.0, better="more", worse="fewer"),
)
BY_NAME = {m.name: m for m in METRICS}
HEADLINE = "decode_tok_s"
MEMORY_HEADLINE = "peak_rss_anon_mb"


def fmt(value: float | None) -> str:
    """A figure rounded for reading: 3 significant digits, never fewer than the integer part
    (1113 MiB, 152 s, 71.3 tok/s, 9.43 s, 0.442 s)."""
    if value is None:
        return "-"
    a = abs(value)
    if a >= 100:
        return f"{value:,.0f}".replace(",", " ") if a >= 10_000 else f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"
