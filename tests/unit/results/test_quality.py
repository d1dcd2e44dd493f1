"""Quality beside speed: pairing records with their bf16 arm, and the figures' arithmetic."""

from __future__ import annotations

import math

import pytest

from omni_ray.results.quality import CAVEAT, compare, greedy_prefix, pair, to_markdown
from omni_ray.workload.quality import ids_digest

IDS = [300, 301, 302, 303]
BASE_LP = [-1.0, -2.0, -3.0]


def _m(logprobs, greedy, *, weights="bfloat16", source="/m/tiny", ids=IDS, decode=100.0):
    mean = sum(logprobs) / len(logprobs)
    return {"quality_logprobs": list(logprobs), "quality_greedy_ids": list(greedy),
            "quality_sequence_len": len(ids), "quality_ids_digest": ids_digest(ids),
            "quality_mean_logprob": mean, "quality_perplexity": math.exp(-mean),
            "quality_source": source, "quality_weights": weights, "decode_tok_s": decode}


def _rec(arm, m, *, engine="vllm", p=0, status="ok", **stage):
    return {"arm": {"id": arm, "label": f"label-{arm}"}, "pass": p, "status": status,
            "config": {"stage": {"model": "tiny", "engine": engine, **stage}},
            "measurements": m}


def test_greedy_prefix_counts_up_to_the_first_difference() -> None:
    assert greedy_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert greedy_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert greedy_prefix([1, 2, 3], [9, 2, 3]) == 0


def test_compare_arithmetic() -> None:
    base = _m(BASE_LP, [1, 2, 3, 4])
    other = _m([-1.5, -2.0, -2.0], [1, 2, 9, 4])
    got = compare(base, other)
    assert got["greedy_prefix"] == 2 and got["greedy_prefix_fraction"] == 0.5
    assert got["greedy_agreement"] == 0.75  # position 3 agrees again after the difference
    assert got["mean_abs_dlogprob"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert got["max_abs_dlogprob"] == 1.0
    # perplexities exp(2) and exp(5.5/3): the ratio is exp(-(mean_other - mean_base))
    assert got["perplexity_ratio"] == pytest.approx(math.exp(5.5 / 3 - 2.0))
    same = compare(base, base)
    assert (same["greedy_agreement"], same["mean_abs_dlogprob"], same["perplexity_ratio"]) == (
        1.0, 0.0, 1.0)


def test_compare_refuses_probes_of_other_ids() -> None:
    with pytest.raises(ValueError, match="quality_ids_digest"):
        compare(_m(BASE_LP, [1]), _m(BASE_LP, [1], ids=[300, 301, 302, 999]))
    with pytest.raises(ValueError, match="tokens: 2 vs 1"):
        compare(_m(BASE_LP, [1, 2]), _m(BASE_LP, [1]))


def test_pairs_each_quantized_arm_with_the_bf16_arm_of_its_engine_and_source() -> None:
    records = [
        _rec("bf16", _m(BASE_LP, [1, 2, 3, 4], decode=100.0)),
        _rec("bf16", _m(BASE_LP, [1, 2, 3, 4], decode=110.0), p=1),
        _rec("int4", _m([-1.5, -2.0, -2.0], [1, 2, 9, 4], weights="cpu_int4", decode=200.0),
             quantization="cpu_int4"),
        # pass 1 compares with bf16's pass 1 (here: the same ids, other figures)
        _rec("int4", _m([-1.0, -2.0, -3.0], [1, 2, 3, 4], weights="cpu_int4", decode=220.0),
             p=1, quantization="cpu_int4"),
        # transformers' bf16 arm is a baseline of transformers arms only
        _rec("hf", _m([-9.0, -9.0, -9.0], [7, 7, 7, 7]), engine="transformers"),
        # a checkpoint of another source has no bf16 arm here
        _rec("other", _m(BASE_LP, [1, 2, 3, 4], weights="cpu_int4", source="/m/small")),
        # failed and probe-less records give nothing
        _rec("failed", {}, status="failed"),
        _rec("plain", {"decode_tok_s": 5.0}),
    ]
    rows = {r["arm"]: r for r in pair(records)}
    assert sorted(rows) == ["int4", "other"]
    r = rows["int4"]
    assert (r["baseline"], r["engine"], r["weights"], r["n"], r["tokens"]) == (
        "bf16", "vllm", "cpu_int4", 2, 4)
    # medians over the two passes: (2, 4) prefix, (0.75, 1.0) agreement
    assert r["greedy_prefix"] == 3 and r["greedy_agreement"] == 0.875
    assert r["mean_abs_dlogprob"] == pytest.approx(0.25)
    assert (r["decode_tok_s"], r["baseline_decode_tok_s"]) == (210.0, 105.0)
    assert r["baseline_perplexity"] == pytest.approx(math.exp(2.0))
    assert rows["other"]["baseline"] is None and rows["other"]["n"] == 0


def test_of_several_bf16_arms_the_closest_stage_is_the_baseline() -> None:
    records = [
        _rec("far", _m(BASE_LP, [1, 2, 3, 4]), kv_cache_mib=64, enforce_eager=False),
        _rec("near", _m(BASE_LP, [1, 2, 3, 4]), kv_cache_mib=32, enforce_eager=False),
        _rec("int4", _m(BASE_LP, [1, 2, 3, 4], weights="cpu_int4"), kv_cache_mib=32,
             enforce_eager=False, quantization="cpu_int4"),
    ]
    (row,) = pair(records)
    assert row["baseline"] == "near"


def test_markdown_says_what_synthetic_weights_make_of_the_numbers() -> None:
    records = [_rec("bf16", _m(BASE_LP, [1, 2, 3, 4])),
               _rec("int4", _m([-1.5, -2.0, -2.0], [1, 2, 9, 4], weights="cpu_int4"),
                    quantization="cpu_int4")]
    text = to_markdown(pair(records), {"bf16": "quantization=null",
                                       "int4": "quantization=cpu_int4"})
    assert "## Quality beside speed" in text
    assert "| quantization=cpu_int4 (int4) | vllm cpu_int4 | quantization=null (bf16) | 2/4 |" \
        in text
    assert CAVEAT in text and "Synthetic random weights" in CAVEAT and "meaningless" in CAVEAT
    assert to_markdown([]) == ""


def test_a_run_directory_with_the_probe_gives_the_quality_table(tmp_path) -> None:
    """From records on disk (as a sweep writes them) to summary.json's pairs and summary.md."""
    from omni_ray.api import write_summary
    from omni_ray.config import expand, sweep_from_dict
    from omni_ray.results.record import make_record
    from omni_ray.results.store import write_json_atomic

    sweep = sweep_from_dict({"name": "q", "model": "tiny", "stage": {"kv_cache_mib": 32},
                             "workload": {"quality": {"tokens": 4, "sequence_len": 4}},
                             "matrix": {"quantization": [None, "cpu_int4"]}})
    arms = expand(sweep)
    figures = [_m(BASE_LP, [1, 2, 3, 4]),
               _m([-1.5, -2.0, -2.0], [1, 2, 9, 4], weights="cpu_int4", decode=200.0)]
    for arm, m in zip(arms, figures):
        rec = make_record(kind="arm", config=arm.to_dict(), measurements=m, status="ok",
                          provenance={}, extra={"arm": {"id": arm.id, "label": arm.label,
                                                        "sweep": "q", "index": arm.index},
                                                "pass": 1, "run_id": "r"})
        write_json_atomic(tmp_path / f"{arm.id}.p1.json", rec)
    summary = write_summary(sweep, arms, tmp_path)
    (row,) = summary["quality"]
    assert (row["arm"], row["baseline"]) == (arms[1].id, arms[0].id)
    assert summary["metrics"][-1] == "quality_perplexity"
    text = (tmp_path / "summary.md").read_text()
    assert "## Quality beside speed" in text and "quantization=cpu_int4" in text
    assert "meaningless" in text
    from omni_ray.report.document import write_report

    html = write_report([tmp_path]).read_text()
    assert "Quality beside speed" in html and "meaningless" in html and "2/4" in html
