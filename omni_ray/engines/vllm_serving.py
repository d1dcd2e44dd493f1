"""vLLM serving: ``AsyncLLM`` in the engine process, fed by the load generator of
``omni_ray.workload.serving`` running as an asyncio task in that same process.

Why not vLLM's OpenAI server and a client process: the HTTP server, its JSON and the client
would be more processes on the slot's cores (or on cores the other slots own). Here there is
one client, the engine process's own event loop, and its CPU time is measured and recorded per
load point (``cpu.client_s`` against ``cpu.engine_core_s``): AsyncLLM always runs its EngineCore
in a child process (vLLM 0.32's ``make_async_mp_client``), which inherits the pinning, the
memory binding and the tree sampler. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
from collections.abc import Callable
from typing import Any

from omni_ray.engines.request import EngineRequest
from omni_ray.engines.vllm_stats import LiveWindow, new_seen, stat_logger
from omni_ray.workload import serving as sv
from omni_ray.workload.prompts import token_prompts


def make_engine(kwargs: dict, loop: asyncio.AbstractEventLoop,
                live: LiveWindow | None = None) -> tuple[Any, dict]:
    """An ``AsyncLLM`` built from ``vllm.LLM``'s keyword arguments, and the dict its stat
    logger (``vllm_stats``) fills with vLLM's own scheduler figures (peaks of KV cache use,
    running, waiting); ``live`` gets every step's figures too."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    seen = new_seen()
    args = AsyncEngineArgs(**kwargs, disable_log_stats=True)  # our logger only

    async def build() -> Any:
        return AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger(seen, live)])

    return loop.run_until_complete(build()), seen


def _tree_cpu_s(root: int) -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its descendants (EngineCore)."""
    import psutil

    me = psutil.Process(root)
    own = sum(me.cpu_times()[:2])
    rest = 0.0
    for child in me.children(recursive=True):
        try:
            rest += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return own, rest


@functools.lru_cache(maxsize=1)
def _tokenizer(model_path: str) -> Any:
    """The model's own tokenizer, loaded once (a duration draws its requests in chunks)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _plan(req: EngineRequest, n: int, vocab: int, model_path: str, max_len: int,
          rng: random.Random) -> list[sv.Planned]:
    """``n`` requests: prompts of the configured lengths (random token ids, distinct), or the
    prompt file's prompts drawn at random and tokenized by the model's own tokenizer."""
    wl = req.workload
    outs = sv.lengths(n, wl.output_len, wl.output_len_max, rng)
    if wl.prompt_file:
        tok = _tokenizer(model_path)
        texts = sv.read_prompt_file(wl.prompt_file)
        prompts = []
        for o in outs:
            ids = tok(rng.choice(texts), add_special_tokens=True)["input_ids"]
            prompts.append(list(ids)[: max(1, max_len - o)])
    else:
        lens = sv.lengths(n, wl.prompt_len, wl.prompt_len_max, rng)
        prompts = [token_prompts(1, length, vocab, seed=rng.randrange(1 << 62))[0]
                   for length in lens]
    return [sv.Planned(p, o) for p, o in zip(prompts, outs)]


def serve(engine: Any, seen: dict, loop: asyncio.AbstractEventLoop, req: EngineRequest,
          model_path: str, sampler: Any, phase: Any, kv_cache_tokens: int,
          head: Any = None) -> dict:
    """Warm-up requests, then each load point in turn on the one engine. Returns the
    measurements: ``serving``, one entry per load point (figures and per-request samples).

    ``head``: this engine is stage 0 of a pipeline (``vllm_pipeline_serving.Head``): each
    request goes through every stage and its figures are the last stage's outputs', on the
    wall clock the stages share; each load point says the ``label`` its request ids start with
    (``<label>.<index>``), by which the launcher finds them in every stage's trace."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    wl = req.workload
    vcfg = engine.vllm_config
    vocab = vcfg.model_config.get_vocab_size()
    max_len = vcfg.model_config.max_model_len
    rng = random.Random(req.seed * 1_000_003 + 17)
    clock = time.perf_counter if head is None else time.time  # a pipeline's: every stage's

    async def stream(rid: str, p: sv.Planned, params: Any):
        async for out in engine.generate({"prompt_token_ids": p.prompt}, params,
                                         request_id=f"omni-{rid}"):
            yield len(out.outputs[0].token_ids)

    def submitter(label: str) -> sv.Submit:
        """Request ``i`` of what ``label`` names (warm-up, a load point) as ``<label>.<i>``."""
        def submit(i: int, p: sv.Planned):
            params = SamplingParams(max_tokens=p.output_len, temperature=0.0, ignore_eos=True,
                                    detokenize=wl.detokenize,
                                    output_kind=RequestOutputKind.DELTA)
            return (stream if head is None else head.stream)(f"{label}.{i}", p, params)
        return submit

    if wl.warmup_requests:
        phase("serving warm-up")
        warm = _plan(req, wl.warmup_requests, vocab, model_path, max_len, rng)
        loop.run_until_complete(sv.drive(submitter("warm"), warm, [0.0] * len(warm),
                                         clock=clock))
    counter = iter(range(1 << 30))

    def draw() -> Callable[[int], sv.Planned]:
        """Request i of a load point, drawn in chunks as they are needed (a duration does not
        say how many)."""
        drawn: list[sv.Planned] = []

        def make(i: int) -> sv.Planned:
            while i >= len(drawn):
                drawn.extend(_plan(req, wl.num_requests, vocab, model_path, max_len, rng))
            return drawn[i]
        return make

    def run_point(load: dict, samples: bool = True) -> tuple[dict, list]:
        """One load point: ``load`` is ``{"request_rate": r}`` (an open loop at this
        workload's burstiness and max_concurrency, unless ``load`` gives its own) or
        ``{"users": n}`` (a closed loop). Returns its figures (and per-request samples)."""
        k = next(counter)
        users = load.get("users")
        point = {"request_rate": load.get("request_rate"), "burstiness": wl.burstiness,
                 "max_concurrency": load.get("max_concurrency", wl.max_concurrency)}
        if users is not None:
            point = {"users": users, "think_time_s": wl.think_time_s}
            phase(f"serving {users} users")
            offsets: Any = ()
        else:
            phase(f"serving {point['request_rate']} req/s")
            offsets = sv.arrivals(float(point["request_rate"]), wl.burstiness,
                                  rng.randrange(1 << 62))
        for key in ("kv_cache_usage", "running", "waiting"):
            seen[key] = 0
        label = f"load{k}"
        sampler.mark(f"{label}_start")
        cpu0, t0 = _tree_cpu_s(os.getpid()), time.perf_counter()
        timings, duration = loop.run_until_complete(sv.drive(
            submitter(label), draw(), offsets, users=users, think_time_s=wl.think_time_s,
            num_requests=None if wl.duration_s else wl.num_requests, duration_s=wl.duration_s,
            max_concurrency=point.get("max_concurrency"), clock=clock))
        wall = time.perf_counter() - t0
        cpu1 = _tree_cpu_s(os.getpid())
        sampler.mark(f"{label}_end")
        figs = sv.figures(timings, duration, percentiles=wl.percentiles, slo=wl.slo)
        usage = seen["kv_cache_usage"] if seen["records"] else None
        point |= {
            "num_requests": len(timings),
            # what ended the load point: a number of requests, or a duration (then requests
            # in flight at its end ran to theirs and are counted)
            "ends_by": "duration_s" if wl.duration_s else "num_requests",
            "duration_limit_s": wl.duration_s, **figs,
            "kv_cache": {"peak_usage": usage,
                         "peak_tokens": None if usage is None else round(usage * kv_cache_tokens),
                         "budget_tokens": kv_cache_tokens, "source": "vLLM SchedulerStats"
                         if usage is not None else "vLLM reported no scheduler stats",
                         "peak_running": seen["running"], "peak_waiting": seen["waiting"]},
            "peak_rss_anon_mb": sampler.peak_anon_mb(f"{label}_start", f"{label}_end"),
            "cpu": {"wall_s": wall, "client_s": cpu1[0] - cpu0[0],
                    "engine_core_s": cpu1[1] - cpu0[1]},
        }
        if samples:
            point["samples"] = sv.samples(timings)
        if head is not None:
            point["label"] = label
        return point, timings

    loads = ([{"users": n} for n in wl.users] if wl.users is not None
             else [{"request_rate": rate} for rate in wl.request_rate])
    out: dict = {"serving": [run_point(load)[0] for load in loads]}
    if wl.search is not None:
        out.update(search(wl, run_point))
    return out


# How a search's probe of load x runs, by what it bisects over; and the record key of its
# capacity.
_PROBE = {"request_rate": lambda x: {"request_rate": x},
          "max_concurrency": lambda x: {"request_rate": "inf", "max_concurrency": x},
          "users": lambda x: {"users": x}}
CAPACITY_KEY = {"request_rate": "capacity_req_s", "max_concurrency": "capacity_concurrency",
                "users": "capacity_users"}


def search(wl: Any, run_point: Callable[..., tuple[dict, list]]) -> dict:
    """The SLO search on this engine: probes of ``num_requests`` (or ``duration_s``) each,
    bisecting ``search.over`` (docs/serving.md)."""
    over = wl.search.get("over", "request_rate")
    probes: list[dict] = []

    def probe(x: float) -> bool:
        point, timings = run_point(_PROBE[over](x), samples=False)
        point["meets_slo"] = sv.meets_slo(timings, wl.slo, wl.search["percentile"])
        probes.append(point)
        return point["meets_slo"]

    found = sv.bisect_load(probe, wl.search["low"], wl.search["high"], wl.search["steps"],
                           over=over)
    out: dict = {"serving_search": {"over": over, **dict(wl.search), "slo": dict(wl.slo),
                                    "capacity": found["capacity"], "bracket": found["bracket"],
                                    "probes": probes}}
    if found["capacity"] is not None:
        out[CAPACITY_KEY[over]] = found["capacity"]
    return out
