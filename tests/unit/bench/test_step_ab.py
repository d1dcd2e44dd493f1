"""step_ab's pure parts: which side goes first, and what the pairs add up to."""

import pytest

from omni_ray.bench import step_ab


def test_sides_alternate_which_goes_first():
    orders = [step_ab.pair_order(i, "a", "b") for i in range(4)]
    assert orders == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]


def test_summary_is_pairwise_and_counts_where_b_wins():
    ms = {"a": [10.0, 20.0, 12.0], "b": [8.0, 25.0, 10.0]}
    s = step_ab.summarize("a", "b", ms)
    assert s["median_step_ms"] == {"a": 12.0, "b": 10.0}
    assert s["ratio_of_medians"] == pytest.approx(1.2)
    assert s["pairwise_ratios"] == pytest.approx([1.25, 0.8, 1.2])
    assert s["pairwise_ratio_median"] == pytest.approx(1.2)
    assert s["sign_test_p"] == 1.0  # 2 of 3: the sweep's sign test (results.pairs) says nothing
    assert s["pairs_b_faster"] == 2


def test_pairs_must_be_positive(capsys):
    with pytest.raises(SystemExit) as info:
        step_ab.main(["--switch", "cpu_attention", "--pairs", "0"])
    assert info.value.code == 2
    assert capsys.readouterr().err.endswith("error: --pairs must be at least 1, got 0\n")


def test_a_missing_model_directory_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        step_ab.main(["--switch", "cpu_attention", "--model", str(tmp_path / "nope")])
    assert f"--model: not a checkpoint directory: {tmp_path / 'nope'}" in capsys.readouterr().err


def test_cpp_wrapper_needs_a_compiled_engine(capsys):
    with pytest.raises(SystemExit):
        step_ab.main(["--switch", "attention_kernels", "--cpp-wrapper", "--eager"])
    assert "--cpp-wrapper needs a compiled engine" in capsys.readouterr().err


def test_weight_prefetch_without_native_kernels_says_why(monkeypatch, capsys):
    from vllm_omni.ops import native

    monkeypatch.setattr(native, "load", lambda: native.Status(False, "disabled by X", None))
    with pytest.raises(SystemExit):
        step_ab.main(["--switch", "weight_prefetch"])
    assert "needs vllm_omni's native kernels: disabled by X" in capsys.readouterr().err


def test_detokenize_switch_changes_only_the_sampling_fields():
    sampling = {"temperature": 0.0, "ignore_eos": True}
    flip = step_ab.flipper("detokenize", sampling)
    flip("off")
    assert sampling == {"temperature": 0.0, "ignore_eos": True, "detokenize": False}
    flip("on")
    assert sampling["detokenize"] is True


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


def test_summary_adds_the_outside_model_pairs_when_measured():
    ms = {"a": [10.0, 20.0], "b": [8.0, 25.0]}
    s = step_ab.summarize("a", "b", ms, {"a": [1.5, 1.6], "b": [1.2, 1.7]})
    assert s["median_outside_model_ms"] == {"a": pytest.approx(1.55), "b": pytest.approx(1.45)}
    assert s["outside_model_pairwise_ratios"] == pytest.approx([1.25, 1.6 / 1.7])
    assert s["outside_model_pairs_b_faster"] == 1
    assert "median_outside_model_ms" not in step_ab.summarize("a", "b", ms)


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
