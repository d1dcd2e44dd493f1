"""vLLM (with vllm_omni's patches): ``vllm.LLM`` built with the stage's explicit KV budget.

Only this module (and vllm_omni) imports vLLM, inside ``load``; the request is typed
(``EngineRequest``), so every default is the schema's.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from omni_ray.engine.budget import MiB, kv_bytes_per_token
from omni_ray.engines import Session, common_env, handover, window_rates
from omni_ray.engines.request import EngineRequest
from omni_ray.engines.vllm_stats import LiveWindow, watch_offline
from omni_ray.measure.clock import Stopwatch
from omni_ray.topology.sysfs import format_cpulist
from omni_ray.workload.prompts import decode_seconds_per_token, token_prompts


def _typed(req: EngineRequest | Mapping[str, Any]) -> EngineRequest:
    """A developer probe's plain dict (``model_path`` for the model) -> the typed request."""
    if isinstance(req, EngineRequest):
        return req
    d = dict(req)
    if "model" not in d and "model" not in d.get("stage", {}) and d.get("model_path"):
        d["model"] = d["model_path"]
    return EngineRequest.from_dict(d)


def _cpp_wrapper(req: EngineRequest) -> bool:
    """Whether inductor's C++ wrapper drives this stage's graph (nothing is compiled when eager).

    With it, a decode step runs no generated Python between the graph's kernels and custom ops
    (vLLM 0.32 compiles a CPU model's whole forward as one graph). It needs layer names passed
    as plain strings: on torch >= 2.11 vLLM passes its opaque ``LayerName`` type, a Python
    object the generated C++ cannot hold, unless ``VLLM_USE_LAYERNAME=0``
    (vllm/utils/torch_utils.py). It costs a longer cold compile (the wrapper is C++ too), and
    alone it measured no faster (results/cpp_wrapper_ab/20261203T130248Z).
    """
    return req.stage.cpp_wrapper and not req.stage.enforce_eager


# stage.serial_kernels: inductor's generated kernels (norms, RoPE, SiLU, residual adds) run on
# the calling thread. vLLM on CPU compiles them with cpp.dynamic_threads, which opens an OpenMP
# region in every kernel even for one decode token; on two cores the region costs more than the
# kernel's work. The int4 GEMMs, attention and bf16 GEMMs are not inductor's and stay parallel.
# Stock vLLM overwrites cpp.dynamic_threads; vllm_omni's inductor_config patch keeps this value.
SERIAL_KERNELS = {"cpp.dynamic_threads": False, "cpp.threads": 1}


def _inductor_settings(req: EngineRequest) -> dict:
    """The inductor_compile_config keys the stage's typed fields set (none when eager)."""
    if req.stage.enforce_eager:
        return {}
    out = {"cpp_wrapper": True} if _cpp_wrapper(req) else {}
    if req.stage.serial_kernels:
        out.update(SERIAL_KERNELS)
    return out


def engine_env(req: EngineRequest | Mapping[str, Any]) -> dict[str, str]:
    """The variables the engine process needs, decided before vLLM is imported."""
    req = _typed(req)
    stage = req.stage
    env = common_env(req) | {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if stage.multiprocessing else "0",
        # Layer names reach the attention ops as str, not vLLM's LayerName objects, so the
        # cpu_attention patch runs its C++ kernels (no Python per layer; measured 1.055x a
        # compiled int4 decode step, results/step_ab/20261203T135456Z.json). stage.env may set
        # "1" to get vLLM's default back.
        "VLLM_USE_LAYERNAME": "0",
    }
    for name in stage.disable_patches:
        env[f"VLLM_OMNI_DISABLE_{name.upper()}"] = "1"
    if req.cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = format_cpulist(list(req.cpus))
    if req.compile_cache_dir:
        env["VLLM_CACHE_ROOT"] = req.compile_cache_dir
    env.update(stage.env)
    if _cpp_wrapper(req):  # after stage.env: the config check refuses another value anyway
        env["VLLM_USE_LAYERNAME"] = "0"
    return env


def engine_kwargs(req: EngineRequest | Mapping[str, Any], model_path: str | None = None) -> dict:
    """``vllm.LLM``'s keyword arguments; ``model_path``: the resolved model directory (default:
    the request's model, as given)."""
    if model_path is None and isinstance(req, Mapping):
        model_path = req.get("model_path")
    req = _typed(req)
    stage = req.stage
    kwargs = dict(
        model=model_path or stage.model,
        dtype=stage.dtype,
        kv_cache_memory_bytes=int(stage.kv_cache_mib) * MiB,
        max_model_len=stage.max_model_len,
        max_num_seqs=stage.max_num_seqs,
        enforce_eager=stage.enforce_eager,
        enable_prefix_caching=False,  # repeats must not be served from the prefix cache
        seed=req.seed,
    )
    if stage.quantization:
        kwargs["quantization"] = stage.quantization
    kwargs.update(_plain(stage.engine_args))
    inductor = _inductor_settings(req)
    if inductor:
        compilation = kwargs.get("compilation_config") or {}
        if isinstance(compilation, int):  # vllm.LLM takes a bare compilation mode too
            compilation = {"mode": compilation}
        compilation = dict(compilation)
        compilation["inductor_compile_config"] = dict(
            compilation.get("inductor_compile_config") or {}, **inductor)
        kwargs["compilation_config"] = compilation
    return kwargs


def _plain(value: object) -> Any:
    from omni_ray.config.fields import thaw

    return thaw(value)


# Every measured request: greedy, and never stopped early by an EOS token.
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def timed_generate(llm, prompts: list[list[int]], params) -> tuple[float, list]:
    """Seconds for ``llm.generate`` of these token-id prompts, and its outputs: the one timing
    the runner and the benchmarks that run an engine in-process (step_ab, decode_profile) use."""
    with Stopwatch() as sw:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return sw.elapsed, outs


def run_workload(llm, wl, vocab_size: int, sampler, seed: int, progress=None) -> dict:
    """``wl``: a ``WorkloadConfig``. Prefill of a ``prompt_len`` prompt is the one-token run;
    decode per step is (N-token run - 1-token run) / (N - 1). ``progress`` (``Session.
    progress``) gets each repeat's window as it is measured."""
    from vllm import SamplingParams

    batch, plen, n = wl.batch, wl.prompt_len, wl.output_len
    greedy = dict(GREEDY, detokenize=wl.detokenize)
    one = SamplingParams(max_tokens=1, **greedy)
    many = SamplingParams(max_tokens=n, **greedy)
    calls = iter(range(1, 1 << 30))

    def prompts(length: int = plen) -> list[list[int]]:
        return token_prompts(batch, length, vocab_size, seed=seed * 1_000_003 + next(calls))

    for _ in range(wl.warmup):
        timed_generate(llm, prompts(), many)
    out: dict = {}
    if wl.context_len:
        timed_generate(llm, prompts(wl.context_len), one)
        time.sleep(0.1)
        sampler.mark("context")
        out["rss_anon_at_context_mb"] = sampler.settled_anon_mb()
    t_one, t_n, first_tokens = [], [], None
    for _ in range(wl.repeats):
        t, _ = timed_generate(llm, prompts(), one)
        t_one.append(t)
        t, outs = timed_generate(llm, prompts(), many)
        t_n.append(t)
        first_tokens = first_tokens or list(outs[0].outputs[0].token_ids)
        if progress is not None:
            progress(**window_rates(batch=batch, prompt_len=plen, output_len=n,
                                    t_one=t_one[-1], t_n=t))
    return timing_figures(t_one, t_n, batch=batch, prompt_len=plen, output_len=n) | {
        "output_token_ids": first_tokens} | out


def quality_probe(llm, req: EngineRequest, model_path: str, vocab_size: int) -> dict:
    """The fixed quality probe (``workload/quality.py``) in one request: the sequence as a
    token-id prompt with ``prompt_logprobs=0`` (each prompt id's own log-probability, from the
    raw logits), then ``tokens`` greedy ids."""
    from vllm import SamplingParams

    from omni_ray.workload.quality import probe_figures, probe_ids

    q = req.workload.quality
    ids = probe_ids(vocab_size, q["sequence_len"])
    params = SamplingParams(max_tokens=q["tokens"], prompt_logprobs=0,
                            **dict(GREEDY, detokenize=False))
    _, (out,) = timed_generate(llm, [ids], params)
    logprobs = [pos[tok].logprob for pos, tok in zip(out.prompt_logprobs[1:], ids[1:])]
    return probe_figures(ids=ids, logprobs=logprobs, greedy_ids=list(out.outputs[0].token_ids),
                         tokens=q["tokens"], model_path=model_path, dtype=req.stage.dtype,
                         quantization=req.stage.quantization)


def stream_generate(llm, prompts: list[list[int]], params,
                    on_step: Callable[[list[list[int]]], None]) -> tuple[float, list[list[int]]]:
    """``llm.generate``'s own loop (``LLMEngine.step`` until no request is left), with
    ``on_step`` called on every row's tokens so far after each step: a pipeline stage hands its
    output on while it generates. Seconds, and the rows of output ids."""
    from vllm.sampling_params import RequestOutputKind

    params = params.clone()
    params.output_kind = RequestOutputKind.CUMULATIVE
    engine = llm.llm_engine
    tag = f"stream{next(_STREAMS)}"
    rows: list[list[int]] = [[] for _ in prompts]
    with Stopwatch() as sw:
        for i, p in enumerate(prompts):
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, params)
        while engine.has_unfinished_requests():
            stepped = False
            for out in engine.step():
                rows[int(out.request_id.split("-")[1])] = list(out.outputs[0].token_ids)
                stepped = True
            if stepped:
                on_step(rows)
    return sw.elapsed, rows


_STREAMS = itertools.count()


def run_pipeline_stage(llm, req: EngineRequest, vocab_size: int, phase, progress) -> dict:
    """One pipeline stage (the edge rule: ``engines/handover.py``): warm up on random prompts
    of its input length, report "waiting", then for each chunk of its input (one without a
    ``window``) generate its share of ``output_len`` greedy tokens on the chunks and outputs so
    far, handing its output on as it grows (every ``out_window`` tokens, else when done). After:
    a 1-token and an ``output_len``-token run on fresh prompts of its input length give TTFT,
    prefill and, by difference, decode rate."""
    from vllm import SamplingParams

    wl = req.workload
    greedy = dict(GREEDY, detokenize=False)
    one = SamplingParams(max_tokens=1, **greedy)
    many = SamplingParams(max_tokens=wl.output_len, **greedy)
    seeds = iter(range(1, 1 << 30))
    plan = handover.chunk_plan(wl.prompt_len, wl.output_len, req.window)

    def fresh() -> list[list[int]]:
        return token_prompts(wl.batch, wl.prompt_len, vocab_size,
                             seed=req.seed * 1_000_003 + next(seeds))

    for _ in range(wl.warmup):
        timed_generate(llm, fresh(), many)
    phase("waiting")
    outbox = handover.Outbox(req.outputs_path, req.out_window)
    prompt: list[list[int]] = []   # c1 o1 c2 o2 ...: the next generation's prompt
    out: list[list[int]] = []      # o1 o2 ...: this stage's output so far
    mapped: list[list[int]] = []   # c1 c2 ...: its input so far, mapped into its vocabulary
    chunk_at, busy, first_token_at = [], 0.0, None
    for k, (need, n) in enumerate(plan):
        rows = handover.wait_for_tokens(req.inputs_path, need)
        chunk_at.append(time.time())
        if k == 0:
            phase("measuring")
            prompt, out, mapped = ([[] for _ in rows] for _ in range(3))
        chunk = handover.map_tokens([r[need - plan[0][0]:] for r in rows], vocab_size)
        prompt = handover.interleave(prompt, chunk)
        mapped = handover.interleave(mapped, chunk)
        before = out

        def step(new: list[list[int]], before=before) -> None:
            nonlocal first_token_at
            if first_token_at is None:
                first_token_at = time.time()
            outbox([b + r for b, r in zip(before, new)])

        t, new = stream_generate(llm, prompt, SamplingParams(max_tokens=n, **greedy), step)
        busy += t
        out = [b + r for b, r in zip(before, new)]
        prompt = handover.interleave(prompt, new)
    output_at = time.time()
    outbox(out, final=True)
    t_one, _ = timed_generate(llm, fresh(), one)
    t_n, _ = timed_generate(llm, fresh(), many)
    progress(**window_rates(batch=len(out), prompt_len=wl.prompt_len,
                            output_len=wl.output_len, t_one=t_one, t_n=t_n))
    return timing_figures([t_one], [t_n], batch=len(out), prompt_len=wl.prompt_len,
                          output_len=wl.output_len) | {
        "generate_s": busy, "busy_fraction": busy / (output_at - chunk_at[0]),
        "input_at": chunk_at[0], "chunk_at": chunk_at, "first_token_at": first_token_at,
        "output_at": output_at, "sent_at": outbox.sent_at, "window": req.window,
        "input_token_ids": mapped, "output_token_ids": out}


def timing_figures(t_one: list[float], t_n: list[float], *, batch: int, prompt_len: int,
                   output_len: int) -> dict:
    """The metric names every in-process engine reports, from its 1-token and N-token runs."""
    m1, mn = statistics.median(t_one), statistics.median(t_n)
    step = decode_seconds_per_token(m1, mn, output_len)
    return dict(
        ttft_s=m1,
        prefill_tok_s=batch * prompt_len / m1,
        # t(n) <= t(1) happens under heavy contention: no decode figure rather than a wrong one
        decode_ms_per_token=step * 1e3 if step > 0 else None,
        decode_tok_s=batch / step if step > 0 else None,
        t_one_s=t_one,
        t_n_s=t_n,
    )


def checkpoint_weight_bytes(model_path: str, quantization: str | None = None,
                            dtype: str | None = None) -> int | None:
    """The weight bytes a decode token reads from the engine's copy of ``model_path``'s
    checkpoint (``measure.regime.checkpoint_bytes_per_token``: int4 bytes for cpu_int4
    quantized at load, floats at the stage's dtype); None when the checkpoint cannot be read."""
    from omni_ray.measure.regime import checkpoint_bytes_per_token

    try:
        return checkpoint_bytes_per_token(model_path, quantization, dtype)
    except (OSError, ValueError, KeyError):
        return None


def decode_regime(model_path: str, cpus, weight_bytes: int | None = ...,
                  quantization: str | None = None, dtype: str | None = None) -> dict:
    """Whether the weights a decode token reads fit in the LLC of the CPUs used, with both
    numbers (``omni_ray.measure.regime``; the LLC from sysfs). ``weight_bytes``: given by an
    engine whose weights are not the checkpoint's (a GGUF); default: read from the checkpoint
    as the engine holds it (``checkpoint_weight_bytes``)."""
    from omni_ray.measure.regime import describe
    from omni_ray.topology.caches import detect_llc

    llc = detect_llc()
    if weight_bytes is ...:
        weight_bytes = checkpoint_weight_bytes(model_path, quantization, dtype)
    return describe(weight_bytes, llc.bytes_for(list(cpus) if cpus else None) if llc else None)


def kv_cache_tokens(llm) -> int:
    """The KV tokens vLLM allocated, of a ``vllm.LLM`` or an ``AsyncLLM``."""
    cache = getattr(llm, "llm_engine", llm).vllm_config.cache_config
    return int(cache.num_gpu_blocks or 0) * int(cache.block_size)


class VllmEngine:
    name = "vllm"
    resident = True

    def __init__(self) -> None:
        self.llm = None
        self._omni = None
        self._loop = None  # serving: the event loop AsyncLLM and the load generator run on

    def environment(self, req: EngineRequest) -> dict[str, str]:
        return engine_env(req)

    def load(self, session: Session) -> dict:
        req = session.req
        with Stopwatch() as imp:
            import vllm_omni

            vllm_omni.register()
            from vllm import LLM
        self._omni = vllm_omni
        session.sampler.mark("load_start")
        session.phase("loading")
        # vLLM's stats, read live: always when serving (its KV peaks need them), offline
        # when asked (they cost each decode step a little; vllm_stats)
        live = LiveWindow(session.progress, rates=self._serving(req))
        kwargs = engine_kwargs(req, session.model_path)
        with Stopwatch() as init:
            if self._serving(req):  # AsyncLLM on this process's event loop (vllm_serving)
                import asyncio

                from omni_ray.engines.vllm_serving import make_engine

                self._loop = asyncio.new_event_loop()
                self.llm, self._stats = make_engine(kwargs, self._loop, live)
            elif req.live_stats:
                self.llm = LLM(**kwargs | {"disable_log_stats": False})
                watch_offline(self.llm, live)
            else:
                self.llm = LLM(**kwargs)
        self._kv_tokens = live.budget = kv_cache_tokens(self.llm)
        session.progress(kv_tokens_budget=self._kv_tokens)
        kv_mib = int(req.stage.kv_cache_mib)
        return dict(
            import_s=imp.elapsed, init_s=init.elapsed,
            vllm_stat_logging=self._serving(req) or req.live_stats,
            kv_cache_tokens=self._kv_tokens,
            kv_cache_bytes_requested=kv_mib * MiB,
            kv_cache_tokens_budget=kv_mib * MiB // kv_bytes_per_token(session.model_path,
                                                                       req.stage.dtype))

    @staticmethod
    def _serving(req: EngineRequest) -> bool:
        return req.workload is not None and req.workload.mode == "serving"

    def run(self, session: Session) -> dict:
        req = session.req
        if self._serving(req):
            from omni_ray.engines import vllm_pipeline_serving as piped
            from omni_ray.engines.vllm_serving import serve

            def served(head=None) -> dict:
                return serve(self.llm, self._stats, self._loop, req, session.model_path,
                             session.sampler, session.phase, self._kv_tokens, head=head)

            if req.inputs_path is None:
                return served()
            # one stage of a serving pipeline (docs/pipelines.md, "Serving")
            if req.stage_index == 0:
                return piped.head(self.llm, self._loop, req, served, session.phase)
            vocab = self.llm.vllm_config.model_config.get_vocab_size()
            return piped.relay(self.llm, self._loop, req, vocab, session.phase) | {
                "kv_cache": self._kv_peaks()}
        vocab = self.llm.llm_engine.vllm_config.model_config.get_vocab_size()
        if req.inputs_path is not None:  # one stage of a pipeline (engine/pipeline.py)
            return run_pipeline_stage(self.llm, req, vocab, session.phase, session.progress)
        m = run_workload(self.llm, req.workload, vocab, session.sampler, req.seed,
                         session.progress)
        if m.get("decode_tok_s") is not None:
            m.update(decode_regime(session.model_path, req.cpus,
                                   self.weight_bytes(req, session.model_path)))
        if req.workload.quality is not None:  # after the speed, on the same engine
            session.phase("quality")
            m.update(quality_probe(self.llm, req, session.model_path, vocab))
        return m

    @staticmethod
    def warm_caches(req: EngineRequest, model_path: str) -> str:
        """Before the runner's sampler: the arm's VLLM_CACHE_ROOT shares vLLM's model-class
        facts, learnt if missing (engines/vllm_modelinfo.py). What it did, for the log."""
        from omni_ray.engines import vllm_modelinfo

        return vllm_modelinfo.warm(os.environ.get("VLLM_CACHE_ROOT"), model_path)

    @staticmethod
    def weight_bytes(req: EngineRequest, model_path: str) -> int | None:
        """What a decode token reads: the checkpoint as this engine holds it (cpu_int4
        quantized at load reads int4 bytes, not the bf16 checkpoint's)."""
        return checkpoint_weight_bytes(model_path, req.stage.quantization, req.stage.dtype)

    def _kv_peaks(self) -> dict:
        """The peaks of vLLM's own scheduler figures over the whole run (a relaying stage of a
        serving pipeline: it does not know the load points)."""
        seen = self._stats
        usage = seen["kv_cache_usage"] if seen["records"] else None
        return {"peak_usage": usage, "budget_tokens": self._kv_tokens,
                "peak_tokens": None if usage is None else round(usage * self._kv_tokens),
                "peak_running": seen["running"], "peak_waiting": seen["waiting"]}

    def report(self) -> dict:
        out = {"patch_report": self._omni.patch_report(), "kernels": self._omni.kernel_report()}
        if self._loop is not None:  # stop the EngineCore child before the process exits
            self.llm.shutdown()
        self.llm = None
        return out


ENGINE = VllmEngine
