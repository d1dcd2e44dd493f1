"""Sweep configs: the frozen schema, YAML loading with located errors, and grid expansion.

    sweep = load_sweep_file("configs/kv.yaml")      # SweepConfig, or ConfigError naming the field
    for arm in expand(sweep): ...                   # Arm: resolved stage + workload + slot_cores

No Ray or vLLM import here: the engine and placement layers consume these objects.
"""

from omni_ray.config.fields import PATCHES, FrozenDict
from omni_ray.config.grid import Arm, arm_id, expand
from omni_ray.config.loader import load_sweep_file, load_sweeps, sweep_from_dict
from omni_ray.config.schema import (
    AXIS_FIELDS, NoiseConfig, PlacementConfig, StageConfig, SweepConfig, WorkloadConfig,
    stage_from_dict, workload_from_dict)

__all__ = [
    "AXIS_FIELDS", "PATCHES", "Arm", "FrozenDict", "NoiseConfig", "PlacementConfig",
    "StageConfig", "SweepConfig", "WorkloadConfig", "arm_id", "expand", "load_sweep_file",
    "load_sweeps", "stage_from_dict", "sweep_from_dict", "workload_from_dict",
]
