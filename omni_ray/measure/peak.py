"""The peak RSS of this process over one step: ``VmHWM`` of /proc/self/status, reset per step.

Writing ``5`` to /proc/self/clear_refs resets the high-water mark to the current RSS (Linux
4.0+), so each step's peak is its own and not the peak of an earlier step. Where the reset is
not allowed the figure is the process's peak so far, and ``reset`` says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator


def _status_bytes(field: str, status: str | None = None, pid: int | str = "self") -> int | None:
    """A kB field of /proc/PID/status in bytes; None when the process is gone (or a zombie,
    which has no memory fields) or the file cannot be read."""
    if status is None:
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            return None
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def rss_bytes() -> int | None:
    return _status_bytes("VmRSS")


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """VmHWM: the high-water mark of the process's RSS (this one's by default)."""
    return _status_bytes("VmHWM", pid=pid)


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclasses.dataclass
class StepPeak:
    start_rss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    reset: bool = False  # False: the peak may be an earlier step's

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def step_peak() -> Iterator[StepPeak]:
    """``with step_peak() as p: ...``; afterwards ``p.peak_rss_bytes`` is the step's peak."""
    p = StepPeak(reset=reset_peak(), start_rss_bytes=rss_bytes())
    try:
        yield p
    finally:
        p.peak_rss_bytes = peak_rss_bytes()
