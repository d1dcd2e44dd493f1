"""Release memory to the OS after the CPU worker loads and warms up the model.

Patches: ``vllm.v1.worker.cpu_worker.CPUWorker.load_model`` (inherited from the GPU Worker,
keyword-only arguments) and ``CPUWorker.compile_or_warm_up_model``.
Why: weights are read, converted and repacked through temporary tensors; glibc keeps the freed
arenas resident, so the engine's RssAnon stays at its load peak for its whole life.
Fix: call ``malloc_trim(0)`` after each step and log the RssAnon drop (also kept in
``TRIM_EVENTS`` for in-process callers).
Remove when: vLLM trims after load itself, or ships a different allocator (tcmalloc/jemalloc),
where malloc_trim does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import logging

from vllm_omni import events

NAME = "release_memory"
TARGET = "vllm.v1.worker.cpu_worker.CPUWorker.{load_model,compile_or_warm_up_model}"
METHODS = ("load_model", "compile_or_warm_up_model")

logger = logging.getLogger("vllm.omni")


@dataclasses.dataclass(frozen=True)
class TrimEvent:
    step: str
    rss_anon_before_mb: float
    rss_anon_after_mb: float

    @property
    def released_mb(self) -> float:
        return self.rss_anon_before_mb - self.rss_anon_after_mb


TRIM_EVENTS: list[TrimEvent] = []


def rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@functools.cache
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def trim(step: str) -> TrimEvent:
    before = rss_anon_mb()
    _libc().malloc_trim(0)
    event = TrimEvent(step, before, rss_anon_mb())
    TRIM_EVENTS.append(event)
    events.emit("malloc_trim",
                "vllm_omni: malloc_trim after %s: RssAnon %.1f -> %.1f MiB (released %.1f)",
                step, event.rss_anon_before_mb, event.rss_anon_after_mb, event.released_mb,
                step=step, before_mb=round(event.rss_anon_before_mb, 1),
                after_mb=round(event.rss_anon_after_mb, 1),
                released_mb=round(event.released_mb, 1))
    return event


def find_target():
    from vllm.v1.worker.cpu_worker import CPUWorker

    missing = [m for m in METHODS if not callable(getattr(CPUWorker, m, None))]
    if missing:
        raise LookupError(f"CPUWorker has no {', '.join(missing)}")
    if not hasattr(_libc(), "malloc_trim"):
        raise LookupError("the C library has no malloc_trim (not glibc)")
    return CPUWorker


def apply(worker_cls) -> None:
    from vllm_omni.patches import mark

    for method in METHODS:
        original = getattr(worker_cls, method)

        def wrapper(self, *args, __original=original, __step=method, **kwargs):
            result = __original(self, *args, **kwargs)
            trim(__step)
            return result

        setattr(worker_cls, method, functools.wraps(original)(wrapper))
    mark(worker_cls, NAME)
