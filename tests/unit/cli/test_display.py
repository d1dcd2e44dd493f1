import io
from types import SimpleNamespace

from omni_ray import events
from rich.console import Console

from omni_ray.cli.display import LiveView, Progress, terminal_view


def task():
    return SimpleNamespace(arm=SimpleNamespace(label="batch=1"), pass_no=2)


def test_an_arm_without_a_decode_figure_prints_na():
    out = io.StringIO()
    p = Progress(out, enabled=True)
    p.start(2, 0, None)
    p.record(task(), {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": None, "rss_anon_tree_mb": 478.2}})
    assert "batch=1 pass 2: decode n/a tok/s, rss 478 MiB" in out.getvalue()


def test_a_pipeline_arm_shows_its_last_stage_decode_and_end_to_end_time():
    out = io.StringIO()
    p = Progress(out, enabled=True)
    p.start(1, 0, None)
    p.record(task(), {"status": "ok", "slot": {}, "stages": [{}, {}], "measurements": {
        "last_stage_decode_tok_s": 41.25, "pipeline_e2e_s": 3.456,
        "last_stage_first_token_s": 1.2, "rss_anon_tree_mb": 700.4, "bottleneck_stage": 0}})
    assert ("batch=1 pass 2: last stage decode 41.2 tok/s, e2e 3.46 s, first token 1.20 s, "
            "rss 700 MiB (bottleneck: stage 0)") in out.getvalue()


def test_a_serving_pipeline_arm_shows_its_first_load_point():
    out = io.StringIO()
    p = Progress(out, enabled=True)
    p.start(1, 0, None)
    point = {"request_throughput": 1.95, "ttft_ms": {"median": 212.4}, "e2e_ms": {"median": 600}}
    p.record(task(), {"status": "ok", "slot": {}, "stages": [{}, {}], "measurements": {
        "serving": [point, point], "rss_anon_tree_mb": 700.4}})
    assert ("batch=1 pass 2: 2 load point(s), the first: 1.95 req/s, pipeline TTFT p50 212 ms, "
            "E2E p50 600 ms, rss 700 MiB") in out.getvalue()


def test_an_arm_on_a_shared_engine_says_whose_and_its_own_peak():
    out = io.StringIO()
    p = Progress(out, enabled=True)
    p.start(2, 0, None)
    p.record(task(), {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": 900.0, "peak_rss_anon_mb": 490.4},
        "shared_engine": {"position": 1, "started_by_label": "batch=4"}})
    assert ("batch=1 pass 2: decode 900.0 tok/s, peak rss 490 MiB, on the engine batch=4 "
            "started") in out.getvalue()


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


class Pipe(io.StringIO):
    def isatty(self):
        return False


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_not_a_terminal_gets_the_plain_lines():
    out = Pipe()
    view = terminal_view(out)
    assert isinstance(view, Progress)
    with view:
        view(events.Started(1, 0, None))
        view(events.ArmStarted(task(), "n0s0"))
        view(events.ArmProgress(task(), "n0s0", "loading", 300.0))  # a pipe gets no redraws
    lines = out.getvalue().splitlines()
    assert lines == ["1 arm runs to do",
                     "[0/1 done, 1 running, 0 failed, 0s elapsed, ETA ?] start batch=1 pass 2 "
                     "on n0s0"]
    assert "\x1b[" not in out.getvalue()


def test_a_terminal_gets_the_live_table():
    assert isinstance(terminal_view(Tty()), LiveView)


def live_view():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120, color_system=None)
    return LiveView(console, refresh_per_second=20), buf


def test_the_live_table_shows_each_slots_arm_pass_phase_and_rss():
    view, buf = live_view()
    t = task()
    with view:
        view(events.Started(3, 0, "127.0.0.1:8265"))
        view(events.ArmStarted(t, "n0s1"))
        view(events.ArmProgress(t, "n0s1", "measuring", 481.4))
        table = view.render()
        view.console.print(table)
    text = buf.getvalue()
    assert "Ray dashboard: http://127.0.0.1:8265" in text and "3 arm runs to do" in text
    *_, row = [line for line in text.splitlines() if "n0s1" in line and "batch=1" in line]
    cells = [c.strip() for c in row.strip("│┃| ").split("│")]
    assert cells[:5] == ["n0s1", "batch=1", "2", "measuring", "481"], cells
    assert "0/3 done, 1 running, 0 failed" in text
    assert "\x1b[" in text  # a terminal: the live display moved the cursor


def test_a_recorded_arm_leaves_the_table_as_a_line_and_gives_an_eta():
    view, buf = live_view()
    t = task()
    with view:
        view(events.Started(2, 0, None))
        view(events.ArmStarted(t, "n0s0"))
        view(events.ArmDone(t, {"status": "timeout", "slot": {}, "error": "no result [5 s]"}))
        assert view.rows == {} and view.failed == 1 and view._eta() != "?"
    assert "batch=1 pass 2: TIMEOUT: no result [5 s]" in buf.getvalue()  # no markup eaten


def test_an_arm_past_the_mean_time_has_no_eta():
    view, _buf = live_view()
    t = task()
    view.total, view.walls = 2, [10.0]
    view(events.ArmStarted(t, "n0s0"))
    view.rows["n0s0"]["t0"] -= 25  # 25 s in, where finished arms took 10 s
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(view.render())
    row = next(line for line in console.file.getvalue().splitlines() if "n0s0" in line)
    assert row.strip("│ ").split("│")[-1].strip() == "?"


def test_a_decode_figure_says_its_regime():
    out = io.StringIO()
    view = Progress(out)
    view(events.Started(1, 0, None))
    view(events.ArmDone(task(), {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": 812.34, "decode_regime": "cache-resident", "rss_anon_tree_mb": 478.2}}))
    assert "decode 812.3 tok/s (cache-resident), rss 478 MiB" in out.getvalue()


def test_a_decode_figure_says_its_share_of_the_speed_of_light():
    out = io.StringIO()
    view = Progress(out)
    view(events.Started(1, 0, None))
    view(events.ArmDone(task(), {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": 170.2, "decode_regime": "DRAM-bound", "decode_sol_frac": 0.8712,
        "rss_anon_tree_mb": 1127.0}}))
    assert "decode 170.2 tok/s (DRAM-bound, 87 % of SoL), rss 1127 MiB" in out.getvalue()


def test_both_views_say_a_recorded_arm_the_same_way():
    record = {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": 812.34, "decode_regime": "DRAM-bound", "rss_anon_tree_mb": 478.2}}
    view, buf = live_view()
    with view:
        view(events.Started(1, 0, None))
        view(events.ArmStarted(task(), "n0s0"))
        view(events.ArmDone(task(), record))
    assert "batch=1 pass 2: decode 812.3 tok/s (DRAM-bound), rss 478 MiB" in buf.getvalue()


def test_a_share_over_100_percent_says_why():
    out = io.StringIO()
    view = Progress(out)
    view(events.Started(1, 0, None))
    view(events.ArmDone(task(), {"status": "ok", "slot": {}, "measurements": {
        "decode_tok_s": 3000.0, "decode_regime": "cache-resident", "decode_sol_frac": 1.18,
        "rss_anon_tree_mb": 478.2}}))
    assert ("(cache-resident, 118 % of SoL (over 100 %: the one-kernel cache probe is slower "
            "than the engine's reads from cache))") in out.getvalue()
