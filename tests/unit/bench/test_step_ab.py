"""step_ab: its config (a one-arm sweep file, read by the sweep's loader), the pairs and what
they add up to, and the record and summary it writes (a fake engine: no vLLM here)."""

import json
import re
from pathlib import Path

import pytest

from omni_ray.bench import step_ab
from omni_ray.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "configs" / "step_ab_tiny.yaml"


def write_yaml(tmp_path: Path, text: str, name: str = "ab.yaml") -> Path:
    """A one-arm file on the tiny model (the project's fragment), plus ``text``."""
    path = tmp_path / name
    path.write_text(f"name: ab\ninclude: [{ROOT / 'configs' / '_fragments' / 'tiny.yaml'}]\n"
                    + text)
    return path


def test_sides_alternate_which_goes_first_as_compare_s_turns_do():
    flips: list[str] = []
    step_ab.take_pairs(flips.append, fake_step({"a": [1.0] * 4, "b": [1.0] * 4}, flips),
                       ("a", "b"), 4, warmup=0)
    assert flips == ["a", "b", "b", "a", "a", "b", "b", "a", "a"]  # then back to A


def test_detokenize_switch_changes_only_the_sampling_fields():
    sampling = {"temperature": 0.0, "ignore_eos": True}
    flip = step_ab.flipper("detokenize", sampling)
    flip("off")
    assert sampling == {"temperature": 0.0, "ignore_eos": True, "detokenize": False}
    flip("on")
    assert sampling["detokenize"] is True


@pytest.mark.native  # loads vllm_omni's C++ kernel set
def test_gemv_streams_switch_sets_the_kernels_stream_count():
    from vllm_omni.ops import native

    if not native.load().available:
        pytest.skip(f"no native kernels: {native.load().reason}")
    flip = step_ab.flipper("gemv_streams", {})
    default = native.ops().set_gemv_streams(2)
    try:
        flip("1")
        assert native.ops().set_gemv_streams(1) == 1
        flip("4")
        assert native.ops().set_gemv_streams(4) == 4
    finally:
        native.ops().set_gemv_streams(default)


def test_gc_switch_turns_the_collector_off_and_back_on():
    import gc

    flip = step_ab.flipper("gc", {})
    try:
        flip("off")
        assert not gc.isenabled()
        flip("on")
        assert gc.isenabled()
    finally:
        gc.enable()


def test_outside_model_time_is_taken_by_difference_of_the_last_two_runs():
    timer = object.__new__(step_ab.OutsideModel)  # no vLLM methods wrapped
    timer.marks = [5.0, 5.0, 5.002, 5.0084]  # older run, then the 1-token and 65-token runs
    assert timer.step_ms(64) == pytest.approx((0.0064 - 0.002) / 64 * 1e3)


def test_attention_sync_switch_flips_where_the_metadata_is_pushed(monkeypatch):
    from vllm_omni.patches import cpu_attention

    monkeypatch.setattr(cpu_attention, "PER_FORWARD_SYNC", True)
    flip = step_ab.flipper("attention_sync", {})
    flip("per_op")
    assert cpu_attention.PER_FORWARD_SYNC is False
    flip("per_forward")
    assert cpu_attention.PER_FORWARD_SYNC is True


def test_cache_update_switch_needs_the_cpp_kernels(monkeypatch):
    from vllm_omni.patches import cpu_attention

    monkeypatch.setattr(cpu_attention, "_NATIVE", None)
    with pytest.raises(RuntimeError, match="not on its C\\+\\+ kernels"):
        step_ab.flipper("cache_update", {})("direct")
    seen = []
    monkeypatch.setattr(cpu_attention, "_NATIVE", type("K", (), {
        "set_direct_update": staticmethod(seen.append)}))
    flip = step_ab.flipper("cache_update", {})
    flip("direct")
    flip("vllm")
    assert seen == [True, False]


def test_weight_pages_moves_each_packed_tensor_once_and_keeps_its_values():
    import torch
    from torch import nn

    from vllm_omni.quantization.cpu_int4 import PACK, SCALES_ZEROS

    embed, head, other = nn.Module(), nn.Module(), nn.Linear(2, 2)
    embed.register_parameter(PACK, nn.Parameter(torch.arange(64, dtype=torch.uint8),
                                                requires_grad=False))
    embed.register_parameter(SCALES_ZEROS, nn.Parameter(torch.ones(4).bfloat16(),
                                                        requires_grad=False))
    for name in (PACK, SCALES_ZEROS):  # a tied head shares the embedding's
        setattr(head, name, getattr(embed, name))
    model = nn.ModuleList([embed, head, other])
    worker = type("W", (), {"model_runner": type("R", (), {"get_model": lambda self: model})()})()
    pack = embed._parameters[PACK]
    before, other_weight = pack.data_ptr(), other.weight.data_ptr()
    assert step_ab.move_packed_weights(worker, True) == 2
    assert pack is embed._parameters[PACK] is head._parameters[PACK]  # same Parameter objects
    assert pack.data_ptr() != before and torch.equal(pack, torch.arange(64, dtype=torch.uint8))
    in_arena = pack.data_ptr()
    assert step_ab.move_packed_weights(worker, False) == 2
    assert pack.data_ptr() != in_arena
    assert torch.equal(embed._parameters[SCALES_ZEROS], torch.ones(4).bfloat16())
    assert other.weight.data_ptr() == other_weight  # not a packed tensor: left alone


# --- the config: a sweep file, read by the sweep's loader -------------------------------------

def test_the_project_files_load_as_one_arm():
    ab = step_ab.load(ROOT / "configs" / "step_ab.yaml", "cpu_attention", 30, affinity=[0, 1])
    s, w = ab.arm.stage, ab.arm.workload
    assert (s.model, s.quantization, s.enforce_eager, s.multiprocessing) == (
        "qwen2.5-0.5b", "cpu_int4", False, False)
    assert (w.prompt_len, w.output_len, w.batch) == (128, 65, 1)
    # a patch switch starts with the patch off: A is vLLM's own
    assert s.disable_patches == ("cpu_attention",)
    assert ab.cpus == (0, 1) and ab.request().cpus == (0, 1)
    assert step_ab.load(TINY, "gc", 3).arm.stage.disable_patches == ()


def test_slot_cores_takes_the_first_cpus_of_the_affinity(tmp_path):
    path = write_yaml(tmp_path, "placement:\n  slot_cores: 2\n")
    assert step_ab.load(path, "gc", 3, affinity=[5, 3, 4]).cpus == (3, 4)
    with pytest.raises(ConfigError, match=r"ab\.yaml: placement\.slot_cores: more than the 1 CPUs "
                                          r"this process may run on, got 2$"):
        step_ab.load(path, "gc", 3, affinity=[0])


@pytest.mark.parametrize("text, field, value", [
    ("workload:\n  batch: 0\n", "workload.batch", "0"),  # the sweep's own check
    ("matrix:\n  batch: [1, 2]\n", "matrix", None),
    ("stage:\n  multiprocessing: true\n", "stage.multiprocessing", "True"),
    ("workload:\n  context_len: 256\n", "workload.context_len", "256"),
    ("stage:\n  cpp_wrapper: true\n", "stage.cpp_wrapper", "True"),  # eager by default
    ("passes: 5\n", "passes", "5"),
    ("workload:\n  repeats: 5\n", "workload.repeats", "5"),
    ("stage:\n  engine: transformers\n  kv_cache_mib: null\n", "stage.engine", "'transformers'"),
])
def test_a_bad_field_is_one_line_naming_file_field_and_value(tmp_path, text, field, value):
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        step_ab.load(path, "gc", 3)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {field}: ")
    if value is not None:
        assert message.endswith(f", got {value}")


def test_compiled_entry_needs_the_cpp_wrapper(tmp_path):
    path = write_yaml(tmp_path, "")
    with pytest.raises(ConfigError, match=r"stage\.cpp_wrapper: --switch compiled_entry needs "
                                          r"it true"):
        step_ab.load(path, "compiled_entry", 3)


def test_cli_exits_2_with_one_line_on_a_bad_file(tmp_path, capsys):
    path = write_yaml(tmp_path, "stage:\n  kv_cache_mib: -1\n", name="bad.yaml")
    assert step_ab.main([str(path), "--switch", "gc"]) == 2
    err = capsys.readouterr().err
    assert err == f"step_ab: error: {path}: stage.kv_cache_mib: must be > 0, got -1\n"


def test_cli_pairs_must_be_positive(capsys):
    assert step_ab.main([str(TINY), "--switch", "gc", "--pairs", "0"]) == 2
    assert capsys.readouterr().err == "step_ab: error: --pairs: must be >= 1, got 0\n"


def test_cli_a_missing_file_is_named(tmp_path, capsys):
    assert step_ab.main([str(tmp_path / "nope.yaml"), "--switch", "gc"]) == 2
    assert re.match(rf"step_ab: error: {tmp_path / 'nope.yaml'}: cannot read file",
                    capsys.readouterr().err)


@pytest.mark.parametrize("switch", ["weight_prefetch", "gemv_streams"])
def test_kernel_switches_without_native_kernels_say_why(switch, monkeypatch, capsys):
    from vllm_omni.ops import native

    monkeypatch.setattr(native, "load", lambda: native.Status(False, "disabled by X", None))
    assert step_ab.main([str(TINY), "--switch", switch]) == 2
    assert (f"--switch {switch} needs vllm_omni's native kernels: disabled by X"
            in capsys.readouterr().err)


# --- the pairs ---------------------------------------------------------------------------------

def fake_step(times: dict[str, list[float]], flips: list[str], tokens=None):
    """A step of a fake engine: the next time of the side last flipped to."""
    def step():
        side = flips[-1]
        t = times[side].pop(0)
        return t, t / 10, (tokens or {}).get(side, [1, 2, 3])
    return step


def test_pairs_alternate_after_an_uncounted_warmup():
    flips: list[str] = []
    times = {"a": [99.0, 10.0, 20.0, 12.0], "b": [99.0, 8.0, 25.0, 10.0]}
    taken = step_ab.take_pairs(flips.append, fake_step(times, flips), ("a", "b"), 3, warmup=1)
    assert flips == ["a", "b", "a", "b", "b", "a", "a", "b", "a"]  # warm-up, pairs, back to A
    assert taken["step_ms"] == {"a": [10.0, 20.0, 12.0], "b": [8.0, 25.0, 10.0]}
    assert taken["outside_model_ms"]["b"] == pytest.approx([0.8, 2.5, 1.0])
    assert taken["same_tokens"] is True


def test_tokens_that_differ_between_the_sides_are_said():
    flips: list[str] = []
    times = {"a": [10.0, 10.0], "b": [8.0, 8.0]}
    taken = step_ab.take_pairs(flips.append, fake_step(times, flips, {"b": [9]}), ("a", "b"), 2,
                               warmup=0)
    assert taken["same_tokens"] is False


def test_measurements_are_compare_s_pair_stats_with_b_as_the_arm():
    taken = {"step_ms": {"a": [10.0, 20.0, 12.0], "b": [8.0, 25.0, 10.0]},
             "outside_model_ms": {"a": [1.5, 1.6, 1.0], "b": [1.2, 1.7, 1.0]},
             "same_tokens": True}
    m = step_ab.pair_measurements(("a", "b"), taken)
    assert m["metric"] == "decode_tok_s"
    assert m["ratios"] == pytest.approx([1.25, 0.8, 1.2])  # rate B / A = step A / B
    assert m["ratio_median"] == pytest.approx(1.2)
    assert (m["wins"], m["losses"], m["pairs_used"]) == (2, 1, 3)
    assert m["sign_test_p"] == 1.0  # 2 of 3: the sweep's sign test (results.pairs) says nothing
    assert m["median_step_ms"] == {"a": 12.0, "b": 10.0}
    o = m["outside_model"]
    assert o["ratios"] == pytest.approx([1.25, 1.6 / 1.7, 1.0])  # A / B
    assert (o["wins"], o["losses"]) == (1, 1)  # the tie counts for neither
    assert m["median_outside_model_ms"] == {"a": 1.5, "b": 1.2}
    unsplit = dict(taken, outside_model_ms={"a": [None] * 3, "b": [None] * 3})
    assert "outside_model" not in step_ab.pair_measurements(("a", "b"), unsplit)


def test_a_pair_beside_a_neighbour_is_counted_and_left_out():
    flips: list[str] = []
    times = {"a": [10.0, 10.0, 10.0], "b": [8.0, 12.0, 8.0]}
    fracs = iter([0.0, 0.9, None])  # None: a window too short to tell
    watched = []

    def watch():
        watched.append(len(flips))
        return lambda: {"neighbour_cpu_frac": next(fracs), "neighbour_window_s": 3.0}

    taken = step_ab.take_pairs(flips.append, fake_step(times, flips), ("a", "b"), 3, warmup=0,
                               watch=watch)
    assert watched == [0, 2, 4]  # one window a pair
    m = step_ab.pair_measurements(("a", "b"), taken)
    assert (m["pairs"], m["pairs_used"], m["pairs_contended"]) == (3, 2, 1)
    assert m["ratios"] == pytest.approx([1.25, 1.25])  # the slower pair ran beside a neighbour
    assert m["outside_model"]["pairs_contended"] == 1
    assert m["neighbours"][1]["neighbour_cpu_frac"] == 0.9


# --- the record and the summary ----------------------------------------------------------------

def fake_measure(ab):
    taken = {"step_ms": {"on": [10.0, 11.0, 10.5], "off": [9.0, 10.0, 9.5]},
             "outside_model_ms": {"on": [1.0, 1.1, 1.0], "off": [0.9, 1.0, 0.9]},
             "same_tokens": True}
    return step_ab.pair_measurements(ab.sides, taken), {"model_path": "/m", "patch_report": {}}


def test_the_run_is_a_versioned_record_with_provenance_and_compare_s_summary(tmp_path):
    ab = step_ab.load(TINY, "gc", 3)
    path = step_ab.run(ab, tmp_path / "results", "cmd", measure_fn=fake_measure)
    run_dir = path.parents[1]
    assert path.relative_to(tmp_path) == Path("results", "step_ab_tiny", run_dir.name, "pairs",
                                              "gc.json")
    assert re.fullmatch(r"\d{8}T\d{6}Z", run_dir.name)
    record = json.loads(path.read_text())
    assert (record["schema_version"], record["kind"], record["status"]) == (1, "step_ab", "ok")
    prov = record["provenance"]
    assert {"time", "host", "git", "packages", "env", "cpu_isa"} <= set(prov)
    assert record["config"]["engine"]["stage"]["model"] == "tiny"
    assert record["config"]["arm"]["label"] == "gc=off"
    assert record["config_hash"] and record["command"] == "cmd"
    assert record["pinning"]["requested_cpus"] == list(ab.cpus)
    # nothing half-written beside it (store.write_*_atomic rename a finished file)
    assert sorted(p.name for p in run_dir.rglob("*")) == ["gc.json", "pairs", "summary.md"]
    summary = (run_dir / "summary.md").read_text()
    assert summary.startswith("# step_ab: gc (on vs off)")
    assert "## Paired comparisons" in summary
    assert "| gc=off | gc=on | decode_tok_s |" in summary
    assert "NOT A RANKING" in summary  # 3 of 3 pairs: p = 0.25
    assert "Outside the model" in summary


def test_a_run_that_fails_while_measuring_is_recorded(tmp_path):
    ab = step_ab.load(TINY, "gc", 3)

    def broken(ab):
        raise RuntimeError("engine died")

    with pytest.raises(RuntimeError, match="engine died"):
        step_ab.run(ab, tmp_path, measure_fn=broken)
    (path,) = tmp_path.glob("step_ab_tiny/*/pairs/gc.json")
    record = json.loads(path.read_text())
    assert (record["status"], record["error"]) == ("failed", "RuntimeError: engine died")
    assert "FAILED: RuntimeError: engine died" in (path.parents[1] / "summary.md").read_text()


def test_a_record_that_cannot_be_written_leaves_no_file(tmp_path):
    ab = step_ab.load(TINY, "gc", 3)

    def nan(ab):
        m, facts = fake_measure(ab)
        return m | {"median_step_ms": {"on": float("nan"), "off": 1.0}}, facts

    with pytest.raises(ValueError, match="cannot write as JSON"):
        step_ab.run(ab, tmp_path, measure_fn=nan)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_bad_input_found_while_loading_is_one_line_and_no_record(tmp_path, capsys, monkeypatch):
    from vllm_omni.errors import OmniInputError

    def bad_checkpoint(ab):
        raise OmniInputError("/m: not a cpu_int4 checkpoint")

    monkeypatch.setattr(step_ab, "measure", bad_checkpoint)
    assert step_ab.main([str(TINY), "--switch", "gc", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "step_ab: error: /m: not a cpu_int4 checkpoint\n"
    assert not list(tmp_path.rglob("*.json"))
