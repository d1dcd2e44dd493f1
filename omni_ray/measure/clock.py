"""Wall-clock timing with ``time.perf_counter``: a stopwatch and a ``timed()`` context manager."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    """Elapsed seconds since ``start()``; ``stop()`` freezes the reading.

    ``elapsed`` reads the running time while going and the final time once stopped.
    """

    def __init__(self) -> None:
        self._start: float | None = None
        self._end: float | None = None

    def start(self) -> "Stopwatch":
        self._start, self._end = time.perf_counter(), None
        return self

    def stop(self) -> float:
        if self._start is None:
            raise RuntimeError("Stopwatch.stop() called before start()")
        self._end = time.perf_counter()
        return self.elapsed

    @property
    def running(self) -> bool:
        return self._start is not None and self._end is None

    @property
    def elapsed(self) -> float:
        """Seconds: 0.0 before start, running time while going, final time once stopped."""
        if self._start is None:
            return 0.0
        end = self._end if self._end is not None else time.perf_counter()
        return end - self._start

    def __enter__(self) -> "Stopwatch":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def timed() -> Iterator[Stopwatch]:
    """``with timed() as t: ...`` then ``t.elapsed`` is the block's duration in seconds."""
    sw = Stopwatch().start()
    try:
        yield sw
    finally:
        sw.stop()
