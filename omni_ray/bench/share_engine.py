"""Sweep wall time with arms sharing one engine start, against a fresh engine process per arm.

    python -m omni_ray.bench.share_engine --out results/share_engine

Issue #25's "one engine, many load points": arms of one pass whose stage configs are equal run
on one engine start (``placement.share_engine``, default on). In one sitting, on this machine's
1-core slots, it runs ``configs/smoke.yaml`` (2 stage configs x 2 batches) and a 4x4 workload
grid on the tiny model (prompt_len x batch, one stage config), each with sharing off and on, in
the order off, on, on, off (a drift of the machine's speed during the sitting falls on both
sides alike). Reported per run: wall time, engine starts (records with a start of their own),
failed and contended passes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import omni_ray
from omni_ray.bench.common import save

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml"


def grid() -> dict:
    """16 arms differing only in their workload: one stage config."""
    return {"name": "grid", "model": "tiny", "passes": 1, "timeout_s": 600,
            "placement": {"slot_cores": 1}, "stage": {"kv_cache_mib": 32, "max_model_len": 512},
            "workload": {"output_len": 16, "warmup": 1, "repeats": 2},
            "matrix": {"prompt_len": [16, 32, 64, 128], "batch": [1, 2, 4, 8]}}


def with_sharing(cfg: dict, on: bool) -> dict:
    return {**cfg, "name": f"{cfg['name']}_{'on' if on else 'off'}",
            "placement": {**cfg.get("placement", {}), "share_engine": on}}


def engine_starts(records: list[dict]) -> int:
    """Records whose arm started an engine of its own (the first of a shared start included)."""
    return sum(not (r.get("shared_engine") or {}).get("position") for r in records)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/share_engine")
    args = p.parse_args(argv)

    import ray
    import yaml

    from omni_ray.placement.cluster import connect

    connect(None, [1])  # Ray started once, outside every timing
    smoke = yaml.safe_load(SMOKE.read_text())
    smoke["include"] = [str(SMOKE.parent / f) for f in smoke.get("include", [])]
    out = tempfile.mkdtemp(prefix="omni-ray-share-")
    runs = []
    for name, cfg, on in [("smoke", smoke, False), ("smoke", smoke, True),
                          ("grid", grid(), True), ("grid", grid(), False)]:
        t0 = time.monotonic()
        report = omni_ray.run_sweep(with_sharing(cfg, on), out=out, allow_busy=True)
        wall = time.monotonic() - t0
        runs.append({"sweep": name, "share_engine": on, "wall_s": round(wall, 2),
                     "arms": len(report.records), "engine_starts": engine_starts(report.records),
                     "failed": report.failed,
                     "contended": sum(bool(r.get("contended")) for r in report.records),
                     "ready_s": [r["measurements"].get("ready_s") for r in report.records
                                 if r.get("status") == "ok" and r["measurements"].get("ready_s")]})
        print(f"{name} share_engine={on}: {wall:.1f} s wall, {runs[-1]['engine_starts']} engine "
              f"starts, {report.failed} failed, {runs[-1]['contended']} contended", flush=True)
    ray.shutdown()

    def wall(sweep: str, on: bool) -> float:
        return next(r["wall_s"] for r in runs if r["sweep"] == sweep and r["share_engine"] == on)

    ratios = {s: round(wall(s, False) / wall(s, True), 3) for s in ("smoke", "grid")}
    path = save(args.out, "share_engine", {"runs": runs, "wall_ratio_off_over_on": ratios},
                [sys.executable, "-m", "omni_ray.bench.share_engine", *(argv or sys.argv[1:])])
    print(f"wall time, fresh process per arm over shared start: smoke {ratios['smoke']:.2f}x, "
          f"4x4 grid {ratios['grid']:.2f}x; written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
