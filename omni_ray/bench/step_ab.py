"""A developer's probe, not a benchmark a user runs: one switch, A against B, in one engine
process, as interleaved pairs of decode steps.

    python -m omni_ray.bench.step_ab configs/step_ab.yaml --switch cpu_attention --pairs 30

On a shared machine two runs minutes apart can differ by more than the change being judged
(here the same decode step took 12-21 ms from run to run), so an A/B of two processes can come
out reversed. Here one in-process engine decodes with A, then with B, ``--pairs`` times,
alternating which side goes first (after ``workload.warmup`` uncounted rounds of both). A side's
step time is taken by difference, (``output_len``-token run - 1-token run) / (output_len - 1),
on the same prompts, as a sweep takes its decode time.

The engine and the workload are an ordinary one-arm sweep file's (configs/step_ab.yaml), read
and checked by the sweep's own loader: a bad field is one line naming the file, the field and
the value, and exit 2. The fields step_ab reads: the stage (model, dtype, quantization,
kv_cache_mib, max_model_len, enforce_eager, cpp_wrapper, serial_kernels, env, disable_patches,
engine_args), ``workload.prompt_len``, ``output_len``, ``batch``, ``warmup``, ``detokenize`` and
``placement.slot_cores`` (the first that many CPUs this process may run on; default all). What
has no meaning in one in-process engine (several arms, pipelines, serving, ``context_len``, the
quality probe, replicas, ``multiprocessing``, other engines) is refused the same way.

The comparison is the one a sweep's ``compare:`` makes (``results.pairs``), with B as the arm
and A as the baseline on ``decode_tok_s``: the pairwise ratios B / A of the decode rate (the
same as A / B of the step time: > 1, B is faster), their median, the sign test; and whether both
sides produced the same tokens. A pair during which something else used the CPUs
(``measure.cpuload.NeighbourLoad`` over the pair, above compare's limit) is counted and left
out, as compare: leaves it out.

A change to vLLM's per-step Python is a few percent of a step, below what 30 pairs of whole steps
resolve here (a pair's ratio scatters by ~10 %). So each step is also split, by the same
difference, into the time inside the model (``GPUModelRunner._model_forward`` and
``LogitsProcessor.forward``: the weight-streaming part) and the rest of ``LLMEngine.step``
(``outside_model_ms``: scheduling, input preparation, sampling, output handling), and the
pairwise ratios A / B of that rest are reported too.

Switches, each flipped at run time without restarting the engine:

- ``cpu_attention``: A is vLLM's own attention ops, B is vllm_omni's short path (the patch is
  removed and applied again; the engine starts with it switched off).
- ``weight_prefetch``: the int4 VNNI GEMV prefetching weights into L2 (A, the default) or
  non-temporally (B).
- ``gemv_streams``: the int4 GEMV of one row reading one block of weights at a time (A) or up
  to four side by side (B; ``set_gemv_streams``). Each set's default is its ``kGemvStreams``:
  1 in the avx512bf16 set (AMD Zen 4/5), 4 in the other AVX-512 sets, 1 where a set can only
  read one.
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
  or straight to inductor's C++ entry (B); needs ``stage.cpp_wrapper: true``.

The result is written as a sweep writes a ``compare:`` pair: a versioned record with the
sweep's provenance (``results.record``, written atomically by ``results.store``) at
``<out>/<sweep name>/<UTC run id>/pairs/<switch>.json``, and ``summary.md`` beside it with
compare's table (``results.pairs.pairs_markdown``). The results before this layout are
``results/step_ab/<UTC timestamp>.json``, from flags instead of a sweep file (``--shape``,
``--model``, ``--eager``, ``--cpp-wrapper``; the model was a cpu_int4 g128 checkpoint made by
``omni-ray quantize``, where configs/step_ab.yaml quantizes at load, to the same layout).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from omni_ray.cli import user_error_types
from omni_ray.config import Arm, SweepConfig, WorkloadConfig, expand, load_sweep_file
from omni_ray.config.fields import thaw
from omni_ray.engine.pairs import turn_order
from omni_ray.engines.request import EngineRequest
from omni_ray.errors import ConfigError, UserError
from omni_ray.measure.cpuload import NeighbourLoad, contended_during
from omni_ray.results.pairs import pair_stats, pairs_markdown, summarize_pairs
from omni_ray.results.record import make_record
from omni_ray.results.store import read_json, write_json_atomic, write_text_atomic

SWITCHES = {
    "cpu_attention": ("vllm", "vllm_omni"),
    "attention_kernels": ("python", "cpp"),
    "weight_prefetch": ("l2", "nta"),
    "gemv_streams": ("1", "4"),
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
# The figure the pairs compare, as a sweep's compare: names it (higher is better).
METRIC = "decode_tok_s"


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
    if switch == "gemv_streams":
        from vllm_omni.ops import native

        return lambda side: native.ops().set_gemv_streams(int(side))
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

    def step_ms(self, steps: int) -> float:
        """Per decode step, by difference of the last two marked runs (1 token, then ``steps``
        decode steps more), as :func:`decode_step_ms` takes the wall time."""
        one, many = (self.marks[-2] - self.marks[-3], self.marks[-1] - self.marks[-2])
        return (many - one) / steps * 1e3



@dataclasses.dataclass(frozen=True)
class StepAB:
    """What one run compares: the sweep file's one arm (its stage with the switch's patch off
    at the start, for a patch switch), the switch, how many pairs, and the CPUs it runs on."""

    sweep: SweepConfig
    arm: Arm
    switch: str
    pairs: int
    cpus: tuple[int, ...]

    @property
    def sides(self) -> tuple[str, str]:
        return SWITCHES[self.switch]

    def request(self) -> EngineRequest:
        """The engine's request, as a sweep builds it for an arm (``engines.vllm`` turns it
        into the environment and ``vllm.LLM``'s arguments)."""
        return dataclasses.replace(EngineRequest.for_arm(self.arm, 0), cpus=self.cpus)


# What has no meaning in one in-process engine: (field path, the arm's value, the one value
# step_ab takes, what to do instead). A sweep file's other fields (timeout_s, noise:,
# placement.share_engine, ...) change nothing here.
_PAIRS_SAY = "leave it out; --pairs says how many"
_SWEEP_DEFAULTS = {fl.name: fl.default for fl in dataclasses.fields(SweepConfig)}


def _refusals(sweep: SweepConfig, arm: Arm) -> list[tuple[str, object, object, str]]:
    s, w, out = arm.stage, arm.workload, "leave it out"
    return [("stage.engine", s.engine, "vllm", "only vllm here"),
            ("stage.multiprocessing", s.multiprocessing, False,
             "only false here: the switch flips this process's engine"),
            ("stages", len(arm.stages) or None, None, out),
            ("workload.mode", w.mode, "offline", "only offline here"),
            ("workload.context_len", w.context_len, 0, out),
            ("workload.quality", w.quality, None, out),
            ("workload.repeats", w.repeats, WorkloadConfig().repeats, _PAIRS_SAY),
            ("passes", sweep.passes, _SWEEP_DEFAULTS["passes"], _PAIRS_SAY),
            ("placement.replicas", arm.replicas, 1, out),
            ("placement.nodes", sweep.placement.nodes, None,
             "leave it out; step_ab runs on this process's CPUs (placement.slot_cores: how many)"),
            ("placement.ray_nodes", sweep.placement.ray_nodes, None, out),
            ("compare", sweep.compare and sweep.compare.to_dict(), None, out)]


def load(path: str | os.PathLike, switch: str, pairs: int,
         affinity: Sequence[int] | None = None) -> StepAB:
    """Read the sweep file with the sweep's loader and check what step_ab adds: one arm, one
    vLLM engine in this process, the switch's needs. ``affinity``: the CPUs this process may
    run on (default: its own). Raises ``UserError`` (``ConfigError`` naming the field)."""
    if switch not in SWITCHES:
        raise UserError(f"--switch: must be one of {', '.join(sorted(SWITCHES))}, got {switch!r}")
    if pairs < 1:
        raise UserError(f"--pairs: must be >= 1, got {pairs}")
    sweep = load_sweep_file(path)
    src = sweep.source
    arms = expand(sweep)
    if len(arms) != 1:
        raise ConfigError(src, "matrix" if sweep.matrix else "zip",
                          f"step_ab runs one arm; the file makes {len(arms)} "
                          f"({', '.join(a.label for a in arms)})")
    arm = arms[0]
    for field, value, wanted, fix in _refusals(sweep, arm):
        if value != wanted:
            raise ConfigError(src, field, f"has no meaning for step_ab (one vLLM engine in this "
                                          f"process); {fix}", thaw(value))
    stage = arm.stage
    if stage.cpp_wrapper and stage.enforce_eager:
        raise ConfigError(src, "stage.cpp_wrapper", "needs a compiled engine "
                                                    "(stage.enforce_eager: false)", True)
    if switch == "compiled_entry" and not stage.cpp_wrapper:
        raise ConfigError(src, "stage.cpp_wrapper", "--switch compiled_entry needs it true (the "
                                                    "entry is the C++ wrapper's)", False)
    if switch in ("weight_prefetch", "gemv_streams"):
        from vllm_omni.ops import native

        status = native.load()
        if not status.available:
            raise UserError(f"--switch {switch} needs vllm_omni's native kernels: "
                            f"{status.reason}")
    if switch in PATCH_SWITCHES and switch not in stage.disable_patches:
        # the engine starts with the patch off: A is vLLM's own, B applies it again
        arm = dataclasses.replace(arm, stage=dataclasses.replace(
            stage, disable_patches=(*stage.disable_patches, switch)))
    allowed = sorted(os.sched_getaffinity(0) if affinity is None else affinity)
    if arm.slot_cores is not None and arm.slot_cores > len(allowed):
        raise ConfigError(src, "placement.slot_cores", f"more than the {len(allowed)} CPUs this "
                                                       f"process may run on", arm.slot_cores)
    return StepAB(sweep, arm, switch, pairs, tuple(allowed[:arm.slot_cores]))


def in_process_engine(req: EngineRequest):
    """(an engine in this process, pinned to ``req.cpus``, and its model directory, resolved
    as a sweep resolves it). Call before anything else imports vLLM: the environment a sweep's
    engine gets is set first (vLLM reads some of it at import)."""
    from omni_ray.engines.vllm import engine_env, engine_kwargs
    from omni_ray.measure.pinning import pin_all_threads
    from omni_ray.models.build import resolve_model

    path = resolve_model(req.model)
    os.environ.update(engine_env(req))
    pin_all_threads(req.cpus)
    import vllm_omni
    from vllm import LLM

    vllm_omni.register()
    return LLM(**engine_kwargs(req, str(path))), path


def decode_step_ms(llm, prompts: list[list[int]], output_len: int, sampling: dict,
                   timer: OutsideModel | None = None) -> tuple[float, list[list[int]]]:
    """One decode step's ms by difference of a 1-token and an ``output_len``-token run on
    ``prompts``, and the tokens. A ``timer`` is marked before and after each run."""
    from vllm import SamplingParams

    from omni_ray.engines.vllm import timed_generate
    from omni_ray.workload.prompts import decode_seconds_per_token

    marks = timer.mark if timer else (lambda: None)
    marks()
    t1, _ = timed_generate(llm, prompts, SamplingParams(max_tokens=1, **sampling))
    marks()
    tn, out = timed_generate(llm, prompts, SamplingParams(max_tokens=output_len, **sampling))
    marks()
    return (decode_seconds_per_token(t1, tn, output_len) * 1e3,
            [list(o.outputs[0].token_ids) for o in out])


Step = Callable[[], tuple[float, float | None, list]]


def take_pairs(flip: Callable[[str], None], step: Step, sides: tuple[str, str], pairs: int,
               warmup: int = 1, watch: Callable[[], Callable[[], dict]] | None = None) -> dict:
    """``warmup`` uncounted rounds of both sides, then ``pairs`` pairs in compare:'s order (the
    first side first in even pairs). ``step()``: (the step's ms, its ms outside the model or
    None, the tokens). ``watch()``, when given, starts watching the CPUs for a pair and returns
    what ends it with its figures (``measure.cpuload.NeighbourLoad``). Returns each side's step
    and outside-model ms in pair order, each pair's neighbour figures, and whether each side
    made the same tokens every time and both the same."""
    a, b = sides
    ms: dict[str, list[float]] = {a: [], b: []}
    outside: dict[str, list[float | None]] = {a: [], b: []}
    neighbours: list[dict] = []
    tokens: dict[str, list | None] = {}
    for _ in range(warmup):
        for side in sides:
            flip(side)
            step()
    # the order a compare: pair's turns take (engine.pairs): A then B, then B then A, ...
    for _, turns in itertools.groupby(turn_order(pairs), key=lambda turn: turn[0]):
        stop = watch() if watch else None
        for _, i in turns:
            side = sides[i]
            flip(side)
            t, out, ids = step()
            ms[side].append(t)
            outside[side].append(out)
            if tokens.setdefault(side, ids) != ids:
                tokens[side] = None  # greedy decoding of the same prompts changed within a side
        if stop:
            neighbours.append(stop())
    flip(a)
    return {"step_ms": ms, "outside_model_ms": outside, "neighbours": neighbours,
            "same_tokens": tokens.get(a) is not None and tokens.get(a) == tokens.get(b)}


def pair_measurements(sides: tuple[str, str], taken: dict, batch: int = 1) -> dict:
    """The pairs as a sweep's ``compare:`` records them (``results.pairs.pair_stats``), B the
    arm and A the baseline, on the decode rate (``batch`` tokens a step; ratio B / A, > 1: B is
    faster), plus each side's step ms; the outside-model ms as ratios A / B (> 1: B spends
    less), when measured. A pair that ran beside a neighbour is counted and left out, as
    compare: leaves it out."""
    a, b = sides
    ms = taken["step_ms"]
    neighbours = taken.get("neighbours") or []
    contended = [contended_during(n) is not None for n in neighbours]
    rate = {s: [batch * 1e3 / t if t > 0 else None for t in v] for s, v in ms.items()}
    out = pair_stats(rate[b], rate[a], contended) | {
        "metric": METRIC, "step_ms": ms, "same_tokens": taken["same_tokens"],
        "median_step_ms": {s: statistics.median(v) for s, v in ms.items()},
        "neighbours": neighbours}
    outside = taken.get("outside_model_ms") or {}
    if outside and all(x is not None for v in outside.values() for x in v):
        out.update(outside_model_ms=outside,
                   outside_model=pair_stats(outside[a], outside[b], contended) | {"ratio": "A / B"},
                   median_outside_model_ms={s: statistics.median(v) for s, v in outside.items()})
    return out


def make_step_record(ab: StepAB, measurements: dict, *, status: str = "ok",
                     error: str | None = None, extra: dict | None = None) -> dict:
    """The run's record, built as a ``compare:`` pair record is (``results.record``, with the
    sweep's provenance): ``config`` holds the resolved arm, the switch and the two sides'
    labels (what ``results.pairs.summarize_pairs`` reads)."""
    a, b = ab.sides
    return make_record(
        kind="step_ab", measurements=measurements, status=status, error=error,
        config={"arm": {"label": f"{ab.switch}={b}", "side": b},
                "baseline": {"label": f"{ab.switch}={a}", "side": a},
                "switch": ab.switch, "pairs": ab.pairs, "metric": METRIC,
                "engine": ab.arm.to_dict(), "source": ab.sweep.source},
        pinning={"requested_cpus": list(ab.cpus)},
        extra={"sweep": ab.sweep.name, **(extra or {})})


def summary_markdown(ab: StepAB, record: dict) -> str:
    """summary.md: what ran, compare's table of the pair, the time outside the model."""
    a, b = ab.sides
    m = record["measurements"]
    s, w = ab.arm.stage, ab.arm.workload
    mode = "eager" if s.enforce_eager else "compiled" + (", C++ wrapper" if s.cpp_wrapper else "")
    lines = [f"# step_ab: {ab.switch} ({a} vs {b})", "",
             f"{ab.sweep.source}: {s.model}, {s.quantization or s.dtype}, {mode}; "
             f"{len(ab.cpus)} CPUs; batch {w.batch}, prompt {w.prompt_len}, {w.output_len} "
             f"tokens. Both sides in one engine process, the switch flipped between them.", ""]
    if record["status"] != "ok":
        lines += [f"FAILED: {record['error']}", ""]
    elif not m.get("same_tokens"):
        lines += ["**Different tokens**: the two sides (or one side's runs) did not decode the "
                  "same tokens.", ""]
    text = "\n".join(lines) + pairs_markdown(summarize_pairs([record]))
    o = m.get("outside_model")
    if o and o.get("ratio_median") is not None:
        med = m["median_outside_model_ms"]
        text += (f"\nOutside the model (scheduling, input preparation, sampling, output "
                 f"handling): {a} {med[a]:.3f} ms, {b} {med[b]:.3f} ms a step; pairwise "
                 f"{a} / {b} {o['ratio_median']:.3f}, {b} faster in {o['wins']}/"
                 f"{o['wins'] + o['losses']} pairs (sign test p={o['sign_test_p']:.2g}).\n")
    return text


def write_run(ab: StepAB, record: dict, out: str | os.PathLike, run_id: str) -> Path:
    """``<out>/<sweep name>/<run_id>/``: the record at ``pairs/<switch>.json`` and
    ``summary.md``, each written atomically; returns the record's path."""
    run_dir = Path(out) / ab.sweep.name / run_id
    path = write_json_atomic(run_dir / "pairs" / f"{ab.switch}.json", record)
    write_text_atomic(run_dir / "summary.md", summary_markdown(ab, record))
    return path


def measure(ab: StepAB) -> tuple[dict, dict]:
    """Build the engine in this process and take the pairs: (measurements, what the record
    adds: the model directory, the patch and kernel reports, what compiled_call replayed)."""
    from omni_ray.engines.vllm import GREEDY
    from omni_ray.workload.prompts import token_prompts

    w = ab.arm.workload
    llm, model = in_process_engine(ab.request())
    import vllm_omni
    from vllm_omni.patches import compiled_call

    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    prompts = token_prompts(w.batch, w.prompt_len, vocab, seed=1)
    sampling = dict(GREEDY, detokenize=w.detokenize)
    timer = OutsideModel()

    def step() -> tuple[float, float, list]:
        t, ids = decode_step_ms(llm, prompts, w.output_len, sampling, timer)
        return t, timer.step_ms(w.output_len - 1), ids

    def watch() -> Callable[[], dict]:
        return NeighbourLoad(os.getpid(), ab.cpus).stop

    taken = take_pairs(flipper(ab.switch, sampling, llm), step, ab.sides, ab.pairs, w.warmup,
                       watch)
    return pair_measurements(ab.sides, taken, w.batch), {
        "model_path": str(model), "patch_report": vllm_omni.patch_report(),
        "kernels": vllm_omni.kernel_report(),
        # what compiled_call did with the model ([] once the patch is removed)
        "compiled_call": compiled_call.replays()}


def run(ab: StepAB, out: str | os.PathLike = "results", command: str = "",
        measure_fn: Callable[[StepAB], tuple[dict, dict]] | None = None) -> Path:
    """Measure (``measure_fn``, default :func:`measure`: the engine in this process) and write
    the run; returns the record's path. A run that fails while measuring is recorded too
    (status failed, its error), then the error goes on; bad input is not a run."""
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    t0 = time.time()
    try:
        measurements, facts = (measure_fn or measure)(ab)
    except user_error_types():  # bad input (a model that is not there): no record, one line
        raise
    except Exception as e:
        write_run(ab, make_step_record(ab, {}, status="failed", error=f"{type(e).__name__}: {e}",
                                       extra={"command": command, "run_id": run_id}),
                  out, run_id)
        raise
    timing = {"started": t0, "ended": time.time()}
    return write_run(ab, make_step_record(ab, measurements, extra={
        "command": command, "run_id": run_id, "timing": timing, **facts}), out, run_id)


def headline(record: dict) -> str:
    """One line of the result, for the terminal."""
    cfg, m = record["config"], record["measurements"]
    a, b = cfg["baseline"]["side"], cfg["arm"]["side"]
    med = m["median_step_ms"]
    line = (f"{cfg['switch']}: {a} {med[a]:.2f} ms, {b} {med[b]:.2f} ms per step; pairwise "
            f"{a}/{b} {m.get('ratio_median', float('nan')):.3f} ({m['wins']}/{m['pairs_used']} "
            f"pairs {b} faster, sign test p={m['sign_test_p']:.2g})")
    if "median_outside_model_ms" in m:
        out, o = m["median_outside_model_ms"], m["outside_model"]
        line += (f"; outside the model {out[a]:.3f} vs {out[b]:.3f} ms, pairwise "
                 f"{o.get('ratio_median', float('nan')):.3f} ({o['wins']}/{o['pairs_used']})")
    return line + f"; same tokens {m['same_tokens']}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("config", help="a one-arm sweep file (e.g. configs/step_ab.yaml)")
    p.add_argument("--switch", choices=sorted(SWITCHES), required=True)
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--out", default="results",
                   help="results root: the run goes to <out>/<sweep name>/<UTC run id>/")
    args = p.parse_args(argv)
    try:
        ab = load(args.config, args.switch, args.pairs)
        command = " ".join([sys.executable, "-m", __spec__.name,
                            *(sys.argv[1:] if argv is None else argv)])
        path = run(ab, args.out, command)
    except user_error_types() as e:  # bad input: one line, exit 2 (as the omni-ray command)
        print(f"step_ab: error: {e}", file=sys.stderr)
        return 2
    print(f"{headline(read_json(path))}  -> {path}", flush=True)
    # vLLM leaves non-daemon threads behind; the result is on disk
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
