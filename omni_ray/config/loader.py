"""From a sweep file (or a dict) to a validated SweepConfig; several files to one run."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from omni_ray.config import fields as f
from omni_ray.config.document import Document, expand_includes, read_document
from omni_ray.config.fields import Origin, Where, thaw
from omni_ray.config.grid import Arm, baselines, expand
from omni_ray.config.schema import (
    COMPARE_FIELDS, NOISE_FIELDS, PIPELINE_STAGE_FIELDS, PLACEMENT_FIELDS, STAGE_AXIS,
    STAGE_FIELDS, STAGE_PLACEMENT_FIELDS, STAGE_REQUIRED, WORKLOAD_FIELDS, CompareConfig,
    NoiseConfig, PipelineStage, PlacementConfig, StageConfig, SweepConfig, WorkloadConfig, check_axes, check_stage,
    check_workload_for, stage_nodes)
from omni_ray.errors import ConfigError, UserError
from omni_ray.models.shapes import SHAPES

TOP_LEVEL = ("name", "model", "include", "stage", "stages", "workload", "matrix", "zip",
             "passes", "placement", "timeout_s", "noise", "baseline", "compare")

_TOP_HINTS = {
    **{k: "belongs under stage:" for k in STAGE_FIELDS if k != "model"},
    **{k: "belongs under workload:" for k in WORKLOAD_FIELDS},
    **{k: "belongs under placement:" for k in PLACEMENT_FIELDS},
    **{k: "belongs under noise:" for k in NOISE_FIELDS},
}
_SECTION_HINTS = {
    **{k: "belongs under stage:" for k in STAGE_FIELDS if k != "model"},
    **{k: "belongs under workload:" for k in WORKLOAD_FIELDS},
    "model": "model is set at the top level, not under stage:",
}
_STAGE_SECTION = {k: v for k, v in STAGE_FIELDS.items() if k != "model"}


def _section(data: Mapping, key: str, table: Mapping[str, f.Check], where: Where,
             ) -> dict[str, Any]:
    raw = data.get(key)
    return {} if raw is None else f.parse_mapping(raw, where / key, table, _SECTION_HINTS)


def _build(doc: Document, where: Where) -> SweepConfig:
    data = doc.data
    for key in data:
        if key not in TOP_LEVEL:
            raise f.unknown_key(where, key, TOP_LEVEL,
                                _TOP_HINTS.get(key) if isinstance(key, str) else None)
    if "name" not in data:
        raise (where / "name").error("required field missing")
    name = f.name(data["name"], where / "name")

    stage = _section(data, "stage", _STAGE_SECTION, where)
    if "model" in data:
        stage["model"] = f.model(data["model"], where / "model")
    workload = _section(data, "workload", WORKLOAD_FIELDS, where)
    placement = _section(data, "placement", PLACEMENT_FIELDS, where)
    noise = _section(data, "noise", NOISE_FIELDS, where)
    matrix, zip_groups = check_axes(data.get("matrix"), data.get("zip"), where)

    swept = {**matrix, **{k: v for group in zip_groups for k, v in group.items()}}
    stages = _stages(data, stage, swept, where) if "stages" in data else ()
    if stages:
        stage = stages[0].stage.to_dict()
    else:
        for key in swept:
            if STAGE_AXIS.fullmatch(key):
                raise (where / "matrix" / key).error("addresses a pipeline stage, but the sweep "
                                                     "gives no stages:")
    if "kv_cache_mib" not in stage and "kv_cache_mib" in swept:
        stage["kv_cache_mib"] = swept["kv_cache_mib"][0]  # as below; engines decide if needed
    for key in STAGE_REQUIRED:
        if key in stage:
            continue
        if key not in swept:
            spot = where / key if key == "model" else where / "stage" / key
            raise spot.error("required field missing (or sweep it in matrix: or zip:)")
        stage[key] = swept[key][0]  # the base takes the axis' first value; every arm overrides

    scalars = {}
    for key, check in (("passes", f.integer(gt=0)), ("timeout_s", f.number(gt=0))):
        if key in data:
            scalars[key] = check(data[key], where / key)

    if "baseline" in data:
        if not isinstance(data["baseline"], str) or not data["baseline"]:
            raise (where / "baseline").error(
                "must be the label of one arm or axis=value pairs", data["baseline"])
        scalars["baseline"] = data["baseline"]

    if "compare" in data:
        compare = f.parse_mapping(data["compare"], where / "compare", COMPARE_FIELDS)
        if "baseline" not in compare:
            if "baseline" not in scalars:
                raise (where / "compare" / "baseline").error(
                    "required field missing (or give the sweep a baseline:)")
            compare["baseline"] = scalars["baseline"]
        scalars["compare"] = CompareConfig(**compare)

    sweep = SweepConfig(
        name=name, source=where.source, stage=StageConfig(**stage),
        workload=WorkloadConfig(**workload), matrix=matrix, zip=zip_groups,
        placement=PlacementConfig(**placement), noise=NoiseConfig(**noise),
        include=doc.includes, stages=stages, **scalars)
    _check_arms(sweep, where)
    return sweep


def _stages(data: Mapping, base: dict[str, Any], swept: Mapping[str, tuple], where: Where,
            ) -> tuple[PipelineStage, ...]:
    """``stages:``: each entry a full stage config plus its placement (``cores``, ``node``);
    the top-level ``model`` is each stage's default. Axes address a stage as ``stages[i].x``."""
    raw = data["stages"]
    at = where / "stages"
    if "stage" in data:
        raise at.error("give stage: (one engine) or stages: (a pipeline), not both")
    if not isinstance(raw, list) or not raw:
        raise at.error("must list at least one stage", raw)
    for key in swept:
        m = STAGE_AXIS.fullmatch(key)
        if m and int(m.group(1)) >= len(raw):
            raise (where / "matrix" / key).error(
                f"no stage {m.group(1)}: the pipeline has {len(raw)} stage(s)")
        if not m and key in STAGE_FIELDS:
            raise (where / "matrix" / key).error(
                f"with stages:, sweep one stage's field as stages[<i>].{key}")
    out = []
    for i, entry in enumerate(raw):
        values = f.parse_mapping(entry, at / i, PIPELINE_STAGE_FIELDS)
        if "model" not in values and "model" in base:
            values["model"] = base["model"]
        for key in ("model", "kv_cache_mib"):
            axis = swept.get(f"stages[{i}].{key}")
            if key not in values and axis is not None:
                values[key] = axis[0]  # the base takes the axis' first value, as stage: does
        if "model" not in values:
            raise (at / i / "model").error("required field missing (or set model: at the top)")
        placement = {k: values.pop(k) for k in STAGE_PLACEMENT_FIELDS if k in values}
        out.append(PipelineStage(stage=StageConfig(**values), **placement))
    return tuple(out)


def compared_arms(compare, arms: list[Arm]) -> tuple[Arm, list[Arm]]:
    """(the baseline arm, the arms paired with it, in the sweep's order)."""
    by_label = {a.label: a for a in arms}
    chosen = compare.arms if compare.arms is not None else [a.label for a in arms]
    return by_label[compare.baseline], [by_label[label] for label in chosen
                                        if label != compare.baseline]


def _check_compare(compare, arms: list[Arm], where: Where) -> None:
    """Labels that name arms, and arms whose engines can take turns on one slot."""
    labels = [a.label for a in arms]
    if compare.baseline not in labels:
        raise (where / "baseline").error(f"must be the label of one arm ({', '.join(labels)})",
                                         compare.baseline)
    for i, label in enumerate(compare.arms or ()):
        if label not in labels:
            raise (where / "arms" / i).error(f"must be the label of one arm "
                                             f"({', '.join(labels)})", label)
        if label == compare.baseline:
            raise (where / "arms" / i).error("is the baseline; list the arms paired with it",
                                             label)
    base, others = compared_arms(compare, arms)
    if not others:
        raise (where / "arms").error("no arm to pair with the baseline", compare.arms)
    for arm in [base, *others]:
        field = "baseline" if arm is base else "arms"
        if arm.stages or arm.replicas != 1 or arm.workload.mode != "offline":
            what = ("a pipeline" if arm.stages else "replicated" if arm.replicas != 1
                    else "a serving arm")
            raise (where / field).error(f"arm {arm.label} is {what}: pairs take turns between "
                                        "two offline single-engine arms", arm.label)
        if arm.slot_cores != base.slot_cores:
            raise (where / field).error(
                f"arm {arm.label} runs on {arm.slot_cores or 'node'}-core slots, the baseline "
                f"on {base.slot_cores or 'node'}: a pair shares one slot", arm.label)


def _check_arms(sweep: SweepConfig, where: Where) -> None:
    """Limits that span fields: found here, not after minutes of engine start-up."""
    arms = expand(sweep)
    try:
        baselines(sweep, arms)
    except ValueError as exc:
        raise (where / "baseline").error(str(exc), sweep.baseline) from None
    if sweep.compare is not None:
        _check_compare(sweep.compare, arms, where / "compare")
    for arm in arms:
        if arm.stages:
            _check_pipeline(sweep, arm, where)
            continue
        s, w = arm.stage, arm.workload
        which = "" if arm.label == "base" else f" (arm {arm.label})"
        check_stage(s, where / "stage", which)
        check_workload_for(s, w, where / "workload", which)
        longest = (w.prompt_len_max or w.prompt_len) + (w.output_len_max or w.output_len)
        if longest > s.max_model_len:
            raise (where / "workload").error(
                f"prompt_len + output_len = {longest} exceeds "
                f"max_model_len {s.max_model_len}{which}")
        if w.quality is not None:  # the probe's prompt is the fixed sequence, then its tokens
            probe = w.quality["sequence_len"] + w.quality["tokens"]
            if probe > s.max_model_len:
                raise (where / "workload" / "quality").error(
                    f"sequence_len + tokens = {probe} exceeds max_model_len "
                    f"{s.max_model_len}{which}", thaw(w.quality))
        shape = SHAPES.get(s.model)
        if shape is not None and s.max_model_len > shape.max_position_embeddings:
            raise (where / "stage" / "max_model_len").error(
                f"exceeds shape {shape.name}'s max_position_embeddings "
                f"{shape.max_position_embeddings}{which}", s.max_model_len)


def _check_pipeline(sweep: SweepConfig, arm: Any, where: Where) -> None:
    """A pipeline arm: every stage as a stage, the cores split of one slot, the token lengths.

    Stage 0 reads ``prompt_len`` tokens; every stage writes ``output_len`` tokens, which are the
    next stage's prompt (docs/pipelines.md). Serving: the longest of each drawn, and a streamed
    edge needs one output length to cut into windows."""
    which = "" if arm.label == "base" else f" (arm {arm.label})"
    w = arm.workload
    if w.quality is not None:
        raise (where / "workload" / "quality").error(
            f"a pipeline has no quality probe (yet): pair its stages' models as arms of their "
            f"own{which}", thaw(w.quality))
    slot = arm.slot_cores
    if slot is None:
        raise (where / "placement" / "slot_cores").error(
            "required with stages: (the stages split one slot's cores)")
    if arm.replicas == "per_node":
        raise (where / "placement" / "replicas").error(
            f"a pipeline runs once per pass, its stages on the nodes they name{which}",
            arm.replicas)
    nodes = stage_nodes(arm.stages, None)
    used: dict[int | None, int] = {}
    for i, ps in enumerate(arm.stages):
        at = where / "stages" / i
        check_stage(ps.stage, at, which)
        check_workload_for(ps.stage, w, where / "workload", which)
        if ps.stage.engine != "vllm":
            raise (at / "engine").error(f"a pipeline stage runs on vllm only{which}",
                                        ps.stage.engine)
        allowed = sweep.placement.nodes
        if ps.node is not None and allowed is not None and ps.node not in allowed:
            raise (at / "node").error(f"not one of placement.nodes {list(allowed)}{which}",
                                      ps.node)
        if ps.node is not None and arm.stages[0].node is None:
            raise (at / "node").error(f"stage 0 names no node: name it too when a later stage "
                                      f"names one{which}", ps.node)
        used[nodes[i]] = used.get(nodes[i], 0) + (ps.cores or 1)
        if used[nodes[i]] > slot:
            on = "the slot's node" if nodes[i] is None else f"node {nodes[i]}"
            raise (at / "cores").error(
                f"the stages on {on} need {used[nodes[i]]} cores, more than the slot's {slot} "
                f"(placement.slot_cores; a stage without cores takes 1){which}",
                ps.cores if ps.cores is not None else ...)
        if ps.window is not None and i == 0:
            raise (at / "window").error(f"stage 0 reads the prompts: no previous stage streams "
                                        f"to it{which}", ps.window)
        if ps.window is not None and w.output_len_max is not None:
            raise (at / "window").error(
                f"a streamed edge needs one output length, but workload.output_len_max is set "
                f"(lengths drawn from {w.output_len} to {w.output_len_max}){which}", ps.window)
        if ps.window is not None and w.output_len % ps.window:
            raise (at / "window").error(
                f"must divide workload.output_len {w.output_len} (the previous stage's output, "
                f"read in whole chunks){which}", ps.window)
        output = w.output_len_max or w.output_len
        prompt = (w.prompt_len_max or w.prompt_len) if i == 0 else output
        if prompt + output > ps.stage.max_model_len:
            raise (at / "max_model_len").error(
                f"the stage's prompt {prompt} + output_len {output} exceed it{which}",
                ps.stage.max_model_len)


def sweep_from_dict(d: Mapping[str, Any], source: str = "<dict>", *,
                    base_dir: str | None = None) -> SweepConfig:
    """A SweepConfig from plain data, with the same rules as a file.

    Relative paths (model directories, ``include:``) resolve against ``base_dir`` (default: the
    working directory).
    """
    if not isinstance(d, Mapping):
        raise ConfigError(source, "", f"must be a mapping of sweep fields, "
                                      f"not a {type(d).__name__}")
    base = os.path.abspath(base_dir or os.getcwd())
    doc = expand_includes(d, Origin(source, base))
    return _build(doc, Where(source, base, origins=doc.origins))


def load_sweep_file(path: str | os.PathLike) -> SweepConfig:
    """Read, merge includes, validate. Errors name the file, the field path and the value."""
    source = os.fspath(path)
    doc = read_document(source)
    base = os.path.dirname(os.path.abspath(source))
    return _build(doc, Where(source, base, origins=doc.origins))


def load_sweeps(paths: Iterable[str | os.PathLike]) -> list[SweepConfig]:
    """Several sweep files that form one run: sweep names must differ across them."""
    sweeps: list[SweepConfig] = []
    for path in paths:
        sweep = load_sweep_file(path)
        for other in sweeps:
            if other.name == sweep.name:
                raise ConfigError(sweep.source, "name",
                                  f"sweep name already used by {other.source}", sweep.name)
        sweeps.append(sweep)
    if not sweeps:
        raise UserError("no sweep files given")
    return sweeps
