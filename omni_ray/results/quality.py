"""Quality beside speed: each quantized arm against the bf16 arm of its source, from records.

Records of arms that ran the quality probe (``workload.quality``; the names:
``omni_ray/workload/quality.py``) are paired: an arm whose ``quality_weights`` is not
``bfloat16`` is compared with a ``bfloat16`` arm of the same engine, the same
``quality_source`` (the bf16 checkpoint its weights come from) and the same probe (the digest
of the ids read and the number of greedy ids). Where several bf16 arms qualify, the one whose
stage differs in the fewest fields wins (then the first); pass p of an arm is compared with
pass p of its baseline, else with the baseline's first pass.

Per pair, over the ``tokens`` greedy ids and the ``sequence_len - 1`` teacher-forced
log-probabilities:

- ``greedy_prefix``: greedy ids equal before the first that differs (``_fraction``: of tokens);
- ``greedy_agreement``: the fraction of the positions whose ids are equal (after the first
  difference the two continue from different contexts);
- ``mean_abs_dlogprob`` (and ``max_abs_dlogprob``): |logprob - baseline logprob| per position;
- ``perplexity_ratio``: the arm's perplexity over the baseline's (exp(-mean logprob)).

The summary gives each arm's medians over its passes. No Ray, no vLLM: records only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

BASELINE_WEIGHTS = "bfloat16"
FIGURES = ("greedy_prefix", "greedy_prefix_fraction", "greedy_agreement", "mean_abs_dlogprob",
           "max_abs_dlogprob", "perplexity_ratio")
# Why the absolute numbers say little, printed under every quality table.
CAVEAT = ("Synthetic random weights (the models `make-model` builds, `tiny` and the other "
          "shapes) make the absolute numbers meaningless: such a model has no text to be good "
          "at. The figures still compare a quantized arm with its bf16 source on the same ids, "
          "so a broken quantizer (a swapped nibble order) stands far outside a working one.")


def greedy_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many ids are equal before the first that differs."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare(baseline: dict, other: dict) -> dict:
    """The figures of one pair of measurements (each with the probe's names)."""
    for key in ("quality_ids_digest", "quality_sequence_len"):
        if baseline.get(key) != other.get(key):
            raise ValueError(f"quality probes differ in {key}: {baseline.get(key)!r} vs "
                             f"{other.get(key)!r}")
    ga, gb = baseline["quality_greedy_ids"], other["quality_greedy_ids"]
    la, lb = baseline["quality_logprobs"], other["quality_logprobs"]
    if len(ga) != len(gb) or not ga:
        raise ValueError(f"quality probes differ in tokens: {len(ga)} vs {len(gb)}")
    if len(la) != len(lb) or not la:
        raise ValueError(f"quality probes differ in log-probabilities: {len(la)} vs {len(lb)}")
    prefix = greedy_prefix(ga, gb)
    deltas = [abs(x - y) for x, y in zip(la, lb)]
    return {
        "greedy_prefix": prefix,
        "greedy_prefix_fraction": prefix / len(ga),
        "greedy_agreement": sum(x == y for x, y in zip(ga, gb)) / len(ga),
        "mean_abs_dlogprob": sum(deltas) / len(deltas),
        "max_abs_dlogprob": max(deltas),
        "perplexity_ratio": other["quality_perplexity"] / baseline["quality_perplexity"],
    }


def _probed(records: list[dict]) -> dict[str, list[dict]]:
    """Arm id -> its ok, unretracted records that carry the probe, in pass order."""
    out: dict[str, list[dict]] = {}
    for rec in records:
        m = rec.get("measurements") or {}
        if rec.get("retracted") or rec.get("status", "ok") != "ok" \
                or "quality_logprobs" not in m:
            continue
        out.setdefault(str(rec["arm"]["id"]), []).append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r.get("pass", 0))
    return out


def _stage(rec: dict) -> dict:
    return (rec.get("config") or {}).get("stage") or {}


def _key(rec: dict) -> tuple:
    m = rec["measurements"]
    return (_stage(rec).get("engine", "vllm"), m.get("quality_source"),
            m.get("quality_ids_digest"), len(m["quality_greedy_ids"]))


def _distance(a: dict, b: dict) -> int:
    """Stage fields that differ, besides what makes one quantized (model, dtype, quantization)."""
    keys = (set(a) | set(b)) - {"model", "dtype", "quantization"}
    return sum(a.get(k) != b.get(k) for k in keys)


def _median(recs: list[dict], metric: str) -> float | None:
    vals = [v for r in recs if isinstance(v := (r.get("measurements") or {}).get(metric),
                                          (int, float)) and not isinstance(v, bool)]
    return statistics.median(vals) if vals else None


def pair(records: list[dict]) -> list[dict]:
    """One row per arm that ran the probe and is not a bf16 baseline: its baseline arm (None
    when no bf16 arm of the same engine, source and probe ran), the medians of ``FIGURES`` over
    its passes, both arms' perplexity and decode rate (the speed it is read beside)."""
    probed = _probed(records)
    baselines = {a: recs for a, recs in probed.items()
                 if recs[0]["measurements"].get("quality_weights") == BASELINE_WEIGHTS}
    rows = []
    for arm, recs in probed.items():
        if arm in baselines:
            continue
        first = recs[0]
        candidates = [(_distance(_stage(first), _stage(b[0])), k, a)
                      for k, (a, b) in enumerate(baselines.items()) if _key(b[0]) == _key(first)]
        row = {"arm": arm, "label": (first.get("arm") or {}).get("label"),
               "engine": _key(first)[0], "weights": first["measurements"].get("quality_weights"),
               "source": first["measurements"].get("quality_source"),
               "tokens": _key(first)[3],
               "sequence_len": first["measurements"].get("quality_sequence_len"),
               "perplexity": _median(recs, "quality_perplexity"),
               "decode_tok_s": _median(recs, "decode_tok_s"), "baseline": None}
        if not candidates:
            rows.append(row | {"n": 0, **dict.fromkeys(FIGURES)})
            continue
        base_arm = min(candidates)[2]
        base = baselines[base_arm]
        by_pass = {r.get("pass"): r for r in base}
        figures = [compare(by_pass.get(r.get("pass"), base[0])["measurements"],
                           r["measurements"]) for r in recs]
        row.update(baseline=base_arm, baseline_label=(base[0].get("arm") or {}).get("label"),
                   baseline_weights=BASELINE_WEIGHTS, n=len(figures),
                   baseline_perplexity=_median(base, "quality_perplexity"),
                   baseline_decode_tok_s=_median(base, "decode_tok_s"),
                   **{f: statistics.median(fig[f] for fig in figures) for f in FIGURES})
        rows.append(row)
    return rows


def _fmt(v: float | None, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def to_markdown(rows: list[dict], labels: dict | None = None) -> str:
    """The pairs as a table, with the caveat (empty text when no arm ran the probe paired)."""
    if not rows:
        return ""
    labels = labels or {}

    def name(arm: str | None) -> str:
        if arm is None:
            return "none (no bf16 arm of this engine and source ran the probe)"
        return f"{labels[arm]} ({arm})" if arm in labels else arm

    lines = ["", "## Quality beside speed", "",
             "| arm | weights | vs bf16 arm | greedy prefix | greedy agreement "
             "| mean abs dlogprob | perplexity | ratio | decode tok/s | bf16 decode tok/s | n |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        prefix = "-" if r["greedy_prefix"] is None else \
            f"{r['greedy_prefix']:g}/{r['tokens']}"
        lines.append(
            f"| {name(r['arm'])} | {r['engine']} {r['weights']} | {name(r['baseline'])} "
            f"| {prefix} | {_fmt(r['greedy_agreement'], '.3f')} "
            f"| {_fmt(r['mean_abs_dlogprob'])} | {_fmt(r['perplexity'])} "
            f"| {_fmt(r['perplexity_ratio'])} | {_fmt(r['decode_tok_s'])} "
            f"| {_fmt(r.get('baseline_decode_tok_s'))} | {r['n']} |")
    lines += ["", "Greedy ids after the fixed sequence (prefix: equal before the first "
              "difference; agreement: equal positions of all), and |logprob - bf16 logprob| "
              "per position of the fixed sequence, read teacher-forced by the same engine; "
              "medians over passes (docs/quality.md).", "", CAVEAT]
    return "\n".join(lines) + "\n"
