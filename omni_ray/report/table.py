"""The summary table of one or several runs, as data, and its Markdown, CSV and JSON forms.

Rows are arms in the sweep's matrix order; a cell is the median, with [min-max] only where
there are several passes; a run that names a baseline arm gets a column of ratios to it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json

from omni_ray.errors import UserError
from omni_ray.report.metric import BY_NAME, HEADLINE, Metric, fmt, fmt_ratio
from omni_ray.report.run import ArmResult, Run
from omni_ray.results.summary import Stat


@dataclasses.dataclass(frozen=True)
class Row:
    run: Run
    arm: ArmResult
    flags: tuple[str, ...]
    ratio: float | None           # headline median / baseline's headline median
    base: ArmResult | None = None  # the arm this row is divided by
    is_baseline: bool = False     # some row of its run is divided by this arm


@dataclasses.dataclass(frozen=True)
class Table:
    metrics: tuple[Metric, ...]
    rows: tuple[Row, ...]
    baseline: dict                # run name -> its baseline: an arm label, or axis=value pairs
    several: bool                 # more than one run: rows name their run


def cell(stat: Stat | None) -> str:
    """"71.3" for one pass, "71.3 [66.4-75.1]" for several."""
    if stat is None:
        return "-"
    if stat.n == 1 or stat.min == stat.max:
        return fmt(stat.median)
    return f"{fmt(stat.median)} [{fmt(stat.min)}-{fmt(stat.max)}]"


def baseline_arm(run: Run, baseline: str | None, *, asked: bool = True) -> ArmResult | None:
    """The arm named by ``baseline`` (label or id), None without one or when this run has no
    such arm (several runs need not share arms). A retracted arm is never a baseline: a
    UserError when the user ``asked`` for it, else (the sweep named it) no baseline."""
    if not baseline:
        return None
    try:
        arm = run.arm(baseline)
    except UserError:
        return None
    if arm.is_retracted and not asked:
        return None
    if arm.is_retracted:
        raise UserError(f"{run.path}: baseline arm {arm.label!r} is retracted "
                        f"({(arm.retraction or {}).get('reason')}); pick another")
    return arm


def ratio(stat: Stat | None, base: Stat | None) -> float | None:
    if stat is None or base is None or base.median == 0:
        return None
    return stat.median / base.median


def build(runs: list[Run], baseline: str | None = None) -> Table:
    metrics: list[Metric] = []
    for run in runs:
        for m in run.metrics():
            if m not in metrics:
                metrics.append(m)
    metrics.sort(key=lambda m: list(BY_NAME).index(m.name))
    rows, named = [], {}
    for run in runs:
        bases = _bases(run, baseline)
        if bases:
            named[run.name] = baseline or run.baseline
        is_base = {b.label for b in bases.values() if b is not None}
        for arm in run.arms:
            base = bases.get(arm.label)
            r = ratio(arm.stats.get(HEADLINE), base.stats.get(HEADLINE)) if base else None
            rows.append(Row(run, arm, tuple(arm.flags(run.noise_pct)), r, base,
                            arm.label in is_base))
    if baseline and not named:
        raise UserError(f"--baseline {baseline!r}: no run has an arm with that label or id")
    return Table(tuple(metrics), tuple(rows), named, len(runs) > 1)


def _bases(run: Run, baseline: str | None) -> dict[str, ArmResult | None]:
    """arm label -> the arm it is divided by: the one asked for (``--baseline``), else the
    sweep's per-arm baselines (summary.json ``baselines``), else the sweep's one baseline arm;
    {} without any. A retracted baseline the sweep named divides nothing."""
    if baseline:
        base = baseline_arm(run, baseline)
        return {a.label: base for a in run.arms} if base else {}
    if run.baselines:
        out = {}
        for label, base_label in run.baselines.items():
            base = baseline_arm(run, base_label, asked=False)
            if base is not None:
                out[label] = base
        return out
    base = baseline_arm(run, run.baseline, asked=False)
    return {a.label: base for a in run.arms} if base else {}


def row_name(row: Row, several: bool) -> str:
    return f"{row.run.name} {row.arm.label}" if several else row.arm.label


def to_markdown(table: Table) -> str:
    ratio_col = [f"{BY_NAME[HEADLINE].title} vs baseline"] if table.baseline else []
    head = ["arm", "passes", *ratio_col, *(m.header for m in table.metrics), "flags"]
    lines = ["| " + " | ".join(head) + " |",
             "|---|---:|" + "---:|" * (len(ratio_col) + len(table.metrics)) + "---|"]
    for row in table.rows:
        struck = row.arm.is_retracted
        name = row_name(row, table.several)
        if row.is_baseline:
            name += " (baseline)"
        cells = [name, str(len(row.arm.measured))]
        if ratio_col:
            cells.append(fmt_ratio(row.ratio))
        cells += [cell(row.arm.stats.get(m.name)) for m in table.metrics]
        if struck:
            cells = [f"~~{c}~~" for c in cells]
        cells.append(", ".join(row.flags))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Cells: median [min-max over passes]; a single figure: one pass, or all equal."]
    notes = [retraction_note(row.arm.retraction, row_name(row, table.several))
             for row in table.rows if row.arm.retraction]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def retraction_note(r: dict, what: str) -> str:
    return (f"RETRACTED {what} on {r['on']}: {r['reason']}"
            + (f" (superseded by {r['superseded_by']})" if r.get("superseded_by") else ""))


_CSV = ("run", "arm", "arm_id", "metric", "unit", "n", "median", "min", "max", "spread_pct",
        "ratio_to_baseline", "flags", "retracted")


def to_csv(table: Table) -> str:
    """One row per arm x metric, raw numbers (no rounding)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(_CSV)
    for row in table.rows:
        base = row.base
        for m in table.metrics:
            s = row.arm.stats.get(m.name)
            r = ratio(s, base.stats.get(m.name)) if base else None
            w.writerow([row.run.name, row.arm.label, row.arm.id, m.name, m.unit,
                        s.n if s else 0, *(("", "", "", "") if s is None else
                                           (s.median, s.min, s.max,
                                            "" if s.spread_pct is None else s.spread_pct)),
                        "" if r is None else r, ";".join(row.flags), row.arm.is_retracted])
    return buf.getvalue()




def to_json(table: Table) -> str:
    out = []
    for row in table.rows:
        base = row.base
        out.append({
            "run": row.run.name, "path": str(row.run.path), "arm": row.arm.label,
            "arm_id": row.arm.id, "index": row.arm.index, "passes": len(row.arm.measured),
            "failed": len(row.arm.failed), "flags": list(row.flags),
            "retracted": row.arm.is_retracted, "retraction": row.arm.retraction,
            "baseline": row.base.label if row.base else None,
            "metrics": {m.name: {**row.arm.stats[m.name].to_dict(), "unit": m.unit,
                                 "ratio_to_baseline": ratio(row.arm.stats[m.name],
                                                            base.stats.get(m.name))
                                 if base else None}
                        for m in table.metrics if m.name in row.arm.stats}})
    return json.dumps({"rows": out}, indent=2, allow_nan=False) + "\n"
