"""Summary statistics over passes, and the flags that stop a noisy number passing as a result.

Each arm (one configuration) runs several interleaved passes; per metric the summary gives the
median, min, max and spread % = (max - min) / |median| * 100, and flags:

  NOISY        spread above the noise threshold (default 8 %)
  CONTENDED    a pass ran while the pre-flight found the cores busy
  SINGLE PASS  n == 1: a single pass is not a result
  FAILED k/n   k of the arm's n records failed or timed out (they give no values)
  SHARED START (a)  a pass ran on the engine arm a started (placement.share_engine): the
               start figures are in a's records

and, for two arms whose medians differ by less than either arm's own spread (max - min),
a NOT A RANKING note: the order between them is noise.

Each arm also carries the regime of its decode figures (``decode_regime``: cache-resident or
DRAM-bound, from the records' measurements) and the CPU they ran on (``hardware``: model, ISA,
LLC, from the records' provenance); the markdown names both.

And, when its records carry the slot's bandwidth probe (``placement.bandwidth_probe``), its
decode figure's share of the speed of light (``speed_of_light``: the median of the passes'
``decode_sol_frac``, the regime and the probe it was taken against); the markdown's
``decode % of SoL`` column says which probe, and a share over 100 % carries its reason.
"""

from __future__ import annotations

import csv
import io
import itertools
import statistics
from collections.abc import Iterable
from typing import NamedTuple

DEFAULT_NOISE_PCT = 8.0


class Stat(NamedTuple):
    median: float
    min: float
    max: float
    spread_pct: float | None  # None when the median is 0 and the values differ
    n: int

    @property
    def range(self) -> float:
        return self.max - self.min

    def to_dict(self) -> dict:
        return self._asdict()


def summarize(values: Iterable[float]) -> Stat:
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("summarize: no values")
    med = statistics.median(vals)
    lo, hi = min(vals), max(vals)
    if hi == lo:
        spread = 0.0
    elif med == 0:
        spread = None
    else:
        spread = (hi - lo) / abs(med) * 100.0
    return Stat(med, lo, hi, spread, len(vals))


def flags(stat: Stat, *, noise_pct: float = DEFAULT_NOISE_PCT,
          contended: bool = False) -> list[str]:
    out = []
    if stat.n == 1:
        out.append("SINGLE PASS")
    elif stat.spread_pct is None or stat.spread_pct > noise_pct:
        out.append("NOISY")
    if contended:
        out.append("CONTENDED")
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1e5:
        return f"{v:.0f}"
    return f"{v:.5g}"


def ranking_note(a: Stat, b: Stat, *, names: tuple[str, str] = ("a", "b"),
                 metric: str | None = None) -> str | None:
    """A "NOT A RANKING" note when |median_a - median_b| is smaller than either arm's spread
    (max - min), or the medians are equal; None when the difference stands out of both."""
    diff = abs(a.median - b.median)
    widest = max(a.range, b.range)
    if diff >= widest and diff != 0:
        return None
    what = f"{metric}: " if metric else ""
    if diff == 0:
        return (f"NOT A RANKING: {what}{names[0]} and {names[1]} have the same median "
                f"{_fmt(a.median)}")
    wide = names[0] if a.range >= b.range else names[1]
    return (f"NOT A RANKING: {what}{names[0]} {_fmt(a.median)} vs {names[1]} {_fmt(b.median)} "
            f"differ by {_fmt(diff)}, less than the spread of {wide} ({_fmt(widest)})")


def _is_contended(record: dict) -> bool:
    if record.get("contended"):
        return True
    preflight = record.get("preflight")
    return isinstance(preflight, dict) and preflight.get("ok") is False


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def summarize_arms(records: list[dict], metrics: list[str], *,
                   noise_pct: float = DEFAULT_NOISE_PCT) -> dict:
    """Group ``records`` by ``record["arm"]["id"]`` and summarise each metric over the passes.

    Failed/timed-out records give no values but are counted (``n_failed``, FAILED flag);
    retracted records are left out and counted (``n_retracted``). A record is contended when
    ``record["contended"]`` is true or ``record["preflight"]["ok"]`` is false."""
    arms: dict[str, dict] = {}
    values: dict[str, dict[str, list[float]]] = {}
    for i, rec in enumerate(records):
        arm = rec.get("arm")
        arm_id = arm.get("id") if isinstance(arm, dict) else None
        if arm_id is None:
            raise ValueError(f"record {i} has no arm id (record['arm']['id'])")
        arm_id = str(arm_id)
        entry = arms.setdefault(arm_id, {"n_records": 0, "n_failed": 0, "n_retracted": 0,
                                         "contended": False, "errors": []})
        values.setdefault(arm_id, {m: [] for m in metrics})
        if arm.get("label") is not None:
            entry.setdefault("label", str(arm["label"]))
        entry["n_records"] += 1
        if rec.get("retracted"):
            entry["n_retracted"] += 1
            continue
        if rec.get("status", "ok") != "ok":
            entry["n_failed"] += 1
            if rec.get("error"):
                entry["errors"].append(str(rec["error"]).splitlines()[0][:200])
            continue
        entry["contended"] = entry["contended"] or _is_contended(rec)
        shared = rec.get("shared_engine") or {}
        if shared.get("position"):  # ran on another arm's engine start: its start figures
            starts = entry.setdefault("shared_start_of", [])
            if shared["started_by"] not in starts:
                starts.append(shared["started_by"])
        measured = rec.get("measurements") or {}
        if measured.get("decode_regime"):
            regimes = entry.setdefault("decode_regime", [])
            if measured["decode_regime"] not in regimes:
                regimes.append(measured["decode_regime"])
        for figure, key in (("prefill", "llamacpp_prefill_setting"),
                            ("decode", "llamacpp_setting")):
            if measured.get(key):  # llama.cpp's fastest setting, per pass: how often each won
                won = entry.setdefault("llamacpp_settings", {}).setdefault(figure, {})
                won[measured[key]] = won.get(measured[key], 0) + 1
        if measured.get("decode_sol_frac") is not None:
            sol = entry.setdefault("_sol", [])
            sol.append(measured)
        hw = hardware(rec.get("provenance"))
        if hw and hw not in entry.setdefault("hardware", []):
            entry["hardware"].append(hw)
        for m in metrics:
            v = _number(measured.get(m))
            if v is not None:
                values[arm_id][m].append(v)

    notes: list[dict] = []
    for arm_id, entry in arms.items():
        arm_flags = []
        if entry["n_failed"]:
            counted = entry["n_records"] - entry["n_retracted"]
            arm_flags.append(f"FAILED {entry['n_failed']}/{counted}")
        if entry["contended"]:
            arm_flags.append("CONTENDED")
        if entry.get("shared_start_of"):
            arm_flags.append("SHARED START (" + ", ".join(entry["shared_start_of"]) + ")")
        entry["flags"] = arm_flags
        if entry.get("_sol"):
            entry["speed_of_light"] = speed_of_light(entry.pop("_sol"))
        entry["metrics"] = {}
        for m in metrics:
            vals = values[arm_id][m]
            if not vals:
                entry["metrics"][m] = None
                continue
            stat = summarize(vals)
            entry["metrics"][m] = {**stat.to_dict(),
                                   "flags": flags(stat, noise_pct=noise_pct,
                                                  contended=entry["contended"])}
    for m in metrics:
        with_stats = [(a, e["metrics"][m]) for a, e in arms.items() if e["metrics"][m]]
        for (name_a, sa), (name_b, sb) in itertools.combinations(with_stats, 2):
            note = ranking_note(_stat(sa), _stat(sb), names=(name_a, name_b), metric=m)
            if note:
                notes.append({"metric": m, "arms": [name_a, name_b], "note": note})
    seen_hw = []
    for e in arms.values():
        seen_hw += [h for h in e.get("hardware", []) if h not in seen_hw]
    return {"metrics": list(metrics), "noise_pct": noise_pct, "arms": arms, "notes": notes,
            "hardware": seen_hw}


def speed_of_light(measured: list[dict]) -> dict:
    """One arm's decode share of the speed of light over its passes (``measured``: the
    measurements of passes with a ``decode_sol_frac``): the median share, its range, the
    regime and probe(s) it was taken against, and the text a table shows (over 100 %: why)."""
    fracs = [float(m["decode_sol_frac"]) for m in measured]
    first = measured[0]
    regime = first.get("decode_regime") or (first.get("sol_probe") or {}).get("regime")
    probes = list(dict.fromkeys(
        (m.get("sol_probe") or {}).get("name") or "the replicas' probes summed"
        for m in measured))
    bws = [float(m["sol_bandwidth_gb_s"]) for m in measured
           if _number(m.get("sol_bandwidth_gb_s")) is not None]
    frac = statistics.median(fracs)
    return {"fraction": frac, "min": min(fracs), "max": max(fracs), "n": len(fracs),
            "regime": regime, "probes": probes,
            "bandwidth_gb_s": statistics.median(bws) if bws else None,
            "weight_bytes_per_token": first.get("decode_weight_bytes_per_token"),
            "llc_bytes": first.get("llc_bytes"),
            "text": sol_text(frac, regime, probes, first.get("decode_weight_bytes_per_token"),
                             first.get("llc_bytes"))}


def sol_text(frac: float, regime: str | None, probes: list[str], weight_bytes: int | None,
             llc_bytes: int | None) -> str:
    """``"87 % of DRAM probe (1024 MiB buffer), DRAM-bound"``; over 100 % with its reason."""
    from omni_ray.measure.speed_of_light import percent_text

    text = percent_text(frac, regime, weight_bytes, llc_bytes, against=" / ".join(probes))
    return text.replace(" (over 100 %", f", {regime or 'no regime'} (over 100 %", 1) \
        if frac > 1 else f"{text}, {regime or 'no regime'}"


# py-cpuinfo's spelling -> the kernel's (/proc/cpuinfo), as topology.detection aliases them.
_FLAG_ALIASES = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16"}


def hardware(provenance: dict | None) -> str | None:
    """``"AMD EPYC (family 26 model 2); ISA avx512_bf16 avx512_vnni avx512f; LLC 32 MiB L3 x1
    (CPUs 0-1)"``
    from a record's provenance (its ``cpu`` and ``llc``); None when it has neither."""
    from omni_ray.topology.machine import ISA_FLAGS

    prov = provenance or {}
    cpu, llc = prov.get("cpu") or {}, prov.get("llc")
    if not cpu and not llc:
        return None
    flags = {_FLAG_ALIASES.get(f, f) for f in cpu.get("flags") or ()}
    isa = " ".join(sorted(flags & ISA_FLAGS)) or "no AVX-512/AMX"
    if llc:
        mib = llc["size_bytes"] / (1 << 20)
        llc_text = (f"{mib:g} MiB L{llc['level']} x{len(llc['instances'])} "
                    f"(CPUs {'; '.join(llc['instances'][:4])})")
    else:
        llc_text = "unknown"
    name = cpu.get("brand") or "unknown CPU"
    if cpu.get("family") is not None:  # a VM may show only "AMD EPYC": the family tells which
        name += f" (family {cpu['family']} model {cpu.get('model')})"
    return f"{name}; ISA {isa}; LLC {llc_text}"


def _stat(d: dict) -> Stat:
    return Stat(*(d[f] for f in Stat._fields))


_CSV_FIELDS = ("arm", "metric", "n", "n_failed", "median", "min", "max", "spread_pct", "flags",
               "note")
SOL_METRIC = "decode_sol_frac"  # its csv rows note the regime and probe; markdown: its text


def to_csv(summary: dict) -> str:
    """One row per arm x metric (empty numbers where an arm has no values for a metric)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(_CSV_FIELDS)
    for arm_id, entry in summary["arms"].items():
        for m in summary["metrics"]:
            s = entry["metrics"].get(m)
            row_flags = entry["flags"] + ([f for f in s["flags"] if f != "CONTENDED"] if s else [])
            note = (entry.get("speed_of_light") or {}).get("text", "") if m == SOL_METRIC else ""
            if s is None:
                w.writerow([arm_id, m, 0, entry["n_failed"], "", "", "", "", ";".join(row_flags),
                            note])
                continue
            spread = "" if s["spread_pct"] is None else round(s["spread_pct"], 3)
            w.writerow([arm_id, m, s["n"], entry["n_failed"], s["median"], s["min"], s["max"],
                        spread, ";".join(row_flags), note])
    return buf.getvalue()


def _cell(s: dict | None) -> str:
    if s is None:
        return "-"
    spread = "?" if s["spread_pct"] is None else f"{s['spread_pct']:.1f}%"
    return f"{_fmt(s['median'])} ({spread})"


def to_markdown(summary: dict) -> str:
    """Arm x metric table of "median (spread%)", a flags column, then the notes."""
    metrics = [m for m in summary["metrics"] if m != SOL_METRIC]  # shown as its text
    labels = summary.get("labels") or {}
    regimes = any(e.get("decode_regime") for e in summary["arms"].values())
    sol = any(e.get("speed_of_light") for e in summary["arms"].values())
    lines = ["| arm | " + " | ".join(metrics) + (" | decode regime" if regimes else "")
             + (" | decode % of SoL" if sol else "") + " | n | flags |",
             "|---|" + "---:|" * len(metrics) + ("---|" if regimes else "")
             + ("---|" if sol else "") + "---:|---|"]
    for arm_id, entry in summary["arms"].items():
        arm_flags = list(entry["flags"])
        present = [m for m in metrics if entry["metrics"].get(m)]
        single = [m for m in present if "SINGLE PASS" in entry["metrics"][m]["flags"]]
        noisy = [m for m in present if "NOISY" in entry["metrics"][m]["flags"]]
        if single:  # named when other figures of the arm have more passes (e.g. a shared start)
            arm_flags.append("SINGLE PASS" + ("" if single == present
                                              else " (" + ", ".join(single) + ")"))
        if noisy:
            arm_flags.append("NOISY (" + ", ".join(noisy) + ")")
        ns = sorted({s["n"] for s in entry["metrics"].values() if s})
        n_text = "/".join(map(str, ns)) if ns else "0"
        cells = [_cell(entry["metrics"].get(m)) for m in metrics]
        name = f"{labels[arm_id]} ({arm_id})" if arm_id in labels else arm_id
        regime = " | " + (", ".join(entry.get("decode_regime") or []) or "-") if regimes else ""
        if sol:
            regime += " | " + (entry.get("speed_of_light") or {}).get("text", "-")
        lines.append(f"| {name} | " + " | ".join(cells) + regime + f" | {n_text} | "
                     + ", ".join(arm_flags) + " |")
    out = "\n".join(lines) + "\n"
    legend = (f"\nCells: median (spread = (max - min) / median); NOISY: spread > "
              f"{summary['noise_pct']:g}%; SINGLE PASS: one pass is not a result.\n")
    out += legend
    if regimes:
        out += ("decode regime: cache-resident when the weight bytes a token reads fit in the "
                "LLC of the CPUs used, else DRAM-bound.\n")
    if sol:
        out += ("decode % of SoL: the median over passes of decode tok/s over its speed of light, "
                "batch x the slot's read bandwidth (the probe of the figure's regime, measured "
                "on the slot's CPUs before the engine loaded) / the weight bytes a token reads; "
                "over 100 % says why.\n")
    for hw in summary.get("hardware") or []:
        out += f"CPU: {hw}\n"
    won = {arm_id: e["llamacpp_settings"] for arm_id, e in summary["arms"].items()
           if e.get("llamacpp_settings")}
    if won:
        out += "\nllama.cpp at its best (the setting that won, passes it won):\n"
        for arm_id, figures in won.items():
            text = "; ".join(f"{figure} " + ", ".join(f"{label} {n}x" for label, n in
                                                      sorted(counts.items(), key=lambda c: -c[1]))
                             for figure, counts in figures.items())
            out += f"- {labels.get(arm_id, arm_id)} ({arm_id}): {text}\n"
    out += baseline_markdown(summary)
    if summary["notes"]:
        out += "\n" + "\n".join(f"- {n['note']}" for n in summary["notes"]) + "\n"
    return out


# What the baseline table divides, where the sweep measured it: speed, then memory settled.
BASELINE_METRICS = ("decode_tok_s", "prefill_tok_s", "tpot_ms", "rss_anon_tree_mb",
                    "peak_rss_anon_during_load_mb")


def baseline_markdown(summary: dict) -> str:
    """Each arm's medians over its baseline's (``baselines``: arm label -> baseline label, from
    the sweep's ``baseline:``), one column per metric both measured; ``*`` where either median
    is NOISY or a single pass: a ratio that is not a ranking."""
    bases = summary.get("baselines") or {}
    labels = summary.get("labels") or {}
    by_label = {e.get("label") or labels.get(arm_id, arm_id): e
                for arm_id, e in summary["arms"].items()}
    rows = [(label, base) for label, base in bases.items()
            if label in by_label and base in by_label]
    metrics = [m for m in BASELINE_METRICS
               if any((by_label[a]["metrics"].get(m) or {}).get("median") is not None
                      and (by_label[b]["metrics"].get(m) or {}).get("median")
                      for a, b in rows)]
    if not rows or not metrics:
        return ""
    single = len(set(bases.values())) == 1
    ids = {**{label: arm_id for arm_id, label in labels.items()},  # the main table's ids
           **{e["label"]: arm_id for arm_id, e in summary["arms"].items() if e.get("label")}}
    lines = ["", f"Against the baseline (`{summary.get('baseline')}`"
             + ("" if single else ", each arm against the baseline at its own matrix point")
             + "): the arm's median / the baseline's.", "",
             "| arm | baseline | " + " | ".join(metrics) + " |",
             "|---|---|" + "---:|" * len(metrics)]
    for label, base in rows:
        cells = []
        for m in metrics:
            a, b = by_label[label]["metrics"].get(m), by_label[base]["metrics"].get(m)
            if not a or not b or a.get("median") is None or not b.get("median"):
                cells.append("-")
                continue
            unsure = any(f.startswith(("NOISY", "SINGLE")) for f in (*a["flags"], *b["flags"]))
            cells.append(f"{a['median'] / b['median']:.3g}x" + ("*" if unsure else ""))
        lines.append(f"| {label} | {'(itself)' if label == base else ids.get(base, base)} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\n* NOISY or single-pass on either side: not a ranking.\n")


# --- serving load points (docs/serving.md) ---------------------------------------------------

# (column, how to read it from one load point of measurements["serving"])
SERVING_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("req/s", ("request_throughput",)),
    ("out tok/s", ("output_throughput",)),
    ("goodput req/s", ("goodput",)),
    ("TTFT p50 ms", ("ttft_ms", "median")),
    ("TTFT p99 ms", ("ttft_ms", "p99")),
    ("TPOT p50 ms", ("tpot_ms", "median")),
    ("TPOT p99 ms", ("tpot_ms", "p99")),
    ("ITL p99 ms", ("itl_ms", "p99")),
    ("E2E p99 ms", ("e2e_ms", "p99")),
    ("KV peak %", ("kv_cache", "peak_usage")),
    ("RSS peak MiB", ("peak_rss_anon_mb",)),
)


def _dig(d: object, keys: tuple[str, ...]) -> float | None:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return _number(d)


# The unit of a search's capacity, by what it bisected over (docs/serving.md).
CAPACITY_UNITS = {"request_rate": "req/s", "max_concurrency": "requests in flight",
                  "users": "users"}


def load_label(point: dict) -> str:
    """How a load point reads in a table: ``4.0 req/s`` (``, <= 8 in flight``), ``16 users``;
    and ``, 30 s`` when it ran for a duration."""
    if point.get("users") is not None:
        text = f"{point['users']} users"
    else:
        text = f"{point.get('request_rate')} req/s"
        if point.get("max_concurrency") is not None:
            text += f", <= {point['max_concurrency']} in flight"
    if point.get("ends_by") == "duration_s":
        text += f", {point.get('duration_limit_s'):g} s"
    return text


def summarize_serving(records: list[dict]) -> list[dict]:
    """One row per arm and load point of serving records: the median over passes of each of
    ``SERVING_COLUMNS`` (a percentile absent from the workload's ``percentiles`` is None)."""
    rows: dict[tuple[str, int], dict] = {}
    for rec in records:
        if rec.get("retracted") or rec.get("status", "ok") != "ok":
            continue
        points = (rec.get("measurements") or {}).get("serving")
        if not isinstance(points, list):
            continue
        arm_id = str(rec["arm"]["id"])
        for k, point in enumerate(points):
            row = rows.setdefault((arm_id, k), {
                "arm": arm_id, "load_point": k, "request_rate": point.get("request_rate"),
                "load": load_label(point),
                "n": 0, "values": {c: [] for c, _ in SERVING_COLUMNS}})
            row["n"] += 1
            for col, keys in SERVING_COLUMNS:
                v = _dig(point, keys)
                if v is not None:
                    row["values"][col].append(v * 100 if col == "KV peak %" else v)
    searches: dict[str, list] = {}
    for rec in records:
        found = (rec.get("measurements") or {}).get("serving_search")
        if isinstance(found, dict) and rec.get("status", "ok") == "ok" and not rec.get("retracted"):
            searches.setdefault(str(rec["arm"]["id"]), []).append(found)
    out = []
    for arm_id, found in searches.items():  # the SLO search: one row per arm, load_point None
        caps = [f["capacity"] for f in found if f.get("capacity") is not None]
        out.append({"arm": arm_id, "load_point": None, "request_rate": "search", "n": len(found),
                    "over": found[0].get("over", "request_rate"),
                    "capacity": statistics.median(caps) if caps else None,
                    "brackets": [f.get("bracket") for f in found],
                    "percentile": found[0].get("percentile"), "slo": found[0].get("slo")})
    for row in rows.values():
        values = row.pop("values")
        row["median"] = {c: (statistics.median(v) if v else None) for c, v in values.items()}
        out.append(row)
    return out


def serving_markdown(rows: list[dict], labels: dict | None = None) -> str:
    """The serving rows as a table (empty text when there are none)."""
    if not rows:
        return ""
    labels = labels or {}
    cols = [c for c, _ in SERVING_COLUMNS]
    lines = ["", "## Serving load points", "",
             "| arm | load | " + " | ".join(cols) + " | n |",
             "|---|---:|" + "---:|" * len(cols) + "---:|"]
    searches = [r for r in rows if r["load_point"] is None]
    rows = [r for r in rows if r["load_point"] is not None]
    for r in rows:
        name = f"{labels[r['arm']]} ({r['arm']})" if r["arm"] in labels else r["arm"]
        cells = [_fmt(r["median"][c]) if r["median"][c] is not None else "-" for c in cols]
        lines.append(f"| {name} | {r['load']} | " + " | ".join(cells) + f" | {r['n']} |")
    lines.append("")
    lines.append("Cells: median over passes. One engine start serves every load point of an arm, "
                 "in order; goodput: requests/s that met every SLO. Per-request samples are in "
                 "each record's measurements.serving[].samples.")
    for r in searches:
        name = f"{labels[r['arm']]} ({r['arm']})" if r["arm"] in labels else r["arm"]
        slo = ", ".join(f"{k} <= {v:g}" for k, v in (r["slo"] or {}).items())
        unit = CAPACITY_UNITS[r["over"]]
        cap = f"below the search's low {unit}" if r["capacity"] is None else \
            f"{_fmt(r['capacity'])} {unit}"
        lines.append(f"- capacity of {name} at p{r['percentile']:g} {slo}: {cap} "
                     f"(brackets [met, failed]: {r['brackets']}; n={r['n']})")
    return "\n".join(lines) + "\n"
