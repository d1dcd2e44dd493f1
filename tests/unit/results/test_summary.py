import csv
import io

import pytest

from omni_ray.results.summary import (Stat, flags, ranking_note, summarize, summarize_arms,
                                      to_csv, to_markdown)


def test_summarize():
    s = summarize([10.0, 11.0, 9.0])
    assert s == Stat(median=10.0, min=9.0, max=11.0, spread_pct=20.0, n=3)
    assert summarize([5]).spread_pct == 0.0
    assert summarize([4, 5, 6, 7]).median == 5.5


def test_summarize_edge_cases():
    with pytest.raises(ValueError, match="no values"):
        summarize([])
    assert summarize([0, 0]).spread_pct == 0.0
    assert summarize([-1, 0, 1]).spread_pct is None  # median 0, values differ
    assert summarize([-10, -12]).spread_pct == pytest.approx(2 / 11 * 100)


def test_flags():
    assert flags(summarize([10, 10.5, 10.2])) == []
    assert flags(summarize([10, 12, 11])) == ["NOISY"]
    assert flags(summarize([10, 12, 11]), noise_pct=25) == []
    assert flags(summarize([10])) == ["SINGLE PASS"]
    assert flags(summarize([10, 10]), contended=True) == ["CONTENDED"]
    assert flags(summarize([-1, 1, 0])) == ["NOISY"]


def test_ranking_note():
    a = summarize([100, 104, 102])  # range 4
    b = summarize([103, 103.5, 103.2])  # range 0.5
    note = ranking_note(a, b, names=("tp1", "tp2"), metric="ready_s")
    assert note.startswith("NOT A RANKING: ready_s: tp1 102 vs tp2 103.2 differ by 1.2")
    assert "spread of tp1 (4)" in note
    assert ranking_note(a, summarize([120, 121])) is None
    assert "same median" in ranking_note(summarize([5]), summarize([5]))
    assert ranking_note(summarize([5]), summarize([6])) is None


def record(arm, pass_, status="ok", **m):
    r = {"arm": {"id": arm}, "pass": pass_, "status": status, "measurements": m}
    if status != "ok":
        r["error"] = "EngineCore died\nTraceback..."
    return r


def records():
    return [
        record("a", 0, ready_s=10.0, rss=1000.0),
        record("b", 0, ready_s=20.0, rss=1001.0),
        record("a", 1, ready_s=10.2, rss=1002.0),
        record("b", 1, status="failed"),
        record("a", 2, ready_s=9.9, rss=1001.0),
        record("b", 2, ready_s=30.0, rss=1000.5),
        {**record("c", 0, ready_s=1.0), "retracted": True},
        {**record("c", 1, ready_s=5.0), "preflight": {"ok": False}},
    ]


def test_summarize_arms():
    s = summarize_arms(records(), ["ready_s", "rss", "decode_s"], noise_pct=8.0)
    assert list(s["arms"]) == ["a", "b", "c"]
    a, b, c = s["arms"]["a"], s["arms"]["b"], s["arms"]["c"]
    assert a["metrics"]["ready_s"]["median"] == 10.0 and a["metrics"]["ready_s"]["n"] == 3
    assert a["metrics"]["ready_s"]["flags"] == [] and a["flags"] == []
    assert a["metrics"]["decode_s"] is None
    assert b["n_records"] == 3 and b["n_failed"] == 1 and b["flags"] == ["FAILED 1/3"]
    assert b["errors"] == ["EngineCore died"]
    assert b["metrics"]["ready_s"]["n"] == 2 and b["metrics"]["ready_s"]["flags"] == ["NOISY"]
    assert c["n_retracted"] == 1 and c["flags"] == ["CONTENDED"]
    assert c["metrics"]["ready_s"]["median"] == 5.0
    assert c["metrics"]["ready_s"]["flags"] == ["SINGLE PASS", "CONTENDED"]
    rss_notes = [n for n in s["notes"] if n["metric"] == "rss"]
    assert [n["arms"] for n in rss_notes] == [["a", "b"]]  # 1001 vs 1000.5 within spread
    assert not [n for n in s["notes"] if n["metric"] == "ready_s" and n["arms"] == ["a", "c"]]


def test_summarize_arms_needs_an_arm_id():
    with pytest.raises(ValueError, match=r"record 1 has no arm id \(record\['arm'\]\['id'\]\)"):
        summarize_arms([record("a", 0), {"measurements": {}}], ["x"])


def test_non_numbers_are_skipped():
    s = summarize_arms([record("a", 0, x=None), record("a", 1, x=True), record("a", 2, x=3)],
                       ["x"])
    assert s["arms"]["a"]["metrics"]["x"]["n"] == 1


def test_to_csv():
    rows = list(csv.DictReader(io.StringIO(to_csv(summarize_arms(records(), ["ready_s"])))))
    assert [r["arm"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["median"] == "10.0" and rows[0]["spread_pct"] == "3.0"
    assert rows[1]["flags"] == "FAILED 1/3;NOISY" and rows[1]["n_failed"] == "1"
    assert rows[2]["flags"] == "CONTENDED;SINGLE PASS"
    empty = list(csv.DictReader(io.StringIO(
        to_csv(summarize_arms([record("z", 0, status="failed")], ["ready_s"])))))
    assert empty[0]["median"] == "" and empty[0]["flags"] == "FAILED 1/1"


def test_to_markdown():
    md = to_markdown(summarize_arms(records(), ["ready_s", "rss"]))
    lines = md.splitlines()
    assert lines[0] == "| arm | ready_s | rss | n | flags |"
    assert lines[2] == "| a | 10 (3.0%) | 1001 (0.2%) | 3 |  |"
    assert lines[3] == "| b | 25 (40.0%) | 1000.8 (0.0%) | 2 | FAILED 1/3, NOISY (ready_s) |"
    assert lines[4] == "| c | 5 (0.0%) | - | 1 | CONTENDED, SINGLE PASS |"
    assert "NOISY: spread > 8%" in md
    assert "- NOT A RANKING: rss: a 1001 vs b 1000.8 differ by 0.25" in md


def test_single_pass_names_its_figures_when_others_have_more():
    """An arm whose engine start was another arm's in one pass has its start figures once and
    its decode figures from every pass: only the former are single."""
    recs = [record("a", 0, ready_s=9.0, decode=5.0), record("a", 1, decode=5.1)]
    line = to_markdown(summarize_arms(recs, ["ready_s", "decode"])).splitlines()[2]
    assert line.endswith("| 1/2 | SINGLE PASS (ready_s) |"), line


def test_an_arm_on_another_arms_engine_start_says_whose():
    about = {"started_by": "a", "arms": ["a", "b"]}
    recs = [{"arm": {"id": "a"}, "measurements": {"ready_s": 9.0, "decode_s": 1.0},
             "shared_engine": about | {"position": 0}},
            {"arm": {"id": "b"}, "measurements": {"decode_s": 2.0},
             "shared_engine": about | {"position": 1}}]
    s = summarize_arms(recs, ["ready_s", "decode_s"])
    assert s["arms"]["a"]["flags"] == [] and s["arms"]["b"]["flags"] == ["SHARED START (a)"]
    assert s["arms"]["b"]["metrics"]["ready_s"] is None  # the start is a's, not copied
    assert "| SHARED START (a)" in to_markdown(s).splitlines()[3]


def test_llamacpp_arms_say_which_setting_won_how_often():
    def rec(pass_, decode_setting):
        return {"arm": {"id": "q4"}, "pass": pass_,
                "measurements": {"decode_tok_s": 100.0 + pass_,
                                 "llamacpp_prefill_setting": "-fa on -t 2",
                                 "llamacpp_setting": decode_setting}}

    s = summarize_arms([rec(0, "-fa off -t 2"), rec(1, "-fa on -t 2"), rec(2, "-fa off -t 2"),
                        record("vllm", 0, decode_tok_s=90.0)], ["decode_tok_s"])
    assert s["arms"]["q4"]["llamacpp_settings"] == {
        "prefill": {"-fa on -t 2": 3}, "decode": {"-fa off -t 2": 2, "-fa on -t 2": 1}}
    assert "llamacpp_settings" not in s["arms"]["vllm"]
    md = to_markdown(s)
    assert "- q4 (q4): prefill -fa on -t 2 3x; decode -fa off -t 2 2x, -fa on -t 2 1x" in md
