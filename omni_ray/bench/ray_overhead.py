"""What Ray costs an arm: the same arm run directly (no Ray) and through the stage actor.

    python -m omni_ray.bench.ray_overhead --model small --passes 3 --out results/ray_overhead

Both paths pin the engine to the same 1-core slot and measure the engine's own process tree, so
the difference is what the actor adds around it (targets: < 2 % rss_anon_tree_mb, < 5 % decode
tokens/s). Passes alternate which path goes first.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from omni_ray.bench.common import median_of, save, spread_pct
from omni_ray.engine.launch import launch_arm
from omni_ray.placement.cluster import resource_name
from omni_ray.topology import local_slots

METRICS = ("rss_anon_tree_mb", "decode_tok_s", "prefill_tok_s", "init_s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--out", default="results/ray_overhead")
    args = p.parse_args(argv)

    import ray

    from omni_ray.placement.actor import StageActor
    from omni_ray.placement.cluster import connect

    slot = local_slots(1)[0]
    req = {"model": args.model,
           "stage": {"kv_cache_mib": 64, "max_model_len": 512},
           "workload": {"prompt_len": 64, "output_len": 32, "batch": 1, "warmup": 1,
                        "repeats": 3, "context_len": 0}}
    connect(None, [1])
    work = Path(tempfile.mkdtemp(prefix="omni-ray-overhead-"))
    runs: dict[str, list[dict]] = {"direct": [], "ray": []}
    for p_no in range(args.passes):
        for path in (("direct", "ray") if p_no % 2 == 0 else ("ray", "direct")):
            name = f"{path}{p_no}"
            if path == "direct":
                r = launch_arm(dict(req, cpus=list(slot.cpus), node=slot.node), work, name,
                               timeout_s=600)
            else:
                actor = StageActor.options(resources={resource_name(1, slot.name): 1}).remote(
                    slot.name, 1, {"sweep": "ray_overhead", "arm": "same", "slot": slot.name})
                r = ray.get(actor.run.remote(req, str(work), name, 600.0, False))
                ray.kill(actor)
            print(f"pass {p_no + 1} {path:<6}: " + ", ".join(
                f"{m} {r.get('measurements', {}).get(m)}" for m in METRICS), flush=True)
            runs[path].append(r)
    ray.shutdown()
    summary = {}
    for m in METRICS:
        d, r = median_of(runs["direct"], m), median_of(runs["ray"], m)
        summary[m] = {"direct": d, "ray": r,
                      "ray_vs_direct_pct": None if not d or r is None else (r - d) / d * 100,
                      "spread_pct": {k: spread_pct([x["measurements"][m] for x in v
                                                    if x.get("status") == "ok"])
                                     for k, v in runs.items()}}
    verdict = {
        "rss_under_2pct": abs(summary["rss_anon_tree_mb"]["ray_vs_direct_pct"] or 99) < 2,
        "decode_under_5pct": abs(summary["decode_tok_s"]["ray_vs_direct_pct"] or 99) < 5}
    path = save(args.out, "ray_overhead", {
        "arm": req, "slot": slot.to_dict(), "passes": args.passes, "summary": summary,
        "verdict": verdict,
        "runs": {k: [{kk: x.get(kk) for kk in ("status", "error", "measurements", "pinning")}
                     for x in v] for k, v in runs.items()}}, [sys.executable, *sys.argv])
    for m, s in summary.items():
        print(f"{m:<18} direct {s['direct']}  ray {s['ray']}  ({s['ray_vs_direct_pct']} %)")
    print(f"verdict {verdict}; written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
