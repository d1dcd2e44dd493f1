"""The report's charts, drawn with matplotlib (Agg, no display) and returned as PNG bytes.

Each function returns None when there is nothing to draw (no values, a single point), so the
page shows only charts that carry information. Retracted arms are never drawn.
"""

from __future__ import annotations

import io

from omni_ray.report.metric import BY_NAME, HEADLINE, MEMORY_HEADLINE, Metric
from omni_ray.report.run import ArmResult, Run, _number

_DPI = 96


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=_DPI)
    _pyplot().close(fig)
    return buf.getvalue()


def _values(arm: ArmResult, metric: str) -> list[float]:
    return [v for r in arm.ok
            if (v := _number((r.get("measurements") or {}).get(metric))) is not None]


def metric_by_axis(run: Run, metric: Metric, axis: str | tuple[str, ...]) -> bytes | None:
    """``metric`` against the values of ``axis`` (in matrix order; a tuple of keys that change
    together is one axis), one line per combination of the other axes; every pass a point, the
    median joined by the line, min-max as a bar."""
    keys = (axis,) if isinstance(axis, str) else tuple(axis)
    arms = [a for a in run.arms if not a.is_retracted and metric.name in a.stats]
    xs: list[str] = []
    lines: dict[str, list[tuple[str, ArmResult]]] = {}
    for arm in arms:
        d = dict(arm.axes)
        if any(k not in d for k in keys):
            continue
        x = ",".join(d[k] for k in keys)
        if x not in xs:
            xs.append(x)
        others = ",".join(f"{k}={v}" for k, v in arm.axes if k not in keys) or metric.title
        lines.setdefault(others, []).append((x, arm))
    if len(xs) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, (name, points) in enumerate(lines.items()):
        color = f"C{i % 10}"
        pos = [xs.index(x) + (i - (len(lines) - 1) / 2) * 0.04 for x, _a in points]
        med = [a.stats[metric.name].median for _x, a in points]
        lo = [m - a.stats[metric.name].min for m, (_x, a) in zip(med, points)]
        hi = [a.stats[metric.name].max - m for m, (_x, a) in zip(med, points)]
        ax.errorbar(pos, med, yerr=[lo, hi], color=color, marker="o", capsize=4,
                    label=name[:60])
        for p, (_x, a) in zip(pos, points):
            vals = _values(a, metric.name)
            ax.scatter([p] * len(vals), vals, color=color, s=10, alpha=0.5, zorder=3)
    name = "+".join(keys)
    ax.set_xticks(range(len(xs)), [x if len(x) <= 24 else x[:23] + "\u2026" for x in xs],
                  rotation=20 if max(map(len, xs)) > 10 and len(xs) > 3 else 0)
    ax.set_xlabel(name)
    ax.set_ylabel(metric.header)
    ax.set_title(f"{metric.title} by {name}"[:80])
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize="small")
    return _png(fig)


def memory_over_time(run: Run, arm: ArmResult) -> bytes | None:
    """RssAnon of the engine's process tree over time, one line per pass, from the sampler's
    samples in each record (``memory.samples`` with ``memory.columns``)."""
    series = []
    for rec in arm.ok:
        mem = rec.get("memory")
        if not isinstance(mem, dict) or not mem.get("samples"):
            continue
        cols = list(mem.get("columns") or [])
        if "t_s" not in cols or "rss_anon_mb" not in cols:
            continue
        ti, mi = cols.index("t_s"), cols.index("rss_anon_mb")
        pts = [(s[ti], s[mi]) for s in mem["samples"]
               if isinstance(s, list) and len(s) > max(ti, mi)]
        if pts:
            series.append((rec.get("pass"), pts, mem.get("marks") or {}))
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    for i, (pass_no, pts, marks) in enumerate(series):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, color=f"C{i % 10}",
                label=f"pass {pass_no}")
        if "ready" in marks and i == 0:
            ax.axvline(marks["ready"], color="grey", ls=":", lw=1, label="ready")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("RssAnon, process tree (MiB)")
    ax.set_title(f"memory over time: {arm.label}"[:80])
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    return _png(fig)


def pareto(runs: list[Run], y: str = HEADLINE, x: str = MEMORY_HEADLINE) -> bytes | None:
    """Throughput against peak memory, one point per arm (min-max bars both ways), the arms
    no other arm beats on both joined as the Pareto front."""
    pts = []
    sweeps = [r.sweep for r in runs]
    for run in runs:
        # several runs: name each point's run by its sweep, or sweep/run when sweeps repeat
        where = "" if len(runs) == 1 else (
            run.sweep if sweeps.count(run.sweep) == 1 else run.name) + " "
        for arm in run.arms:
            if arm.is_retracted or x not in arm.stats or y not in arm.stats:
                continue
            name = where + arm.label
            pts.append((arm.stats[x], arm.stats[y], name))
    if len(pts) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (sx, sy, name) in enumerate(pts):
        ax.errorbar([sx.median], [sy.median], xerr=[[sx.median - sx.min], [sx.max - sx.median]],
                    yerr=[[sy.median - sy.min], [sy.max - sy.median]], fmt="o",
                    color=f"C{i % 10}", capsize=3, label=name[:70])
    front = sorted((p for p in pts if not any(
        q[0].median <= p[0].median and q[1].median >= p[1].median
        and (q[0].median, q[1].median) != (p[0].median, p[1].median) for q in pts)),
        key=lambda p: p[0].median)
    ax.plot([p[0].median for p in front], [p[1].median for p in front], color="black",
            lw=1, ls="--", label="Pareto front")
    ax.set_xlabel(BY_NAME[x].header)
    ax.set_ylabel(BY_NAME[y].header)
    ax.set_title(f"{BY_NAME[y].title} vs {BY_NAME[x].title} (up and left is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    return _png(fig)
