"""One switch, A against B, in one engine process: interleaved pairs of decode steps.

    python -m omni_ray.bench.step_ab --switch cpu_attention --pairs 30 --out results/step_ab/

On a shared machine two runs minutes apart can differ by more than the change being judged
(here the same decode step took 12-21 ms from run to run), so an A/B of two processes can come
out reversed. Here one in-process engine (compiled unless ``--eager``) decodes with A, then with
B, ``--pairs`` times, alternating which side goes first. A side's step time is taken by
difference, (65-token run - 1-token run) / 64, on the same prompt. The result is each side's
median step, the median of the pairwise ratios A / B (> 1: B is faster), and whether both sides
produced the same tokens.

A change to vLLM's per-step Python is a few percent of a step, below what 30 pairs of whole steps
resolve here (a pair's ratio scatters by ~10 %). So each step is also split, by the same
difference, into the time inside the model (``GPUModelRunner._model_forward`` and
``LogitsProcessor.forward``: the weight-streaming part) and the rest of ``LLMEngine.step``
(``outside_model_ms``: scheduling, input preparation, sampling, output handling), and the
pairwise ratios of that rest are reported too.

Switches, each flipped at run time without restarting the engine:

- ``cpu_attention``: A is vLLM's own attention ops, B is vllm_omni's short path (the patch is
  removed and applied again; the engine starts with it switched off).
- ``weight_prefetch``: the int4 VNNI GEMV prefetching weights into L2 (A, the default) or
  non-temporally (B).
- ``attention_kernels``: the cpu_attention patch on its Python kernels (A) or its C++ ones (B);
  the C++ ones need layer names as strings (``VLLM_USE_LAYERNAME=0``, omni-ray's default).
- ``detokenize``: the output detokenized as it is made (A, vLLM's default) or token ids only (B,
  ``SamplingParams(detokenize=False)``, what a sweep with ``detokenize: false`` measures, as
  llama-bench does).
- ``gc``: Python's cyclic garbage collector on (A, the default) or off (B) in the engine's
  process: what the collections that vLLM's per-step objects trigger cost a decode step.
- ``attention_sync``: the cpu_attention patch's C++ kernels check the forward context (taking
  the GIL) on every op call (A), or get the step's metadata once before the model's forward (B).
- ``cache_update``: inside the cpu_attention patch's C++ kernels, each layer's new K/V rows are
  written by vLLM's ``cpu_attn_reshape_and_cache`` (A) or copied directly on the calling thread
  (B, the same bytes in the cache).
- ``step_overhead``: A is vLLM's own per-step Python (buffer self-copies, the slot-mapping
  launch, the sampler), B is vllm_omni's ``step_overhead`` patch (removed and applied again;
  the engine starts with it switched off).
- ``compiled_call``: A is vLLM's call of the compiled model (Dynamo's Python reading every
  parameter, then the graph), B is vllm_omni's ``compiled_call`` patch replaying the graph's
  input list (removed and applied again; after each flip its first forwards are vLLM's path
  while it learns, two or three of a 65-token run's forwards).
- ``weight_pages``: the cpu_int4 packed weights in torch's own allocations (A, ``4k``: small
  tensors in 4 KiB pages) or in vllm_omni's weight arena (B, ``huge``: mappings advised for 2 MiB
  transparent huge pages, where the engine loads them); each flip copies every packed tensor
  into the side's memory (``Parameter.data``, so the compiled graph keeps its inputs).
- ``compiled_entry``: with the ``compiled_call`` patch replaying, the replayed inputs go to the
  graph object Dynamo's code calls (A: torch's runtime wrappers, then inductor's C++-wrapper glue)
  or straight to inductor's C++ entry (B); needs ``--cpp-wrapper``.

The model is the shape's cpu_int4 g128 checkpoint (made once: ``ensure_int4``) or
``--model DIR``. Writes ``<out>/<UTC timestamp>.json`` with provenance.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path

from omni_ray import envs
from omni_ray.bench.common import save_and_exit
from omni_ray.errors import UserError
from omni_ray.results.pairs import pair_stats

SWITCHES = {
    "cpu_attention": ("vllm", "vllm_omni"),
    "attention_kernels": ("python", "cpp"),
    "weight_prefetch": ("l2", "nta"),
    "detokenize": ("on", "off"),
    "gc": ("on", "off"),
    "step_overhead": ("vllm", "vllm_omni"),
    "attention_sync": ("per_op", "per_forward"),
    "cache_update": ("vllm", "direct"),
    "compiled_call": ("vllm", "vllm_omni"),
    "compiled_entry": ("graph", "entry"),
    "weight_pages": ("4k", "huge"),
}
# Switches that flip a vllm_omni patch: the engine starts with it disabled, and A is vLLM's own.
PATCH_SWITCHES = ("cpu_attention", "step_overhead", "compiled_call")
PROMPT_LEN = 128
OUTPUT_LEN = 64
STAGE = {"kv_cache_mib": 256, "max_model_len": 1024, "multiprocessing": False}


def move_packed_weights(worker, huge: bool) -> int:
    """Copy every cpu_int4 packed tensor of the worker's model into the weight arena (``huge``)
    or into torch's allocations; returns how many were moved (run on the worker)."""
    from vllm_omni.ops import weight_arena
    from vllm_omni.quantization.cpu_int4 import PACK, SCALES_ZEROS

    seen: set[int] = set()
    for module in worker.model_runner.get_model().modules():
        for name in (PACK, SCALES_ZEROS):
            param = module._parameters.get(name)
            if param is None or id(param) in seen:  # a tied head shares the embedding's
                continue
            seen.add(id(param))
            param.data = weight_arena.copy(param.data) if huge else param.data.clone()
    return len(seen)


def flipper(switch: str, sampling: dict, llm=None):
    """side -> None: puts the engine's process (or ``sampling``, the SamplingParams fields every
    request of this run gets) in that side's state."""
    if switch == "weight_pages":
        def flip_pages(side: str) -> None:
            if not any(llm.collective_rpc(move_packed_weights, args=(side == "huge",))):
                raise RuntimeError("weight_pages: the engine's model has no cpu_int4 weights")
        return flip_pages

    if switch == "detokenize":
        return lambda side: sampling.update(detokenize=side == "on")
    if switch == "gc":
        import gc

        return lambda side: gc.enable() if side == "on" else gc.disable()
    if switch == "weight_prefetch":
        from vllm_omni.ops import native

        return lambda side: native.ops().set_weight_prefetch(side)
    from vllm_omni import patches

    # the rest are switches of vllm_omni's patches, flipped through their ablation interface
    return functools.partial(patches.ablate, switch)


class OutsideModel:
    """Seconds of ``LLMEngine.step`` spent outside the model's forward and logits, summed over
    the steps since the engine started; ``mark()`` records the running total. Wraps the three
    methods in this process (a measurement harness, not a vllm_omni patch)."""

    TIMED = (("vllm.v1.engine.llm_engine", "LLMEngine", "step", 1.0),
             ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward", -1.0),
             ("vllm.model_executor.layers.logits_processor", "LogitsProcessor", "forward", -1.0))

    def __init__(self) -> None:
        import importlib

        self.total = 0.0
        self.marks: list[float] = []
        for module, cls_name, method, sign in self.TIMED:
            cls = getattr(importlib.import_module(module), cls_name)
            setattr(cls, method, self._timed(getattr(cls, method), sign))

    def _timed(self, inner, sign: float):
        @functools.wraps(inner)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.total += sign * (time.perf_counter() - t0)
        return timed

    def mark(self) -> None:
        self.marks.append(self.total)

    def step_ms(self, output_len: int) -> float:
        """Per decode step, by difference of the last two marked runs (1 and output_len + 1
        tokens), as :func:`decode_step_ms` takes the wall time."""
        one, many = (self.marks[-2] - self.marks[-3], self.marks[-1] - self.marks[-2])
        return (many - one) / output_len * 1e3


def pair_order(i: int, a: str, b: str) -> tuple[str, str]:
    return (a, b) if i % 2 == 0 else (b, a)


def summarize(a: str, b: str, ms: dict[str, list[float]],
              outside: dict[str, list[float]] | None = None) -> dict:
    """The pairs' comparison as a sweep's ``compare:`` makes it (``results.pairs``): ratios
    A / B of step times (> 1: B is faster), their median, the sign test."""
    s = pair_stats(ms[a], ms[b])
    med = {side: statistics.median(v) for side, v in ms.items()}
    out = {"median_step_ms": med, "ratio_of_medians": med[a] / med[b],
           "pairwise_ratio_median": s["ratio_median"], "pairs_b_faster": s["wins"],
           "pairwise_ratios": s["ratios"], "sign_test_p": s["sign_test_p"]}
    if outside:
        o = pair_stats(outside[a], outside[b])
        out.update({"median_outside_model_ms": {k: statistics.median(v)
                                                for k, v in outside.items()},
                    "outside_model_pairwise_ratio_median": o["ratio_median"],
                    "outside_model_pairs_b_faster": o["wins"],
                    "outside_model_pairwise_ratios": o["ratios"],
                    "outside_model_sign_test_p": o["sign_test_p"]})
    return out


GROUP_SIZE = 128


def ensure_int4(shape: str, work: Path) -> Path:
    """The shape's cpu_int4 g128 checkpoint under ``work``, quantized once (again when
    ``omni-ray quantize`` writes another config today, e.g. a changed row_threshold)."""
    import json
    import shlex
    import subprocess
    import sys

    from omni_ray.models.build import ensure_model
    from vllm_omni.quantization.cpu_int4 import DEFAULT_ROW_THRESHOLD

    model = ensure_model(shape)
    int4 = work / model.name / f"cpu_int4-g{GROUP_SIZE}"
    if (int4 / "omni_quantize.json").is_file():
        qc = json.loads((int4 / "config.json").read_text()).get("quantization_config", {})
        if qc.get("row_threshold") == DEFAULT_ROW_THRESHOLD:
            return int4
    cmd = [sys.executable, "-m", "omni_ray.cli", "quantize", str(model), str(int4),
           "--group-size", str(GROUP_SIZE), "--overwrite"]
    log = int4.parent / "quantize.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL).returncode
    if rc != 0:
        raise UserError(f"omni-ray quantize failed (exit {rc}); see {log}")
    return int4


def in_process_engine(stage: dict, cpus: list[int], shape: str, model: str | None):
    """(an engine in this process, pinned to ``cpus``, and its checkpoint): ``model`` or the
    shape's cpu_int4 g128 checkpoint, made once (``ensure_int4``). Call before anything
    else imports vLLM: the stage's environment is set first (vLLM reads some of it at import)."""
    from omni_ray.engine.runner import engine_env, engine_kwargs
    from omni_ray.measure.pinning import pin_all_threads

    # the environment does not depend on the checkpoint: the shape names the model here
    os.environ.update(engine_env({"model": model or shape, "stage": stage, "cpus": cpus}))
    if model:
        path = Path(model)
    else:
        path = ensure_int4(shape, envs.cache_dir() / "bench" / "int4_peers")
    pin_all_threads(cpus)
    import vllm_omni
    from vllm import LLM

    vllm_omni.register()
    return LLM(**engine_kwargs({"model_path": str(path), "stage": stage, "cpus": cpus})), path


def decode_step_ms(llm, prompt: list[list[int]], output_len: int, sampling: dict,
                   timer: OutsideModel | None = None) -> tuple[float, list[int]]:
    """One decode step's ms by difference of a 1-token and an ``output_len + 1``-token run on
    ``prompt`` (the decode steps run at context len(prompt) .. + output_len), and the tokens.
    A ``timer`` is marked before and after each run."""
    from vllm import SamplingParams

    from omni_ray.engine.runner import timed_generate
    from omni_ray.workload.prompts import decode_seconds_per_token

    marks = timer.mark if timer else (lambda: None)
    marks()
    t1, _ = timed_generate(llm, prompt, SamplingParams(max_tokens=1, **sampling))
    marks()
    tn, out = timed_generate(llm, prompt, SamplingParams(max_tokens=output_len + 1, **sampling))
    marks()
    return (decode_seconds_per_token(t1, tn, output_len + 1) * 1e3,
            list(out[0].outputs[0].token_ids))


def run(args: argparse.Namespace) -> dict:
    from omni_ray.engine.runner import GREEDY
    from omni_ray.workload.prompts import token_prompts

    a, b = SWITCHES[args.switch]
    cpus = sorted(os.sched_getaffinity(0))
    stage = dict(STAGE, enforce_eager=args.eager, cpp_wrapper=args.cpp_wrapper,
                 disable_patches=[args.switch] if args.switch in PATCH_SWITCHES else [])
    llm, model = in_process_engine(stage, cpus, args.shape, args.model)
    import vllm_omni
    from vllm_omni.patches import compiled_call

    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    prompt = token_prompts(1, PROMPT_LEN, vocab, seed=1)
    sampling = dict(GREEDY)

    timer = OutsideModel()

    def step_ms() -> tuple[float, list[int]]:
        return decode_step_ms(llm, prompt, OUTPUT_LEN, sampling, timer)

    flip = flipper(args.switch, sampling, llm)
    ms: dict[str, list[float]] = {a: [], b: []}
    outside: dict[str, list[float]] = {a: [], b: []}
    tokens: dict[str, list[int] | None] = {}
    for side in (a, b):  # warm-up of both sides, not counted
        flip(side)
        step_ms()
    for i in range(args.pairs):
        for side in pair_order(i, a, b):
            flip(side)
            t, ids = step_ms()
            ms[side].append(t)
            outside[side].append(timer.step_ms(OUTPUT_LEN))
            if tokens.setdefault(side, ids) != ids:
                tokens[side] = None  # greedy decoding of one prompt changed within a side
    flip(a)
    return {"switch": args.switch, "a": a, "b": b, "model": str(model), "shape": args.shape,
            "mode": "eager" if args.eager else "compiled", "cpp_wrapper": args.cpp_wrapper,
            "cpus": cpus, "pairs": args.pairs,
            "prompt_len": PROMPT_LEN, "output_len": OUTPUT_LEN, "step_ms": ms,
            "outside_model_ms": outside, **summarize(a, b, ms, outside),
            "same_tokens": tokens[a] is not None and tokens[a] == tokens[b],
            "patch_report": vllm_omni.patch_report(),
            # what compiled_call did with the model ([] once the patch is removed)
            "compiled_call": compiled_call.replays()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--switch", choices=sorted(SWITCHES), required=True)
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--model", help="a cpu_int4 checkpoint directory (default: the shape's)")
    p.add_argument("--eager", action="store_true", help="enforce_eager (default: compiled)")
    p.add_argument("--cpp-wrapper", action="store_true",
                   help="compiled with inductor's C++ wrapper (omni-ray's stage.cpp_wrapper)")
    p.add_argument("--out", default="results/step_ab/")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs must be at least 1, got {args.pairs}")
    if args.switch == "compiled_entry" and not args.cpp_wrapper:
        p.error("--switch compiled_entry needs --cpp-wrapper (the entry is the C++ wrapper's)")
    if args.cpp_wrapper and args.eager:
        p.error("--cpp-wrapper needs a compiled engine; drop --eager")
    if args.model and not Path(args.model).is_dir():
        p.error(f"--model: not a checkpoint directory: {args.model}")
    if args.switch == "weight_prefetch":
        from vllm_omni.ops import native

        status = native.load()
        if not status.available:
            p.error(f"--switch weight_prefetch needs vllm_omni's native kernels: {status.reason}")
    body = run(args)
    med, out = body["median_step_ms"], body["median_outside_model_ms"]
    save_and_exit(args.out, "step_ab", body, __spec__.name, argv,
                  f"{body['switch']}: {body['a']} {med[body['a']]:.2f} ms, {body['b']} "
                  f"{med[body['b']]:.2f} ms per step; pairwise {body['a']}/{body['b']} "
                  f"{body['pairwise_ratio_median']:.3f} ({body['pairs_b_faster']}/{body['pairs']} "
                  f"pairs {body['b']} faster); outside the model {out[body['a']]:.3f} vs "
                  f"{out[body['b']]:.3f} ms, pairwise "
                  f"{body['outside_model_pairwise_ratio_median']:.3f} "
                  f"({body['outside_model_pairs_b_faster']}/{body['pairs']}); same tokens "
                  f"{body['same_tokens']}")


if __name__ == "__main__":
    main()
