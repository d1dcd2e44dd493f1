"""A run directory read back: its arm records grouped by arm, in the sweep's matrix order, with
the files that could not be read listed instead of breaking the rest."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omni_ray.errors import UserError
from omni_ray.report.metric import METRICS
from omni_ray.results.record import upgrade
from omni_ray.results.store import read_json
from omni_ray.results.summary import Stat, flags, summarize

# JSON files in a run directory that are not arm records: the sweep's summary, and the
# report's own JSON table (omni-ray report RUN_DIR --format json).
_NOT_RECORDS = ("summary.json", "report.json")
# How the sweep names an arm record: ARMID.pN.json.
RECORD_GLOB = "*.p[0-9]*.json"


@dataclasses.dataclass(frozen=True)
class Skipped:
    path: str
    problem: str


@dataclasses.dataclass(frozen=True)
class ArmResult:
    """One arm of a run: its passes (ok, failed, retracted) and a Stat per metric with values."""

    id: str
    label: str
    index: int
    config_hash: str | None
    config: dict
    ok: tuple[dict, ...]
    failed: tuple[dict, ...]
    retracted: tuple[dict, ...]
    stats: dict[str, Stat]       # metric name -> Stat over the passes in ``measured``
    contended: bool

    @property
    def measured(self) -> tuple[dict, ...]:
        """The ok passes the figures come from: the unretracted ones, or for an arm retracted
        as a whole its retracted ones (shown struck through, never used)."""
        if self.is_retracted:
            return tuple(r for r in self.retracted if r.get("status") == "ok")
        return self.ok

    @property
    def axes(self) -> tuple[tuple[str, str], ...]:
        return parse_label(self.label)

    @property
    def is_retracted(self) -> bool:
        """Every pass of the arm is retracted: it shows struck through and is never a base."""
        return bool(self.retracted) and not self.ok and not self.failed

    @property
    def retraction(self) -> dict | None:
        if not self.retracted:
            return None
        r = self.retracted[0]
        return {"on": r.get("retracted_on"), "reason": r.get("reason"),
                "superseded_by": r.get("superseded_by")}

    def flags(self, noise_pct: float) -> list[str]:
        out = []
        if self.failed:
            out.append(f"FAILED {len(self.failed)}/{len(self.failed) + len(self.ok)}")
        if self.contended:
            out.append("CONTENDED")
        ns = {s.n for s in self.stats.values()}
        if ns == {1}:
            out.append("SINGLE PASS")
        noisy = [m.title for m in METRICS
                 if m.name in self.stats and "NOISY" in flags(self.stats[m.name],
                                                             noise_pct=noise_pct)]
        if noisy:
            out.append("NOISY: " + ", ".join(noisy))
        if self.is_retracted:
            out.append("RETRACTED")
        elif self.retracted:
            out.append(f"RETRACTED {len(self.retracted)} pass(es)")
        return out


@dataclasses.dataclass(frozen=True)
class Run:
    path: Path
    sweep: str
    run_id: str
    arms: tuple[ArmResult, ...]      # matrix order
    skipped: tuple[Skipped, ...]
    noise_pct: float = 8.0
    baseline: str | None = None      # the sweep's baseline: an arm label or axis=value pairs
    baselines: dict = dataclasses.field(default_factory=dict)  # arm label -> its baseline's

    @property
    def name(self) -> str:
        return f"{self.sweep}/{self.run_id}"

    @property
    def records(self) -> list[dict]:
        return [r for a in self.arms for r in (*a.ok, *a.failed, *a.retracted)]

    @property
    def is_retracted(self) -> bool:
        return all(a.is_retracted for a in self.arms)

    @property
    def provenance(self) -> dict:
        for rec in self.records:
            if isinstance(rec.get("provenance"), dict):
                return rec["provenance"]
        return {}

    @property
    def git(self) -> dict:
        return self.provenance.get("git") or {}

    @property
    def commits(self) -> list[dict]:
        """Every distinct {"sha", "dirty"} the records were measured at (a resumed run can span
        commits), in record order."""
        out: list[dict] = []
        for rec in self.records:
            g = (rec.get("provenance") or {}).get("git") if isinstance(rec.get("provenance"),
                                                                      dict) else None
            if isinstance(g, dict):
                key = {"sha": g.get("sha"), "dirty": bool(g.get("dirty"))}
                if key not in out:
                    out.append(key)
        return out

    @property
    def cpu(self) -> dict:
        return self.provenance.get("cpu") or {}

    @property
    def axis_names(self) -> list[str]:
        names: list[str] = []
        for arm in self.arms:
            for key, _v in arm.axes:
                if key not in names:
                    names.append(key)
        return names

    def axis_groups(self) -> list[tuple[str, ...]]:
        """The axes worth a chart: keys that take one value in every arm are left out, and keys
        that always change together (a zip group, or a matrix seen only partly) are one axis."""
        groups: list[tuple[str, ...]] = []
        partitions: dict[tuple[str, ...], frozenset] = {}
        for key in self.axis_names:
            by_value: dict[str, set[int]] = {}
            for i, arm in enumerate(self.arms):
                by_value.setdefault(dict(arm.axes).get(key, "\0"), set()).add(i)
            if len(by_value) < 2:
                continue
            part = frozenset(frozenset(v) for v in by_value.values())
            twin = next((g for g, p in partitions.items() if p == part), None)
            if twin is None:
                groups.append((key,))
                partitions[(key,)] = part
            else:
                merged = twin + (key,)
                groups[groups.index(twin)] = merged
                partitions[merged] = partitions.pop(twin)
        return groups

    def metrics(self) -> list:
        """The metrics that at least one arm has a value for, in table order."""
        return [m for m in METRICS if any(m.name in a.stats for a in self.arms)]

    def arm(self, key: str) -> ArmResult:
        for a in self.arms:
            if key in (a.id, a.label):
                return a
        raise UserError(f"{self.path}: no arm {key!r} (arms: "
                        f"{', '.join(a.label for a in self.arms)})")


def parse_label(label: str) -> tuple[tuple[str, str], ...]:
    """"kv_cache_mib=64,batch=1" -> (("kv_cache_mib", "64"), ("batch", "1")); "base" -> ()."""
    if not label or label == "base":
        return ()
    out = []
    for part in label.split(","):
        key, sep, value = part.partition("=")
        out.append((key, value) if sep else (part, ""))
    return tuple(out)


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def read_record(path: Path) -> dict:
    """One arm record, upgraded; a file that is not one is a one-line UserError naming it."""
    rec = upgrade(read_json(path), source=str(path))
    arm = rec.get("arm")
    if not isinstance(arm, dict) or not arm.get("id"):
        raise UserError(f"{path}: not a sweep arm record (no arm.id; kind "
                        f"{rec.get('kind')!r})")
    return rec


def record_files(path: Path, pattern: str = "*.json") -> list[Path]:
    """The JSON files of a run directory that should be records (``pattern``: RECORD_GLOB for
    the sweep's own names only), sorted; hidden files and the summary/report are left out."""
    return sorted(p for p in path.glob(pattern)
                  if p.name not in _NOT_RECORDS and not p.name.startswith("."))


def load_run(path: str | Path) -> Run:
    """Read every record of the run directory ``path`` (or one record file).

    Unreadable or foreign files are listed in ``skipped``; no readable record at all is a
    UserError naming the directory and the first problem."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = record_files(path)
    else:
        raise UserError(f"{path}: no such run directory")
    records: list[tuple[Path, dict]] = []
    skipped: list[Skipped] = []
    for f in files:
        try:
            records.append((f, read_record(f)))
        except UserError as e:
            if path.is_file():
                raise
            skipped.append(Skipped(str(f), str(e).removeprefix(f"{f}: ")))
    if not records:
        why = f"; skipped {len(skipped)}, first: {skipped[0].path}: {skipped[0].problem}" \
            if skipped else ""
        below = "" if files or not any(path.rglob(RECORD_GLOB)) else (
            "; it holds runs below it: give a run directory (SWEEP/RUN_ID), or --index")
        raise UserError(f"{path}: no result records (*.pN.json arm records){why}{below}")
    return _assemble(path, records, skipped)


def _assemble(path: Path, records: list[tuple[Path, dict]], skipped: list[Skipped]) -> Run:
    by_arm: dict[str, list[dict]] = {}
    for _f, rec in records:
        by_arm.setdefault(str(rec["arm"]["id"]), []).append(rec)
    arms = []
    for arm_id, recs in by_arm.items():
        recs.sort(key=lambda r: r.get("pass") or 0)
        first = recs[0]
        arm = first["arm"]
        config = first.get("config") if isinstance(first.get("config"), dict) else {}
        ok = tuple(r for r in recs if not r.get("retracted") and r.get("status") == "ok")
        failed = tuple(r for r in recs if not r.get("retracted") and r.get("status") != "ok")
        retracted = tuple(r for r in recs if r.get("retracted"))
        # an arm retracted as a whole keeps its figures (struck through); else only ok passes
        measured = ok if (ok or failed) else tuple(r for r in retracted
                                                   if r.get("status") == "ok")
        stats = {}
        for m in METRICS:
            vals = [v for r in measured
                    if (v := _number((r.get("measurements") or {}).get(m.name))) is not None]
            if vals:
                stats[m.name] = summarize(vals)
        contended = any(r.get("contended") or (isinstance(r.get("preflight"), dict)
                                               and r["preflight"].get("ok") is False)
                        for r in ok)
        index = arm.get("index", config.get("index"))
        arms.append(ArmResult(
            id=arm_id, label=str(arm.get("label") or config.get("label") or arm_id),
            index=index if isinstance(index, int) else 10**9, config_hash=first.get("config_hash"),
            config=config, ok=ok, failed=failed, retracted=retracted, stats=stats,
            contended=contended))
    arms.sort(key=lambda a: (a.index, a.label))
    first = records[0][1]
    sweep = str(first["arm"].get("sweep") or first.get("config", {}).get("sweep")
                or path.parent.name)
    run_id = str(first.get("run_id") or (path.name if path.is_dir() else path.parent.name))
    noise, baseline, bases = _from_summary(path)
    return Run(path=path, sweep=sweep, run_id=run_id, arms=tuple(arms), skipped=tuple(skipped),
               noise_pct=noise, baseline=baseline, baselines=bases)


def _from_summary(path: Path) -> tuple[float, str | None, dict]:
    """The sweep's noise threshold (8 % without one), its baseline (None) and each arm's
    baseline arm label ({}: a summary from before per-arm baselines names one arm for all),
    from the summary.json the sweep wrote beside its records."""
    summary = (path if path.is_dir() else path.parent) / "summary.json"
    try:
        data = read_json(summary)
    except UserError:
        return 8.0, None, {}
    if not isinstance(data, dict):
        return 8.0, None, {}
    noise = data.get("noise_pct")
    baseline = data.get("baseline")
    bases = data.get("baselines")
    return (float(noise) if _number(noise) is not None else 8.0,
            baseline if isinstance(baseline, str) and baseline else None,
            {str(k): str(v) for k, v in bases.items()} if isinstance(bases, dict) else {})
