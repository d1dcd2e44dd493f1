import csv
import io
import json

import pytest

from omni_ray.errors import UserError
from omni_ray.report import table
from omni_ray.report.metric import fmt
from omni_ray.report.retraction import retract_result
from omni_ray.report.run import load_run
from omni_ray.results.summary import summarize


@pytest.mark.parametrize("value, text", [
    (1113.27, "1113"), (151.57, "152"), (71.272, "71.3"), (9.4301, "9.43"), (0.44197, "0.442"),
    (21760, "21 760"), (64, "64.0"), (5, "5.00"), (None, "-"), (0.0, "0")])
def test_fmt_rounds_for_reading(value, text):
    assert fmt(value) == text


def test_cell_shows_spread_only_with_several_passes():
    assert table.cell(summarize([71.272])) == "71.3"
    assert table.cell(summarize([70.0, 71.272, 75.0])) == "71.3 [70.0-75.0]"
    assert table.cell(summarize([5.0, 5.0])) == "5.00"
    assert table.cell(None) == "-"


@pytest.fixture
def two_arms(make_run):
    return make_run("s", {"kv=64": [{"decode_tok_s": 10.0, "peak_rss_anon_mb": 1000.0}] * 2,
                          "kv=256": [{"decode_tok_s": 12.0, "peak_rss_anon_mb": 1200.0}] * 2})


def test_markdown_units_matrix_order_and_no_empty_metric_columns(two_arms):
    md = table.to_markdown(table.build([load_run(two_arms)]))
    head = md.splitlines()[0]
    assert "decode (tok/s)" in head and "peak RssAnon (MiB)" in head
    assert "ready" not in head  # no arm has it
    rows = md.splitlines()[2:4]
    assert rows[0].startswith("| kv=64 | 2 | 10.0 |")
    assert rows[1].startswith("| kv=256 | 2 | 12.0 |")


def test_baseline_column_is_a_ratio(two_arms):
    t = table.build([load_run(two_arms)], baseline="kv=64")
    assert [r.ratio for r in t.rows] == [1.0, 1.2]
    md = table.to_markdown(t)
    assert "| kv=64 (baseline) | 2 | 1.000x |" in md
    assert "| kv=256 | 2 | 1.200x |" in md


def test_unknown_baseline_is_a_user_error(two_arms):
    with pytest.raises(UserError, match=r"--baseline 'kv=1': no run has an arm"):
        table.build([load_run(two_arms)], baseline="kv=1")


def test_retracted_arm_is_struck_through_and_never_a_baseline(two_arms):
    for f in two_arms.glob("id-kv=64.p*.json"):
        retract_result(f, "wrong model", on="2026-12-02T00:00:00+00:00")
    run = load_run(two_arms)
    md = table.to_markdown(table.build([run]))
    assert "| ~~kv=64~~ | ~~2~~ | ~~10.0~~ | ~~1000~~ |" in md  # its data kept, struck
    assert "RETRACTED kv=64 on 2026-12-02T00:00:00+00:00: wrong model" in md
    with pytest.raises(UserError, match=r"baseline arm 'kv=64' is retracted \(wrong model\)"):
        table.build([run], baseline="kv=64")


def test_csv_and_json_carry_raw_numbers(two_arms):
    t = table.build([load_run(two_arms)], baseline="kv=64")
    rows = list(csv.DictReader(io.StringIO(table.to_csv(t))))
    decode = [r for r in rows if r["metric"] == "decode_tok_s"]
    assert [float(r["median"]) for r in decode] == [10.0, 12.0]
    assert float(decode[1]["ratio_to_baseline"]) == pytest.approx(1.2)
    data = json.loads(table.to_json(t))
    assert data["rows"][1]["metrics"]["peak_rss_anon_mb"]["unit"] == "MiB"
    assert data["rows"][1]["metrics"]["peak_rss_anon_mb"]["ratio_to_baseline"] == 1.2


def test_a_baseline_named_in_summary_json_is_used_unless_retracted(two_arms):
    (two_arms / "summary.json").write_text('{"noise_pct": 8.0, "baseline": "kv=256"}')
    t = table.build([load_run(two_arms)])
    assert t.baseline == {"fake/20261201T100000Z": "kv=256"}
    assert [r.ratio for r in t.rows] == [pytest.approx(10 / 12), 1.0]
    for f in two_arms.glob("id-kv=256.p*.json"):
        retract_result(f, "bad")
    assert table.build([load_run(two_arms)]).baseline == {}


def test_the_sweep_file_baseline_reaches_summary_json_and_the_report(make_run):
    """sweep file `baseline:` -> api.write_summary -> summary.json -> the ratio column."""
    from omni_ray.api import write_summary
    from omni_ray.config import expand, sweep_from_dict

    sweep = sweep_from_dict({"name": "fake", "model": "tiny",
                             "matrix": {"kv_cache_mib": [64, 256]},
                             "baseline": "kv_cache_mib=256"})
    assert sweep.baseline == "kv_cache_mib=256"
    run_dir = make_run("s", {"kv_cache_mib=64": [{"decode_tok_s": 10.0}],
                             "kv_cache_mib=256": [{"decode_tok_s": 20.0}]})
    write_summary(sweep, expand(sweep), run_dir)
    t = table.build([load_run(run_dir)])
    assert [r.ratio for r in t.rows] == [0.5, 1.0]


def test_a_baseline_by_axis_values_divides_each_arm_at_its_own_matrix_point(make_run):
    """`baseline: kv_cache_mib=256` with a prompt_len matrix: each arm against the kv 256 arm
    at its own prompt length, in summary.md and in the report."""
    from omni_ray.api import write_summary
    from omni_ray.config import expand, sweep_from_dict

    sweep = sweep_from_dict({"name": "fake", "model": "tiny", "baseline": "kv_cache_mib=256",
                             "matrix": {"prompt_len": [128, 512]},
                             "zip": [{"kv_cache_mib": [64, 256], "batch": [1, 2]}]})
    speed = {(128, 64): 10.0, (128, 256): 20.0, (512, 64): 9.0, (512, 256): 30.0}
    run_dir = make_run("s", {f"prompt_len={p},kv_cache_mib={kv},batch={b}":
                             [{"decode_tok_s": speed[p, kv]}] * 2
                             for p in (128, 512) for kv, b in ((64, 1), (256, 2))})
    write_summary(sweep, expand(sweep), run_dir)
    md = (run_dir / "summary.md").read_text()
    assert "Against the baseline (`kv_cache_mib=256`, each arm against the baseline at its own " \
           "matrix point)" in md
    rows = [line for line in md.splitlines() if line.startswith("| prompt_len=")
            and line.count("|") == 4]
    assert [r.split(" | ")[-1] for r in rows] == ["0.5x |", "1x |", "0.3x |", "1x |"]
    t = table.build([load_run(run_dir)])
    assert [r.ratio for r in t.rows] == [0.5, 1.0, 0.3, 1.0]
    assert [r.is_baseline for r in t.rows] == [False, True, False, True]
    assert [r.base.label for r in t.rows][2] == "prompt_len=512,kv_cache_mib=256,batch=2"
