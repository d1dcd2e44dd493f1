"""The one object that crosses to an engine process: a typed, validated ``EngineRequest``.

It is built from an arm (``for_arm``) or from plain data (``from_dict``, which is what the engine
process reads back from its request file); both go through the frozen ``StageConfig`` and
``WorkloadConfig``, so every field is checked once and every default lives in the schema, never
in a ``.get(key, default)`` on the engine side. Where the arm runs (``cpus``, ``node``) and the
compile cache are added with ``dataclasses.replace`` by the actor and the launcher.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omni_ray.config.fields import Where
from omni_ray.config.schema import (PipelineStage, StageConfig, WorkloadConfig, check_stage,
                                    check_workload_for, stage_from_dict, workload_from_dict)

SOURCE = "engine request"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineRequest:
    stage: StageConfig
    workload: WorkloadConfig | None = None  # None: load, report ready, stop (a warm start's prime)
    seed: int = 0
    cpus: tuple[int, ...] | None = None     # the slot's CPUs; None: wherever the process may run
    node: int | None = None                 # the slot's NUMA node (memory bound there)
    compile_cache_dir: str | None = None    # vLLM's compile cache of this arm
    simulated: bool = False                 # the node is a simulated socket (not bound)
    go_file: str | None = None              # a replica: measure once this file exists
    go_timeout_s: float = 600.0             # ... or after this long, saying so
    # A pipeline arm (docs/pipelines.md): its stages; the actor runs engine/pipeline.py for it.
    stages: tuple[PipelineStage, ...] = ()
    # ... whose stages name other NUMA nodes too: the CPUs of its slot on each, ((node, cpus),)
    node_cpus: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # One pipeline stage's engine: after load and warmup it waits for its input token ids in
    # ``inputs_path`` and writes its output token ids to ``outputs_path`` (the next stage's input;
    # the edge rule and file: engines/handover.py). ``window``: it reads its input in chunks of
    # this many tokens as they arrive (None: all at once); ``out_window``: the next stage's.
    inputs_path: str | None = None
    outputs_path: str | None = None
    window: int | None = None
    out_window: int | None = None
    # Which stage of how many this engine is (None: not a pipeline's). A serving pipeline's
    # stage 0 runs the load generator and the others relay (engines/vllm_pipeline_serving.py).
    stage_index: int | None = None
    stage_count: int = 0
    # Read the engine's own stats live (vLLM's KV use, engines/vllm_stats.py) where they cost
    # the measurement: a sweep under --monitor.
    live_stats: bool = False
    # Arms sharing this engine start (placement.share_engine, docs/serving.md): their
    # workloads, run after ``workload`` on the same engine, each giving a result of its own.
    then: tuple[WorkloadConfig, ...] = ()
    # One side of a paired comparison (compare:, docs/compare.md): after load it runs its
    # workload ``turns`` times, turn k once ``<turns_dir>/<k>.go`` exists, writing the turn's
    # figures to ``<turns_dir>/<k>.done.json``; the other side's turns come in between.
    turns: int = 0
    turns_dir: str | None = None
    # Probe the slot's read bandwidth for the decode speed of light before the engine loads
    # (placement.bandwidth_probe; measure/bandwidth.py), cached in ``probe_cache_dir`` (the
    # run's: once per slot and regime). Off by default: a developer probe or a test asks.
    bandwidth_probe: bool = False
    probe_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stage, StageConfig):
            raise TypeError(f"stage must be a StageConfig, got {type(self.stage).__name__}")
        if self.workload is not None and not isinstance(self.workload, WorkloadConfig):
            raise TypeError(f"workload must be a WorkloadConfig or None, "
                            f"got {type(self.workload).__name__}")
        if self.cpus is not None:
            object.__setattr__(self, "cpus", tuple(int(c) for c in self.cpus))
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "node_cpus", tuple((int(n), tuple(int(c) for c in cpus))
                                                    for n, cpus in self.node_cpus))
        object.__setattr__(self, "then", tuple(self.then))
        where = Where(SOURCE, "")
        if self.turns and (self.turns_dir is None or self.workload is None or self.then):
            raise (where / "turns").error("needs turns_dir and one workload", self.turns)
        check_stage(self.stage, where / "stage")
        if self.workload is not None:
            check_workload_for(self.stage, self.workload, where / "workload")
        for k, wl in enumerate(self.then):  # the engine is built for the first workload's mode
            if not isinstance(wl, WorkloadConfig):
                raise TypeError(f"then[{k}] must be a WorkloadConfig, got {type(wl).__name__}")
            if self.workload is None or wl.mode != self.workload.mode:
                raise (where / f"then[{k}]" / "mode").error(
                    "must be the first workload's (one engine serves both)", wl.mode)
            check_workload_for(self.stage, wl, where / f"then[{k}]")

    @property
    def engine(self) -> str:
        return self.stage.engine

    @property
    def model(self) -> str:
        return self.stage.model

    @classmethod
    def for_arm(cls, arm: Any, seed: int) -> EngineRequest:
        """The request of one arm pass (``arm``: a ``config.Arm``); ``seed``: the pass number."""
        return cls(stage=arm.stage, workload=arm.workload, seed=seed,
                   stages=getattr(arm, "stages", ()))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineRequest:
        """From plain data (``to_dict``'s, or a developer probe's dict whose ``model`` sits
        beside ``stage``); every value is checked by the schema's checkers."""
        stage = dict(d["stage"])
        if "model" in d and "model" not in stage:
            stage["model"] = d["model"]
        workload = d.get("workload")
        return cls(stage=stage_from_dict(stage, SOURCE),
                   workload=None if workload is None else workload_from_dict(workload, SOURCE),
                   seed=int(d.get("seed", 0)),
                   cpus=None if d.get("cpus") is None else tuple(d["cpus"]),
                   node=d.get("node"), compile_cache_dir=d.get("compile_cache_dir"),
                   simulated=bool(d.get("simulated", False)), go_file=d.get("go_file"),
                   go_timeout_s=float(d.get("go_timeout_s", 600.0)),
                   stages=tuple(PipelineStage.from_dict(ps, SOURCE) for ps in d.get("stages", ())),
                   node_cpus=d.get("node_cpus", ()),
                   inputs_path=d.get("inputs_path"), outputs_path=d.get("outputs_path"),
                   window=d.get("window"), out_window=d.get("out_window"),
                   stage_index=d.get("stage_index"), stage_count=int(d.get("stage_count", 0)),
                   live_stats=bool(d.get("live_stats", False)),
                   then=tuple(workload_from_dict(w, SOURCE) for w in d.get("then", ())),
                   turns=int(d.get("turns", 0)), turns_dir=d.get("turns_dir"),
                   bandwidth_probe=bool(d.get("bandwidth_probe", False)),
                   probe_cache_dir=d.get("probe_cache_dir"))

    @classmethod
    def coerce(cls, req: EngineRequest | Mapping[str, Any]) -> EngineRequest:
        return req if isinstance(req, EngineRequest) else cls.from_dict(req)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.stage.model, "engine": self.stage.engine,
                "stage": self.stage.to_dict(),
                "workload": None if self.workload is None else self.workload.to_dict(),
                "seed": self.seed, "cpus": None if self.cpus is None else list(self.cpus),
                "node": self.node, "compile_cache_dir": self.compile_cache_dir,
                "simulated": self.simulated, "go_file": self.go_file,
                "go_timeout_s": self.go_timeout_s,
                "stages": [ps.to_dict() for ps in self.stages],
                "node_cpus": [[n, list(cpus)] for n, cpus in self.node_cpus],
                "inputs_path": self.inputs_path, "outputs_path": self.outputs_path,
                "window": self.window, "out_window": self.out_window,
                "stage_index": self.stage_index, "stage_count": self.stage_count,
                "live_stats": self.live_stats,
                "then": [w.to_dict() for w in self.then],
                "turns": self.turns, "turns_dir": self.turns_dir,
                "bandwidth_probe": self.bandwidth_probe, "probe_cache_dir": self.probe_cache_dir}
