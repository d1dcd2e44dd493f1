"""A progress line for long builds: a bar redrawn in place on a terminal, plain lines elsewhere.

On a TTY the line is redrawn with ``\\r`` as bytes go by; on a pipe or a log file one line is
printed at each tenth of the work, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30


class Progress:
    def __init__(self, label: str, total: int, stream: TextIO | None = None,
                 tty: bool | None = None) -> None:
        self.label, self.total, self.done = label, max(1, total), 0
        self.stream = sys.stderr if stream is None else stream
        self.tty = _isatty(self.stream) if tty is None else tty
        self._t0 = time.monotonic()
        self._next_tenth = 1
        self._last_draw = 0.0

    def advance(self, n: int) -> None:
        self.done = min(self.total, self.done + n)
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw >= 0.2 or self.done == self.total:
                self._last_draw = now
                self.stream.write("\r" + self._line())
                self.stream.flush()
            return
        while self._next_tenth <= 10 and self.done * 10 >= self._next_tenth * self.total:
            self._next_tenth += 1
            print(self._line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _line(self) -> str:
        frac = self.done / self.total
        bar = "#" * int(frac * _WIDTH)
        unit, scale = ("GB", 1e9) if self.total >= 1e9 else ("MB", 1e6)
        return (f"{self.label} [{bar:<{_WIDTH}}] {frac:4.0%} {self.done / scale:.2f}/"
                f"{self.total / scale:.2f} {unit} {time.monotonic() - self._t0:.0f}s")


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
