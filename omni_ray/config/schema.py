"""The sweep schema: frozen, typed dataclasses that validate themselves when built.

Every field has one checker (``STAGE_FIELDS`` and friends); the same checker validates a YAML
value, each value of a matrix axis, and a dataclass built directly from Python, so a bad value
can never sit in a config object. ``*_from_dict`` give errors the file and field path.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from omni_ray.config import fields as f
from omni_ray.config.fields import FrozenDict, Where, thaw

ENGINES = ("vllm", "llamacpp", "transformers")

STAGE_FIELDS: dict[str, f.Check] = {
    "model": f.model,
    "engine": f.choice(*ENGINES),
    "dtype": f.choice("bfloat16", "float32", "float16"),
    "quantization": f.optional(f.choice("cpu_int4", "cpu_int4_a8", "Q8_0", "Q4_0")),
    "kv_cache_mib": f.optional(f.integer(gt=0)),
    "max_model_len": f.integer(gt=0),
    "max_num_seqs": f.integer(gt=0),
    "enforce_eager": f.boolean,
    "multiprocessing": f.boolean,
    "env": f.env,
    "disable_patches": f.patch_names,
    "warm_start": f.boolean,
    "cpp_wrapper": f.boolean,
    "serial_kernels": f.boolean,
    "engine_args": f.engine_args,
    "memory_limit_mib": f.optional(f.integer(gt=0)),
}
STAGE_REQUIRED = ("model",)
# Required for these engines only (vLLM's explicit KV budget); other engines refuse it.
ENGINE_REQUIRED = {"vllm": ("kv_cache_mib",), "llamacpp": (), "transformers": ()}

# The stage fields each engine gives a meaning to. Any other field must stay at its default on
# that engine's arms: a value it would silently ignore is refused instead. llama.cpp and
# transformers size their own KV cache, compile nothing and load no vllm_omni patch.
_COMMON_STAGE = ("model", "engine", "dtype", "quantization", "max_model_len", "env")
ENGINE_STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "vllm": tuple(STAGE_FIELDS),
    "llamacpp": _COMMON_STAGE + ("engine_args",),
    "transformers": _COMMON_STAGE,
}
# What ``engine_args`` holds on a llama.cpp arm: the settings its users tune, each one value or a
# list the engine tries, keeping the fastest per test (none given: flash attention on and off,
# all the slot's CPUs and half of them as threads).
LLAMACPP_ENGINE_ARGS = {"flash_attn": ("on", "off", "auto"), "threads": None}
# quantization values per engine (None: the dtype's weights as they are)
ENGINE_QUANTIZATION: dict[str, tuple[str | None, ...]] = {
    "vllm": (None, "cpu_int4", "cpu_int4_a8"),  # cpu_int4_a8: W4A8 activations
    "llamacpp": (None, "Q8_0", "Q4_0"),
    "transformers": (None,),
}
# Why a field has no meaning on an engine: the end of its refusal.
_NO_MEANING_WHY = {
    "kv_cache_mib": "it sizes its own KV cache",
    "max_num_seqs": "it runs one sequence per batch row",
    "enforce_eager": "it compiles nothing",
    "multiprocessing": "it has no EngineCore process",
    "disable_patches": "vllm_omni's patches are vLLM's",
    "warm_start": "it compiles nothing",
    "cpp_wrapper": "it compiles nothing",
    "serial_kernels": "it compiles nothing",
    "engine_args": "they are vllm.LLM's",
}

WORKLOAD_FIELDS: dict[str, f.Check] = {
    "prompt_len": f.integer(gt=0),
    "output_len": f.integer(ge=2),  # decode time is taken by difference of N and 1 tokens
    "batch": f.integer(gt=0),
    "context_len": f.integer(ge=0),
    "warmup": f.integer(ge=0),
    "repeats": f.integer(gt=0),
    "detokenize": f.boolean,
    # after the speed, the fixed quality probe on the same engine (omni_ray/workload/quality.py)
    "quality": f.quality,
    # serving (docs/serving.md); offline arms leave these at their defaults
    "mode": f.choice("offline", "serving"),
    "request_rate": f.request_rates,
    "burstiness": f.number(gt=0),
    "max_concurrency": f.optional(f.integer(gt=0)),
    "num_requests": f.integer(gt=0),
    "warmup_requests": f.integer(ge=0),
    "prompt_len_max": f.optional(f.integer(gt=0)),
    "output_len_max": f.optional(f.integer(gt=0)),
    "prompt_file": f.optional(f.prompt_file),
    "percentiles": f.percentiles,
    "slo": f.slo,
    "search": f.optional(f.search),
    "users": f.optional(f.user_counts),
    "think_time_s": f.number(ge=0),
    "duration_s": f.optional(f.number(gt=0)),
}
# Fields that only a serving arm uses, and those only an offline arm uses.
SERVING_FIELDS = ("request_rate", "burstiness", "max_concurrency", "num_requests",
                  "warmup_requests", "prompt_len_max", "output_len_max", "prompt_file",
                  "percentiles", "slo", "search", "users", "think_time_s", "duration_s")
OFFLINE_FIELDS = ("batch", "context_len", "warmup", "repeats", "quality")

# A pipeline stage (``stages:``, docs/pipelines.md): a full stage config plus its placement.
# ``cores``: how many of the arm's slot CPUs it gets (None: an equal share of what the stages
# with a number leave); ``node``: the NUMA node it must run on (None: the previous stage's);
# ``window``: its input streams from the previous stage in chunks of this many tokens as they
# are produced (None: all at once, when the previous stage has finished).
STAGE_PLACEMENT_FIELDS: dict[str, f.Check] = {
    "cores": f.optional(f.integer(gt=0)),
    "node": f.optional(f.integer(ge=0)),
    "window": f.optional(f.integer(gt=0)),
}
PIPELINE_STAGE_FIELDS: dict[str, f.Check] = {**STAGE_FIELDS, **STAGE_PLACEMENT_FIELDS}
# A matrix or zip key addressing one pipeline stage's field: ``stages[1].kv_cache_mib``.
STAGE_AXIS = re.compile(r"stages\[(\d+)\]\.(\w+)")

PLACEMENT_FIELDS: dict[str, f.Check] = {
    "slot_cores": f.optional(f.integer(gt=0)),
    "nodes": f.optional(f.node_list),
    "max_slots": f.optional(f.integer(gt=0)),
    "ray_nodes": f.optional(f.ray_node_list),
    "replicas": f.replicas,
    "share_engine": f.boolean,
    "bandwidth_probe": f.boolean,
}

NOISE_FIELDS: dict[str, f.Check] = {
    "spread_pct": f.number(gt=0),
}

# ``compare:`` (docs/compare.md): arms measured as interleaved pairs against a baseline arm,
# both engines loaded on one slot, taking turns seconds apart; a sign test says which is faster.
def _label(value: object, where: Where) -> str:
    if not isinstance(value, str) or not value:
        raise where.error("must be the label of one arm", value)
    return value


def _labels(value: object, where: Where) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise where.error("must be a non-empty list of arm labels", value)
    return tuple(_label(v, where / i) for i, v in enumerate(value))


COMPARE_METRICS = ("decode_tok_s", "prefill_tok_s")
COMPARE_FIELDS: dict[str, f.Check] = {
    "baseline": _label,
    "arms": f.optional(_labels),
    "pairs": f.integer(ge=2),
    "metric": f.choice(*COMPARE_METRICS),
}


# What a matrix or zip key may name: one namespace, so a name says which config it sets.
AXIS_FIELDS: dict[str, f.Check] = {
    **STAGE_FIELDS, **WORKLOAD_FIELDS, "slot_cores": PLACEMENT_FIELDS["slot_cores"],
    "replicas": PLACEMENT_FIELDS["replicas"]}
assert len(AXIS_FIELDS) == len(STAGE_FIELDS) + len(WORKLOAD_FIELDS) + 2, "axis names collide"


def axis_check(key: object) -> f.Check | None:
    """The checker of a matrix or zip key: a field name, or ``stages[i].field``; None if neither."""
    if not isinstance(key, str):
        return None
    if key in AXIS_FIELDS:
        return AXIS_FIELDS[key]
    m = STAGE_AXIS.fullmatch(key)
    return PIPELINE_STAGE_FIELDS.get(m.group(2)) if m else None


def _recheck(obj: object, table: Mapping[str, f.Check]) -> None:
    """Validate and normalise every field of a just-built dataclass, in place."""
    where = Where(type(obj).__name__, os.getcwd())
    for name, check in table.items():
        object.__setattr__(obj, name, check(getattr(obj, name), where / name))


class _Config:
    """Shared by the config dataclasses: ``to_dict()`` gives plain, stable, JSON-able data."""

    def to_dict(self) -> dict[str, Any]:
        return {field.name: _plain(getattr(self, field.name))
                for field in dataclasses.fields(self)}  # type: ignore[arg-type]


def _plain(value: object) -> object:
    return value.to_dict() if isinstance(value, _Config) else thaw(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageConfig(_Config):
    """One engine (vLLM by default): what it loads and how it is built."""

    model: str                      # a shape name from SHAPES, or an absolute model directory
    engine: str = "vllm"            # vllm | llamacpp | transformers (omni_ray/engines/)
    dtype: str = "bfloat16"         # bfloat16 | float32 | float16
    quantization: str | None = None  # None | "cpu_int4" | "cpu_int4_a8" (vllm) | "Q8_0" | "Q4_0"
    kv_cache_mib: int | None = None  # vllm: explicit KV budget (kv_cache_memory_bytes / 2**20)
    max_model_len: int = 1024
    max_num_seqs: int = 8
    enforce_eager: bool = True
    multiprocessing: bool = False   # vLLM's own V1 multiprocessing (EngineCore in a child)
    env: dict[str, str] = dataclasses.field(default_factory=FrozenDict)  # engine process env
    disable_patches: tuple[str, ...] = ()  # vllm_omni patches to switch off (ablation)
    warm_start: bool = False        # start once before measuring, so the compile cache is warm
    cpp_wrapper: bool = False       # compiled stages: inductor's C++ wrapper drives the graph
    serial_kernels: bool = False    # compiled stages: inductor's kernels open no OpenMP region
    engine_args: dict[str, Any] = dataclasses.field(default_factory=FrozenDict)  # to vllm.LLM
    # the engine tree's RssAnon may not pass this: the launcher kills it and records the arm
    # failed, out of memory, with its peak (engine/launch.py says why not a cgroup or rlimit)
    memory_limit_mib: int | None = None

    def __post_init__(self) -> None:
        _recheck(self, STAGE_FIELDS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineStage(_Config):
    """One stage of a pipeline: its engine config and where in the arm's slot it runs.

    Stage i+1's input is stage i's output token ids, each mapped into its vocabulary as
    ``id % vocab_size`` (the one declared rule, MAP_RULE), after stage i has finished or, with
    ``window``, in chunks as they are produced (the rule: engines/handover.py)."""

    stage: StageConfig
    cores: int | None = None        # CPUs of its slot (None: an equal share of the rest)
    node: int | None = None         # the NUMA node it must run on (None: the previous stage's)
    window: int | None = None       # input streamed in chunks of this many tokens (None: whole)

    def __post_init__(self) -> None:
        if not isinstance(self.stage, StageConfig):
            raise TypeError(f"stage must be a StageConfig, got {type(self.stage).__name__}")
        _recheck(self, STAGE_PLACEMENT_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        return {**self.stage.to_dict(), "cores": self.cores, "node": self.node,
                **({"window": self.window} if self.window is not None else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> PipelineStage:
        d = dict(d)
        placement = {k: d.pop(k) for k in STAGE_PLACEMENT_FIELDS if k in d}
        return cls(stage=stage_from_dict(d, source), **placement)


MAP_RULE = "id % vocab_size"  # how a stage's output ids become the next stage's input ids


def stage_nodes(stages: tuple[PipelineStage, ...], first: int | None) -> list[int | None]:
    """Each stage's NUMA node: its own ``node``, else the previous stage's; stage 0's, else
    ``first`` (the node of the slot the arm got)."""
    out: list[int | None] = []
    for ps in stages:
        out.append(ps.node if ps.node is not None else out[-1] if out else first)
    return out


def place_stages(stages: tuple[PipelineStage, ...], first: int | None,
                 slots: Mapping[int | None, list[int]]) -> list[tuple[int | None, list[int]]]:
    """Each stage's (node, CPUs): the stages on one node split that node's slot CPUs
    (``slots``: node -> CPUs) in stage order, as ``split_cores`` does."""
    nodes = stage_nodes(stages, first)
    placed: list[tuple[int | None, list[int]]] = [(n, []) for n in nodes]
    for node in dict.fromkeys(nodes):
        if node not in slots:
            i = nodes.index(node)
            raise ValueError(f"stage {i}: node {node} has no slot of this arm (slots on nodes "
                             f"{sorted(slots, key=str)})")
        mine = [i for i, n in enumerate(nodes) if n == node]
        for i, cpus in zip(mine, split_cores(tuple(stages[i] for i in mine), list(slots[node]))):
            placed[i] = (node, cpus)
    return placed


def split_cores(stages: tuple[PipelineStage, ...], cpus: list[int]) -> list[list[int]]:
    """Each stage's CPUs: consecutive runs of the slot's ``cpus`` in stage order; a stage
    without ``cores`` takes an equal share (at least one) of what the others leave."""
    fixed = sum(s.cores or 0 for s in stages)
    free = [s for s in stages if s.cores is None]
    share = (len(cpus) - fixed) // len(free) if free else 0
    counts = [s.cores if s.cores is not None else share for s in stages]
    if fixed > len(cpus) or any(c < 1 for c in counts):
        raise ValueError(f"stages need {counts} CPUs, the slot has {len(cpus)} ({cpus})")
    out, at = [], 0
    for c in counts:
        out.append(list(cpus[at:at + c]))
        at += c
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkloadConfig(_Config):
    """What is run against a ready engine, and how often it is measured."""

    prompt_len: int = 32
    output_len: int = 16            # >= 2: decode per token = (N-token run - 1-token run) / (N-1)
    batch: int = 1
    context_len: int = 0            # fill the KV cache to this many tokens before measuring
    warmup: int = 1
    repeats: int = 3
    detokenize: bool = True         # False: token ids only, as llama-bench and vLLM's
                                    # --disable-detokenize benchmarks measure
    # {tokens, sequence_len} (``true``: the defaults): after its speed, the arm's engine runs
    # the fixed quality probe (greedy ids, teacher-forced log-probabilities; docs/quality.md)
    quality: dict | None = None
    # serving (docs/serving.md): an async engine fed by a load generator in the same process
    mode: str = "offline"           # offline | serving
    request_rate: tuple = ("inf",)  # req/s per load point, each served on the same engine
    burstiness: float = 1.0         # gamma shape of the gaps; 1 = Poisson
    max_concurrency: int | None = None  # requests in flight at most (None: no limit)
    num_requests: int = 32          # measured requests per load point
    warmup_requests: int = 2        # sent once before the first load point, not counted
    prompt_len_max: int | None = None  # set: prompt lengths uniform in [prompt_len, this]
    output_len_max: int | None = None  # set: output lengths uniform in [output_len, this]
    prompt_file: str | None = None  # prompts from this file, one a line (real tokenizer)
    percentiles: tuple = (90.0, 99.0)  # reported besides mean and median
    slo: dict = dataclasses.field(default_factory=FrozenDict)  # ttft_ms/tpot_ms/e2e_ms -> ms
    search: dict | None = None      # {over, percentile, low, high, steps}: bisect the capacity
    users: tuple | None = None      # a closed loop of N users per load point (instead of rates)
    think_time_s: float = 0.0       # a user's pause between a reply and its next request
    duration_s: float | None = None  # each load point sends for this long (not num_requests)

    def __post_init__(self) -> None:
        _recheck(self, WORKLOAD_FIELDS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlacementConfig(_Config):
    """Where arms run: cores per slot (None = a whole NUMA node), which NUMA nodes of each Ray
    node (None = all), which Ray nodes (labels ``key=value``, host names, addresses or node ids;
    None = all) and how many slots at most run at once (None = every free slot)."""

    slot_cores: int | None = None
    nodes: tuple[int, ...] | None = None
    max_slots: int | None = None
    ray_nodes: tuple[str, ...] | None = None
    replicas: int | str = 1         # "per_node": one engine per NUMA node at once, summed
    # Arms of one pass whose stage configs are equal run on one engine start, one after
    # another (docs/serving.md); false: a fresh engine process per arm.
    share_engine: bool = True
    # Each slot's read bandwidth, probed once per run and regime before an engine loads, gives
    # every decode figure its speed-of-light fraction (docs/measurements.md); false: no probe.
    bandwidth_probe: bool = True

    def __post_init__(self) -> None:
        _recheck(self, PLACEMENT_FIELDS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompareConfig(_Config):
    """Paired comparisons (docs/compare.md): each of ``arms`` (None: every other arm) against
    ``baseline``, ``pairs`` turns each, the order alternating, on ``metric``."""

    baseline: str
    arms: tuple[str, ...] | None = None
    pairs: int = 20
    metric: str = "decode_tok_s"

    def __post_init__(self) -> None:
        _recheck(self, COMPARE_FIELDS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoiseConfig(_Config):
    """When a result is flagged NOISY: spread across passes above ``spread_pct`` percent."""

    spread_pct: float = 8.0

    def __post_init__(self) -> None:
        _recheck(self, NOISE_FIELDS)


def check_axes(matrix: object, zip_groups: object, where: Where,
               ) -> tuple[FrozenDict, tuple[FrozenDict, ...]]:
    """Validate ``matrix`` (field -> values) and ``zip`` (groups of field -> equal-length values).

    Returns them frozen, every value normalised by its field's checker. A field may be swept by
    one axis only; values within an axis must differ (two equal arms would share an id).
    """
    placed: dict[str, str] = {}  # field -> the axis that sweeps it, for the "twice" error

    def values_of(data: Mapping, at: Where, axis: str) -> FrozenDict:
        out = {}
        for key, values in data.items():
            check = axis_check(key)
            if check is None:
                raise f.unknown_key(at, key, [*AXIS_FIELDS, "stages[<i>].<field>"])
            if key in placed:
                raise (at / key).error(f"already swept by {placed[key]}")
            placed[key] = axis
            if not isinstance(values, (list, tuple)):
                raise (at / key).error("must be a list of values", values)
            if not values:
                raise (at / key).error("must list at least one value", values)
            out[key] = tuple(check(v, at / key / i) for i, v in enumerate(values))
        return FrozenDict(out)

    def no_repeats(rows: list, at: Where, key: str | None) -> None:
        seen: dict[str, int] = {}
        for i, row in enumerate(rows):
            text = f.canonical_json(row)
            if text in seen:
                spot = at / key / i if key else at / i
                raise spot.error(f"repeats entry [{seen[text]}]", thaw(row))
            seen[text] = i

    if matrix is None:
        matrix = {}
    if not isinstance(matrix, Mapping):
        raise (where / "matrix").error("must be a mapping of field -> list of values", matrix)
    frozen_matrix = values_of(matrix, where / "matrix", "matrix")
    for key, values in frozen_matrix.items():
        no_repeats(list(values), where / "matrix", key)

    if zip_groups is None:
        zip_groups = ()
    if not isinstance(zip_groups, (list, tuple)):
        raise (where / "zip").error("must be a list of mappings field -> list of values",
                                    zip_groups)
    groups = []
    for g, group in enumerate(zip_groups):
        at = where / "zip" / g
        if not isinstance(group, Mapping) or not group:
            raise at.error("must be a non-empty mapping of field -> list of values", group)
        frozen = values_of(group, at, f"zip[{g}]")
        keys = list(frozen)
        for key in keys[1:]:
            if len(frozen[key]) != len(frozen[keys[0]]):
                raise (at / key).error(
                    f"has {len(frozen[key])} values but {keys[0]} has {len(frozen[keys[0]])}; "
                    "zipped lists must have equal lengths")
        no_repeats([[frozen[k][i] for k in keys] for i in range(len(frozen[keys[0]]))], at, None)
        groups.append(frozen)
    return frozen_matrix, tuple(groups)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig(_Config):
    """One sweep file: a base stage and workload, and the axes that vary them.

    ``stage`` is the base every arm starts from. A required stage field given only by an axis
    (``kv_cache_mib`` swept in ``matrix``) takes that axis' first value here; every arm then
    overrides it. Axes: each ``matrix`` key, then each ``zip`` group, last one fastest.
    """

    name: str
    source: str                     # the file (as given), or "<dict>"
    stage: StageConfig
    workload: WorkloadConfig = dataclasses.field(default_factory=WorkloadConfig)
    matrix: dict[str, tuple] = dataclasses.field(default_factory=FrozenDict)
    zip: tuple[dict[str, tuple], ...] = ()
    passes: int = 3                 # interleaved passes over all arms
    placement: PlacementConfig = dataclasses.field(default_factory=PlacementConfig)
    timeout_s: float = 600.0        # per arm
    noise: NoiseConfig = dataclasses.field(default_factory=NoiseConfig)
    include: tuple[str, ...] = ()   # the fragments merged in, absolute paths, in merge order
    baseline: str | None = None     # the label of the arm the report divides the others by
    stages: tuple[PipelineStage, ...] = ()  # a pipeline (docs/pipelines.md); stage = stages[0]
    compare: CompareConfig | None = None  # paired comparisons after the passes (docs/compare.md)

    def __post_init__(self) -> None:
        where = Where(self.source or "SweepConfig", os.getcwd())
        object.__setattr__(self, "stages", tuple(self.stages))
        for i, ps in enumerate(self.stages):
            if not isinstance(ps, PipelineStage):
                raise (where / "stages" / i).error("must be a PipelineStage", ps)
        checks = {"name": f.name, "passes": f.integer(gt=0), "timeout_s": f.number(gt=0)}
        for field, check in checks.items():
            object.__setattr__(self, field, check(getattr(self, field), where / field))
        for field, cls in (("stage", StageConfig), ("workload", WorkloadConfig),
                           ("placement", PlacementConfig), ("noise", NoiseConfig)):
            if not isinstance(getattr(self, field), cls):
                raise (where / field).error(f"must be a {cls.__name__}", getattr(self, field))
        matrix, zip_groups = check_axes(self.matrix, self.zip, where)
        object.__setattr__(self, "matrix", matrix)
        object.__setattr__(self, "zip", zip_groups)
        object.__setattr__(self, "include", tuple(self.include))


_MISPLACED = {
    **{k: "belongs under stage:" for k in STAGE_FIELDS if k != "model"},
    **{k: "belongs under workload:" for k in WORKLOAD_FIELDS},
    **{k: "belongs under placement:" for k in PLACEMENT_FIELDS},
    **{k: "belongs under noise:" for k in NOISE_FIELDS},
}


def stage_from_dict(d: Mapping[str, Any], source: str = "<dict>", *,
                    base_dir: str | None = None) -> StageConfig:
    """A StageConfig from plain data (``model`` and ``kv_cache_mib`` required).

    Relative model paths resolve against ``base_dir`` (default: the working directory).
    """
    where = Where(source, base_dir or os.getcwd())
    values = f.parse_mapping(d, where, STAGE_FIELDS, hints=_MISPLACED)
    for key in STAGE_REQUIRED:
        if key not in values:
            raise (where / key).error("required field missing")
    stage = StageConfig(**values)
    check_stage(stage, where)
    return stage


def check_stage(stage: StageConfig, where: Where, which: str = "") -> None:
    """Limits that span a stage's fields (``which`` names the arm, for sweeps). ``where`` is
    the stage's position (``stage`` in a file, the root for a stage given alone)."""
    check_engine_fields(stage, where, which)
    names = stage.env.get("VLLM_USE_LAYERNAME", "0")
    if stage.cpp_wrapper and names != "0":
        raise where.error("cpp_wrapper needs plain layer names; env.VLLM_USE_LAYERNAME must be "
                          f"0 or unset{which}", names)
    if stage.serial_kernels and "inductor_config" in stage.disable_patches:
        raise where.error("serial_kernels needs the inductor_config patch (stock vLLM on CPU "
                          f"overwrites cpp.dynamic_threads); keep it out of disable_patches{which}",
                          list(stage.disable_patches))


_STAGE_DEFAULTS = {fl.name: (fl.default if fl.default is not dataclasses.MISSING
                               else fl.default_factory())  # type: ignore[misc]
                   for fl in dataclasses.fields(StageConfig)
                   if fl.default is not dataclasses.MISSING
                   or fl.default_factory is not dataclasses.MISSING}


def check_engine_fields(stage: StageConfig, where: Where, which: str = "") -> None:
    """The fields ``stage.engine`` needs are there; those it has no meaning for are not."""
    engine = stage.engine
    for key in ENGINE_REQUIRED[engine]:
        if getattr(stage, key) is None:
            raise (where / key).error(f"required field missing for engine {engine}{which}")
    for key in STAGE_FIELDS:
        if key in ENGINE_STAGE_FIELDS[engine] or key not in _STAGE_DEFAULTS:
            continue
        value = getattr(stage, key)
        if value != _STAGE_DEFAULTS[key]:
            raise (where / key).error(f"has no meaning for engine {engine} "
                                      f"({_NO_MEANING_WHY.get(key, 'it does not use it')}); "
                                      f"leave it out{which}", thaw(value))
    if engine == "llamacpp":
        check_llamacpp_args(stage.engine_args, where / "engine_args", which)
    if stage.quantization not in ENGINE_QUANTIZATION[engine]:
        allowed = ", ".join(str(q) for q in ENGINE_QUANTIZATION[engine] if q) or "none"
        raise (where / "quantization").error(
            f"not a quantization of engine {engine} (allowed: {allowed}){which}",
            stage.quantization)


def check_llamacpp_args(args, where: Where, which: str = "") -> None:
    """``engine_args`` of a llama.cpp arm: ``flash_attn`` (on/off/auto) and ``threads`` (>= 1),
    each one value or a non-empty list of them."""
    for key, value in args.items():
        if key not in LLAMACPP_ENGINE_ARGS:
            raise (where / key).error(
                f"not a llama.cpp setting (allowed: {', '.join(LLAMACPP_ENGINE_ARGS)}){which}",
                thaw(value))
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        allowed = LLAMACPP_ENGINE_ARGS[key]
        # YAML reads a bare on/off as true/false: both mean the setting's name
        ok = bool(values) and all(
            (isinstance(v, bool) or v in allowed) if allowed
            else isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)
        if not ok:
            want = f"one of {', '.join(allowed)}" if allowed else "a thread count >= 1"
            raise (where / key).error(f"must be {want}, or a list of them{which}", thaw(value))


def check_workload_for(stage: StageConfig, workload: WorkloadConfig, where: Where,
                       which: str = "") -> None:
    """Workload fields an engine cannot honour with the same meaning as vLLM's.

    llama.cpp runs through llama-bench: one sequence (no batch), token ids only (it never
    detokenizes), and its decode runs after ``prompt_len`` tokens of context (``-d``), so a
    separate ``context_len`` fill has no counterpart.

    A serving arm needs vLLM (its async engine) and leaves the offline fields at their
    defaults; an offline arm leaves the serving fields at theirs."""
    check_mode_fields(stage, workload, where, which)
    if stage.engine != "llamacpp":
        return
    if workload.batch != 1:
        raise (where / "batch").error(
            f"must be 1 for engine llamacpp (llama-bench runs one sequence){which}",
            workload.batch)
    if workload.context_len:
        raise (where / "context_len").error(
            "has no meaning for engine llamacpp (its decode runs after prompt_len tokens, "
            f"llama-bench -d); leave it out{which}", workload.context_len)
    if workload.detokenize:
        raise (where / "detokenize").error(
            "must be false for engine llamacpp (llama-bench never detokenizes; "
            f"false measures every engine on token ids){which}", workload.detokenize)


_WORKLOAD_DEFAULTS = {fl.name: (fl.default if fl.default is not dataclasses.MISSING
                                  else fl.default_factory())  # type: ignore[misc]
                      for fl in dataclasses.fields(WorkloadConfig)}


def check_mode_fields(stage: StageConfig, workload: WorkloadConfig, where: Where,
                      which: str = "") -> None:
    """The fields of the other mode stay at their defaults; ranges are ordered."""
    serving = workload.mode == "serving"
    if serving and stage.engine != "vllm":
        raise (where / "mode").error(f"serving needs engine vllm (its async engine), not "
                                     f"{stage.engine}{which}", workload.mode)
    other = OFFLINE_FIELDS if serving else SERVING_FIELDS
    for key in other:
        value = getattr(workload, key)
        if value != _WORKLOAD_DEFAULTS[key]:
            raise (where / key).error(f"has no meaning in mode {workload.mode}; leave it out"
                                      f"{which}", thaw(value))
    for key, low in (("prompt_len_max", "prompt_len"), ("output_len_max", "output_len")):
        high = getattr(workload, key)
        if high is not None and high < getattr(workload, low):
            raise (where / key).error(f"must be >= {low} {getattr(workload, low)}{which}", high)
    if workload.search is not None and not workload.slo:
        raise (where / "search").error(f"needs an slo to meet{which}", thaw(workload.search))
    check_load_fields(workload, where, which)
    if workload.prompt_file and workload.prompt_len_max is not None:
        raise (where / "prompt_len_max").error(
            f"has no meaning with prompt_file (its prompts have their own lengths){which}",
            workload.prompt_len_max)


# A closed loop's users send when their last reply came: no arrival schedule of its own.
_OPEN_LOOP_FIELDS = ("request_rate", "burstiness", "max_concurrency")


def check_load_fields(workload: WorkloadConfig, where: Where, which: str = "") -> None:
    """A closed loop (``users``) leaves the open loop's fields at their defaults; a think time
    needs users; a ``duration_s`` replaces ``num_requests``, and an open loop sending for a
    duration at rate inf needs ``max_concurrency`` (else it sends without end)."""
    if workload.users is not None:
        for key in _OPEN_LOOP_FIELDS:
            value = getattr(workload, key)
            if value != _WORKLOAD_DEFAULTS[key]:
                raise (where / key).error(f"has no meaning with users (a closed loop sends "
                                          f"when a reply comes){which}", thaw(value))
    elif workload.think_time_s:
        raise (where / "think_time_s").error(f"needs users (a closed loop){which}",
                                             workload.think_time_s)
    if workload.duration_s is None:
        return
    if workload.num_requests != _WORKLOAD_DEFAULTS["num_requests"]:
        raise (where / "num_requests").error(
            f"has no meaning with duration_s (requests are sent until it is over){which}",
            workload.num_requests)
    if workload.users is None and workload.max_concurrency is None \
            and "inf" in workload.request_rate:
        raise (where / "request_rate").error(
            f"inf with duration_s sends without end; set max_concurrency or users{which}",
            "inf")


def workload_from_dict(d: Mapping[str, Any], source: str = "<dict>") -> WorkloadConfig:
    """A WorkloadConfig from plain data; every field has a default."""
    where = Where(source, os.getcwd())
    return WorkloadConfig(**f.parse_mapping(d, where, WORKLOAD_FIELDS, hints=_MISPLACED))
