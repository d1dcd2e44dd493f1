import io
from types import SimpleNamespace

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


def test_a_decode_figure_says_its_regime():
    out = io.StringIO()
    p = Progress(out, enabled=True)
    p.start(1, 0, None)
    p.record(task(), {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": 812.34, "decode_regime": "cache-resident", "rss_anon_tree_mb": 478.2}})
    assert "decode 812.3 tok/s (cache-resident), rss 478 MiB" in out.getvalue()
