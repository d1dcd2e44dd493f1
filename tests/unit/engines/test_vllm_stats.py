"""The live window over vLLM's per-step stats (no engine runs here: the steps are given)."""

import types

import pytest

from omni_ray.engines import window_rates
from omni_ray.engines.vllm_stats import LiveWindow, new_seen, stat_logger


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _window(rates: bool, budget: int) -> tuple[LiveWindow, list, Clock]:
    """A live window of 1 s on a clock the test moves, and the lines it says."""
    lines, clock = [], Clock()
    live = LiveWindow(lambda **f: lines.append(f), rates=rates, window_s=1.0, clock=clock)
    live.budget = budget
    return live, lines, clock


def test_a_line_a_window_with_the_kv_in_use_and_the_windows_token_rates():
    live, lines, clock = _window(True, 4096)
    clock.t += 0.4
    live.add(0.01, prompt_tokens=64, output_tokens=0)
    assert lines == []  # the window is not over
    clock.t += 0.6
    live.add(0.02, prompt_tokens=0, output_tokens=30)
    clock.t += 0.5
    live.add(0.03, prompt_tokens=0, output_tokens=10)
    clock.t += 1.5
    live.add(0.04, prompt_tokens=0, output_tokens=20)
    assert lines == [
        {"kv_tokens_budget": 4096, "kv_tokens_used": 82, "prefill_tokens": 64,
         "decode_tokens": 30, "window_s": 1.0, "prefill_tok_s": 64.0, "decode_tok_s": 30.0},
        {"kv_tokens_budget": 4096, "kv_tokens_used": 164, "prefill_tokens": 0,
         "decode_tokens": 30, "window_s": 2.0, "prefill_tok_s": 0.0, "decode_tok_s": 15.0}]


def test_offline_the_window_says_the_kv_only():
    live, lines, clock = _window(False, 1000)
    clock.t += 2
    live.add(0.5, prompt_tokens=16, output_tokens=1)
    assert lines == [{"kv_tokens_budget": 1000, "kv_tokens_used": 500}]


def test_one_stat_logger_keeps_the_peaks_and_feeds_the_live_window():
    pytest.importorskip("vllm")
    live, lines, clock = _window(True, 100)
    seen = new_seen()
    logger = stat_logger(seen, live)(vllm_config=None)
    sched = types.SimpleNamespace(kv_cache_usage=0.25, num_running_reqs=2, num_waiting_reqs=1)
    it = types.SimpleNamespace(num_prompt_tokens=8, num_generation_tokens=2)
    logger.record(sched, it)
    clock.t += 1
    logger.record(types.SimpleNamespace(kv_cache_usage=0.1, num_running_reqs=1,
                                        num_waiting_reqs=0), None)
    assert seen == {"kv_cache_usage": 0.25, "running": 2, "waiting": 1, "records": 2}
    assert lines[0]["kv_tokens_used"] == 10 and lines[0]["decode_tok_s"] == 2.0


def test_a_window_by_the_arms_rule_and_no_decode_figure_when_n_is_not_slower():
    w = window_rates(batch=2, prompt_len=16, output_len=5, t_one=0.5, t_n=1.3)
    assert w["prefill_tok_s"] == 64.0 and w["decode_tokens"] == 8
    assert w["decode_tok_s"] == pytest.approx(8 / 0.8)
    assert "decode_tok_s" not in window_rates(batch=1, prompt_len=8, output_len=4, t_one=0.5,
                                              t_n=0.4)
