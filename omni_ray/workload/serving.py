"""Serving load: arrivals, lengths, the load generator and the figures of one load point.

Pure Python (asyncio, no vLLM): the engine side hands :func:`drive` a ``submit`` coroutine
factory that streams a request's tokens, so the generator and every figure are unit-tested
without an engine. Definitions follow ``vllm bench serve`` (vllm/benchmarks/serve.py):

- arrivals: gaps drawn from a gamma distribution of shape ``burstiness`` and mean
  ``1 / request_rate`` (burstiness 1 is a Poisson process; lower is burstier); ``inf`` sends
  every request at once;
- TTFT: first token received - request sent; E2E: last token - sent; ITL: the gaps between
  successive outputs received (one per streamed chunk); TPOT: (E2E - TTFT) / (output tokens - 1);
- goodput: requests per second that met every SLO given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence

# The SLO keys a workload may name, and the per-request figure each bounds (milliseconds).
SLO_METRICS = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2e_ms"}
# The per-request figures summarised with percentiles.
LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def arrivals(rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Seconds after the start at which each request is sent (non-decreasing, without end)."""
    if not rate > 0 or not burstiness > 0:
        raise ValueError(f"need rate > 0, burstiness > 0; got {rate}, {burstiness}")
    if math.isinf(rate):
        yield from itertools.repeat(0.0)
        return
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)  # gamma mean = shape * scale = 1 / rate
    t = 0.0
    while True:
        yield t
        t += rng.gammavariate(burstiness, theta)


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """The first ``n`` of :func:`arrivals`."""
    if n < 0:
        raise ValueError(f"need n >= 0, got {n}")
    return list(itertools.islice(arrivals(rate, burstiness, seed), n))


def lengths(n: int, low: int, high: int | None, rng: random.Random) -> list[int]:
    """``n`` lengths: ``low`` each (``high`` None), else uniform over [low, high] inclusive."""
    if high is None or high == low:
        return [low] * n
    return [rng.randint(low, high) for _ in range(n)]


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0 < p < 100) by linear interpolation between order statistics
    (numpy's default, which ``vllm bench serve`` uses); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclasses.dataclass
class RequestTiming:
    """One request as the client saw it: when it was sent and when each output arrived."""

    prompt_len: int
    output_len: int                   # tokens asked for
    sent: float = 0.0
    chunks: list[float] = dataclasses.field(default_factory=list)  # arrival time of each output
    tokens: int = 0                   # output tokens received
    error: str | None = None

    @property
    def ttft_ms(self) -> float | None:
        return (self.chunks[0] - self.sent) * 1e3 if self.chunks else None

    @property
    def e2e_ms(self) -> float | None:
        return (self.chunks[-1] - self.sent) * 1e3 if self.chunks else None

    @property
    def tpot_ms(self) -> float | None:
        if self.tokens < 2 or not self.chunks:
            return None
        return (self.chunks[-1] - self.chunks[0]) * 1e3 / (self.tokens - 1)

    @property
    def itl_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.chunks, self.chunks[1:])]


@dataclasses.dataclass(frozen=True)
class Planned:
    """A request to send: its prompt (token ids) and how many tokens to generate."""

    prompt: list[int]
    output_len: int


# submit(index, planned) -> async iterator yielding the number of new tokens in each output, or
# (new tokens, when) for an output produced elsewhere at a time on ``drive``'s clock (a serving
# pipeline's last stage, docs/pipelines.md): the request's figures are then that output's.
Submit = Callable[[int, Planned], AsyncIterator[int | tuple[int, float]]]


async def drive(submit: Submit, plan: Sequence[Planned] | Callable[[int], Planned],
                offsets: Iterable[float] = (), *, users: int | None = None,
                think_time_s: float = 0.0, num_requests: int | None = None,
                duration_s: float | None = None, max_concurrency: int | None = None,
                clock: Callable[[], float] = time.perf_counter) -> tuple[list[RequestTiming],
                                                                         float]:
    """Send requests and stream each to its end; returns the timings (in the order sent) and
    the seconds from the start to the last output.

    ``plan``: the requests, or a function index -> request (drawn as they are needed).
    Open loop (``users`` None): request i is sent ``offsets[i]`` seconds after the start, with
    at most ``max_concurrency`` in flight (a request held back waits, and its latency counts
    from when it is sent, as in vllm bench serve). Closed loop: ``users`` users each send a
    request, wait for its last output and ``think_time_s``, and send the next.
    Either ends after ``num_requests`` requests (default: ``len(plan)``) or, with
    ``duration_s``, once that many seconds have passed since the start: no request is sent
    after it, and those in flight finish and are counted."""
    make = plan if callable(plan) else plan.__getitem__
    if num_requests is None and duration_s is None:
        num_requests = len(plan)  # type: ignore[arg-type]
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency and not users else None
    timings: list[RequestTiming] = []
    start = clock()

    def more() -> bool:
        if num_requests is not None and len(timings) >= num_requests:
            return False
        return duration_s is None or clock() - start < duration_s

    def send() -> Awaitable[None]:
        """Request ``len(timings)``, sent now (its clock starts here); the coroutine streams
        it to its end."""
        i = len(timings)
        planned = make(i)
        rec = RequestTiming(prompt_len=len(planned.prompt), output_len=planned.output_len,
                            sent=clock())
        timings.append(rec)
        return stream(i, planned, rec)

    async def stream(i: int, planned: Planned, rec: RequestTiming) -> None:
        try:
            async for out in submit(i, planned):
                new_tokens, at = out if isinstance(out, tuple) else (out, clock())
                rec.chunks.append(at)
                rec.tokens += new_tokens
        except Exception as exc:  # a failed request is counted as failed, the run goes on
            rec.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        finally:
            if limit is not None:
                limit.release()

    if users:
        async def user() -> None:
            while more():
                await send()
                if think_time_s:
                    await asyncio.sleep(think_time_s)

        await asyncio.gather(*(user() for _ in range(users)))
    else:
        sent: list[asyncio.Future] = []
        for offset in offsets:
            if not more() or (duration_s is not None and offset >= duration_s):
                break  # never wait for a request that will not be sent
            delay = start + offset - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if limit is not None:
                await limit.acquire()
            if not more():
                if limit is not None:
                    limit.release()
                break
            sent.append(asyncio.ensure_future(send()))
            await asyncio.sleep(0)  # the request starts now, not when the next one is due
        await asyncio.gather(*sent)
    ends = [r.chunks[-1] for r in timings if r.chunks]
    return timings, (max(ends) - start) if ends else 0.0


def stats(values: Sequence[float], percentiles: Sequence[float]) -> dict:
    """Mean, median and each percentile of ``values`` (None for each without values)."""
    if not values:
        return {"mean": None, "median": None, **{f"p{p:g}": None for p in percentiles}}
    return {"mean": sum(values) / len(values), "median": percentile(values, 50),
            **{f"p{p:g}": percentile(values, p) for p in percentiles}}


def good(rec: RequestTiming, slo: Mapping[str, float]) -> bool:
    """Whether a completed request met every SLO (``slo``: SLO_METRICS key -> milliseconds)."""
    if rec.error or not rec.chunks:
        return False
    for key, limit in slo.items():
        value = getattr(rec, SLO_METRICS[key])
        if value is not None and value > limit:
            return False
    return True


def figures(timings: Sequence[RequestTiming], duration_s: float, *,
            percentiles: Sequence[float], slo: Mapping[str, float]) -> dict:
    """One load point's figures: completed/failed counts, throughputs, goodput, and for each
    of TTFT, TPOT, ITL (every gap of every request) and E2E its mean, median and percentiles."""
    done = [r for r in timings if not r.error and r.chunks]
    out_tokens = sum(r.tokens for r in done)
    per = {
        "ttft_ms": [r.ttft_ms for r in done],
        "tpot_ms": [r.tpot_ms for r in done if r.tpot_ms is not None],
        "itl_ms": [x for r in done for x in r.itl_ms],
        "e2e_ms": [r.e2e_ms for r in done],
    }
    n_good = sum(good(r, slo) for r in done)
    out: dict = {
        "completed": len(done), "failed": len(timings) - len(done), "duration_s": duration_s,
        "request_throughput": len(done) / duration_s if duration_s > 0 else None,
        "output_throughput": out_tokens / duration_s if duration_s > 0 else None,
        "total_input_tokens": sum(r.prompt_len for r in done),
        "total_output_tokens": out_tokens,
    }
    if slo:
        out["good_requests"] = n_good
        out["goodput"] = n_good / duration_s if duration_s > 0 else None
    for name in LATENCY_METRICS:
        out[name] = stats(per[name], percentiles)
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def samples(timings: Sequence[RequestTiming]) -> dict:
    """The per-request samples, column-wise and in milliseconds to the microsecond: compact
    enough to keep in the record, complete enough to recompute every figure above."""
    return {
        "prompt_len": [r.prompt_len for r in timings],
        "output_tokens": [r.tokens for r in timings],
        "sent_s": [round(r.sent - timings[0].sent, 6) if timings else 0 for r in timings],
        "ttft_ms": [_ms(r.ttft_ms) for r in timings],
        "tpot_ms": [_ms(r.tpot_ms) for r in timings],
        "e2e_ms": [_ms(r.e2e_ms) for r in timings],
        "itl_ms": [[_ms(x) for x in r.itl_ms] for r in timings],
        "error": [r.error for r in timings] if any(r.error for r in timings) else None,
    }


def read_prompt_file(path: str) -> list[str]:
    """The prompts of a prompt file: one per non-blank line (``#`` lines are comments)."""
    with open(path, encoding="utf-8") as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]


def meets_slo(timings: Sequence[RequestTiming], slo: Mapping[str, float],
              percentile_: float) -> bool:
    """Whether a load point met the SLO: every request completed, and the ``percentile_``-th
    percentile of each SLO metric over its requests is within its threshold."""
    if not timings or any(r.error or not r.chunks for r in timings):
        return False
    for key, limit in slo.items():
        values = [v for r in timings if (v := getattr(r, SLO_METRICS[key])) is not None]
        value = percentile(values, percentile_)
        if value is not None and value > limit:
            return False
    return True


def bisect_load(probe: Callable[[float], bool], low: float, high: float, steps: int, *,
                over: str = "request_rate") -> dict:
    """The highest load in [low, high] at which ``probe(load)`` (a short load point meeting
    the SLO) holds, by bisection on a log scale (loads span decades): ``low`` first, then
    ``high``, then up to ``steps`` midpoints. A rate (``over`` request_rate) takes real
    midpoints; a count (max_concurrency, users) takes whole ones and stops once the bracket's
    ends are neighbours. Returns ``capacity`` (the highest load that met it, None when even
    ``low`` did not), the final ``bracket`` [met, failed] and every ``probe``."""
    whole = over != "request_rate"
    tried: list[dict] = []

    def check(load: float) -> bool:
        ok = bool(probe(load))
        tried.append({over: load, "meets_slo": ok})
        return ok

    if not check(low):
        return {"capacity": None, "bracket": [None, low], "probes": tried}
    if check(high):
        return {"capacity": high, "bracket": [high, None], "probes": tried}
    lo, hi = low, high
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if whole:
            if hi - lo <= 1:
                break
            mid = min(max(round(mid), lo + 1), hi - 1)
        if check(mid):
            lo = mid
        else:
            hi = mid
    return {"capacity": lo, "bracket": [lo, hi], "probes": tried}
