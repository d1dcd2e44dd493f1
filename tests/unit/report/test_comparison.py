import pytest

from omni_ray.errors import UserError
from omni_ray.report.comparison import (
    NOISE, SAME, compare_runs, default_bands, load_bands, to_text, verdict)
from omni_ray.report.metric import BY_NAME
from omni_ray.report.retraction import retract_result
from omni_ray.results.summary import summarize

DECODE, PEAK = BY_NAME["decode_tok_s"], BY_NAME["peak_rss_anon_mb"]


def test_default_bands_are_the_documented_ones():
    b = default_bands()
    assert (b["rss_anon_tree_mb"], b["peak_rss_anon_mb"], b["init_s"], b["ready_s"],
            b["decode_tok_s"], b["prefill_tok_s"], b["import_s"]) == (1.5, 2, 12, 12, 6, 6, 5)


@pytest.mark.parametrize("base, new, expected", [
    ([100.0], [90.0], "slower"),             # single passes, 10 % > 6 % band
    ([100.0], [110.0], "faster"),
    ([100.0], [95.0], SAME),                 # inside the 6 % band
    ([100.0], [100.0], SAME),
    ([80.0, 100.0, 120.0], [90.0], NOISE),   # inside the base's own spread: never a regression
    ([100.0], [70.0, 90.0, 110.0], NOISE),   # inside the new run's spread
])
def test_decode_verdicts(base, new, expected):
    assert verdict(DECODE, summarize(base), summarize(new), 6.0) == expected


def test_memory_regresses_upward():
    assert verdict(PEAK, summarize([1000.0]), summarize([1030.0]), 2.0) == "larger"
    assert verdict(PEAK, summarize([1000.0]), summarize([1015.0]), 2.0) == SAME
    assert verdict(PEAK, summarize([1000.0]), summarize([900.0]), 2.0) == "smaller"


def test_regression_sets_exit_1_and_is_named(make_run, tmp_path):
    base = make_run("base", {"x=1": [{"decode_tok_s": 100.0}] * 3})
    new = make_run("new", {"x=1": [{"decode_tok_s": 80.0}] * 3})
    c = compare_runs(base, new)
    assert c.exit_code == 1
    text = to_text(c)
    assert "slower  <-- REGRESSION" in text
    assert "1 regression(s): x=1 decode_tok_s" in text
    assert f"git {'a' * 12}" in text
    assert compare_runs(base, base).exit_code == 0


def test_match_by_label_when_only_unmeasured_fields_changed(make_run):
    base = make_run("base", {"x=1": [{"decode_tok_s": 100.0}]}, timeout_s=900.0)
    new = make_run("new", {"x=1": [{"decode_tok_s": 100.0}]}, timeout_s=300.0)
    c = compare_runs(base, new)
    assert [a.matched_by for a in c.arms] == ["label"]


def test_no_arm_in_common_is_one_line(make_run):
    base = make_run("base", {"x=1": [{"decode_tok_s": 1.0}]})
    new = make_run("new", {"x=2": [{"decode_tok_s": 1.0}]})
    with pytest.raises(UserError, match=r"new/20261201T100000Z: no arm in common with "
                                        r".*base arms: x=1; new arms: x=2"):
        compare_runs(base, new)


def test_cpu_and_dirty_tree_are_warned(make_run):
    prov = {"git": {"sha": "b" * 40, "dirty": True}, "cpu": {"brand": "Other", "flags": ["sse"]}}
    base = make_run("base", {"x=1": [{"decode_tok_s": 1.0}]})
    new = make_run("new", {"x=1": [{"decode_tok_s": 1.0}]}, provenance=prov)
    text = to_text(compare_runs(base, new))
    assert "WARNING: CPU MODEL DIFFERS: 'Test CPU' vs 'Other'" in text
    assert "WARNING: CPU FLAGS DIFFER" in text
    assert "measured from a dirty tree" in text
    assert f"git {'b' * 12} (DIRTY tree)" in text


def test_retracted_base_is_never_a_baseline(make_run):
    base = make_run("base", {"x=1": [{"decode_tok_s": 1.0}]})
    new = make_run("new", {"x=1": [{"decode_tok_s": 1.0}]})
    retract_result(base, "wrong host", superseded_by=new)
    with pytest.raises(UserError, match=r"retracted \(wrong host\); a retracted run is never "
                                        r"a baseline, use .*new"):
        compare_runs(base, new)


def test_retracted_arm_is_shown_not_compared(make_run):
    base = make_run("base", {"x=1": [{"decode_tok_s": 100.0}], "x=2": [{"decode_tok_s": 1.0}]})
    new = make_run("new", {"x=1": [{"decode_tok_s": 50.0}], "x=2": [{"decode_tok_s": 1.0}]})
    retract_result(new / "id-x=1.p1.json", "bad pass")
    c = compare_runs(base, new)
    assert c.exit_code == 0
    assert "RETRACTED in new: not compared" in to_text(c)


def test_bands_file(tmp_path):
    f = tmp_path / "bands.yaml"
    f.write_text("decode_tok_s: 20\n")
    assert load_bands(f)["decode_tok_s"] == 20.0
    f.write_text("decode_speed: 20\n")
    with pytest.raises(UserError, match=r"bands\.yaml: decode_speed: unknown metric"):
        load_bands(f)
    f.write_text("decode_tok_s: -1\n")
    with pytest.raises(UserError, match=r"bands\.yaml: decode_tok_s: must be a percentage"):
        load_bands(f)
    f.write_text("[1, 2]\n")
    with pytest.raises(UserError, match=r"bands\.yaml: must be a mapping"):
        load_bands(f)
    with pytest.raises(UserError, match=r"missing\.yaml: no such bands file"):
        load_bands(tmp_path / "missing.yaml")


def test_wider_band_turns_a_regression_into_same(make_run, tmp_path):
    base = make_run("base", {"x=1": [{"decode_tok_s": 100.0}]})
    new = make_run("new", {"x=1": [{"decode_tok_s": 90.0}]})
    f = tmp_path / "b.json"
    f.write_text('{"decode_tok_s": 15}')
    assert compare_runs(base, new).exit_code == 1
    assert compare_runs(base, new, bands=f).exit_code == 0


def test_same_label_with_a_changed_measured_field_is_explained(make_run, tmp_path):
    import json

    base = make_run("base", {"x=1": [{"decode_tok_s": 1.0}], "x=2": [{"decode_tok_s": 1.0}]})
    new = make_run("new", {"x=1": [{"decode_tok_s": 1.0}], "x=2": [{"decode_tok_s": 1.0}]})
    f = new / "id-x=2.p1.json"
    rec = json.loads(f.read_text())
    rec["config"]["stage"]["kv_cache_mib"] = 128
    rec["config_hash"] = "changed"
    f.write_text(json.dumps(rec))
    text = to_text(compare_runs(base, new))
    assert "only in base: x=2 (id-x=2): same label, config differs in stage.kv_cache_mib" in text
    assert "only in new: x=2" in text


def test_spreads_are_printed(make_run):
    base = make_run("base", {"x=1": [{"decode_tok_s": 90.0}, {"decode_tok_s": 110.0}]})
    new = make_run("new", {"x=1": [{"decode_tok_s": 100.0}]})
    line = next(ln for ln in to_text(compare_runs(base, new)).splitlines()
                if ln.strip().startswith("decode (tok/s)"))
    assert line.split() == ["decode", "(tok/s)", "100", "20.0%", "100", "1", "pass", "1.000",
                            "same"]
