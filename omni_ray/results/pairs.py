"""Paired comparisons (``compare:``, docs/compare.md): what the pairs of turns of two arms say.

Each pair is one turn of the arm and one of the baseline, run back to back on one slot, so the
two figures of a pair saw nearly the same machine; drift over minutes cancels in their ratio.
Per pair record: the pairwise ratios arm / baseline of the compared figure, their median, the
ratio of the two sides' medians, in how many pairs the arm was faster, and the two-sided sign
test's p value for "neither is faster" (ties dropped). Pairs where a turn ran beside a neighbour
(``neighbour_cpu_frac`` over the slot's limit: the other side's idle engine spinning counts) are
counted and left out. Pure: records in, dicts and markdown out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from omni_ray.measure.cpuload import contended_during

SIGNIFICANT_P = 0.05  # below it the summary names the faster side; above, NOT A RANKING


def sign_test(wins: int, n: int) -> float:
    """Two-sided exact sign test: the chance of a split at least as uneven as ``wins`` of
    ``n`` when each side wins half the time (1.0 when n is 0)."""
    if not 0 <= wins <= n:
        raise ValueError(f"wins must be within 0..{n}, got {wins}")
    if n == 0:
        return 1.0
    low = min(wins, n - wins)
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def pair_stats(arm: Sequence[float | None], baseline: Sequence[float | None],
               contended: Sequence[bool] = ()) -> dict:
    """The comparison of two sides' figures, pair by pair (index k of each is pair k)."""
    contended = list(contended) or [False] * len(arm)
    usable = [(a, b) for a, b, bad in zip(arm, baseline, contended)
              if not bad and a is not None and b is not None and b > 0]
    ratios = [a / b for a, b in usable]
    decided = [r for r in ratios if r != 1.0]
    wins = sum(r > 1.0 for r in decided)
    out = {"pairs": len(arm), "pairs_used": len(usable),
           "pairs_contended": sum(bool(c) for c in contended), "ratios": ratios,
           "wins": wins, "losses": len(decided) - wins,
           "sign_test_p": sign_test(wins, len(decided))}
    if usable:
        out.update(ratio_median=statistics.median(ratios),
                   arm_median=statistics.median(a for a, _ in usable),
                   baseline_median=statistics.median(b for _, b in usable))
        out["ratio_of_medians"] = out["arm_median"] / out["baseline_median"]
    return out


def verdict(stats: dict) -> str:
    """``faster``/``slower`` when the sign test says so, else NOT A RANKING with its p."""
    if stats.get("ratio_median") is None:
        return "no usable pair"
    p = stats["sign_test_p"]
    if p >= SIGNIFICANT_P:
        return f"NOT A RANKING (sign test p={p:.2g})"
    return f"{'faster' if stats['wins'] > stats['losses'] else 'slower'} (sign test p={p:.2g})"


def from_turns(arm_turns: Sequence[dict], baseline_turns: Sequence[dict], metric: str) -> dict:
    """``pair_stats`` of two sides' turn figures (as ``runner.take_turns`` writes them)."""
    n = min(len(arm_turns), len(baseline_turns))
    arm_turns, baseline_turns = list(arm_turns)[:n], list(baseline_turns)[:n]
    contended = [contended_during(a) is not None or contended_during(b) is not None
                 for a, b in zip(arm_turns, baseline_turns)]
    return pair_stats([t.get(metric) for t in arm_turns],
                      [t.get(metric) for t in baseline_turns], contended) | {"metric": metric}


def summarize_pairs(records: Sequence[dict]) -> list[dict]:
    """One row per pair record: the labels, its figures (``measurements``) and the verdict."""
    rows = []
    for rec in records:
        m = rec.get("measurements") or {}
        cfg = rec.get("config") or {}
        rows.append({"arm": (cfg.get("arm") or {}).get("label"),
                     "baseline": (cfg.get("baseline") or {}).get("label"),
                     "status": rec.get("status"), "error": rec.get("error"),
                     "metric": m.get("metric") or cfg.get("metric"),
                     **{k: m.get(k) for k in ("pairs", "pairs_used", "pairs_contended",
                                              "wins", "losses", "sign_test_p", "ratio_median",
                                              "ratio_of_medians", "arm_median",
                                              "baseline_median")},
                     "verdict": verdict(m) if rec.get("status") == "ok" else "FAILED"})
    return rows


def pairs_markdown(rows: Sequence[dict]) -> str:
    """The summary's section: one line per compared arm."""
    if not rows:
        return ""

    def num(v, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    lines = ["", "## Paired comparisons", "",
             "Each pair: one turn of the arm and one of the baseline, back to back on one slot "
             "(the order alternating); ratio = arm / baseline.", "",
             "| arm | baseline | metric | arm median | baseline median | median of pair "
             "ratios | wins | pairs used (contended) | verdict |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['arm']} | {r['baseline']} | {r['metric']} | - | - | - | - | - | "
                         f"FAILED: {r['error']} |")
            continue
        lines.append(f"| {r['arm']} | {r['baseline']} | {r['metric']} | "
                     f"{num(r['arm_median'], '.4g')} | {num(r['baseline_median'], '.4g')} | "
                     f"{num(r['ratio_median'], '.3f')}x | {r['wins']}/{r['wins'] + r['losses']} "
                     f"| {r['pairs_used']}/{r['pairs']} ({r['pairs_contended']}) | "
                     f"{r['verdict']} |")
    return "\n".join(lines) + "\n"
