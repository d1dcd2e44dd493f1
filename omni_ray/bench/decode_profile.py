"""Where a decode step's time goes: one in-process vLLM engine under ``torch.profiler``.

    python -m omni_ray.bench.decode_profile REQ.json OUT.json

REQ is an engine request as ``omni_ray.engine.runner`` takes it (model, stage, cpus, node) plus
``profile``: {prompt_len, output_len, repeats, compiled}. The engine is eager unless
``compiled`` is true (then the stage's own compile settings, e.g. ``cpp_wrapper`` and
``serial_kernels``, as a sweep runs them; the compiled graph calls the attention and its own
kernels directly, so both count as "other model ops"). It is built in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, set with the runner's ``engine_env`` before vLLM is imported,
after pinning), so the profiler sees the model's ops, the sampler and vLLM's own step work.

Decode per step is taken by difference, as in the runner: (run of N tokens - run of 1 token) /
(N - 1), for the wall time (unprofiled, median of ``repeats``) and for each bucket (profiled).
Buckets are inclusive CPU times of non-overlapping ranges:

- ``int4_gemm_ms``: ``vllm_omni::cpu_int4_linear`` calls whose N is not the vocabulary
- ``attention_ms``: ``Attention.forward`` (KV cache write and the attention kernel)
- ``lm_head_logits_ms``: ``LogitsProcessor.forward`` (the head GEMM and logits handling)
- ``sampling_ms``: ``Sampler.forward``
- ``other_model_ops_ms``: the rest of the model's forward (norms, RoPE, SiLU, residual adds,
  embedding lookup, op dispatch between them)
- ``outside_model_ms``: profiled wall time per step minus the model forward, logits and
  sampling: vLLM's per-step overhead (scheduler, input preparation, output processing).
  ``wall_ms`` (unprofiled) is the real step time; ``profiler_overhead_ms`` is how much the
  profiler added, mostly to the many small ops of "other model ops".

The ranges are added by wrapping those classes' ``forward`` in ``torch.profiler.record_function``
in this process only (a measurement harness, not a vllm_omni patch). With a bf16 model the
``int4_gemm_ms`` bucket is empty and ``aten::linear`` calls are bucketed as ``bf16_gemm_ms``.
"""

from __future__ import annotations

import functools
import statistics

RANGES = {
    "attention": ("vllm.model_executor.layers.attention.attention", "Attention"),
    "logits": ("vllm.model_executor.layers.logits_processor", "LogitsProcessor"),
    "sampling": ("vllm.v1.sample.sampler", "Sampler"),
    "model_forward": ("vllm.model_executor.models.llama", "LlamaForCausalLM"),
}
PREFIX = "omni_bench::"
INT4_OP = "vllm_omni::cpu_int4_linear"


def wrap_ranges() -> dict[str, bool]:
    """Wrap each class's forward in a record_function range; returns which ones applied."""
    import importlib

    import torch

    applied = {}
    for key, (mod_name, cls_name) in RANGES.items():
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError):
            applied[key] = False
            continue
        inner = cls.forward
        if getattr(inner, "_omni_bench_range", None):
            applied[key] = True
            continue

        def make(inner, name):
            @functools.wraps(inner)
            def forward(self, *args, **kwargs):
                with torch.profiler.record_function(name):
                    return inner(self, *args, **kwargs)
            forward._omni_bench_range = name
            return forward

        cls.forward = make(inner, PREFIX + key)
        applied[key] = True
    return applied


def _n_of_int4(event) -> int | None:
    shapes = getattr(event, "input_shapes", None) or []
    if len(shapes) > 2 and len(shapes[2]) == 3:  # scales_zeros [G, N, 2]
        return shapes[2][1]
    return None


def bucket_ms(events, vocab_size: int) -> dict[str, float]:
    """Inclusive CPU ms per bucket over one profiled run (see the module docstring)."""
    out = {"int4_gemm_ms": 0.0, "int4_gemm_calls": 0, "bf16_gemm_ms": 0.0,
           "attention_ms": 0.0, "lm_head_logits_ms": 0.0, "lm_head_gemm_ms": 0.0,
           "sampling_ms": 0.0, "model_forward_ms": 0.0}
    ranges = {PREFIX + "attention": "attention_ms", PREFIX + "logits": "lm_head_logits_ms",
              PREFIX + "sampling": "sampling_ms", PREFIX + "model_forward": "model_forward_ms"}
    for e in events:
        ms = e.cpu_time_total / 1e3
        if e.name in ranges:
            out[ranges[e.name]] += ms
        elif e.name == INT4_OP:
            n = _n_of_int4(e)
            if n is not None and n >= vocab_size:
                out["lm_head_gemm_ms"] += ms
            else:
                out["int4_gemm_ms"] += ms
                out["int4_gemm_calls"] += 1
        elif e.name == "aten::linear" and _inside_model_not_head(e):
            out["bf16_gemm_ms"] += ms
    return out


def _inside_model_not_head(event) -> bool:
    """An aten::linear of the model's layers (not the head, which runs under the logits range)."""
    p = getattr(event, "cpu_parent", None)
    while p is not None:
        if p.name == PREFIX + "logits":
            return False
        if p.name == PREFIX + "model_forward":
            return True
        p = p.cpu_parent
    return False


def _generate(llm, prompt, n: int) -> float:
    from vllm import SamplingParams

    from omni_ray.engine.runner import GREEDY, timed_generate

    return timed_generate(llm, [prompt], SamplingParams(max_tokens=n, **GREEDY))[0]


def run(req: dict) -> dict:
    from omni_ray.measure.pinning import bind_memory, pin_all_threads
    from omni_ray.models.build import resolve_model
    from omni_ray.engine.runner import engine_kwargs
    from omni_ray.workload.prompts import decode_seconds_per_token, token_prompts

    req = dict(req, model_path=str(resolve_model(req["model"])))
    if req.get("cpus"):
        pin_all_threads(req["cpus"])
    if req.get("node") is not None:
        bind_memory(req["node"])
    import torch
    import vllm_omni

    vllm_omni.register()
    applied = wrap_ranges()
    from vllm import LLM

    llm = LLM(**engine_kwargs(req))
    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    prof_cfg = req["profile"]
    plen, n, repeats = prof_cfg["prompt_len"], prof_cfg["output_len"], prof_cfg["repeats"]
    seeds = iter(range(1, 1 << 20))

    def prompt():
        return token_prompts(1, plen, vocab, seed=next(seeds))[0]

    _generate(llm, prompt(), n)  # warm-up
    t1 = [_generate(llm, prompt(), 1) for _ in range(repeats)]
    tn = [_generate(llm, prompt(), n) for _ in range(repeats)]
    wall_step_ms = decode_seconds_per_token(statistics.median(t1), statistics.median(tn), n) * 1e3
    wall_step_min_ms = decode_seconds_per_token(min(t1), min(tn), n) * 1e3

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
        _generate(llm, prompt(), 2)  # the profiler's own first-use cost stays out of the figures
    profiled, top = {}, ""
    for tokens in (1, n):
        for _ in range(2):  # the faster of two profiled runs: less of other processes' noise
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                wall = _generate(llm, prompt(), tokens)
            if tokens not in profiled or wall < profiled[tokens][0]:
                profiled[tokens] = (wall, bucket_ms(prof.events(), vocab))
                if tokens == n:
                    top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    (w1, b1), (wn, bn) = profiled[1], profiled[n]
    steps = n - 1
    per_step = {k: (bn[k] - b1[k]) / steps for k in bn if k.endswith("_ms")}
    per_step["int4_gemm_calls"] = (bn["int4_gemm_calls"] - b1["int4_gemm_calls"]) / steps
    per_step["profiled_wall_ms"] = (wn - w1) / steps * 1e3
    per_step["wall_ms"] = wall_step_ms
    per_step["wall_min_ms"] = wall_step_min_ms
    model = per_step["model_forward_ms"]
    inside = per_step["int4_gemm_ms"] + per_step["bf16_gemm_ms"] + per_step["attention_ms"]
    per_step["other_model_ops_ms"] = model - inside
    # From the profiled wall, like the buckets: the profiler slows the many small ops, so the
    # unprofiled wall minus profiled buckets can come out negative.
    per_step["outside_model_ms"] = (per_step["profiled_wall_ms"] - model
                                    - per_step["lm_head_logits_ms"] - per_step["sampling_ms"])
    per_step["profiler_overhead_ms"] = per_step["profiled_wall_ms"] - wall_step_ms
    per_step["rest_ms"] = per_step["other_model_ops_ms"] + per_step["outside_model_ms"]
    from omni_ray.results.provenance import collect
    from omni_ray.results.summary import hardware

    provenance = collect()
    return {"status": "ok", "per_step_ms": per_step, "ranges_applied": applied,
            "vocab_size": vocab, "prompt_len": plen, "output_len": n, "repeats": repeats,
            "t_one_s": t1, "t_n_s": tn,
            "profiled_wall_s": {"1": w1, str(n): wn}, "torch_threads": torch.get_num_threads(),
            "patch_report": vllm_omni.patch_report(), "top_ops_self_cpu": top,
            "compiled": not req["stage"].get("enforce_eager"), "provenance": provenance,
            "hardware": hardware(provenance)}


def main(argv: list[str] | None = None) -> None:
    from omni_ray.engine.runner import serve

    serve(run, argv, adjust=in_process, typed=False)


def in_process(req: dict) -> dict:
    """The request as run here: vLLM in this process, eager unless ``profile.compiled``."""
    stage = dict(req["stage"], multiprocessing=False)
    if not (req.get("profile") or {}).get("compiled"):
        stage["enforce_eager"] = True
    return dict(req, stage=stage)


if __name__ == "__main__":
    main()
