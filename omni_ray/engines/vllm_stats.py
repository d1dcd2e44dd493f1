"""vLLM's own figures, read by one stat logger: KV cache use and request counts from its
``SchedulerStats``, tokens from its ``IterationStats``, at every engine step.

Two readers of the one reading: the serving load points keep their peaks (``seen``, reset per
load point; ``vllm_serving``), and ``LiveWindow`` writes the last window's figures as progress
lines (``Session.progress``) for the stage actor's live gauges: the KV tokens in use against
the budget, and in serving mode the prompt and output tokens per second of the window.

vLLM computes these stats only with its stat logging on: always for serving (``AsyncLLM``); for
an offline arm only when the request asks for them (``EngineRequest.live_stats``, a sweep under
``--monitor``), since they cost every decode step a little (see docs/monitor.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

WINDOW_S = 1.0  # at most one progress line a second


class LiveWindow:
    """Counts vLLM's tokens of each step and says, once per ``window_s``, the KV tokens in use
    (vLLM's ``kv_cache_usage`` fraction of the ``budget`` tokens it allocated, set once the
    engine is built) and, with ``rates``, the prompt and output tokens per second of the window
    just ended."""

    def __init__(self, emit: Callable[..., None], *, rates: bool, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.emit, self.budget, self.rates = emit, 0, rates
        self.window_s, self.clock = window_s, clock
        self.t0 = clock()
        self.prompt_tokens = self.output_tokens = 0

    def add(self, kv_usage: float | None, prompt_tokens: int, output_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        now = self.clock()
        seconds = now - self.t0
        if seconds < self.window_s:
            return
        out: dict = {"kv_tokens_budget": self.budget}
        if kv_usage is not None:
            out["kv_tokens_used"] = round(kv_usage * self.budget)
        if self.rates:
            out |= {"prefill_tokens": self.prompt_tokens, "decode_tokens": self.output_tokens,
                    "window_s": seconds, "prefill_tok_s": self.prompt_tokens / seconds,
                    "decode_tok_s": self.output_tokens / seconds}
        self.emit(**out)
        self.t0, self.prompt_tokens, self.output_tokens = now, 0, 0


def new_seen() -> dict:
    """The peaks the stat logger keeps (the serving mode resets them per load point)."""
    return {"kv_cache_usage": 0.0, "running": 0, "waiting": 0, "records": 0}


def stat_logger(seen: dict, live: LiveWindow | None) -> type:
    """A vLLM stat logger class (for ``AsyncLLM(stat_loggers=)`` or ``StatLoggerManager``)
    that keeps the peaks of vLLM's SchedulerStats in ``seen`` and feeds ``live``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class OmniStats(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            usage = None
            if scheduler_stats is not None:
                usage = float(scheduler_stats.kv_cache_usage)
                seen["records"] += 1
                seen["kv_cache_usage"] = max(seen["kv_cache_usage"], usage)
                seen["running"] = max(seen["running"], int(scheduler_stats.num_running_reqs))
                seen["waiting"] = max(seen["waiting"], int(scheduler_stats.num_waiting_reqs))
            if live is not None:
                it = iteration_stats
                live.add(usage, it.num_prompt_tokens if it else 0,
                         it.num_generation_tokens if it else 0)

        def log_engine_initialized(self) -> None:
            pass

    return OmniStats


def watch_offline(llm: Any, live: LiveWindow) -> None:
    """Feed ``live`` from an offline ``vllm.LLM`` built with ``disable_log_stats=False``.

    What it patches: the ``LLMEngine``'s ``logger_manager`` (vLLM 0.32's ``StatLoggerManager``,
    which ``LLMEngine.step`` calls with each step's stats), replaced by one holding this stat
    logger instead of vLLM's log-line logger. Why: ``vllm.LLM`` takes no stat loggers of its
    own. When it can go: when ``vllm.LLM`` passes ``stat_loggers`` on to its ``LLMEngine``.
    """
    from vllm.v1.metrics.loggers import StatLoggerManager

    engine = llm.llm_engine
    if getattr(engine, "logger_manager", None) is None:
        raise RuntimeError("omni-ray: vllm.LLM has no logger_manager (stat logging off, or "
                           "vLLM changed); cannot read KV use live (engines/vllm_stats.py)")
    engine.logger_manager = StatLoggerManager(
        vllm_config=engine.vllm_config, custom_stat_loggers=[stat_logger(new_seen(), live)],
        enable_default_loggers=False)
