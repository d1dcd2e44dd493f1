"""The report, compare and retract verbs end to end in-process: output, exit codes, one-line
errors."""

import json

import pytest

from omni_ray import cli
from tests.unit.report.fakes import make_run_dir


@pytest.fixture
def runs(tmp_path):
    base = make_run_dir(tmp_path, "base", {"x=1": [{"decode_tok_s": 100.0}] * 2})
    slower = make_run_dir(tmp_path, "slower", {"x=1": [{"decode_tok_s": 80.0}] * 2})
    return base, slower


def test_report_writes_html_and_says_where(runs, capsys):
    assert cli.main(["report", str(runs[0])]) == 0
    assert capsys.readouterr().out == f"report: {runs[0] / 'report.html'}\n"
    assert (runs[0] / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_report_to_stdout_as_markdown(runs, capsys):
    assert cli.main(["report", str(runs[0]), "--format", "md", "--out", "-"]) == 0
    assert "| x=1 | 2 | 100 |" in capsys.readouterr().out


def test_report_index(runs, capsys):
    root = runs[0].parent.parent
    assert cli.main(["report", str(root), "--index"]) == 0
    assert (root / "INDEX.md").is_file()
    assert capsys.readouterr().out == f"index: {root / 'INDEX.md'}\n"


def test_compare_exit_codes(runs, capsys):
    base, slower = runs
    assert cli.main(["compare", str(base), str(base)]) == 0
    assert "no regression" in capsys.readouterr().out
    assert cli.main(["compare", str(base), str(slower)]) == 1
    assert "REGRESSION" in capsys.readouterr().out


def test_retract_then_report_and_compare_refuse_it_as_base(runs, capsys):
    base, slower = runs
    assert cli.main(["retract", str(base), "--reason", "wrong host",
                     "--superseded-by", str(slower)]) == 0
    assert capsys.readouterr().out == f"retracted 2 record(s) in {base}\n"
    rec = json.loads((base / "id-x=1.p1.json").read_text())
    assert rec["retracted"] and rec["reason"] == "wrong host"


def test_bad_input_is_one_line_exit_2(runs, tmp_path, user_error):
    base, slower = runs
    (tmp_path / "empty").mkdir()
    assert "empty: no result records" in user_error("report", tmp_path / "empty")
    (tmp_path / "bands.yaml").write_text("speed: 3\n")
    assert "bands.yaml: speed: unknown metric" in user_error(
        "compare", base, slower, "--bands", tmp_path / "bands.yaml")
    other = make_run_dir(tmp_path, "other", {"y=1": [{"decode_tok_s": 1.0}]})
    assert "no arm in common" in user_error("compare", base, other)
    trunc = tmp_path / "t.json"
    trunc.write_text('{"a": ')
    assert "t.json: corrupt JSON at line 1" in user_error("compare", base, trunc)
    assert "t.json: corrupt JSON" in user_error("retract", trunc, "--reason", "x")
    assert cli.main(["retract", str(base), "--reason", "x"]) == 0
    assert "already retracted" in user_error("retract", base, "--reason", "x")
    assert "--index takes one results directory" in user_error("report", base, slower, "--index")


def test_sweep_end_writes_each_report_and_survives_an_empty_run(runs, tmp_path, capsys):
    from omni_ray.cli.sweep import write_reports

    write_reports([runs[0], tmp_path / "never-started"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"report: {runs[0] / 'report.html'}"
    assert out[1].startswith("report not written: ") and "never-started" in out[1]
    assert (runs[0] / "report.html").is_file()


def test_sweep_has_no_report_flag():
    args = cli.build_parser().parse_args(["sweep", "x.yaml", "--no-report"])
    assert args.no_report is True
