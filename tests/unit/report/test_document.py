import base64
import json
import re

import pytest

from omni_ray.errors import UserError
from omni_ray.report.document import render, write_report
from omni_ray.report.retraction import retract_result
from omni_ray.report.run import load_run

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def grid(make_run):
    """A 2 x 2 matrix, three passes each, with memory samples, and one failed pass."""
    arms = {}
    for kv in (64, 256):
        for batch in (1, 4):
            arms[f"kv={kv},batch={batch}"] = [
                {"decode_tok_s": 10.0 * batch + p, "peak_rss_anon_mb": 900.0 + kv + p}
                for p in range(3)]
    arms["kv=256,batch=4"].append("failed")
    samples = [[t / 10, 100.0 + t, 10.0, 1] for t in range(20)]
    return make_run("grid", arms, samples=samples)


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


def test_html_is_self_contained_with_drawn_charts(grid):
    html = render([load_run(grid)])
    images = _images(html)
    # decode and peak RssAnon by kv and by batch (4), Pareto (1), memory per arm (4)
    assert len(images) == 9
    assert all(img.startswith(PNG) and len(img) > 2000 for img in images)
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing fetched from a network
    assert "<script" not in html


def test_html_has_provenance_failures_and_badges(grid):
    html = render([load_run(grid)])
    assert "Test CPU" in html and "avx512f" in html and "a" * 40 in html
    assert "engine died: out of memory" in html and "MemoryError" in html  # error + log tail
    assert '<span class="badge FAILED">FAILED 1/4</span>' in html
    assert "decode (tok/s)" in html


def test_html_strikes_retracted_and_lists_skipped_files(grid):
    retract_result(grid / "id-kv=64,batch=1.p1.json", "x")
    retract_result(grid / "id-kv=64,batch=1.p2.json", "x")
    retract_result(grid / "id-kv=64,batch=1.p3.json", "x", superseded_by=grid)
    (grid / "cut.p9.json").write_text('{"schema_version": 1,')
    html = render([load_run(grid)])
    assert '<tr class="retracted">' in html
    assert "RETRACTED kv=64,batch=1 on" in html
    assert "Skipped files" in html and "cut.p9.json" in html and "corrupt JSON" in html


def test_several_runs_side_by_side(grid, make_run):
    other = make_run("other", {"kv=64,batch=1": [{"decode_tok_s": 11.0,
                                                  "peak_rss_anon_mb": 950.0}]})
    html = render([load_run(grid), load_run(other)])
    assert "All runs side by side" in html
    assert html.count('<h2 id="fake/20261201T100000Z">') == 2


def test_write_report_paths_and_formats(grid, tmp_path):
    assert write_report([grid]) == grid / "report.html"
    out = write_report([grid], out=tmp_path / "o", form="json")
    assert out == tmp_path / "o" / "report.json"
    assert json.loads(out.read_text())["rows"][0]["arm"] == "kv=64,batch=1"
    md = write_report([grid], out=tmp_path / "r.md", form="md").read_text()
    assert md.startswith("# fake/20261201T100000Z\n")
    with pytest.raises(UserError, match=r"--format: must be one of html, md, csv, json, got 'pdf'"):
        write_report([grid], form="pdf")


def test_provenance_names_every_commit_a_resumed_run_spans(make_run, tmp_path):
    from omni_ray.results.store import write_json_atomic
    from tests.unit.report.fakes import PROVENANCE, record

    other = {**PROVENANCE, "git": {"sha": "b" * 40, "dirty": True}}
    run_dir = make_run("s", {"x=1": [{"decode_tok_s": 1.0}]})
    write_json_atomic(run_dir / "id-x=1.p2.json",
                      record("x=1", 0, 2, provenance=other, decode_tok_s=1.0))
    html = render([load_run(run_dir)])
    assert f"{'a' * 40}, {'b' * 40} (dirty tree)" in html
