"""Run one arm in this (fresh) interpreter: ``python -m omni_ray.engine.runner REQ.json OUT.json``.

The order matters and is the point of this module: set the environment, pin the process and bind
its memory *before* torch or vLLM is imported (vLLM's EngineCore and workers inherit all three),
start the process-tree sampler, then import, build the engine, run the workload and read the
pinning back from every thread of every process of the tree.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback

from omni_ray.engine.budget import MiB, kv_bytes_per_token
from omni_ray.engine.launch import PHASE_MARK
from omni_ray.measure.clock import Stopwatch
from omni_ray.measure.pinning import affinity_tree, bind_memory, pin_all_threads, violations
from omni_ray.measure.sampler import TreeSampler, self_rss_anon_mb
from omni_ray.topology.sysfs import format_cpulist
from omni_ray.workload.prompts import decode_seconds_per_token, token_prompts


def _cpp_wrapper(stage: dict) -> bool:
    """Whether inductor's C++ wrapper drives this stage's graph (nothing is compiled when eager).

    With it, a decode step runs no generated Python between the graph's kernels and custom ops
    (vLLM 0.32 compiles a CPU model's whole forward as one graph). It needs layer names passed
    as plain strings: on torch >= 2.11 vLLM passes its opaque ``LayerName`` type, a Python
    object the generated C++ cannot hold, unless ``VLLM_USE_LAYERNAME=0``
    (vllm/utils/torch_utils.py). It costs a longer cold compile (the wrapper is C++ too), and
    alone it measured no faster (results/cpp_wrapper_ab/20261203T130248Z).
    """
    return bool(stage.get("cpp_wrapper")) and not stage.get("enforce_eager", True)


# stage.serial_kernels: inductor's generated kernels (norms, RoPE, SiLU, residual adds) run on
# the calling thread. vLLM on CPU compiles them with cpp.dynamic_threads, which opens an OpenMP
# region in every kernel even for one decode token; on two cores the region costs more than the
# kernel's work. The int4 GEMMs, attention and bf16 GEMMs are not inductor's and stay parallel.
# Stock vLLM overwrites cpp.dynamic_threads; vllm_omni's inductor_config patch keeps this value.
SERIAL_KERNELS = {"cpp.dynamic_threads": False, "cpp.threads": 1}


def _inductor_settings(stage: dict) -> dict:
    """The inductor_compile_config keys the stage's typed fields set (none when eager)."""
    if stage.get("enforce_eager", True):
        return {}
    out = {"cpp_wrapper": True} if _cpp_wrapper(stage) else {}
    if stage.get("serial_kernels"):
        out.update(SERIAL_KERNELS)
    return out


def engine_env(req: dict) -> dict[str, str]:
    """The variables the engine process needs, decided before vLLM is imported."""
    stage = req["stage"]
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if stage.get("multiprocessing") else "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # Layer names reach the attention ops as str, not vLLM's LayerName objects, so the
        # cpu_attention patch runs its C++ kernels (no Python per layer; measured 1.055x a
        # compiled int4 decode step, results/step_ab/20261203T135456Z.json). stage.env may set
        # "1" to get vLLM's default back.
        "VLLM_USE_LAYERNAME": "0",
    }
    for name in stage.get("disable_patches", ()):
        env[f"VLLM_OMNI_DISABLE_{name.upper()}"] = "1"
    if req.get("cpus"):
        env["OMP_NUM_THREADS"] = str(len(req["cpus"]))
        env["VLLM_CPU_OMP_THREADS_BIND"] = format_cpulist(req["cpus"])
    if req.get("compile_cache_dir"):
        env["VLLM_CACHE_ROOT"] = req["compile_cache_dir"]
    env.update({k: str(v) for k, v in (stage.get("env") or {}).items()})
    if _cpp_wrapper(stage):  # after stage.env: the config check refuses another value anyway
        env["VLLM_USE_LAYERNAME"] = "0"
    return env


def engine_kwargs(req: dict) -> dict:
    stage = req["stage"]
    kwargs = dict(
        model=req["model_path"],  # resolved by run() from req["model"]
        dtype=stage.get("dtype", "bfloat16"),
        kv_cache_memory_bytes=int(stage["kv_cache_mib"]) * MiB,
        max_model_len=stage.get("max_model_len", 1024),
        max_num_seqs=stage.get("max_num_seqs", 8),
        enforce_eager=stage.get("enforce_eager", True),
        enable_prefix_caching=False,  # repeats must not be served from the prefix cache
        seed=req.get("seed", 0),
    )
    if stage.get("quantization"):
        kwargs["quantization"] = stage["quantization"]
    kwargs.update(stage.get("engine_args") or {})
    inductor = _inductor_settings(stage)
    if inductor:
        compilation = kwargs.get("compilation_config") or {}
        if isinstance(compilation, int):  # vllm.LLM takes a bare compilation mode too
            compilation = {"mode": compilation}
        compilation = dict(compilation)
        compilation["inductor_compile_config"] = dict(
            compilation.get("inductor_compile_config") or {}, **inductor)
        kwargs["compilation_config"] = compilation
    return kwargs


# Every measured request: greedy, and never stopped early by an EOS token.
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def timed_generate(llm, prompts: list[list[int]], params) -> tuple[float, list]:
    """Seconds for ``llm.generate`` of these token-id prompts, and its outputs: the one timing
    the runner and the benchmarks that run an engine in-process (step_ab, decode_profile) use."""
    with Stopwatch() as sw:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return sw.elapsed, outs


def run_workload(llm, wl: dict, vocab_size: int, sampler: TreeSampler, seed: int) -> dict:
    from vllm import SamplingParams

    batch, plen, n = wl["batch"], wl["prompt_len"], wl["output_len"]
    greedy = dict(GREEDY, detokenize=wl.get("detokenize", True))
    one = SamplingParams(max_tokens=1, **greedy)
    many = SamplingParams(max_tokens=n, **greedy)
    calls = iter(range(1, 1 << 30))

    def prompts(length: int = plen) -> list[list[int]]:
        return token_prompts(batch, length, vocab_size, seed=seed * 1_000_003 + next(calls))

    for _ in range(wl.get("warmup", 1)):
        timed_generate(llm, prompts(), many)
    out: dict = {}
    if wl.get("context_len"):
        timed_generate(llm, prompts(wl["context_len"]), one)
        time.sleep(0.1)
        sampler.mark("context")
        out["rss_anon_at_context_mb"] = sampler.settled_anon_mb()
    t_one, t_n, first_tokens = [], [], None
    for _ in range(wl.get("repeats", 3)):
        t, _ = timed_generate(llm, prompts(), one)
        t_one.append(t)
        t, outs = timed_generate(llm, prompts(), many)
        t_n.append(t)
        first_tokens = first_tokens or list(outs[0].outputs[0].token_ids)
    m1, mn = statistics.median(t_one), statistics.median(t_n)
    step = decode_seconds_per_token(m1, mn, n)
    out.update(
        ttft_s=m1,
        prefill_tok_s=batch * plen / m1,
        # t(n) <= t(1) happens under heavy contention: no decode figure rather than a wrong one
        decode_ms_per_token=step * 1e3 if step > 0 else None,
        decode_tok_s=batch / step if step > 0 else None,
        t_one_s=t_one,
        t_n_s=t_n,
        output_token_ids=first_tokens,
    )
    return out


def decode_regime(model_path: str, cpus: list[int] | None) -> dict:
    """Whether the weights a decode token reads fit in the LLC of the CPUs used, with both
    numbers (``omni_ray.measure.regime``; the LLC from sysfs)."""
    from omni_ray.measure.regime import checkpoint_bytes_per_token, describe
    from omni_ray.topology.caches import detect_llc

    llc = detect_llc()
    try:
        weight_bytes = checkpoint_bytes_per_token(model_path)
    except (OSError, ValueError, KeyError):
        weight_bytes = None
    return describe(weight_bytes, llc.bytes_for(cpus) if llc else None)


def kv_cache_tokens(llm) -> int:
    cache = llm.llm_engine.vllm_config.cache_config
    return int(cache.num_gpu_blocks or 0) * int(cache.block_size)


def read_back(pinning: dict, cpus: list[int] | None, when: str) -> None:
    """Read every thread's affinity back into ``pinning`` (at ready, and again after the
    workload: a thread moved off the slot while measuring is a violation too); each violation
    line says when it was seen, and the read-back with more threads sets the counts."""
    tree = affinity_tree(os.getpid())
    threads = sum(len(t) for t in tree.values())
    if threads >= pinning.get("threads", 0):
        pinning["threads"], pinning["processes"] = threads, len(tree)
    allowed = {c for t in tree.values() for cs in t.values() for c in cs}
    pinning["allowed_cpus"] = sorted(allowed | set(pinning.get("allowed_cpus", ())))
    pinning.setdefault("violations", [])
    pinning["violations"] += [f"{when}: {v}" for v in violations(tree, cpus)] if cpus else []
    pinning.setdefault("read_back", []).append(when)


def run(req: dict) -> dict:
    """Everything after the environment is set; returns the result dict."""
    import psutil

    from omni_ray.models.build import resolve_model

    me = psutil.Process()
    req = dict(req, model_path=str(resolve_model(req["model"])))
    cpus, node = req.get("cpus"), req.get("node")
    pinning: dict = {"requested_cpus": cpus, "node": node}
    if cpus:
        pinning["pinned_tids"] = len(pin_all_threads(cpus))
    if node is not None:
        pinning["membind"] = bind_memory(node).to_dict()

    with TreeSampler(os.getpid()) as sampler:
        sampler.mark("start")
        with Stopwatch() as imp:
            import vllm_omni

            vllm_omni.register()
            from vllm import LLM
        sampler.mark("load_start")
        print(f"{PHASE_MARK}loading", flush=True)  # the actor's status() reads these
        with Stopwatch() as init:
            llm = LLM(**engine_kwargs(req))
        sampler.mark("ready")
        print(f"{PHASE_MARK}measuring", flush=True)
        ready_s = time.time() - me.create_time()
        time.sleep(0.3)
        m = dict(
            import_s=imp.elapsed,
            init_s=init.elapsed,
            ready_s=ready_s,
            rss_anon_mb=self_rss_anon_mb(os.getpid()),
            rss_anon_tree_mb=sampler.settled_anon_mb(),
            peak_rss_anon_during_load_mb=sampler.peak_anon_mb("load_start", "ready"),
            kv_cache_tokens=kv_cache_tokens(llm),
            kv_cache_bytes_requested=int(req["stage"]["kv_cache_mib"]) * MiB,
            kv_cache_tokens_budget=int(req["stage"]["kv_cache_mib"]) * MiB // kv_bytes_per_token(
                req["model_path"], req["stage"].get("dtype", "bfloat16")),
            engine_pids=sorted(p.pid for p in [me, *me.children(recursive=True)]),
        )
        read_back(pinning, cpus, "ready")
        if req.get("workload"):
            vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
            m.update(run_workload(llm, req["workload"], vocab, sampler, req.get("seed", 0)))
            if m.get("decode_tok_s") is not None:
                m.update(decode_regime(req["model_path"], cpus))
            read_back(pinning, cpus, "end")  # a thread moved off the slot while measuring
        sampler.mark("end")
        m["peak_rss_anon_mb"] = sampler.peak_anon_mb()
        report = vllm_omni.patch_report()
        kernels = vllm_omni.kernel_report()
        del llm
    out = {"status": "ok", "measurements": m, "pinning": pinning, "patch_report": report,
           "kernels": kernels, "memory": sampler.to_dict()}
    if pinning["violations"]:  # measured off the slot: the figures are not the slot's
        out.update(status="failed", error=f"pinning: {len(pinning['violations'])} thread(s) "
                   f"outside CPUs {format_cpulist(cpus)}: {pinning['violations'][0]}")
    return out


def die_with_parent() -> None:
    """SIGKILL this engine when the process that launched it (the stage actor) dies."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def serve(run_fn, argv: list[str] | None = None, adjust=None) -> None:
    """``REQ.json OUT.json``: run ``run_fn(req)`` in this fresh process, write its result
    atomically (a failure becomes a result too) and exit. ``adjust`` may rewrite the request
    first. The environment is set before ``run_fn`` imports torch or vLLM."""
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    req_path, out_path = argv
    with open(req_path) as f:
        req = json.load(f)
    if adjust is not None:
        req = adjust(req)
    os.environ.update(engine_env(req))
    try:
        result = run_fn(req)
        code = 0
    except BaseException as exc:  # recorded, then the launcher decides; nothing is lost
        traceback.print_exc()
        result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        code = 1
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, default=str)
    os.replace(tmp, out_path)
    sys.stdout.flush()
    # vLLM leaves non-daemon threads and atexit work behind; the result is on disk, so leave now.
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    serve(run, argv)


if __name__ == "__main__":
    main()
