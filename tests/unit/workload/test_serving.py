"""The pure parts of serving: arrivals, lengths, percentiles, the load generator, goodput."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import statistics

import pytest

from omni_ray.workload import serving as sv


def test_infinite_rate_sends_everything_at_once():
    assert sv.arrival_offsets(5, math.inf, 1.0, seed=0) == [0.0] * 5


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_arrivals_have_the_rate_asked_for(burstiness):
    offsets = sv.arrival_offsets(20_000, 8.0, burstiness, seed=1)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / 8, rel=0.03)
    # gamma(shape k, mean m): variance m^2 / k; lower burstiness = burstier
    assert statistics.pvariance(gaps) == pytest.approx((1 / 8) ** 2 / burstiness, rel=0.1)


def test_arrivals_repeat_with_the_seed():
    assert sv.arrival_offsets(10, 2.0, 1.0, seed=3) == sv.arrival_offsets(10, 2.0, 1.0, seed=3)
    assert sv.arrival_offsets(10, 2.0, 1.0, seed=3) != sv.arrival_offsets(10, 2.0, 1.0, seed=4)


@pytest.mark.parametrize("rate", [0, -1.0, math.nan])
def test_arrivals_refuse_a_rate_that_is_not_positive(rate):
    with pytest.raises(ValueError, match="rate > 0"):
        sv.arrival_offsets(3, rate, 1.0, seed=0)


def test_lengths_fixed_and_uniform():
    rng = random.Random(0)
    assert sv.lengths(4, 7, None, rng) == [7] * 4
    drawn = sv.lengths(2000, 10, 20, rng)
    assert min(drawn) == 10 and max(drawn) == 20
    assert statistics.fmean(drawn) == pytest.approx(15, abs=0.5)


def test_percentile_interpolates_as_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert sv.percentile(xs, 50) == 2.5
    assert sv.percentile(xs, 90) == pytest.approx(3.7)
    assert sv.percentile([5.0], 99) == 5.0
    assert sv.percentile([], 50) is None


def _timing(sent, chunks, tokens, error=None):
    return sv.RequestTiming(prompt_len=8, output_len=tokens, sent=sent, chunks=chunks,
                            tokens=tokens, error=error)


def test_request_figures():
    r = _timing(1.0, [1.1, 1.15, 1.3], 3)
    assert r.ttft_ms == pytest.approx(100)
    assert r.e2e_ms == pytest.approx(300)
    assert r.tpot_ms == pytest.approx(100)  # 200 ms over 2 tokens after the first
    assert r.itl_ms == pytest.approx([50, 150])


def test_goodput_counts_requests_meeting_every_slo():
    rs = [_timing(0, [0.1, 0.2], 2), _timing(0, [0.6, 0.7], 2), _timing(0, [0.1, 0.9], 2),
          _timing(0, [], 0, error="boom")]
    figs = sv.figures(rs, 2.0, percentiles=(90,), slo={"ttft_ms": 500, "tpot_ms": 500})
    assert (figs["completed"], figs["failed"], figs["good_requests"]) == (3, 1, 1)
    assert figs["goodput"] == 0.5 and figs["request_throughput"] == 1.5
    assert figs["output_throughput"] == 3.0
    assert figs["ttft_ms"]["median"] == pytest.approx(100)
    assert set(figs["e2e_ms"]) == {"mean", "median", "p90"}
    assert "goodput" not in sv.figures(rs, 2.0, percentiles=(90,), slo={})


def test_drive_sends_on_schedule_and_limits_concurrency():
    in_flight, peak = 0, 0

    def submit(i, planned):
        async def stream():
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            for _ in range(planned.output_len):
                await asyncio.sleep(0.01)
                yield 1
            in_flight -= 1
        return stream()

    plan = [sv.Planned([1, 2, 3], 3) for _ in range(6)]
    timings, duration = asyncio.run(
        sv.drive(submit, plan, [0.0] * 6, max_concurrency=2))
    assert peak == 2
    assert [t.tokens for t in timings] == [3] * 6 and all(len(t.chunks) == 3 for t in timings)
    assert duration >= 3 * 0.03 * 0.9  # three waves of two
    samples = sv.samples(timings)
    assert len(samples["ttft_ms"]) == 6 and samples["error"] is None
    assert all(len(row) == 2 for row in samples["itl_ms"])


def test_drive_records_a_failed_request_and_goes_on():
    def submit(i, planned):
        async def stream():
            if i == 1:
                raise RuntimeError("engine said no")
            yield 1
        return stream()

    timings, _ = asyncio.run(sv.drive(submit, [sv.Planned([1], 2)] * 3, [0.0, 0.0, 0.0]))
    assert [t.error for t in timings] == [None, "RuntimeError: engine said no", None]


def test_drive_takes_the_time_an_output_was_produced_elsewhere():
    # a pipeline's stage 0 yields the last stage's outputs with the time that stage had them
    def submit(i, planned):
        async def stream():
            yield 1, 100.5 + i
            yield 2, 100.75 + i
        return stream()

    timings, duration = asyncio.run(sv.drive(submit, [sv.Planned([1], 3)] * 2, [0.0, 0.0],
                                             clock=lambda: 100.0))
    first, second = timings
    assert (first.sent, first.chunks, first.tokens) == (100.0, [100.5, 100.75], 3)
    assert second.chunks == [101.5, 101.75] and second.ttft_ms == pytest.approx(1500.0)
    assert first.tpot_ms == pytest.approx(125.0)  # (last - first) / (3 - 1) tokens
    assert duration == pytest.approx(1.75)


def test_prompt_file_skips_blanks_and_comments(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("# c\n\nhello there\n  second  \n")
    assert sv.read_prompt_file(str(p)) == ["hello there", "second"]


def test_meets_slo_at_the_percentile():
    fast = [_timing(0, [0.05, 0.06], 2) for _ in range(9)]
    slow = [_timing(0, [0.9, 0.91], 2)]
    assert sv.meets_slo(fast + slow, {"ttft_ms": 100}, 50)
    assert not sv.meets_slo(fast + slow, {"ttft_ms": 100}, 99)
    assert not sv.meets_slo(fast + [_timing(0, [], 0, error="x")], {"ttft_ms": 100}, 50)


@pytest.mark.parametrize("capacity", [0.7, 3.3, 20.0, 63.0])
def test_bisection_brackets_the_capacity(capacity):
    out = sv.bisect_load(lambda rate: rate <= capacity, 0.5, 64.0, steps=8)
    met, failed = out["bracket"]
    assert met <= capacity < failed and failed / met < 1.05
    assert out["capacity"] == met
    assert len(out["probes"]) == 2 + 8
    assert [p["meets_slo"] for p in out["probes"][:2]] == [True, False]


def test_bisection_ends_early_outside_the_range():
    assert sv.bisect_load(lambda r: False, 1, 8, 5) == {
        "capacity": None, "bracket": [None, 1], "probes": [{"request_rate": 1, "meets_slo": False}]}
    assert sv.bisect_load(lambda r: True, 1, 8, 5)["capacity"] == 8


class FakeClock:
    """Time that passes only when a fake engine streams a token (one unit each)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _engine(clock, log):
    """A fake engine: each output token takes one unit of ``clock``; ``log`` gets
    ("start"|"end", index) in the order they happen."""
    def submit(i, planned):
        async def stream():
            log.append(("start", i))
            for _ in range(planned.output_len):
                await asyncio.sleep(0)
                clock.now += 1.0
                yield 1
            log.append(("end", i))
        return stream()
    return submit


def _in_flight_peak(log):
    now = peak = 0
    for kind, _ in log:
        now += 1 if kind == "start" else -1
        peak = max(peak, now)
    return peak


def test_closed_loop_users_send_when_their_reply_came():
    clock, log = FakeClock(), []
    timings, _ = asyncio.run(sv.drive(_engine(clock, log), lambda i: sv.Planned([1, 2], 3),
                                      users=3, num_requests=10, clock=clock))
    assert len(timings) == 10 and all(t.tokens == 3 and not t.error for t in timings)
    assert _in_flight_peak(log) == 3
    # the first three start at once; every later request starts right after a reply (its
    # user's: no think time), never while three are in flight
    assert [k for k, _ in log[:3]] == ["start"] * 3
    later = log[3:]
    for j, (kind, _) in enumerate(later):
        if kind == "start":
            assert later[j - 1][0] == "end", log


def test_closed_loop_think_time_leaves_a_gap():
    log = []
    timings, _ = asyncio.run(sv.drive(_engine(FakeClock(), log),
                                      lambda i: sv.Planned([1], 2), users=1, num_requests=3,
                                      think_time_s=0.01))
    # one user: strictly one request at a time, each sent after the last one's end
    assert [k for k, _ in log] == ["start", "end"] * 3
    assert all(b.sent >= a.chunks[-1] + 0.01 for a, b in zip(timings, timings[1:]))


def test_closed_loop_for_a_duration_finishes_what_is_in_flight():
    clock, log = FakeClock(), []
    drawn = []

    def make(i):
        drawn.append(i)
        return sv.Planned([1], 4)

    timings, duration = asyncio.run(sv.drive(_engine(clock, log), make, users=2,
                                             duration_s=10.0, clock=clock))
    # nothing is sent at or after 10 units; what was in flight then ran to its end
    assert all(t.sent < 10.0 for t in timings)
    assert all(t.tokens == 4 for t in timings)
    assert max(t.chunks[-1] for t in timings) >= 10.0 and duration == clock.now
    assert drawn == list(range(len(timings)))  # drawn only as sent, each once
    assert len(timings) > 2 and _in_flight_peak(log) == 2  # each user sent more than one


def test_open_loop_for_a_duration_stops_sending_from_an_endless_schedule():
    clock, log = FakeClock(), []
    offsets = itertools.count(0.0, 0.0)  # all due at once, without end
    timings, _ = asyncio.run(sv.drive(_engine(clock, log), lambda i: sv.Planned([1], 2),
                                      offsets, duration_s=5.0, max_concurrency=2,
                                      clock=clock))
    assert timings and all(t.sent < 5.0 and t.tokens == 2 for t in timings)
    assert _in_flight_peak(log) == 2


def test_open_loop_for_a_duration_on_a_real_clock():
    submit = _engine(FakeClock(), [])
    timings, _ = asyncio.run(sv.drive(submit, lambda i: sv.Planned([1], 2),
                                      itertools.count(0.0, 0.01), duration_s=0.1))
    # offsets 0, 0.01, ... 0.09 fall inside the duration: at most those ten are sent
    assert 1 <= len(timings) <= 10 and all(t.tokens == 2 for t in timings)


@pytest.mark.parametrize("capacity", [1, 2, 7, 33, 63])
def test_bisection_over_a_count_ends_on_neighbours(capacity):
    out = sv.bisect_load(lambda n: n <= capacity, 1, 64, steps=10, over="max_concurrency")
    met, failed = out["bracket"]
    assert out["capacity"] == met == capacity and failed == capacity + 1
    assert all(isinstance(p["max_concurrency"], int) for p in out["probes"])
    assert len({p["max_concurrency"] for p in out["probes"]}) == len(out["probes"])  # none twice
    assert len(out["probes"]) <= 2 + 10


def test_bisection_over_users_with_few_steps_keeps_a_bracket():
    out = sv.bisect_load(lambda n: n <= 40, 1, 1000, steps=2, over="users")
    met, failed = out["bracket"]
    assert met <= 40 < failed and len(out["probes"]) == 4
    assert [p["users"] for p in out["probes"][:2]] == [1, 1000]


def test_open_loop_ends_without_waiting_for_the_next_arrival():
    clock, log = FakeClock(), []
    # the next request would be due 1000 units after the last: not waited for, it is not sent
    offsets = itertools.chain([0.0, 0.0], itertools.repeat(1000.0))
    timings, _ = asyncio.run(asyncio.wait_for(sv.drive(
        _engine(clock, log), lambda i: sv.Planned([1], 2), offsets, num_requests=2,
        clock=clock), timeout=30))
    assert len(timings) == 2
    timings, _ = asyncio.run(asyncio.wait_for(sv.drive(
        _engine(clock, log), lambda i: sv.Planned([1], 2), [0.0, 1e9], duration_s=5.0,
        clock=clock), timeout=30))
    assert len(timings) == 1
