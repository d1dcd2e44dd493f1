"""The report of one or several runs: a self-contained HTML page (charts inlined as PNG data
URIs, no script, no network) or the same tables as Markdown, CSV or JSON."""

from __future__ import annotations

import base64
import datetime as _dt
import html
import os
from pathlib import Path

from omni_ray.errors import UserError
from omni_ray.report import plot, table
from omni_ray.report.metric import BY_NAME, HEADLINE, fmt, fmt_ratio
from omni_ray.report.run import Run, load_run
from omni_ray.results.store import write_text_atomic

FORMATS = ("html", "md", "csv", "json")

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1400px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:right;vertical-align:top}
td{white-space:nowrap}td small{color:#777}
td.l{white-space:normal;max-width:60em;overflow-wrap:break-word}
th{background:#f4f4f4}td:first-child,th:first-child,td.l{text-align:left}
tr.retracted td{text-decoration:line-through;color:#888}
.badge{display:inline-block;border-radius:3px;padding:0 .4em;margin:1px;font-size:.8em;
  background:#eee}td.flags{min-width:16em}
.badge.NOISY,.badge.CONTENDED{background:#fde7b0}.badge.FAILED,.badge.RETRACTED{background:#f7c1c1}
.badge.SINGLE{background:#dde8f7}.badge.baseline{background:#cfe9cf}
.charts{display:flex;flex-wrap:wrap;gap:1em}.charts img{border:1px solid #eee}
pre{background:#f7f7f7;padding:.5em;overflow-x:auto;max-height:20em;font-size:.85em}
.skipped{color:#a40}.wide{overflow-x:auto;max-width:100%}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _img(png: bytes | None, alt: str) -> str:
    if png is None:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _badge(flag: str) -> str:
    return f'<span class="badge {_e(flag.split()[0].rstrip(":"))}">{_e(flag)}</span>'


def _cell_html(stat) -> str:
    """The median, and below it in small type the min-max range where there are several."""
    if stat is None:
        return "<td>-</td>"
    spread = "" if stat.n == 1 or stat.min == stat.max else (
        f'<br><small>{_e(fmt(stat.min))}&ndash;{_e(fmt(stat.max))}</small>')
    return f"<td>{_e(fmt(stat.median))}{spread}</td>"


def _table_html(t: table.Table) -> str:
    ratio_col = bool(t.baseline)
    head = ["arm", "passes"] + ([f"{BY_NAME[HEADLINE].title} vs baseline"]
                               if ratio_col else []) + [m.header for m in t.metrics] + ["flags"]
    out = ['<div class="wide"><table><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head)
           + "</tr></thead><tbody>"]
    for row in t.rows:
        name = table.row_name(row, t.several)
        badges = [_badge(f) for f in row.flags]
        if row.is_baseline:
            badges.insert(0, '<span class="badge baseline">baseline</span>')
        label = _e(name).replace(",", ",<wbr>")  # a long label breaks between its axes
        cells = [f'<td class="l" title="{_e(row.arm.id)}">{label}</td>',
                 f"<td>{len(row.arm.measured)}</td>"]
        if ratio_col:
            cells.append(f"<td>{_e(fmt_ratio(row.ratio))}</td>")
        cells += [_cell_html(row.arm.stats.get(m.name)) for m in t.metrics]
        cells.append(f'<td class="l flags">{"".join(badges)}</td>')
        cls = ' class="retracted"' if row.arm.is_retracted else ""
        out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    out.append("<p>Cells: the median over passes, the min&ndash;max below it where there are "
               "several passes that differ. Arms in the sweep's matrix order.</p>")
    notes = [table.retraction_note(r.arm.retraction, table.row_name(r, t.several))
             for r in t.rows if r.arm.retraction]
    if notes:
        out.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    return "\n".join(out)


def _provenance_html(run: Run) -> str:
    p = run.provenance
    cpu = run.cpu
    pinning = {}
    for rec in run.records:
        if isinstance(rec.get("pinning"), dict):
            pinning = rec["pinning"]
            break
    # a resumed run can span commits: name every (sha, dirty) its records were measured at
    shas = [f"{c['sha'] or 'unknown'}{' (dirty tree)' if c['dirty'] else ''}"
            for c in run.commits]
    packages = ", ".join(f"{k} {v}" for k, v in (p.get("packages") or {}).items() if v)
    rows = [("host", p.get("host")), ("time of first record", p.get("time")),
            ("git SHA", ", ".join(shas) or "unknown"), ("CPU", cpu.get("brand")),
            ("CPU flags", " ".join(cpu.get("flags") or [])),
            ("cores seen", p.get("cpu_count")), ("affinity", p.get("affinity")),
            ("Python", (p.get("python") or {}).get("version")), ("packages", packages),
            ("kernel", (p.get("platform") or {}).get("release")),
            ("pinning", ", ".join(f"{k}={v}" for k, v in pinning.items()
                                  if k in ("requested_cpus", "node", "allowed_cpus", "threads",
                                           "violations")))]
    body = "".join(f'<tr><th>{_e(k)}</th><td class="l">{_e(v if v is not None else "-")}</td>'
                   "</tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _failures_html(run: Run) -> str:
    items = []
    for arm in run.arms:
        for rec in arm.failed:
            tail = rec.get("stderr_tail") or ""
            items.append(f"<h4>{_e(arm.label)} pass {_e(rec.get('pass'))}: "
                         f"{_e(rec.get('status'))}</h4><p>{_e(rec.get('error'))}</p>"
                         + (f"<pre>{_e(tail[-4000:])}</pre>" if tail else ""))
    if not items:
        return "<p>No failed arm.</p>"
    return "\n".join(items)


def _serving_html(run: Run) -> str:
    """Serving arms: one row per arm and load point, medians over passes (docs/serving.md)."""
    from omni_ray.results.summary import SERVING_COLUMNS, _fmt, summarize_serving

    rows = [r for r in summarize_serving([r for a in run.arms for r in a.ok])
            if r["load_point"] is not None]
    if not rows:
        return ""
    labels = {a.id: a.label for a in run.arms}
    cols = [c for c, _ in SERVING_COLUMNS]
    head = "".join(f"<th>{_e(c)}</th>" for c in ["arm", "load", *cols, "n"])
    body = "".join(
        f"<tr><td>{_e(labels.get(r['arm'], r['arm']))}</td><td>{_e(r['load'])}</td>"
        + "".join(f"<td>{_e(_fmt(r['median'][c]))}</td>" for c in cols)
        + f"<td>{r['n']}</td></tr>" for r in rows)
    return ("<h3>Serving load points</h3><p>One engine start per arm serves its load points in "
            "order; per-request samples are in each record.</p>"
            f"<table><tr>{head}</tr>{body}</table>")


def _quality_html(run: Run) -> str:
    """Arms that ran the quality probe, each quantized one against its bf16 arm
    (docs/quality.md), with the caveat on synthetic weights."""
    from omni_ray.results.quality import CAVEAT, pair
    from omni_ray.results.summary import _fmt

    rows = pair([r for a in run.arms for r in a.ok])
    if not rows:
        return ""
    labels = {a.id: a.label for a in run.arms}
    cols = ["arm", "weights", "vs bf16 arm", "greedy prefix", "greedy agreement",
            "mean |dlogprob|", "perplexity", "ratio", "decode tok/s", "bf16 decode tok/s", "n"]
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(v)}</td>" for v in (
            labels.get(r["arm"], r["arm"]), f"{r['engine']} {r['weights']}",
            labels.get(r["baseline"], r["baseline"]) if r["baseline"] else "none",
            "-" if r["greedy_prefix"] is None else f"{r['greedy_prefix']:g}/{r['tokens']}",
            _fmt(r["greedy_agreement"]), _fmt(r["mean_abs_dlogprob"]), _fmt(r["perplexity"]),
            _fmt(r["perplexity_ratio"]), _fmt(r["decode_tok_s"]),
            _fmt(r.get("baseline_decode_tok_s")), r["n"])) + "</tr>" for r in rows)
    return (f"<h3>Quality beside speed</h3><p>{_e(CAVEAT)}</p>"
            f"<table><tr>{head}</tr>{body}</table>")


def _run_html(run: Run, baseline: str | None, title_level: str = "h2") -> str:
    out = [f'<{title_level} id="{_e(run.name)}">{_e(run.name)}'
           + (" (retracted)" if run.is_retracted else "") + f"</{title_level}>",
           f"<p>{_e(run.path)} &middot; {len(run.arms)} arms &middot; "
           f"{len(run.records)} records</p>"]
    out.append(_table_html(table.build([run], baseline)))
    out.append(_serving_html(run))
    out.append(_quality_html(run))
    charts = []
    for axis in run.axis_groups():
        for m in run.metrics():
            charts.append(_img(plot.metric_by_axis(run, m, axis), f"{m.title} by {'+'.join(axis)}"))
    charts.append(_img(plot.pareto([run]), "throughput vs memory"))
    if any(charts):
        out.append("<h3>Charts</h3><div class=\"charts\">" + "".join(charts) + "</div>")
    mem = [_img(plot.memory_over_time(run, a), f"memory over time {a.label}")
           for a in run.arms if not a.is_retracted]
    if any(mem):
        out.append("<h3>Memory over time</h3><div class=\"charts\">" + "".join(mem) + "</div>")
    out.append("<h3>Provenance</h3>" + _provenance_html(run))
    out.append("<h3>Failed arms</h3>" + _failures_html(run))
    if run.skipped:
        out.append("<h3>Skipped files</h3><ul class=\"skipped\">" + "".join(
            f"<li>{_e(s.path)}: {_e(s.problem)}</li>" for s in run.skipped) + "</ul>")
    return "\n".join(out)


def render_html(runs: list[Run], baseline: str | None = None) -> str:
    title = runs[0].name if len(runs) == 1 else f"{len(runs)} runs"
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>omni-ray report: {_e(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>omni-ray report: {_e(title)}</h1><p>Generated {now} from the result records; "
             "numbers are medians over passes.</p>"]
    if len(runs) > 1:
        parts.append("<h2>All runs side by side</h2>" + _table_html(table.build(runs, baseline)))
        parts.append('<div class="charts">' + _img(plot.pareto(runs), "throughput vs memory")
                     + "</div>")
    for run in runs:
        parts.append(_run_html(run, baseline))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def render(runs: list[Run], form: str = "html", baseline: str | None = None) -> str:
    if form not in FORMATS:
        raise UserError(f"--format: must be one of {', '.join(FORMATS)}, got {form!r}")
    if form == "html":
        return render_html(runs, baseline)
    t = table.build(runs, baseline)
    if form == "md":
        title = runs[0].name if len(runs) == 1 else ", ".join(r.name for r in runs)
        skipped = [f"- skipped {s.path}: {s.problem}" for r in runs for s in r.skipped]
        return f"# {title}\n\n" + table.to_markdown(t) + (
            "\n" + "\n".join(skipped) + "\n" if skipped else "")
    return table.to_csv(t) if form == "csv" else table.to_json(t)


def default_path(run_dirs: list[Path], form: str) -> Path:
    """Beside a single run (RUN_DIR/report.html); in the working directory for several."""
    base = run_dirs[0] if len(run_dirs) == 1 and run_dirs[0].is_dir() else Path(".")
    return base / f"report.{form}"


def write_report(run_dirs: list[str | os.PathLike], *, out: str | os.PathLike | None = None,
                 form: str = "html", baseline: str | None = None) -> Path:
    """Read the runs, render them and write one file; returns its path.

    ``out`` is a directory (the file is ``report.FORMAT`` in it) or a file name ending in
    ``.FORMAT``; default: beside a single run, or ./report.FORMAT for several."""
    if not run_dirs:
        raise UserError("no run directory given")
    if form not in FORMATS:
        raise UserError(f"--format: must be one of {', '.join(FORMATS)}, got {form!r}")
    dirs = [Path(d) for d in run_dirs]
    runs = [load_run(d) for d in dirs]
    text = render(runs, form, baseline)
    if out is None:
        path = default_path(dirs, form)
    else:
        out = Path(out)
        path = out if out.suffix == f".{form}" else out / f"report.{form}"
    return write_text_atomic(path, text)
