"""Sweep throughput: the same independent arms on 1 slot and on 2 slots, side by side.

    python -m omni_ray.bench.slots_speedup --out results/slots_speedup

Target on this 2-core machine: 2 slots finish the arms at least 1.8x faster in wall-clock than
1 slot. Also reports the coordinator's overhead per arm (wall time outside the engine process:
actor start, pre-flight, record writing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import omni_ray
from omni_ray.bench.common import save


def sweep(max_slots: int, arms: int, model: str) -> dict:
    return {"name": f"slots{max_slots}", "model": model, "passes": 1, "timeout_s": 600,
            "placement": {"slot_cores": 1, "max_slots": max_slots},
            "stage": {"kv_cache_mib": 64, "max_model_len": 512},
            "workload": {"prompt_len": 64, "output_len": 32, "warmup": 1, "repeats": 2},
            "matrix": {"batch": list(range(1, arms + 1))}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--arms", type=int, default=4)
    p.add_argument("--out", default="results/slots_speedup")
    args = p.parse_args(argv)

    import ray

    from omni_ray.placement.cluster import connect

    connect(None, [1])  # started once, outside both timings
    out = tempfile.mkdtemp(prefix="omni-ray-slots-")
    runs = {}
    for n in (1, 2):
        t0 = time.monotonic()
        report = omni_ray.run_sweep(sweep(n, args.arms, args.model), out=out, allow_busy=True)
        wall = time.monotonic() - t0
        over = [r["timing"]["coordinator_overhead_s"] for r in report.records]
        runs[n] = {"wall_s": wall, "failed": report.failed,
                   "coordinator_overhead_s_median": statistics.median(over),
                   "coordinator_overhead_s": over,
                   "engine_wall_s": [r["timing"]["engine_wall_s"] for r in report.records],
                   "contended": [r["contended"] for r in report.records],
                   "slots": [r["slot"]["slot"]["name"] for r in report.records]}
        print(f"{n} slot(s): {wall:.1f} s wall, coordinator overhead per arm "
              f"{runs[n]['coordinator_overhead_s_median']:.2f} s (median)", flush=True)
    ray.shutdown()
    speedup = runs[1]["wall_s"] / runs[2]["wall_s"]
    path = save(args.out, "slots_speedup", {
        "arms": args.arms, "model": args.model, "runs": runs, "speedup": speedup,
        "target": 1.8, "met": speedup >= 1.8}, [sys.executable, *sys.argv])
    print(f"speed-up 2 slots vs 1: {speedup:.2f}x (target 1.8x); written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
