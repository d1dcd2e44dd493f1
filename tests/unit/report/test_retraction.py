import json

import pytest

from omni_ray.errors import UserError
from omni_ray.report.retraction import retract_result


def test_retract_a_record_keeps_its_data(make_run):
    run_dir = make_run("s", {"x=1": [{"decode_tok_s": 10.0}]})
    f = run_dir / "id-x=1.p1.json"
    before = json.loads(f.read_text())
    changed = retract_result(f, "measured the wrong model", superseded_by=run_dir,
                             on="2026-12-02T00:00:00+00:00")
    after = json.loads(f.read_text())
    assert changed == [f]
    assert after["retracted"] is True
    assert after["retracted_on"] == "2026-12-02T00:00:00+00:00"
    assert after["reason"] == "measured the wrong model"
    assert after["superseded_by"] == str(run_dir)
    assert after["measurements"] == before["measurements"]
    assert not list(run_dir.glob(".*.tmp"))  # the atomic write left no temporary file


def test_retract_twice_is_one_line(make_run):
    f = make_run("s", {"x=1": [{"decode_tok_s": 10.0}]}) / "id-x=1.p1.json"
    retract_result(f, "wrong")
    with pytest.raises(UserError, match=r"p1\.json: record already retracted on .*: wrong$"):
        retract_result(f, "again")


def test_retract_a_run_retracts_every_record_then_refuses(make_run):
    run_dir = make_run("s", {"x=1": [{"decode_tok_s": 1.0}] * 2, "x=2": [{"decode_tok_s": 2.0}]})
    assert len(retract_result(run_dir, "bad host")) == 3
    with pytest.raises(UserError, match=r"run \(every record\) already retracted"):
        retract_result(run_dir, "bad host")


def test_not_a_result_is_refused_and_nothing_changes(make_run, tmp_path):
    run_dir = make_run("s", {"x=1": [{"decode_tok_s": 1.0}]})
    (run_dir / "bench.p2.json").write_text('{"kind": "decode_pairs"}')
    with pytest.raises(UserError, match=r"bench\.p2\.json: not a sweep arm record"):
        retract_result(run_dir, "bad")
    assert "retracted" not in json.loads((run_dir / "id-x=1.p1.json").read_text())
    with pytest.raises(UserError, match=r"bench\.p2\.json: not a sweep arm record"):
        retract_result(run_dir / "bench.p2.json", "bad")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty: not a result"):
        retract_result(tmp_path / "empty", "bad")
    with pytest.raises(UserError, match=r"nope: no such result file or run directory"):
        retract_result(tmp_path / "nope", "bad")


def test_a_reason_is_required(make_run):
    f = make_run("s", {"x=1": [{"decode_tok_s": 1.0}]}) / "id-x=1.p1.json"
    with pytest.raises(UserError, match=r"--reason must say why"):
        retract_result(f, "  ")


def test_the_reports_own_json_does_not_block_a_run_retraction(make_run):
    from omni_ray.report.document import write_report

    run_dir = make_run("s", {"x=1": [{"decode_tok_s": 1.0}]})
    write_report([run_dir], form="json")
    (run_dir / "notes.json").write_text("[]")
    assert [f.name for f in retract_result(run_dir, "bad")] == ["id-x=1.p1.json"]
