import io
from types import SimpleNamespace

from omni_ray import events
from omni_ray.cli.display import Progress


def task():
    return SimpleNamespace(arm=SimpleNamespace(label="batch=1"), pass_no=2)


def test_an_arm_without_a_decode_figure_prints_na():
    out = io.StringIO()
    p = Progress(out, enabled=True)
    p.start(2, 0, None)
    p.record(task(), {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": None, "rss_anon_tree_mb": 478.2}})
    assert "batch=1 pass 2: decode n/a tok/s, rss 478 MiB" in out.getvalue()


def test_a_failed_arm_says_why():
    out = io.StringIO()
    p = Progress(out, enabled=True)
    p.start(1, 0, None)
    p.record(task(), {"status": "timeout", "slot": None, "error": "no result within 5 s"})
    assert "TIMEOUT: no result within 5 s" in out.getvalue() and "1 failed" in out.getvalue()


def test_the_view_consumes_the_runs_events():
    out = io.StringIO()
    view = Progress(out)
    view(events.Started(2, 1, "127.0.0.1:8265"))
    view(events.ArmStarted(task(), "n0s1"))
    view(events.ArmDone(task(), {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": 12.34, "rss_anon_tree_mb": 478.2}}))
    lines = out.getvalue().splitlines()
    assert lines[0] == "Ray dashboard: http://127.0.0.1:8265"
    assert lines[1] == "2 arm runs to do, 1 already done (resume)"
    assert lines[2].endswith("1 running, 0 failed, 0s elapsed, ETA ?] start batch=1 pass 2 on n0s1")
    assert lines[3].endswith("] batch=1 pass 2: decode 12.3 tok/s, rss 478 MiB")
    assert lines[3].startswith("[1/2 done, 0 running, 0 failed")
