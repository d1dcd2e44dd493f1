"""What the sweep verb prints: the plan of a dry run, and the arms while they run.

Both views are consumers of the run's events (``omni_ray.events``), passed to ``run_sweep``:
``LiveView`` redraws a table of slots in a terminal (rich); ``Progress`` prints one line per arm
started and recorded, for a pipe, a CI log or ``ray job submit``. ``terminal_view(stream)``
picks one by whether ``stream`` is a terminal.
"""

from __future__ import annotations

import time

from omni_ray import events


def _fmt_s(s: float) -> str:
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _num(value, spec: str) -> str:
    """A figure, or "n/a" where the arm has none (e.g. a decode-by-difference that was <= 0)."""
    return "n/a" if value is None else format(value, spec)


def monitor_lines(url: str, graphs: dict, moved: str | None) -> list[str]:
    """What --monitor prints: where Prometheus is (and why not on the port asked), a graph
    link per omni-ray metric."""
    lines = [f"Prometheus: {url}" + (f" ({moved})" if moved else "")]
    lines += [f"  {metric}: {link}" for metric, link in graphs.items()]
    return lines


def print_plan(planned, passes, stream) -> None:
    from omni_ray.placement.schedule import bundles, engine_key
    from omni_ray.topology import local_slots

    for sweep, arms, out_dir in planned:
        n_pass = passes or sweep.passes
        starts = len(bundles(arms, lambda arm: engine_key(sweep, arm)))
        print(f"sweep {sweep.name} ({sweep.source}): {len(arms)} arms x {n_pass} passes "
              f"-> {out_dir}; {starts} engine start(s) a pass", file=stream)
        for arm in arms:
            slots = ", ".join(s.name for s in local_slots(arm.slot_cores, sweep.placement.nodes))
            print(f"  {arm.id}  {arm.label:<40} slot_cores={arm.slot_cores or 'node'} "
                  f"on [{slots}]", file=stream)
        if sweep.compare is not None:
            from omni_ray.config.loader import compared_arms

            base, others = compared_arms(sweep.compare, list(arms))
            print(f"  then compare: {len(others)} arm(s) x {sweep.compare.pairs} pairs of "
                  f"turns against {base.id} ({sweep.compare.metric}; docs/compare.md)",
                  file=stream)
    print("dry run: nothing was started", file=stream)



def header(total: int, skipped: int, dashboard_url: str | None) -> list[str]:
    """The lines a run starts with, in either view: the dashboard, and what there is to do."""
    lines = [f"Ray dashboard: http://{dashboard_url.removeprefix('http://')}"] if dashboard_url else []
    return [*lines, f"{total} arm runs to do" + (f", {skipped} already done (resume)"
                                                  if skipped else "")]


def outcome(record: dict) -> str:
    """What a recorded arm pass gave, in either view: its decode (with its regime and share of
    the speed of light, over 100 % with why) and RSS (a pipeline's: its last stage's decode,
    its end-to-end and first-token times; a serving pipeline's: its first load point's
    throughput, TTFT and E2E), or why it failed."""
    if record["status"] != "ok":
        return f"{record['status'].upper()}: {record.get('error')}"
    m = record.get("measurements") or {}
    if record.get("stages") and m.get("serving"):  # a serving pipeline: its first load point
        first = m["serving"][0]
        return (f"{len(m['serving'])} load point(s), the first: "
                f"{_num(first.get('request_throughput'), '.2f')} req/s, pipeline TTFT p50 "
                f"{_num((first.get('ttft_ms') or {}).get('median'), '.0f')} ms, E2E p50 "
                f"{_num((first.get('e2e_ms') or {}).get('median'), '.0f')} ms, "
                f"rss {_num(m.get('rss_anon_tree_mb'), '.0f')} MiB")
    if record.get("stages"):  # a pipeline: its last stage's decode, and the pipeline's own
        return (f"last stage decode {_num(m.get('last_stage_decode_tok_s'), '.1f')} tok/s, "
                f"e2e {_num(m.get('pipeline_e2e_s'), '.2f')} s, first token "
                f"{_num(m.get('last_stage_first_token_s'), '.2f')} s, "
                f"rss {_num(m.get('rss_anon_tree_mb'), '.0f')} MiB "
                f"(bottleneck: stage {_num(m.get('bottleneck_stage'), 'd')})")
    said = [m["decode_regime"]] if m.get("decode_regime") else []
    if m.get("decode_sol_frac") is not None:  # the share of the slot's speed of light
        from omni_ray.measure.speed_of_light import over_reason

        frac, why = m["decode_sol_frac"], ""
        if frac > 1:
            why = " (over 100 %: " + over_reason(m.get("decode_regime"),
                                                 m.get("decode_weight_bytes_per_token"),
                                                 m.get("llc_bytes")) + ")"
        said.append(f"{frac * 100:.0f} % of SoL{why}")
    regime = f" ({', '.join(said)})" if said else ""
    contended = ", CONTENDED" if record.get("contended") else ""
    shared = record.get("shared_engine") or {}
    if shared.get("position"):  # no start of its own: its peak, and whose engine it ran on
        return (f"decode {_num(m.get('decode_tok_s'), '.1f')} tok/s{regime}, "
                f"peak rss {_num(m.get('peak_rss_anon_mb'), '.0f')} MiB, on the engine "
                f"{shared.get('started_by_label')} started{contended}")
    return (f"decode {_num(m.get('decode_tok_s'), '.1f')} tok/s{regime}, "
            f"rss {_num(m.get('rss_anon_tree_mb'), '.0f')} MiB{contended}")


def finish_lines(report) -> list[str]:
    """The lines a run ends with, in either view: where each sweep's results are."""
    lines = [f"{name}: results in {out_dir} (summary.md)"
             for name, out_dir in report.out_dirs.items()]
    return lines + ([f"stopped: {report.refused}"] if report.refused else [])

class Progress:
    """The terminal view: ``progress(event)`` prints what a sweep emits."""

    def __init__(self, stream, enabled: bool = True) -> None:
        self.stream, self.enabled = stream, enabled
        self.total = self.done = self.failed = self.running = 0
        self.t0 = time.monotonic()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __call__(self, event: events.Event) -> None:
        match event:
            case events.Planned(planned, passes):
                print_plan(planned, passes, self.stream)
            case events.Started(total, skipped, dashboard_url):
                self.start(total, skipped, dashboard_url)
            case events.Monitoring(url, graphs, moved):
                for line in monitor_lines(url, graphs, moved):
                    self._say(line)
            case events.ArmStarted(task, slot):
                self.dispatch(task, slot)
            case events.ArmDone(task, record):
                self.record(task, record)
            case events.Note(text):
                self._say(text)
            case events.Finished(report):
                self.finish(report)

    def _say(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def start(self, total: int, skipped: int, dashboard_url: str | None) -> None:
        self.total, self.t0 = total, time.monotonic()
        for line in header(total, skipped, dashboard_url):
            self._say(line)

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
        self.failed += record["status"] != "ok"
        self._say(f"{self._status()} {task.arm.label} pass {task.pass_no}: {outcome(record)}")

    def finish(self, report) -> None:
        for line in finish_lines(report):
            self._say(line)


def terminal_view(stream):
    """The live table when ``stream`` is a terminal, else today's plain lines."""
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        from rich.console import Console

        return LiveView(Console(file=stream))
    return Progress(stream)


class LiveView:
    """A rich live table: one row per slot (arm, pass, phase, RSS now, elapsed, ETA) under a
    line of totals; a finished arm pass is printed above it as the plain view's line."""

    def __init__(self, console, refresh_per_second: float = 2.0) -> None:
        self.console = console
        self.refresh_per_second = refresh_per_second
        self.total = self.done = self.failed = 0
        self.walls: list[float] = []  # wall seconds of the arm passes recorded so far
        self.rows: dict[str, dict] = {}  # slot -> {task, phase, rss_mb, t0}
        self.t0 = time.monotonic()
        self.live = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __call__(self, event: events.Event) -> None:
        match event:
            case events.Planned(planned, passes):
                print_plan(planned, passes, self.console.file)
            case events.Started(total, skipped, dashboard_url):
                self.start(total, skipped, dashboard_url)
            case events.Monitoring(url, graphs, moved):
                for line in monitor_lines(url, graphs, moved):
                    self._say(line)
            case events.ArmStarted(task, slot):
                self.rows[slot] = {"task": task, "phase": "starting", "rss_mb": None,
                                   "t0": time.monotonic()}
                self.refresh()
            case events.ArmProgress(task, slot, phase, rss_mb):
                row = self.rows.get(slot)
                if row is not None and row["task"] is task:
                    row["phase"] = phase
                    row["rss_mb"] = rss_mb if rss_mb is not None else row["rss_mb"]
                    self.refresh()
            case events.ArmDone(task, record):
                self.record(task, record)
            case events.Note(text):
                self._say(text)
            case events.Finished(report):
                self.stop()
                for line in finish_lines(report):
                    self._say(line)

    def _say(self, text: str) -> None:
        """One plain line above the table (no rich markup: labels and errors are data)."""
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def start(self, total: int, skipped: int, dashboard_url: str | None) -> None:
        from rich.live import Live

        self.total, self.t0 = total, time.monotonic()
        for line in header(total, skipped, dashboard_url):
            self._say(line)
        self.live = Live(console=self.console, get_renderable=self.render,
                         refresh_per_second=self.refresh_per_second, transient=True)
        self.live.start()

    def refresh(self) -> None:
        if self.live is not None:
            self.live.refresh()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def _eta(self) -> str:
        if not self.walls:
            return "?"
        mean = sum(self.walls) / len(self.walls)
        slots = max(1, len(self.rows))
        running_left = sum(max(0.0, mean - (time.monotonic() - r["t0"]))
                           for r in self.rows.values())
        queued = max(0, self.total - self.done - len(self.rows))
        return _fmt_s((running_left + queued * mean) / slots)

    def render(self):
        from rich.table import Table
        from rich.text import Text

        el = time.monotonic() - self.t0
        title = (f"{self.done}/{self.total} done, {len(self.rows)} running, {self.failed} "
                 f"failed, {_fmt_s(el)} elapsed, ETA {self._eta()}")
        table = Table(title=title, title_justify="left", expand=False)
        for col, right in (("slot", False), ("arm", False), ("pass", True), ("phase", False),
                           ("RSS MiB", True), ("elapsed", True), ("ETA", True)):
            table.add_column(col, justify="right" if right else "left")
        mean = sum(self.walls) / len(self.walls) if self.walls else None
        for slot in sorted(self.rows):
            row = self.rows[slot]
            arm_el = time.monotonic() - row["t0"]
            # past the mean of the finished ones: no honest figure, say so
            eta = "?" if mean is None or arm_el > mean else _fmt_s(mean - arm_el)
            table.add_row(slot, Text(row["task"].arm.label), str(row["task"].pass_no), row["phase"],
                          _num(row["rss_mb"], ".0f"), _fmt_s(arm_el), eta)
        return table

    def record(self, task, record: dict) -> None:
        self.done += 1
        for slot, row in list(self.rows.items()):
            if row["task"] is task:
                self.walls.append(time.monotonic() - row["t0"])
                del self.rows[slot]
        self.failed += record["status"] != "ok"
        self._say(f"{task.arm.label} pass {task.pass_no}: {outcome(record)}")
        self.refresh()
