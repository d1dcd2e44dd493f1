"""Grid expansion: counts, order, labels, and ids that follow the resolved config only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from omni_ray.config import Arm, expand, load_sweep_file, sweep_from_dict

VALID = Path(__file__).resolve().parents[3] / "tests" / "configs" / "valid"


def _sweep(**extra: object) -> dict:
    return {"name": "g", "model": "tiny", "stage": {"kv_cache_mib": 64}, **extra}


def test_no_axes_is_one_base_arm() -> None:
    (arm,) = expand(load_sweep_file(VALID / "minimal.yaml"))
    assert (arm.label, arm.index, arm.sweep, arm.slot_cores, arm.timeout_s) == (
        "base", 0, "minimal", None, 600.0)
    assert arm.stage.kv_cache_mib == 64


def test_matrix_order_last_key_fastest() -> None:
    arms = expand(load_sweep_file(VALID / "matrix.yaml"))
    assert [a.label for a in arms] == [
        "kv_cache_mib=32,batch=1", "kv_cache_mib=32,batch=4",
        "kv_cache_mib=64,batch=1", "kv_cache_mib=64,batch=4",
        "kv_cache_mib=128,batch=1", "kv_cache_mib=128,batch=4"]
    assert [(a.stage.kv_cache_mib, a.workload.batch) for a in arms] == [
        (32, 1), (32, 4), (64, 1), (64, 4), (128, 1), (128, 4)]


def test_matrix_key_order_is_file_order() -> None:
    arms = expand(sweep_from_dict(_sweep(matrix={"batch": [1, 2], "kv_cache_mib": [8, 16]})))
    assert arms[1].label == "batch=1,kv_cache_mib=16"


def test_zip_moves_together_and_is_one_axis() -> None:
    arms = expand(load_sweep_file(VALID / "zip.yaml"))
    assert len(arms) == 6
    assert [(a.workload.batch, a.workload.prompt_len, a.workload.output_len) for a in arms] == [
        (1, 16, 4), (1, 128, 32), (1, 256, 64), (8, 16, 4), (8, 128, 32), (8, 256, 64)]
    assert arms[0].label == "batch=1,prompt_len=16,output_len=4"


def test_counts_multiply() -> None:
    sweep = sweep_from_dict(_sweep(
        matrix={"batch": [1, 2, 3], "dtype": ["bfloat16", "float32"]},
        zip=[{"prompt_len": [8, 16], "output_len": [4, 8]}, {"warmup": [0, 1, 2, 3]}]))
    assert len(expand(sweep)) == 3 * 2 * 2 * 4


def test_slot_cores_axis_and_default() -> None:
    sweep = sweep_from_dict(_sweep(placement={"slot_cores": 8}))
    assert expand(sweep)[0].slot_cores == 8
    arms = expand(sweep_from_dict(_sweep(placement={"slot_cores": 8},
                                         matrix={"slot_cores": [2, 4]})))
    assert [a.slot_cores for a in arms] == [2, 4]


def test_labels_of_non_scalar_values(tmp_path: Path) -> None:
    (tmp_path / "my-model").mkdir()
    sweep = sweep_from_dict(_sweep(matrix={
        "model": ["tiny", "my-model"], "disable_patches": [[], ["kv_budget", "aot_cache"]],
        "quantization": [None], "enforce_eager": [False], "env": [{"A": 1}]}),
        base_dir=str(tmp_path))
    assert [a.label for a in expand(sweep)][-1] == (
        "model=my-model,disable_patches=aot_cache+kv_budget,quantization=null,"
        "enforce_eager=false,env={A:1}")
    assert expand(sweep)[0].label.startswith("model=tiny,disable_patches=none,")


def test_same_config_same_id() -> None:
    a = expand(load_sweep_file(VALID / "matrix.yaml"))
    b = expand(load_sweep_file(VALID / "matrix.yaml"))
    assert [x.id for x in a] == [x.id for x in b]
    assert all(len(x.id) == 12 and int(x.id, 16) >= 0 for x in a)


def test_id_ignores_how_the_value_was_written() -> None:
    # The same resolved arm, once from the base config and once from an axis, key order swapped.
    (base,) = expand(sweep_from_dict(_sweep(workload={"batch": 4, "prompt_len": 8})))
    swept = expand(sweep_from_dict({"workload": {"prompt_len": 8}, "stage": {"kv_cache_mib": 64},
                                    "model": "tiny", "name": "g", "matrix": {"batch": [2, 4]}}))
    assert swept[1].id == base.id and swept[1].label != base.label


def test_changed_value_changes_id() -> None:
    ids = {arm.id for arm in expand(sweep_from_dict(_sweep(matrix={"kv_cache_mib": [63, 64]})))}
    ids |= {expand(sweep_from_dict(_sweep(name="other")))[0].id}                   # sweep name
    ids |= {expand(sweep_from_dict(_sweep(placement={"slot_cores": 2})))[0].id}    # slot_cores
    ids |= {expand(sweep_from_dict(_sweep(stage={"kv_cache_mib": 64,
                                                 "env": {"A": "1"}})))[0].id}     # env
    assert len(ids) == 5


def test_id_ignores_run_settings() -> None:
    plain = expand(sweep_from_dict(_sweep()))[0].id
    assert expand(sweep_from_dict(_sweep(passes=1, timeout_s=5, noise={"spread_pct": 2})))[0].id \
        == plain


def test_ids_of_literal_configs_are_pinned() -> None:
    # Literal ids, written down once (git 55aeeb6): stored results and --resume find an arm by
    # its id, so a change to the recipe (arm_id, or what a config's to_dict() holds) orphans
    # them. When this fails on purpose, stored records need an upgrade path first.
    assert [a.id for a in expand(sweep_from_dict(_sweep()))] == ["07013dcaad04"]
    arms = expand(sweep_from_dict(_sweep(matrix={"kv_cache_mib": [63, 64]},
                                         placement={"slot_cores": 2})))
    assert [(a.label, a.id) for a in arms] == [("kv_cache_mib=63", "e9f83aa26e38"),
                                              ("kv_cache_mib=64", "d40c3eaa91cc")]


def test_arm_to_dict_is_stable_json() -> None:
    arm = expand(load_sweep_file(VALID / "everything.yaml"))[3]
    d = arm.to_dict()
    assert list(d) == ["id", "sweep", "label", "index", "stage", "workload", "slot_cores",
                       "timeout_s", "replicas"]
    assert json.loads(json.dumps(d)) == d
    assert d["stage"]["disable_patches"] == ["kv_budget"] and d["slot_cores"] == 4
    assert d["stage"]["engine_args"] == {"seed": 7,
                                         "compilation_config": {"level": 0, "custom_ops": ["none"]}}


def test_arm_id_cannot_be_passed_in() -> None:
    arm = expand(sweep_from_dict(_sweep()))[0]
    fields = {f.name for f in dataclasses.fields(Arm) if f.init}
    assert "id" not in fields
    moved = dataclasses.replace(arm, stage=dataclasses.replace(arm.stage, kv_cache_mib=65))
    assert moved.id != arm.id


def test_expand_is_deterministic_and_pure() -> None:
    sweep = load_sweep_file(VALID / "everything.yaml")
    assert expand(sweep) == expand(sweep)
    assert [a.index for a in expand(sweep)] == [0, 1, 2, 3]


def test_quality_probe_is_id_neutral_off_and_part_of_the_id_on() -> None:
    # off (the default, false or null) keeps the ids pinned above; on, true is the defaults
    plain = expand(sweep_from_dict(_sweep()))[0].id
    assert expand(sweep_from_dict(_sweep(workload={"quality": False})))[0].id == plain
    on = expand(sweep_from_dict(_sweep(workload={"quality": True})))[0]
    spelled = expand(sweep_from_dict(_sweep(workload={"quality": {"tokens": 32}})))[0]
    assert on.id == spelled.id != plain
    assert on.workload.quality == {"tokens": 32, "sequence_len": 128}
    assert on.to_dict()["workload"]["quality"] == {"tokens": 32, "sequence_len": 128}


def _peers(baseline: str) -> dict:
    return _sweep(stage={"kv_cache_mib": 32}, baseline=baseline,
                  workload={"detokenize": False},
                  matrix={"prompt_len": [128, 512]},
                  zip=[{"engine": ["vllm", "vllm", "llamacpp"],
                        "quantization": [None, "cpu_int4", "Q4_0"],
                        "kv_cache_mib": [32, 32, None]}])


def test_baseline_by_some_axes_divides_each_arm_by_its_own_matrix_point() -> None:
    from omni_ray.config.grid import baselines

    sweep = sweep_from_dict(_peers("engine=llamacpp,quantization=Q4_0"))
    got = baselines(sweep)
    q4 = {p: f"prompt_len={p},engine=llamacpp,quantization=Q4_0,kv_cache_mib=null"
          for p in (128, 512)}
    assert len(got) == 6
    for label, base in got.items():
        assert base == q4[int(label.split(",")[0].split("=")[1])]


def test_baseline_naming_a_matrix_value_or_a_whole_label_is_one_arm_for_all() -> None:
    from omni_ray.config.grid import baselines

    one = "prompt_len=128,engine=vllm,quantization=null,kv_cache_mib=32"
    for spec in (one, "prompt_len=128,quantization=null"):
        got = baselines(sweep_from_dict(_peers(spec)))
        assert set(got.values()) == {one} and len(got) == 6
    assert baselines(sweep_from_dict(_sweep(matrix={"batch": [1, 2]}))) == {}
