"""Process-tree memory sampler: RssAnon/RssFile summed over a root process and all descendants.

vLLM's CPU engine runs its EngineCore (and workers) as child processes, so reading the memory of
one PID misses most of it. ``TreeSampler`` is a daemon thread that every ``interval_s`` reads
``RssAnon`` and ``RssFile`` from ``/proc/PID/status`` for every process in the tree, and finds the
tree again every ``rescan_s`` (a child born between rescans is seen from the next rescan on).
Processes that exit between a rescan and a read are skipped, not errors.

Units: MiB (kB from /proc divided by 1024). Times: ``time.monotonic()``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple

_PROC = "/proc"
_KB_PER_MIB = 1024.0


class Sample(NamedTuple):
    t: float  # time.monotonic()
    rss_anon_mb: float
    rss_file_mb: float
    n_procs: int


def _status_kb(pid: int, keys: tuple[str, ...]) -> dict[str, int] | None:
    """The given kB fields of /proc/PID/status (0 when absent, e.g. kernel threads, zombies);
    None when the process is gone or unreadable."""
    try:
        with open(f"{_PROC}/{pid}/status", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out = dict.fromkeys(keys, 0)
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in out:
            out[name] = int(rest.split()[0])
    return out


def _children_from_task_files(pid: int) -> list[int] | None:
    """Direct children of ``pid`` from /proc/PID/task/*/children; None if the kernel has no such
    files (CONFIG_PROC_CHILDREN) or they cannot be read."""
    try:
        tids = os.listdir(f"{_PROC}/{pid}/task")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []  # gone
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"{_PROC}/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            if not os.path.exists(f"{_PROC}/{pid}/task/{tid}"):
                continue  # the thread ended
            return None  # the file does not exist on this kernel
        except PermissionError:
            return None
    return kids


def _ppid_map() -> dict[int, list[int]]:
    """parent pid -> child pids, from the 4th field of every /proc/PID/stat."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir(_PROC):
        if not name.isdigit():
            continue
        try:
            with open(f"{_PROC}/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        # comm (field 2) may contain spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) >= 2:
            parents.setdefault(int(fields[1]), []).append(int(name))
    return parents


def tree_pids(root_pid: int) -> list[int]:
    """``root_pid`` and all its live descendants, root first; [] if the root is gone."""
    if not os.path.exists(f"{_PROC}/{root_pid}"):
        return []
    out, queue, seen = [], [root_pid], {root_pid}
    ppid_map: dict[int, list[int]] | None = None
    while queue:
        pid = queue.pop(0)
        out.append(pid)
        kids = None if ppid_map is not None else _children_from_task_files(pid)
        if kids is None:
            if ppid_map is None:
                ppid_map = _ppid_map()
            kids = ppid_map.get(pid, [])
        for kid in kids:
            if kid not in seen:
                seen.add(kid)
                queue.append(kid)
    return out


def _sum_rss(pids: Iterable[int]) -> tuple[float, float, list[int]]:
    anon = file = 0
    alive: list[int] = []
    for pid in pids:
        kb = _status_kb(pid, ("RssAnon", "RssFile"))
        if kb is None:
            continue
        anon += kb["RssAnon"]
        file += kb["RssFile"]
        alive.append(pid)
    return anon / _KB_PER_MIB, file / _KB_PER_MIB, alive


def tree_rss(root_pid: int) -> tuple[float, float, list[int]]:
    """One reading: (RssAnon MiB, RssFile MiB, live pids) summed over the tree at ``root_pid``."""
    return _sum_rss(tree_pids(root_pid))


def self_rss_anon_mb(pid: int) -> float:
    """RssAnon of one process (not its children) in MiB; ProcessLookupError if it is gone."""
    kb = _status_kb(pid, ("RssAnon",))
    if kb is None:
        raise ProcessLookupError(f"process {pid} is gone: no /proc/{pid}/status")
    return kb["RssAnon"] / _KB_PER_MIB


class TreeSampler:
    """Samples the RSS of the process tree at ``root_pid`` on a daemon thread.

    ``with TreeSampler(pid) as s: ...; s.mark("loaded"); ...`` then ``s.peak_anon_mb()``,
    ``s.peak_anon_mb("start", "loaded")``, ``s.to_dict()``. ``start()`` and ``stop()`` each take a
    reading synchronously, and so does ``mark()``, so a phase shorter than the interval still has
    a sample at each end.
    """

    def __init__(self, root_pid: int, interval_s: float = 0.02, rescan_s: float = 0.5) -> None:
        if interval_s <= 0 or rescan_s <= 0:
            raise ValueError(f"interval_s and rescan_s must be > 0, got {interval_s}, {rescan_s}")
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.rescan_s = rescan_s
        self.samples: list[Sample] = []
        self.marks: dict[str, float] = {}
        self.pids_seen: set[int] = set()
        self.error: BaseException | None = None
        self._pids: list[int] = []
        self._last_scan = float("-inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0: float | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "TreeSampler":
        if self._thread is not None:
            raise RuntimeError("TreeSampler already started")
        self._t0 = time.monotonic()
        self.mark("start")
        self._thread = threading.Thread(
            target=self._run, name=f"TreeSampler-{self.root_pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> "TreeSampler":
        """Stop the thread and take a last reading. Re-raises an error the thread hit."""
        if self._thread is None:
            return self
        self._stop.set()
        self._thread.join()
        if self.error is None:
            self.mark("stop")
        if self.error is not None:
            raise RuntimeError(f"TreeSampler({self.root_pid}) failed: {self.error!r}") \
                from self.error
        return self

    def __enter__(self) -> "TreeSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        next_t = time.monotonic()
        try:
            while not self._stop.is_set():
                self._sample_once()
                next_t += self.interval_s
                now = time.monotonic()
                if next_t < now:  # fell behind (slow /proc read, busy host): do not burst
                    next_t = now
                self._stop.wait(next_t - now)
        except BaseException as e:  # noqa: BLE001 - kept and re-raised by stop()
            self.error = e

    def _sample_once(self) -> Sample:
        now = time.monotonic()
        with self._lock:
            if now - self._last_scan >= self.rescan_s:
                self._pids = tree_pids(self.root_pid)
                self._last_scan = now
            pids = self._pids
        anon, file, alive = _sum_rss(pids)
        with self._lock:  # time taken under the lock so samples stay in time order
            sample = Sample(time.monotonic(), anon, file, len(alive))
            self.pids_seen.update(alive)
            if len(alive) != len(pids):
                self._pids = alive
            self.samples.append(sample)
        return sample

    # -- marks and readings ----------------------------------------------------------------
    def mark(self, label: str) -> float:
        """Record a named time point (and take a reading there); returns its monotonic time.
        A label marked again moves to the new time."""
        t = self._sample_once().t  # the reading belongs to the windows on both sides
        with self._lock:
            self.marks[label] = t
        return t

    def _window(self, start_label: str | None, end_label: str | None) -> list[Sample]:
        for label in (start_label, end_label):
            if label is not None and label not in self.marks:
                raise KeyError(f"no mark {label!r}; marks are {sorted(self.marks)}")
        lo = self.marks[start_label] if start_label is not None else float("-inf")
        hi = self.marks[end_label] if end_label is not None else float("inf")
        with self._lock:
            return [s for s in self.samples if lo <= s.t <= hi]

    def peak_anon_mb(self, start_label: str | None = None,
                     end_label: str | None = None) -> float | None:
        """Highest tree RssAnon (MiB) between two marks (inclusive; None = open end);
        None if no sample falls in the window."""
        window = self._window(start_label, end_label)
        return max(s.rss_anon_mb for s in window) if window else None

    def last_anon_mb(self) -> float | None:
        with self._lock:
            return self.samples[-1].rss_anon_mb if self.samples else None

    def settled_anon_mb(self, window_s: float = 0.3) -> float | None:
        """Median tree RssAnon over the last ``window_s`` seconds of samples (ignores a
        momentary spike or dip at the end)."""
        with self._lock:
            if not self.samples:
                return None
            t_end = self.samples[-1].t
            recent = [s.rss_anon_mb for s in self.samples if s.t >= t_end - window_s]
        return statistics.median(recent)

    def to_dict(self, max_samples: int = 2000) -> dict:
        """JSON-ready: unit, interval, peak, marks and samples (t relative to start).

        Beyond ``max_samples`` the samples are downsampled by keeping the highest-RssAnon sample
        of each consecutive bucket, so the recorded series still contains the peak."""
        with self._lock:
            samples = list(self.samples)
            marks = dict(self.marks)
            pids_seen = sorted(self.pids_seen)
        t0 = self._t0 if self._t0 is not None else (samples[0].t if samples else 0.0)
        kept = _downsample(samples, max_samples)
        return {
            "unit": "MiB",
            "source": "/proc/PID/status RssAnon, RssFile summed over the process tree",
            "root_pid": self.root_pid,
            "interval_s": self.interval_s,
            "rescan_s": self.rescan_s,
            "n_samples": len(samples),
            "peak_anon_mb": _r(max((s.rss_anon_mb for s in samples), default=None)),
            "peak_file_mb": _r(max((s.rss_file_mb for s in samples), default=None)),
            "last_anon_mb": _r(samples[-1].rss_anon_mb if samples else None),
            "max_procs": max((s.n_procs for s in samples), default=0),
            "pids_seen": pids_seen,
            "marks": {k: round(v - t0, 4) for k, v in sorted(marks.items(), key=lambda kv: kv[1])},
            "columns": ["t_s", "rss_anon_mb", "rss_file_mb", "n_procs"],
            "samples": [[round(s.t - t0, 4), _r(s.rss_anon_mb), _r(s.rss_file_mb), s.n_procs]
                        for s in kept],
            "downsampled": len(kept) < len(samples),
            "error": repr(self.error) if self.error is not None else None,
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _downsample(samples: list[Sample], max_samples: int) -> list[Sample]:
    if max_samples <= 0:
        return []
    if len(samples) <= max_samples:
        return samples
    n = len(samples)
    out = []
    for i in range(max_samples):
        bucket = samples[i * n // max_samples:(i + 1) * n // max_samples]
        if bucket:
            out.append(max(bucket, key=lambda s: s.rss_anon_mb))
    return out
