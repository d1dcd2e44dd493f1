"""The arithmetic of paired comparisons (compare:): sign test, pairwise ratios, contended pairs
left out, the verdict and the summary's section."""

from __future__ import annotations

import math

import pytest

from omni_ray.results.pairs import (from_turns, pair_stats, pairs_markdown, sign_test,
                                    summarize_pairs, verdict)


@pytest.mark.parametrize("wins,n,p", [(0, 0, 1.0), (5, 10, 1.0), (10, 10, 2 / 1024),
                                      (9, 10, 22 / 1024), (1, 10, 22 / 1024), (3, 4, 10 / 16),
                                      (20, 20, 2 / 2 ** 20)])
def test_sign_test_is_the_exact_two_sided_binomial(wins, n, p):
    assert sign_test(wins, n) == pytest.approx(p)


def test_sign_test_refuses_impossible_counts():
    with pytest.raises(ValueError, match="within 0..4"):
        sign_test(5, 4)


def test_pairs_compare_turn_by_turn_and_drop_ties_and_contended_pairs():
    # drift: both sides slow down together; the arm is 10 % faster in every clean pair
    arm = [110.0, 99.0, 88.0, 77.0, 100.0, 50.0]
    base = [100.0, 90.0, 80.0, 70.0, 100.0, 100.0]
    s = pair_stats(arm, base, [False, False, False, False, False, True])
    assert s["pairs"] == 6 and s["pairs_used"] == 5 and s["pairs_contended"] == 1
    assert s["ratios"] == pytest.approx([1.1, 1.1, 1.1, 1.1, 1.0])
    assert (s["wins"], s["losses"]) == (4, 0)  # the tie decides nothing
    assert s["sign_test_p"] == pytest.approx(2 / 16)
    assert s["ratio_median"] == pytest.approx(1.1)
    assert s["ratio_of_medians"] == pytest.approx(99.0 / 90.0)
    assert verdict(s) == "NOT A RANKING (sign test p=0.12)"


def test_enough_pairs_one_way_name_the_faster_side():
    s = pair_stats([90.0 + i for i in range(12)], [100.0 + i for i in range(12)])
    assert s["wins"] == 0 and verdict(s).startswith("slower (sign test p=0.00049")
    assert verdict(pair_stats([2.0] * 12, [1.0] * 12)).startswith("faster")


def test_turn_figures_pair_by_index_and_a_neighbour_marks_the_pair():
    arm = [{"turn": k, "decode_tok_s": 50.0 + k, "neighbour_cpu_frac": 0.01} for k in range(4)]
    base = [{"turn": k, "decode_tok_s": 40.0, "neighbour_cpu_frac": 0.01} for k in range(4)]
    base[2]["neighbour_cpu_frac"] = 0.6  # the idle arm spun while the baseline measured
    s = from_turns(arm, base, "decode_tok_s")
    assert s["metric"] == "decode_tok_s" and s["pairs_contended"] == 1
    assert s["pairs_used"] == 3 and s["arm_median"] == 51.0


def test_summary_section_says_what_was_compared_and_how_sure():
    ok = {"status": "ok", "config": {"arm": {"label": "quantization=cpu_int4"},
                                     "baseline": {"label": "quantization=null"}},
          "measurements": pair_stats([12.0] * 10, [10.0] * 10) | {"metric": "decode_tok_s"}}
    failed = {"status": "failed", "error": "side a (tiny, vllm): boom",
              "config": {"arm": {"label": "x"}, "baseline": {"label": "quantization=null"},
                         "metric": "decode_tok_s"}, "measurements": {}}
    rows = summarize_pairs([ok, failed])
    assert rows[0]["verdict"].startswith("faster") and rows[0]["wins"] == 10
    assert math.isclose(rows[0]["ratio_median"], 1.2)
    md = pairs_markdown(rows)
    assert "| quantization=cpu_int4 | quantization=null | decode_tok_s | 12 | 10 | 1.200x | " \
           "10/10 | 10/10 (0) | faster (sign test p=0.002) |" in md
    assert "| x | quantization=null | decode_tok_s | - | - | - | - | - | FAILED: side a" in md
    assert pairs_markdown([]) == ""
