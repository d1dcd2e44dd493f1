"""The serving table of a summary: one row per arm and load point, medians over passes."""

from __future__ import annotations

from omni_ray.results.summary import serving_markdown, summarize_serving


def _record(arm, ttft_p99, status="ok"):
    point = {"request_rate": 4.0, "request_throughput": 3.5, "output_throughput": 40.0,
             "goodput": 3.0, "ttft_ms": {"median": 10.0, "p99": ttft_p99},
             "tpot_ms": {"median": 2.0, "p99": 3.0}, "itl_ms": {"median": 2.0, "p99": 4.0},
             "e2e_ms": {"median": 50.0, "p99": 80.0}, "kv_cache": {"peak_usage": 0.25},
             "peak_rss_anon_mb": 500.0}
    flood = dict(point, request_rate="inf")
    return {"arm": {"id": arm}, "status": status,
            "measurements": {"ready_s": 1.0, "serving": [point, flood]}}


def test_rows_are_medians_over_passes_per_load_point():
    rows = summarize_serving([_record("a", 10.0), _record("a", 30.0), _record("a", 20.0),
                              _record("a", 999.0, status="failed"),
                              {"arm": {"id": "offline"}, "measurements": {"ready_s": 1.0}}])
    assert [(r["arm"], r["load_point"], r["request_rate"], r["n"]) for r in rows] == [
        ("a", 0, 4.0, 3), ("a", 1, "inf", 3)]
    assert rows[0]["median"]["TTFT p99 ms"] == 20.0
    assert rows[0]["median"]["KV peak %"] == 25.0
    text = serving_markdown(rows, {"a": "base"})
    assert "| base (a) | 4.0 req/s |" in text and "| base (a) | inf req/s |" in text


def test_no_serving_records_no_table():
    assert summarize_serving([{"arm": {"id": "x"}, "measurements": {}}]) == []
    assert serving_markdown([]) == ""


def test_a_search_gives_one_capacity_line():
    rec = _record("a", 10.0)
    rec["measurements"]["serving_search"] = {"percentile": 99.0, "slo": {"ttft_ms": 500.0},
                                             "capacity": 3.2, "bracket": [3.2, 4.0]}
    rows = summarize_serving([rec])
    assert [r["load_point"] for r in rows] == [None, 0, 1]
    text = serving_markdown(rows, {"a": "base"})
    assert "- capacity of base (a) at p99 ttft_ms <= 500: 3.2 req/s" in text
    assert text.count("| base (a) |") == 2


def test_a_serving_run_directory_gives_summary_and_report(tmp_path):
    """From records on disk (as a sweep writes them) to summary.md and report.html."""
    from omni_ray.api import write_summary
    from omni_ray.config import expand, load_sweep_file
    from omni_ray.report.document import write_report
    from omni_ray.results.record import make_record
    from omni_ray.results.store import write_json_atomic

    root = __import__("pathlib").Path(__file__).resolve().parents[3]
    sweep = load_sweep_file(root / "configs" / "serving.yaml")
    (arm,) = expand(sweep)
    measured = _record(arm.id, 42.0)["measurements"]
    measured["serving_search"] = {"percentile": 90.0, "slo": {"ttft_ms": 200.0},
                                  "capacity": 6.5, "bracket": [6.5, 9.0], "probes": []}
    rec = make_record(kind="arm", config=arm.to_dict(), measurements=measured, status="ok",
                      provenance={}, extra={"arm": {"id": arm.id, "label": arm.label,
                                                    "sweep": sweep.name, "index": 0},
                                            "pass": 1, "run_id": "r"})
    write_json_atomic(tmp_path / f"{arm.id}.p1.json", rec)
    summary = write_summary(sweep, [arm], tmp_path)
    assert [r["request_rate"] for r in summary["serving"]] == ["search", 4.0, "inf"]
    text = (tmp_path / "summary.md").read_text()
    assert "## Serving load points" in text and "capacity of base" in text
    html = write_report([tmp_path]).read_text()
    assert "Serving load points" in html and "42" in html


def test_closed_loop_points_and_a_concurrency_search_read_as_such():
    rec = _record("a", 10.0)
    users = dict(rec["measurements"]["serving"][0], users=8, think_time_s=0.0,
                 ends_by="duration_s", duration_limit_s=5.0)
    del users["request_rate"]
    rec["measurements"]["serving"] = [users]
    rec["measurements"]["serving_search"] = {"over": "max_concurrency", "percentile": 99.0,
                                             "slo": {"ttft_ms": 500.0}, "capacity": 6,
                                             "bracket": [6, 7]}
    text = serving_markdown(summarize_serving([rec]), {"a": "base"})
    assert "| base (a) | 8 users, 5 s |" in text
    assert "- capacity of base (a) at p99 ttft_ms <= 500: 6 requests in flight" in text


def test_a_serving_pipeline_run_directory_gives_summary_and_report(tmp_path):
    """A serving pipeline's records (engine/pipeline.summarise_serving's measurements): the
    pipeline's load points in the serving table, its start figures in the arms' table."""
    from omni_ray.api import write_summary
    from omni_ray.config import expand, load_sweep_file
    from omni_ray.report.document import write_report
    from omni_ray.results.record import make_record
    from omni_ray.results.store import write_json_atomic

    root = __import__("pathlib").Path(__file__).resolve().parents[3]
    sweep = load_sweep_file(root / "configs" / "pipeline_serving.yaml")
    arms = expand(sweep)
    for arm in arms:
        point = _record(arm.id, 1234.0)["measurements"]["serving"][0]
        point["stages"] = [{"stage": 0, "kv_cache": point.pop("kv_cache"),
                            "peak_rss_anon_mb": point.pop("peak_rss_anon_mb")},
                           {"stage": 1, "handover_ms": {"median": 1.0}}]
        measured = {"serving": [point], "ready_s": 30.0, "rss_anon_tree_mb": 900.0,
                    "pipeline_peak_rss_anon_mb": 950.0}
        rec = make_record(kind="arm", config=arm.to_dict(), measurements=measured, status="ok",
                          provenance={}, extra={"arm": {"id": arm.id, "label": arm.label,
                                                        "sweep": sweep.name, "index": 0},
                                                "pass": 1, "run_id": "r",
                                                "stages": [{"stage": 0}, {"stage": 1}]})
        write_json_atomic(tmp_path / f"{arm.id}.p1.json", rec)
    summary = write_summary(sweep, arms, tmp_path)
    assert [r["median"]["TTFT p99 ms"] for r in summary["serving"]] == [1234.0, 1234.0]
    assert [r["median"]["KV peak %"] for r in summary["serving"]] == [None, None]  # per stage
    text = (tmp_path / "summary.md").read_text()
    assert "## Serving load points" in text and "stages[1].window=8" in text
    assert "Serving load points" in write_report([tmp_path]).read_text()
