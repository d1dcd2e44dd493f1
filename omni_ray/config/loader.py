"""From a sweep file (or a dict) to a validated SweepConfig; several files to one run."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from omni_ray.config import fields as f
from omni_ray.config.document import Document, expand_includes, read_document
from omni_ray.config.fields import Origin, Where
from omni_ray.config.grid import expand
from omni_ray.config.schema import (
    NOISE_FIELDS, PLACEMENT_FIELDS, STAGE_FIELDS, STAGE_REQUIRED, WORKLOAD_FIELDS, NoiseConfig,
    PlacementConfig, StageConfig, SweepConfig, WorkloadConfig, check_axes, check_stage,
    check_workload_for)
from omni_ray.errors import ConfigError, UserError
from omni_ray.models.shapes import SHAPES

TOP_LEVEL = ("name", "model", "include", "stage", "workload", "matrix", "zip", "passes",
             "placement", "timeout_s", "noise", "baseline")

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
            raise (where / "baseline").error("must be the label of one arm", data["baseline"])
        scalars["baseline"] = data["baseline"]

    sweep = SweepConfig(
        name=name, source=where.source, stage=StageConfig(**stage),
        workload=WorkloadConfig(**workload), matrix=matrix, zip=zip_groups,
        placement=PlacementConfig(**placement), noise=NoiseConfig(**noise),
        include=doc.includes, **scalars)
    _check_arms(sweep, where)
    return sweep


def _check_arms(sweep: SweepConfig, where: Where) -> None:
    """Limits that span fields: found here, not after minutes of engine start-up."""
    arms = expand(sweep)
    if sweep.baseline is not None and sweep.baseline not in {a.label for a in arms}:
        raise (where / "baseline").error(
            f"must be the label of one arm ({', '.join(a.label for a in arms)})", sweep.baseline)
    for arm in arms:
        s, w = arm.stage, arm.workload
        which = "" if arm.label == "base" else f" (arm {arm.label})"
        check_stage(s, where / "stage", which)
        check_workload_for(s, w, where / "workload", which)
        longest = (w.prompt_len_max or w.prompt_len) + (w.output_len_max or w.output_len)
        if longest > s.max_model_len:
            raise (where / "workload").error(
                f"prompt_len + output_len = {longest} exceeds "
                f"max_model_len {s.max_model_len}{which}")
        shape = SHAPES.get(s.model)
        if shape is not None and s.max_model_len > shape.max_position_embeddings:
            raise (where / "stage" / "max_model_len").error(
                f"exceeds shape {shape.name}'s max_position_embeddings "
                f"{shape.max_position_embeddings}{which}", s.max_model_len)


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
