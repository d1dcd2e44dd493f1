"""Grid expansion: a sweep's axes -> the arms it runs, in a fixed order, with stable ids."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
from typing import Any

from omni_ray.config.fields import canonical_json
from omni_ray.config.schema import (
    SERVING_FIELDS, STAGE_AXIS, STAGE_FIELDS, WORKLOAD_FIELDS, PipelineStage, PlacementConfig,
    StageConfig, SweepConfig, WorkloadConfig)


def arm_id(sweep: str, stage: StageConfig, workload: WorkloadConfig,
           slot_cores: int | None, replicas: int | str = 1,
           stages: tuple[PipelineStage, ...] = ()) -> str:
    """First 12 hex digits of sha256 over the canonical JSON of the resolved arm.

    Equal configs give equal ids whatever the file looked like (key order, includes, which
    values came from an axis). The model enters as resolved: a directory by its absolute path.
    ``replicas`` enters only when it is not 1, so arms of one engine keep the ids they had.
    """
    arm = {"sweep": sweep, "stage": _id_stage(stage), "workload": _id_workload(workload),
           "slot_cores": slot_cores}
    if replicas != 1:
        arm["replicas"] = replicas
    if stages:  # a pipeline; single-stage arms keep the ids they had before pipelines existed
        arm["stages"] = [ps.to_dict() for ps in stages]
    text = canonical_json(arm)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# Stage fields added after results were stored, at the value every earlier arm had: left out of
# the id when they hold it, so those arms keep their ids (and --resume finds them).
_ID_NEUTRAL = {"engine": "vllm", "memory_limit_mib": None}


# Workload fields added with serving mode and the quality probe: at their defaults they are
# left out of the id too.
_ID_NEUTRAL_WORKLOAD = {k: v for k, v in WorkloadConfig().to_dict().items()
                        if k in ("mode", "quality", *SERVING_FIELDS)}


def _id_workload(workload: WorkloadConfig) -> dict[str, Any]:
    return {k: v for k, v in workload.to_dict().items()
            if not (k in _ID_NEUTRAL_WORKLOAD and v == _ID_NEUTRAL_WORKLOAD[k])}


def _id_stage(stage: StageConfig) -> dict[str, Any]:
    return {k: v for k, v in stage.to_dict().items()
            if not (k in _ID_NEUTRAL and v == _ID_NEUTRAL[k])}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arm:
    """One point of a sweep: a fully resolved stage, workload and slot size.

    ``id`` is computed from the content (see :func:`arm_id`), never passed in.
    """

    id: str = dataclasses.field(init=False)
    sweep: str
    label: str                      # "kv_cache_mib=64,batch=1", or "base" without axes
    index: int                      # position in expand() order
    stage: StageConfig
    workload: WorkloadConfig
    slot_cores: int | None          # None = a whole NUMA node
    timeout_s: float
    replicas: int | str = 1         # "per_node": one engine per NUMA node at once
    stages: tuple[PipelineStage, ...] = ()  # a pipeline's stages; then stage is stages[0]'s

    def __post_init__(self) -> None:
        PlacementConfig(slot_cores=self.slot_cores, replicas=self.replicas)  # validates them
        object.__setattr__(self, "id", arm_id(self.sweep, self.stage, self.workload,
                                              self.slot_cores, self.replicas, self.stages))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, keys in a fixed order."""
        return {"id": self.id, "sweep": self.sweep, "label": self.label, "index": self.index,
                "stage": self.stage.to_dict(), "workload": self.workload.to_dict(),
                "slot_cores": self.slot_cores, "timeout_s": self.timeout_s,
                "replicas": self.replicas,
                **({"stages": [ps.to_dict() for ps in self.stages]} if self.stages else {})}


def label_value(field: str, value: object) -> str:
    """How one axis value reads in a label: short, no ',' or '=' of its own."""
    if field == "model" and isinstance(value, str) and os.path.isabs(value):
        return os.path.basename(value.rstrip(os.sep)) or value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "+".join(label_value("", v) for v in value) or "none"
    if isinstance(value, dict):
        return "{" + ";".join(f"{k}:{label_value('', v)}" for k, v in value.items()) + "}"
    return str(value)


def axes(sweep: SweepConfig) -> list[list[tuple[tuple[str, Any], ...]]]:
    """Each axis as its list of points; a point is the (field, value) pairs it sets."""
    out = [[((key, v),) for v in values] for key, values in sweep.matrix.items()]
    for group in sweep.zip:
        keys = list(group)
        out.append([tuple((k, group[k][i]) for k in keys) for i in range(len(group[keys[0]]))])
    return out


def expand(sweep: SweepConfig) -> list[Arm]:
    """The cartesian product of the axes: matrix keys in file order, then zip groups, the last
    axis varying fastest. No axes: one arm labelled "base"."""
    arms = []
    for index, combo in enumerate(itertools.product(*axes(sweep))):
        pairs = [pair for point in combo for pair in point]
        setting = dict(pairs)
        stage = dataclasses.replace(
            sweep.stage, **{k: v for k, v in setting.items() if k in STAGE_FIELDS})
        workload = dataclasses.replace(
            sweep.workload, **{k: v for k, v in setting.items() if k in WORKLOAD_FIELDS})
        stages = list(sweep.stages)
        for key, value in setting.items():
            m = STAGE_AXIS.fullmatch(key)
            if m:
                i, field = int(m.group(1)), m.group(2)
                if field in STAGE_FIELDS:
                    stages[i] = dataclasses.replace(
                        stages[i], stage=dataclasses.replace(stages[i].stage, **{field: value}))
                else:
                    stages[i] = dataclasses.replace(stages[i], **{field: value})
        if stages:
            stage = stages[0].stage
        arms.append(Arm(
            sweep=sweep.name,
            label=",".join(f"{k}={label_value(k, v)}" for k, v in pairs) or "base",
            index=index, stage=stage, workload=workload,
            slot_cores=setting.get("slot_cores", sweep.placement.slot_cores),
            replicas=setting.get("replicas", sweep.placement.replicas),
            timeout_s=sweep.timeout_s, stages=tuple(stages)))
    return arms


def label_pairs(label: str) -> dict[str, str]:
    """``"prompt_len=128,engine=vllm"`` -> ``{"prompt_len": "128", "engine": "vllm"}``
    (``"base"``, no axes: ``{}``); label values hold no ',' or '=' (``label_value``)."""
    if label == "base":
        return {}
    return dict(p.split("=", 1) for p in label.split(",") if "=" in p)


def baselines(sweep: SweepConfig, arms: list[Arm] | None = None) -> dict[str, str]:
    """Each arm's baseline (arm label -> baseline arm label) under ``sweep.baseline``; {} without
    one. ``baseline`` is either one arm's whole label (every arm against that arm) or values of
    some axes, ``engine=llamacpp,quantization=Q4_0``: then each arm is divided by the arm that
    has those values and the arm's own value on every matrix axis the baseline does not name
    (prompt_len=512 against the baseline at 512). ValueError says what does not fit."""
    spec = sweep.baseline
    if not spec:
        return {}
    arms = expand(sweep) if arms is None else arms
    labels = [a.label for a in arms]
    if spec in labels:
        return {label: spec for label in labels}
    want = label_pairs(spec)
    axes = {k for label in labels for k in label_pairs(label)}
    if not want or any(k not in axes for k in want):
        unknown = sorted(set(want) - axes) if want else []
        raise ValueError(("not an axis of this sweep: " + ", ".join(unknown) + "; "
                          if unknown else "")
                         + "must be the label of one arm or axis=value pairs of its axes ("
                         + ", ".join(sorted(axes)) + ")")
    candidates = [p for p in map(label_pairs, labels) if all(p.get(k) == v
                                                             for k, v in want.items())]
    if not candidates:
        raise ValueError(f"no arm has {spec} (arms: {', '.join(labels)})")
    free = [k for k in sweep.matrix if k not in want]
    out = {}
    for label in labels:
        own = label_pairs(label)
        found = [c for c in candidates if all(c.get(k) == own.get(k) for k in free)]
        if len(found) > 1:
            at = ",".join(f"{k}={own.get(k)}" for k in free) or "every point"
            raise ValueError(f"{len(found)} arms have {spec} at {at}: name more axes")
        if found:
            out[label] = next(lb for lb in labels if label_pairs(lb) == found[0])
    return out
