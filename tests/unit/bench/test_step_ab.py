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
    assert s["pairs_b_faster"] == 2


def test_pairs_must_be_positive():
    with pytest.raises(SystemExit):
        step_ab.main(["--switch", "cpu_attention", "--pairs", "0"])


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
