"""The frozen schema from Python: the same checks as files, immutability, plain-data round trips."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from vllm_omni import patches as omni_patches

from omni_ray.config import (
    AXIS_FIELDS, FrozenDict, NoiseConfig, PlacementConfig, StageConfig, SweepConfig,
    WorkloadConfig, stage_from_dict, sweep_from_dict, workload_from_dict)
from omni_ray.errors import ConfigError


def test_stage_defaults() -> None:
    stage = stage_from_dict({"model": "tiny", "kv_cache_mib": 64})
    assert stage == StageConfig(model="tiny", kv_cache_mib=64, dtype="bfloat16",
                                quantization=None, max_model_len=1024, max_num_seqs=8,
                                enforce_eager=True, multiprocessing=False, env={},
                                disable_patches=(), warm_start=False, engine_args={})


def test_workload_defaults() -> None:
    assert workload_from_dict({}) == WorkloadConfig(
        prompt_len=32, output_len=16, batch=1, context_len=0, warmup=1, repeats=3,
        detokenize=True)


def test_other_defaults() -> None:
    assert PlacementConfig() == PlacementConfig(slot_cores=None, nodes=None)
    assert NoiseConfig().spread_pct == 8.0


@pytest.mark.parametrize(("d", "match"), [
    ({"kv_cache_mib": 64}, r"^<dict>: model: required field missing$"),
    ({"model": "tiny"}, r"^<dict>: kv_cache_mib: required field missing for engine vllm$"),
    ({"model": "tiny", "kv_cache_mib": 0}, r"^<dict>: kv_cache_mib: must be > 0, got 0$"),
    ({"model": "tiny", "kv_cache_mib": 1, "batch": 2},
     r"^<dict>: batch: unknown key \(belongs under workload:\); allowed: model, engine, dtype"),
    ({"model": "tiny", "kv_cache_mib": 1, "engine_args": {"dtype": "half"}},
     r"engine_args\.dtype: duplicates a typed field; set stage\.dtype instead"),
    ({"model": "tiny", "kv_cache_mib": 1, "engine_args": {
        "compilation_config": {"inductor_compile_config": {"cpp_wrapper": True}}}},
     r"^<dict>: engine_args\.compilation_config\.inductor_compile_config\.cpp_wrapper: "
     r"duplicates a typed field; set stage\.cpp_wrapper instead, got True$"),
    ({"model": "tiny", "kv_cache_mib": 1, "cpp_wrapper": True, "env": {"VLLM_USE_LAYERNAME": 1}},
     r"^<dict>: cpp_wrapper needs plain layer names; env\.VLLM_USE_LAYERNAME must be 0 or "
     r"unset, got '1'$"),
    ({"model": "tiny", "kv_cache_mib": 1, "cpp_wrapper": "yes"},
     r"^<dict>: cpp_wrapper: must be"),
    ({"model": "tiny", "kv_cache_mib": 1, "engine_args": {
        "compilation_config": {"inductor_compile_config": {"dce": True, "cpp.threads": 1}}}},
     r"^<dict>: engine_args\.compilation_config\.inductor_compile_config\.cpp\.threads: "
     r"duplicates a typed field; set stage\.serial_kernels instead, got 1$"),
    ({"model": "tiny", "kv_cache_mib": 1, "serial_kernels": True,
      "disable_patches": ["inductor_config"]},
     r"^<dict>: serial_kernels needs the inductor_config patch \(stock vLLM on CPU overwrites "
     r"cpp\.dynamic_threads\); keep it out of disable_patches, got \['inductor_config'\]$"),
])
def test_stage_from_dict_errors(d: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        stage_from_dict(d)


def test_stage_from_dict_names_the_source() -> None:
    with pytest.raises(ConfigError, match=r"^api: dtype: must be one of"):
        stage_from_dict({"model": "tiny", "kv_cache_mib": 1, "dtype": "fp8"}, source="api")


def test_workload_from_dict_error() -> None:
    with pytest.raises(ConfigError, match=r"^<dict>: output_len: must be >= 2, got 1$"):
        workload_from_dict({"output_len": 1})


def test_model_directory_resolves_to_absolute(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m").mkdir()
    assert stage_from_dict({"model": "m", "kv_cache_mib": 1}, base_dir=str(tmp_path)).model == \
        str(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    assert stage_from_dict({"model": "./m", "kv_cache_mib": 1}).model == str(tmp_path / "m")


def test_shape_name_wins_over_a_directory_of_that_name(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiny").mkdir()
    monkeypatch.chdir(tmp_path)
    assert stage_from_dict({"model": "tiny", "kv_cache_mib": 1}).model == "tiny"
    assert stage_from_dict({"model": "./tiny", "kv_cache_mib": 1}).model == str(tmp_path / "tiny")


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ConfigError, match=r"^StageConfig: kv_cache_mib: must be > 0, got -1$"):
        StageConfig(model="tiny", kv_cache_mib=-1)
    with pytest.raises(ConfigError, match=r"^WorkloadConfig: batch: must be an integer, got True"):
        WorkloadConfig(batch=True)
    stage = StageConfig(model="tiny", kv_cache_mib=1)
    with pytest.raises(ConfigError, match=r"StageConfig: dtype: must be one of"):
        dataclasses.replace(stage, dtype="int8")


def test_normalisation() -> None:
    stage = stage_from_dict({"model": "tiny", "kv_cache_mib": 1, "env": {"B": 2, "A": "x"},
                             "disable_patches": ["release_memory", "aot_cache"],
                             "engine_args": {"compilation_config": {"custom_ops": ["none"]}}})
    assert list(stage.env.items()) == [("A", "x"), ("B", "2")]
    assert stage.disable_patches == ("aot_cache", "release_memory")
    assert stage.engine_args == {"compilation_config": {"custom_ops": ("none",)}}
    assert NoiseConfig(spread_pct=5).spread_pct == 5.0 and isinstance(
        NoiseConfig(spread_pct=5).spread_pct, float)
    assert PlacementConfig(nodes=[1, 0]).nodes == (0, 1)


def test_configs_are_frozen_all_the_way_down() -> None:
    stage = stage_from_dict({"model": "tiny", "kv_cache_mib": 1, "env": {"A": "1"},
                             "engine_args": {"cc": {"x": [1]}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        stage.kv_cache_mib = 2  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        stage.env["A"] = "2"
    with pytest.raises(TypeError, match="read-only"):
        stage.engine_args["cc"].update(x=2)
    assert isinstance(stage.engine_args["cc"]["x"], tuple)
    assert hash(stage) == hash(stage_from_dict(stage.to_dict()))


def test_to_dict_is_plain_json_and_round_trips() -> None:
    stage = stage_from_dict({"model": "tiny", "kv_cache_mib": 1, "env": {"A": "1"},
                             "disable_patches": ["kv_budget"],
                             "engine_args": {"cc": {"x": [1, 2.5, None]}}})
    d = stage.to_dict()
    assert type(d["env"]) is dict and type(d["engine_args"]["cc"]["x"]) is list
    assert type(d["disable_patches"]) is list
    assert json.loads(json.dumps(d)) == d
    assert stage_from_dict(d) == stage
    d["env"]["A"] = "changed"  # a copy: the config is untouched
    assert stage.env["A"] == "1"


def test_pickle_and_asdict() -> None:
    stage = stage_from_dict({"model": "tiny", "kv_cache_mib": 1, "env": {"A": "1"}})
    assert pickle.loads(pickle.dumps(stage)) == stage
    assert dataclasses.asdict(stage)["env"] == {"A": "1"}


def test_frozen_dict_equals_plain_dict() -> None:
    assert FrozenDict(a=1) == {"a": 1}
    assert hash(FrozenDict(a=1, b=2)) == hash(FrozenDict(b=2, a=1))


def test_axis_fields_are_one_namespace() -> None:
    stage = {f.name for f in dataclasses.fields(StageConfig)}
    workload = {f.name for f in dataclasses.fields(WorkloadConfig)}
    assert not stage & workload
    assert set(AXIS_FIELDS) == stage | workload | {"slot_cores", "replicas"}


def test_sweep_from_dict() -> None:
    sweep = sweep_from_dict({"name": "api", "model": "tiny", "stage": {"kv_cache_mib": 8},
                             "matrix": {"batch": [1, 2]}})
    assert (sweep.name, sweep.source, sweep.passes, sweep.timeout_s) == ("api", "<dict>", 3, 600.0)
    assert sweep.matrix == {"batch": (1, 2)} and sweep.zip == ()


def test_sweep_from_dict_errors_name_the_source() -> None:
    with pytest.raises(ConfigError, match=r"^mine: matrix\.batch\[0\]: must be > 0, got 0$"):
        sweep_from_dict({"name": "api", "model": "tiny", "stage": {"kv_cache_mib": 8},
                         "matrix": {"batch": [0]}}, source="mine")
    with pytest.raises(ConfigError, match=r"^<dict>: must be a mapping of sweep fields, not a "):
        sweep_from_dict([])  # type: ignore[arg-type]


def test_sweep_from_dict_includes_resolve_in_base_dir(tmp_path: Path) -> None:
    (tmp_path / "f.yaml").write_text("model: tiny\nstage: {kv_cache_mib: 16}\n")
    sweep = sweep_from_dict({"name": "api", "include": ["f.yaml"]}, base_dir=str(tmp_path))
    assert sweep.stage.kv_cache_mib == 16 and sweep.include == (str(tmp_path / "f.yaml"),)


def test_required_field_from_an_axis_only() -> None:
    sweep = sweep_from_dict({"name": "a", "matrix": {"model": ["small", "tiny"],
                                                     "kv_cache_mib": [64, 32]}})
    assert (sweep.stage.model, sweep.stage.kv_cache_mib) == ("small", 64)


def test_sweep_config_direct_construction_validates() -> None:
    stage = StageConfig(model="tiny", kv_cache_mib=1)
    with pytest.raises(ConfigError, match=r"^SweepConfig: name: must be a name"):
        SweepConfig(name="a b", source="", stage=stage)
    with pytest.raises(ConfigError, match=r"^x: matrix\.batch\[0\]: must be > 0, got 0"):
        SweepConfig(name="a", source="x", stage=stage, matrix={"batch": [0]})


@pytest.mark.parametrize("patch", [m.NAME for m in omni_patches.PATCHES])
def test_every_patch_switch_is_refused_in_stage_env(patch):
    """stage.env cannot switch a patch off behind disable_patches' back, for every patch
    vllm_omni has (the list is vllm_omni's own, so a new patch is covered)."""
    name = f"VLLM_OMNI_DISABLE_{patch.upper()}"
    with pytest.raises(ConfigError, match=rf"^<dict>: env\.{name}: set by the typed field "
                                          r"stage\.disable_patches"):
        stage_from_dict({"model": "tiny", "kv_cache_mib": 64, "env": {name: "1"}}, "<dict>")
    assert patch in stage_from_dict({"model": "tiny", "kv_cache_mib": 64,
                                     "disable_patches": [patch]}).disable_patches


def test_a_swept_layer_name_setting_that_breaks_cpp_wrapper_names_the_arm(tmp_path):
    from omni_ray.config.loader import sweep_from_dict

    d = {"name": "s", "model": "tiny", "stage": {"kv_cache_mib": 8, "cpp_wrapper": True,
                                                 "enforce_eager": False},
         "matrix": {"env": [{}, {"VLLM_USE_LAYERNAME": "1"}]}}
    with pytest.raises(ConfigError, match=r"^<dict>: stage: cpp_wrapper needs plain layer names; "
                                          r"env\.VLLM_USE_LAYERNAME must be 0 or unset \(arm env="):
        sweep_from_dict(d)
    ok = {"model": "tiny", "kv_cache_mib": 8, "env": {"VLLM_USE_LAYERNAME": "0"}}
    assert stage_from_dict(ok | {"cpp_wrapper": True}).env["VLLM_USE_LAYERNAME"] == "0"
