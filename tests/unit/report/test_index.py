from omni_ray.report.index import render_index, write_index
from omni_ray.report.retraction import retract_result


def test_index_lists_runs_and_other_files_without_crashing(make_run, tmp_path):
    root = tmp_path
    make_run("good", {"x=1": [{"decode_tok_s": 10.0, "peak_rss_anon_mb": 900.0}],
                      "x=2": [{"decode_tok_s": 20.0, "peak_rss_anon_mb": 1000.0}]})
    gone = make_run("gone", {"x=1": [{"decode_tok_s": 1.0}]})
    retract_result(gone, "wrong model")
    (root / "bench").mkdir()
    (root / "bench" / "a.json").write_text('{"kind": "decode_pairs", "provenance": '
                                           '{"git": {"sha": "cafe"}}}')
    (root / "bench" / "b.json").write_text('{"kind": "dec')
    (root / "bench" / "notes.md").write_text("notes")
    broken = root / "broken" / "r1"
    broken.mkdir(parents=True)
    (broken / "x.p1.json").write_text("{")
    text = render_index(root)
    good = next(line for line in text.splitlines() if "(good/2026" in line)
    assert "2026-12-01 10:00" in good and "aaaaaaaaaa" in good and "Test CPU" in good
    assert "decode 10.0-20.0 tok/s; peak RssAnon 900-1000 MiB" in good
    assert "| RETRACTED |" in text
    assert "- `bench/a.json`: kind decode_pairs, git cafe" in text
    assert "- `bench/b.json`: unreadable: corrupt JSON" in text
    assert "- `bench/notes.md`" in text
    assert "- broken/r1: " in text and "no result records" in text
    assert "good/20261201T100000Z/id-x=1.p1.json" not in text  # records are the run's, not other
    path = write_index(root)
    assert path == root / "INDEX.md" and path.read_text() == text
    assert "INDEX.md" not in render_index(root)  # it does not list itself


def test_index_names_the_cpu_and_skips_a_runs_logs(make_run, tmp_path):
    from tests.unit.report.fakes import PROVENANCE

    prov = dict(PROVENANCE, cpu={"brand": "AMD EPYC", "family": 26, "model": 2,
                                 "flags": ["avx2", "avx512f", "avx512vnni"]},
                llc={"level": 3, "size_bytes": 32 << 20, "instances": ["0-1"]})
    run = make_run("zen5", {"x=1": [{"decode_tok_s": 10.0}]}, provenance=prov)
    logs = run / "logs"  # what the coordinator writes beside the records
    logs.mkdir()
    (logs / "id-x=1.p1.request.json").write_text('{"model": "tiny"}')
    (logs / "id-x=1.p1.result.json").write_text('{"status": "ok"}')
    (logs / "id-x=1.p1.log").write_text("engine log")
    text = render_index(tmp_path)
    row = next(line for line in text.splitlines() if "(zen5/2026" in line)
    assert "AMD EPYC (family 26 model 2); ISA avx512_vnni avx512f; LLC 32 MiB L3 x1" in row
    assert "could not be read" not in text and "logs" not in text.split("## Other files")[0]
    # a directory named logs that is not inside a run is read like any other
    (tmp_path / "other" / "logs").mkdir(parents=True)
    (tmp_path / "other" / "logs" / "x.p1.json").write_text("{")
    assert "- other/logs: " in render_index(tmp_path)
