import pytest

from omni_ray.errors import UserError
from omni_ray.report.run import load_run, parse_label


def test_parse_label():
    assert parse_label("kv_cache_mib=64,batch=1") == (("kv_cache_mib", "64"), ("batch", "1"))
    assert parse_label("env={OMP:ACTIVE}") == (("env", "{OMP:ACTIVE}"),)
    assert parse_label("base") == ()


def test_arms_in_matrix_order_not_file_order(make_run):
    # "z..." sorts after "a..." by file name; the matrix index puts it first
    run_dir = make_run("s", {"z=1": [{"decode_tok_s": 10.0}], "a=2": [{"decode_tok_s": 20.0}]})
    run = load_run(run_dir)
    assert [a.label for a in run.arms] == ["z=1", "a=2"]
    assert run.axis_names == ["z", "a"]
    assert run.sweep == "fake"


def test_stats_over_ok_passes_and_failures_counted(make_run):
    run = load_run(make_run("s", {"x=1": [{"decode_tok_s": 10.0}, {"decode_tok_s": 12.0},
                                          "failed"]}))
    arm = run.arms[0]
    assert arm.stats["decode_tok_s"].median == 11.0
    assert arm.stats["decode_tok_s"].n == 2
    assert len(arm.failed) == 1
    assert "FAILED 1/3" in arm.flags(8.0)
    assert "NOISY: decode" in arm.flags(8.0)  # spread 18 %


def test_broken_and_foreign_files_are_skipped_and_listed(make_run):
    run_dir = make_run("s", {"x=1": [{"decode_tok_s": 10.0}]})
    (run_dir / "trunc.p2.json").write_text('{"schema_version": 1, "kind": "ar')
    (run_dir / "bench.json").write_text('{"kind": "decode_pairs", "pairs": 3}')
    run = load_run(run_dir)
    assert len(run.arms) == 1
    problems = {s.path.rsplit("/", 1)[1]: s.problem for s in run.skipped}
    assert problems["trunc.p2.json"].startswith("corrupt JSON at line 1")
    assert "not a sweep arm record" in problems["bench.json"]


def test_directory_without_records_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty: no result records"):
        load_run(tmp_path / "empty")
    with pytest.raises(UserError, match=r"nowhere: no such run directory"):
        load_run(tmp_path / "nowhere")


def test_only_broken_files_names_the_first_problem(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "a.p1.json").write_text("[1, 2")
    with pytest.raises(UserError, match=r"run: no result records .*a\.p1\.json: corrupt JSON"):
        load_run(d)


def test_a_foreign_file_given_directly_is_an_error(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('{"kind": "int4_peers"}')
    with pytest.raises(UserError, match=r"x\.json: not a sweep arm record"):
        load_run(f)


def test_a_results_root_hints_at_a_run_directory_or_index(make_run, tmp_path):
    make_run("s", {"x=1": [{"decode_tok_s": 10.0}]})
    with pytest.raises(UserError, match=r"no result records .*give a run directory .*--index"):
        load_run(tmp_path)


def test_the_summary_and_the_reports_json_are_not_records(make_run):
    from omni_ray.report.document import write_report

    run_dir = make_run("s", {"x=1": [{"decode_tok_s": 10.0}]})
    write_report([run_dir], form="json")
    (run_dir / "summary.json").write_text("{}")
    assert load_run(run_dir).skipped == ()


def test_axis_groups_drop_constant_keys_and_merge_keys_that_change_together(make_run):
    run = load_run(make_run("s", {
        "model=tiny,eager=false,warm=true,patch=none": [{"decode_tok_s": 1.0}],
        "model=tiny,eager=false,warm=true,patch=aot": [{"decode_tok_s": 1.0}],
        "model=tiny,eager=true,warm=false,patch=none": [{"decode_tok_s": 1.0}]}))
    assert run.axis_groups() == [("eager", "warm"), ("patch",)]


def test_a_pipeline_run_shows_its_last_stage_decode_and_end_to_end_time(make_run):
    run = load_run(make_run("s", {"stages[1].node=1": [
        {"last_stage_decode_tok_s": 40.0, "pipeline_e2e_s": 3.0,
         "last_stage_first_token_s": 1.0, "pipeline_peak_rss_anon_mb": 900.0}]}))
    assert [m.name for m in run.metrics()][:3] == [
        "last_stage_decode_tok_s", "pipeline_e2e_s", "last_stage_first_token_s"]
    assert run.arms[0].stats["pipeline_e2e_s"].median == 3.0
