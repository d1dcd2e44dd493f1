"""What the sweep verb prints: the plan of a dry run, and a live line per arm while it runs."""

from __future__ import annotations

import time


def _fmt_s(s: float) -> str:
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _num(value, spec: str) -> str:
    """A figure, or "n/a" where the arm has none (e.g. a decode-by-difference that was <= 0)."""
    return "n/a" if value is None else format(value, spec)


def print_plan(planned, passes, stream) -> None:
    from omni_ray.placement.cluster import local_slots

    for sweep, arms, out_dir in planned:
        n_pass = passes or sweep.passes
        print(f"sweep {sweep.name} ({sweep.source}): {len(arms)} arms x {n_pass} passes "
              f"-> {out_dir}", file=stream)
        for arm in arms:
            slots = ", ".join(s.name for s in local_slots(arm.slot_cores, sweep.placement.nodes))
            print(f"  {arm.id}  {arm.label:<40} slot_cores={arm.slot_cores or 'node'} "
                  f"on [{slots}]", file=stream)
    print("dry run: nothing was started", file=stream)


class Progress:
    def __init__(self, stream, enabled: bool) -> None:
        self.stream, self.enabled = stream, enabled
        self.total = self.done = self.failed = self.running = 0
        self.t0 = time.monotonic()

    def _say(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def start(self, total: int, skipped: int, dashboard_url: str | None) -> None:
        self.total, self.t0 = total, time.monotonic()
        if dashboard_url:
            self._say(f"Ray dashboard: http://{dashboard_url.removeprefix('http://')}")
        self._say(f"{total} arm runs to do" + (f", {skipped} already done (resume)"
                                                if skipped else ""))

    def _status(self) -> str:
        el = time.monotonic() - self.t0
        eta = "?" if not self.done else _fmt_s(el / self.done * (self.total - self.done))
        return (f"[{self.done}/{self.total} done, {self.running} running, {self.failed} failed,"
                f" {_fmt_s(el)} elapsed, ETA {eta}]")

    def dispatch(self, task, slot: str) -> None:
        self.running += 1
        self._say(f"{self._status()} start {task.arm.label} pass {task.pass_no} on {slot}")

    def record(self, task, record: dict) -> None:
        self.done += 1
        self.running = max(0, self.running - (record.get("slot") is not None))
        m = record.get("measurements") or {}
        if record["status"] == "ok":
            regime = f" ({m['decode_regime']})" if m.get("decode_regime") else ""
            what = (f"decode {_num(m.get('decode_tok_s'), '.1f')} tok/s{regime}, "
                    f"rss {_num(m.get('rss_anon_tree_mb'), '.0f')} MiB")
        else:
            self.failed += 1
            what = f"{record['status'].upper()}: {record.get('error')}"
        self._say(f"{self._status()} {task.arm.label} pass {task.pass_no}: {what}")

    def finish(self, report) -> None:
        for name, out_dir in report.out_dirs.items():
            self._say(f"{name}: results in {out_dir} (summary.md)")
        if report.refused:
            self._say(f"stopped: {report.refused}")
