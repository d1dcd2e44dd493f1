"""Comparing two runs: arms matched by config hash (or by label when only fields that do not
change the measurement differ), a verdict per metric from a band and the runs' own spreads.

A difference smaller than either run's spread (max - min over passes) is "same (noise)", never
a regression; a difference inside the metric's band is "same"; otherwise the metric's better or
worse word (faster/slower, smaller/larger, more/fewer). Retracted arms are shown, never compared.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import yaml

from omni_ray.errors import UserError
from omni_ray.report.metric import METRICS, Metric, fmt
from omni_ray.report.run import ArmResult, Run, load_run
from omni_ray.results.summary import Stat

# Config fields that name or schedule an arm but do not change what it measures.
NOT_MEASURED = ("id", "sweep", "label", "index", "timeout_s")

NOISE = "same (noise)"
SAME = "same"


def default_bands() -> dict[str, float]:
    return {m.name: m.band_pct for m in METRICS}


def load_bands(path: str | os.PathLike) -> dict[str, float]:
    """Default bands updated from a YAML/JSON mapping ``metric: percent``; an unknown metric or
    a value that is not a percentage >= 0 is a one-line UserError naming the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such bands file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not YAML/JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: must be a mapping of metric -> band percent, got "
                        f"{type(data).__name__}")
    bands = default_bands()
    for key, value in data.items():
        if key not in bands:
            raise UserError(f"{path}: {key}: unknown metric (known: {', '.join(bands)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UserError(f"{path}: {key}: must be a percentage >= 0, got {value!r}")
        bands[key] = float(value)
    return bands


@dataclasses.dataclass(frozen=True)
class MetricVerdict:
    metric: Metric
    base: Stat
    new: Stat
    verdict: str

    @property
    def ratio(self) -> float | None:
        return None if self.base.median == 0 else self.new.median / self.base.median

    @property
    def regressed(self) -> bool:
        return self.verdict == self.metric.worse


@dataclasses.dataclass(frozen=True)
class ArmComparison:
    base: ArmResult
    new: ArmResult
    matched_by: str                      # "config hash" or "label"
    metrics: tuple[MetricVerdict, ...]

    @property
    def retracted(self) -> bool:
        return self.base.is_retracted or self.new.is_retracted


@dataclasses.dataclass(frozen=True)
class Comparison:
    base: Run
    new: Run
    arms: tuple[ArmComparison, ...]
    only_base: tuple[ArmResult, ...]
    only_new: tuple[ArmResult, ...]
    warnings: tuple[str, ...]

    @property
    def regressions(self) -> list[tuple[ArmComparison, MetricVerdict]]:
        return [(a, v) for a in self.arms if not a.retracted for v in a.metrics if v.regressed]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0


def verdict(metric: Metric, base: Stat, new: Stat, band_pct: float) -> str:
    diff = new.median - base.median
    if diff == 0:
        return SAME
    if abs(diff) <= max(base.range, new.range):
        return NOISE
    if base.median == 0 or abs(diff) / abs(base.median) * 100 <= band_pct:
        return SAME
    better = (diff > 0) == metric.higher_is_better
    return metric.better if better else metric.worse


def measured_config(config: dict) -> str:
    return json.dumps({k: v for k, v in config.items() if k not in NOT_MEASURED},
                      sort_keys=True, default=str)


def match_arms(base: Run, new: Run) -> tuple[list[tuple[ArmResult, ArmResult, str]],
                                             list[ArmResult], list[ArmResult]]:
    pairs = []
    left = list(new.arms)
    unmatched = []
    for b in base.arms:
        hit = next((n for n in left if b.config_hash and n.config_hash == b.config_hash), None)
        how = "config hash"
        if hit is None:
            hit = next((n for n in left if n.label == b.label
                        and measured_config(n.config) == measured_config(b.config)), None)
            how = "label"
        if hit is None:
            unmatched.append(b)
            continue
        left.remove(hit)
        pairs.append((b, hit, how))
    return pairs, unmatched, left


def _provenance_warnings(base: Run, new: Run) -> list[str]:
    out = []
    for run in (base, new):
        for c in run.commits:
            if c["dirty"]:
                out.append(f"{run.name} was measured from a dirty tree at {c['sha']}: its code "
                           "is not exactly that commit")
        if len(run.commits) > 1:
            out.append(f"{run.name} spans {len(run.commits)} commits (a resumed run?)")
    bc, nc = base.cpu, new.cpu
    if bc.get("brand") != nc.get("brand"):
        out.append(f"CPU MODEL DIFFERS: {bc.get('brand')!r} vs {nc.get('brand')!r}: the runs "
                   "measured different machines")
    bf, nf = set(bc.get("flags") or []), set(nf_ := nc.get("flags") or [])
    if bf != nf and bf and nf_:
        gone = sorted(bf - nf)[:8]
        added = sorted(nf - bf)[:8]
        out.append(f"CPU FLAGS DIFFER: only in base {gone or '[]'}, only in new {added or '[]'}")
    return out


def compare_runs(base_dir: str | os.PathLike, new_dir: str | os.PathLike, *,
                 bands: dict[str, float] | str | os.PathLike | None = None) -> Comparison:
    """Compare the run ``new_dir`` against ``base_dir``. No arm in common, or a base run that is
    retracted, is a UserError (a retracted result is never a baseline)."""
    if bands is None:
        bands = default_bands()
    elif not isinstance(bands, dict):
        bands = load_bands(bands)
    base, new = load_run(base_dir), load_run(new_dir)
    if base.is_retracted:
        first = base.arms[0].retraction or {}
        raise UserError(f"{base.path}: retracted ({first.get('reason')}); a retracted run is "
                        "never a baseline" + (f", use {first['superseded_by']}"
                                              if first.get("superseded_by") else ""))
    pairs, only_base, only_new = match_arms(base, new)
    if not pairs:
        raise UserError(f"{new.path}: no arm in common with {base.path} (base arms: "
                        f"{', '.join(a.label for a in base.arms)}; new arms: "
                        f"{', '.join(a.label for a in new.arms)})")
    arms = []
    for b, n, how in pairs:
        verdicts = []
        for m in METRICS:
            if m.name in b.stats and m.name in n.stats:
                verdicts.append(MetricVerdict(m, b.stats[m.name], n.stats[m.name],
                                              verdict(m, b.stats[m.name], n.stats[m.name],
                                                      bands.get(m.name, m.band_pct))))
        arms.append(ArmComparison(b, n, how, tuple(verdicts)))
    return Comparison(base, new, tuple(arms), tuple(only_base), tuple(only_new),
                      tuple(_provenance_warnings(base, new)))


def _spread(stat: Stat) -> str:
    if stat.n == 1:
        return "1 pass"
    return "?" if stat.spread_pct is None else f"{stat.spread_pct:.1f}%"


def config_diff(a: object, b: object, path: str = "") -> list[str]:
    """The dotted paths where two configs differ in a field that changes the measurement."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            if not path and key in NOT_MEASURED:
                continue
            out += config_diff(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if a == b else [path or "(root)"]


def _sha(run: Run) -> str:
    return ", ".join((c["sha"] or "unknown")[:12] + (" (DIRTY tree)" if c["dirty"] else "")
                     for c in run.commits) or "unknown"


def _strike(text: str) -> str:
    """Struck through on a terminal (combining long stroke overlay)."""
    return "".join(ch + "\u0336" for ch in text)


def to_text(c: Comparison) -> str:
    lines = [f"base {c.base.name}  git {_sha(c.base)}  ({c.base.path})",
             f"new  {c.new.name}  git {_sha(c.new)}  ({c.new.path})"]
    for w in c.warnings:
        lines.append(f"WARNING: {w}")
    for a in c.arms:
        label = a.base.label if a.base.label == a.new.label else f"{a.base.label} -> {a.new.label}"
        head = (f"\n{label}  (matched by {a.matched_by}; passes {len(a.base.measured)} -> "
                f"{len(a.new.measured)})")
        if a.retracted:
            which = "base" if a.base.is_retracted else "new"
            lines.append(_strike(head.strip()) + f"  RETRACTED in {which}: not compared")
            continue
        lines.append(head)
        width = max((len(v.metric.header) for v in a.metrics), default=10)
        lines.append(f"  {'metric':<{width}}  {'base':>9} {'spread':>6}  {'new':>9} "
                     f"{'spread':>6}  {'ratio':>7}  verdict")
        for v in a.metrics:
            mark = "  <-- REGRESSION" if v.regressed else ""
            ratio = "-" if v.ratio is None else f"{v.ratio:.3f}"
            lines.append(f"  {v.metric.header:<{width}}  {fmt(v.base.median):>9} "
                         f"{_spread(v.base):>6}  {fmt(v.new.median):>9} {_spread(v.new):>6}  "
                         f"{ratio:>7}  {v.verdict}{mark}")
    lines.append("\nspread: (max - min) / median over passes; '1 pass': no spread to judge by")
    new_by_label = {a.label: a for a in c.only_new}
    for arm in c.only_base:
        twin = new_by_label.get(arm.label)
        why = f": same label, config differs in {', '.join(config_diff(arm.config, twin.config))}" \
            if twin else ""
        lines.append(f"only in base: {arm.label} ({arm.id}){why}")
    for arm in c.only_new:
        lines.append(f"only in new: {arm.label} ({arm.id})")
    n = len(c.regressions)
    lines.append("\n" + (f"{n} regression(s): " + ", ".join(
        f"{a.new.label} {v.metric.name}" for a, v in c.regressions) if n else "no regression"))
    return "\n".join(lines) + "\n"

