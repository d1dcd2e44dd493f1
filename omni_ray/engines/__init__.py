"""Engines behind one small interface, one module each: ``vllm``, ``llamacpp``, ``transformers``.

In the spirit of optimum-benchmark's backends. The engine process (``omni_ray.engine.runner``)
sets the environment an engine asks for, pins and binds, starts the process-tree RssAnon
sampler, then drives the engine through a ``Session``:

    engine = load_engine(req.engine)()
    env = engine.environment(req)       # before torch, vLLM or a peer is imported or started
    facts = engine.load(session)        # import, build, load weights: "ready" when it returns
    measured = engine.run(session)      # the workload: the same metric names for every engine
    extra = engine.report()             # record fields of its own: vLLM's patch_report and
                                        # kernels; any other engine's under "engine_report"

The launcher, the pinning, the sampler, the record and the summary never see which engine ran:
every engine reports ``ttft_s``, ``prefill_tok_s`` (a ``prompt_len`` prompt, ``batch`` rows),
``decode_ms_per_token`` and ``decode_tok_s`` (``batch`` tokens per step, after ``prompt_len``
tokens of context), ``decode_regime``, and memory as the engine tree's RssAnon
(``rss_anon_tree_mb``, ``peak_rss_anon_mb``). A figure an engine cannot give is absent, never
a stand-in. ``prepare`` does the slow one-off work (a llama.cpp build, a GGUF conversion) before
a sweep starts, with a progress line, so no arm's timeout pays for it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

from omni_ray.config.schema import ENGINES, StageConfig
from omni_ray.engines.request import EngineRequest

PHASE_MARK = "omni-ray phase: "  # the actor's status() reads these lines from the engine log
# Figures of the last window while an engine measures, one JSON object a line (``Session.
# progress``): the stage actor sets its live gauges from them (engine/launch.live_figures).
PROGRESS_MARK = "omni-ray progress: "


class Session:
    """What the runner hands an engine: its request, the resolved model directory, the tree
    sampler, a phase line, and the pinning read-back (an engine whose work runs in child
    processes started later calls ``read_pinning`` while they run)."""

    def __init__(self, req: EngineRequest, model_path: str, sampler: Any,
                 read_pinning: Callable[[], None]) -> None:
        self.req, self.model_path, self.sampler = req, model_path, sampler
        self.read_pinning = read_pinning

    def phase(self, name: str) -> None:
        print(f"{PHASE_MARK}{name}", flush=True)

    def progress(self, **figures: float | int) -> None:
        """A progress line: the last window's figures (``window_rates``' names, the KV tokens
        in use and the budget), with the tokens and seconds they come from."""
        print(f"{PROGRESS_MARK}{json.dumps(figures)}", flush=True)


def window_rates(*, batch: int, prompt_len: int, output_len: int, t_one: float,
                 t_n: float) -> dict:
    """One measured window of an in-process engine, a 1-token run then an ``output_len``-token
    run: the prefill and decode rates with the tokens and seconds they come from, by the same
    rule as the arm's figures (``engines.vllm.timing_figures``). No decode figure when the
    N-token run was not the slower."""
    out = {"prefill_tokens": batch * prompt_len, "prefill_s": t_one,
           "prefill_tok_s": batch * prompt_len / t_one}
    if output_len > 1 and t_n > t_one:
        tokens, seconds = batch * (output_len - 1), t_n - t_one
        out |= {"decode_tokens": tokens, "decode_s": seconds, "decode_tok_s": tokens / seconds}
    return out


class Engine(Protocol):
    name: str
    # True: after load() the model is held by this process tree, so the runner takes ready_s and
    # the settled RssAnon at ready. False (llama.cpp: llama-bench loads per test): run() reports
    # the tree's RssAnon while the decode test runs.
    resident: bool

    def environment(self, req: EngineRequest) -> dict[str, str]: ...
    def load(self, session: Session) -> dict: ...
    def run(self, session: Session) -> dict: ...
    def report(self) -> dict: ...


def load_engine(name: str) -> type:
    """The engine class of ``name`` (its module is imported; heavy imports wait for load())."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; engines: {', '.join(ENGINES)}")
    return importlib.import_module(f"omni_ray.engines.{name}").ENGINE


def common_env(req: EngineRequest) -> dict[str, str]:
    """Variables every engine process gets: offline Hugging Face, one OpenMP thread per slot
    CPU. ``stage.env`` is applied after the engine's own."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if req.cpus:
        env["OMP_NUM_THREADS"] = str(len(req.cpus))
    return env


def prepare(stage: StageConfig, log: Callable[[str], None] | None = None) -> None:
    """One-off work an engine needs before any arm of ``stage`` starts (cached, so fast when
    done): a llama.cpp build and the GGUF of the model. ``log`` receives progress lines."""
    engine = load_engine(stage.engine)
    prep = getattr(engine, "prepare", None)
    if prep is not None:
        prep(stage, log or (lambda line: print(line, file=sys.stderr, flush=True)))


def slot_threads(req: EngineRequest) -> int:
    """Threads an engine with its own thread count uses: one per slot CPU."""
    return len(req.cpus) if req.cpus else len(os.sched_getaffinity(0))
