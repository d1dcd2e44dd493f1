"""Pipelines in sweep files: ``stages:``, axes addressing one stage, the cores split."""

from __future__ import annotations

import pytest

from omni_ray.config import expand, sweep_from_dict
from omni_ray.config.schema import PipelineStage, StageConfig, split_cores
from omni_ray.errors import ConfigError

BASE = {"name": "p", "model": "tiny", "placement": {"slot_cores": 2},
        "workload": {"prompt_len": 16, "output_len": 8},
        "stages": [{"kv_cache_mib": 32, "cores": 1}, {"kv_cache_mib": 16, "max_model_len": 128}]}


def test_stages_load_with_the_top_level_model_and_stage_is_the_first():
    sweep = sweep_from_dict(BASE)
    assert [ps.stage.kv_cache_mib for ps in sweep.stages] == [32, 16]
    assert [ps.stage.model for ps in sweep.stages] == ["tiny", "tiny"]
    assert sweep.stage == sweep.stages[0].stage
    (arm,) = expand(sweep)
    assert arm.stages == sweep.stages and arm.to_dict()["stages"][1]["max_model_len"] == 128


def test_an_axis_sets_one_stage_field_and_its_cores():
    sweep = sweep_from_dict(BASE | {"matrix": {"stages[1].kv_cache_mib": [16, 64],
                                               "stages[1].cores": [1]}})
    arms = expand(sweep)
    assert [[(ps.stage.kv_cache_mib, ps.cores) for ps in a.stages] for a in arms] == [
        [(32, 1), (16, 1)], [(32, 1), (64, 1)]]
    assert arms[0].label == "stages[1].kv_cache_mib=16,stages[1].cores=1"
    assert len({a.id for a in arms}) == 2


def test_a_pipeline_arm_id_differs_from_its_first_stage_alone():
    one = sweep_from_dict({k: v for k, v in BASE.items() if k != "stages"}
                          | {"stage": {"kv_cache_mib": 32}})
    two = sweep_from_dict(BASE)
    assert expand(one)[0].id != expand(two)[0].id
    assert "stages" not in expand(one)[0].to_dict()  # single-stage records are unchanged


def test_split_cores_gives_consecutive_cpus_and_shares_the_rest():
    tiny = StageConfig(model="tiny", kv_cache_mib=16)
    stages = (PipelineStage(stage=tiny, cores=1), PipelineStage(stage=tiny))
    assert split_cores(stages, [4, 5, 6]) == [[4], [5, 6]]
    with pytest.raises(ValueError, match="need"):
        split_cores((PipelineStage(stage=tiny, cores=2), PipelineStage(stage=tiny)), [0, 1])


def test_cores_of_all_stages_beyond_the_slot_name_the_stage():
    bad = BASE | {"stages": [{"kv_cache_mib": 32, "cores": 1}, {"kv_cache_mib": 16, "cores": 2}]}
    with pytest.raises(ConfigError, match=r"stages\[1\]\.cores: .*more than the slot's 2"):
        sweep_from_dict(bad)


def test_a_window_streams_into_a_later_stage_and_is_an_axis():
    sweep = sweep_from_dict(BASE | {"matrix": {"stages[1].window": [4, 8]}})
    assert [a.stages[1].window for a in expand(sweep)] == [4, 8]
    assert "window" not in sweep_from_dict(BASE).stages[1].to_dict()  # ids kept without one


@pytest.mark.parametrize("stage,window,message", [
    (1, 0, r"stages\[1\]\.window: must be > 0, got 0"),
    (1, 3, r"stages\[1\]\.window: must divide workload.output_len 8 .*, got 3"),
    (0, 4, r"stages\[0\]\.window: stage 0 reads the prompts.*, got 4"),
])
def test_a_bad_window_names_the_stage_field_and_value(stage, window, message):
    stages = [dict(s) for s in BASE["stages"]]
    stages[stage]["window"] = window
    with pytest.raises(ConfigError, match=message):
        sweep_from_dict(BASE | {"stages": stages})


def test_a_serving_workload_applies_to_the_pipeline_as_a_whole():
    serving = {"mode": "serving", "prompt_len": 16, "output_len": 8, "request_rate": [1, 4],
               "slo": {"ttft_ms": 500}, "search": {"percentile": 90, "low": 1, "high": 8}}
    sweep = sweep_from_dict(BASE | {"workload": serving,
                                    "matrix": {"stages[1].window": [None, 4]}})
    arms = expand(sweep)
    assert [a.workload.mode for a in arms] == ["serving", "serving"]
    assert [a.stages[1].window for a in arms] == [None, 4]
    users = sweep_from_dict(BASE | {"workload": {"mode": "serving", "users": [1, 2],
                                                 "duration_s": 5}})
    assert expand(users)[0].workload.users == (1, 2)


def test_a_serving_pipeline_s_streamed_edge_needs_one_output_length():
    wl = {"mode": "serving", "prompt_len": 16, "output_len": 8, "output_len_max": 16}
    sweep_from_dict(BASE | {"workload": wl})  # whole edges take any length
    bad = BASE | {"workload": wl, "stages": [BASE["stages"][0], BASE["stages"][1] | {"window": 4}]}
    with pytest.raises(ConfigError, match=r"stages\[1\]\.window: a streamed edge needs one "
                                          r"output length, .*got 4$"):
        sweep_from_dict(bad)


def test_a_serving_pipeline_fits_the_longest_lengths_in_each_stage():
    wl = {"mode": "serving", "prompt_len": 16, "prompt_len_max": 100, "output_len": 8}
    with pytest.raises(ConfigError, match=r"stages\[0\]\.max_model_len: the stage's prompt 100 "
                                          r"\+ output_len 8 exceed it, got 64$"):
        sweep_from_dict(BASE | {"workload": wl, "stages": [
            {"kv_cache_mib": 32, "cores": 1, "max_model_len": 64}, BASE["stages"][1]]})
