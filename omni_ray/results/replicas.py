"""One arm spanning sockets: the results of its replicas (one engine per NUMA node, run at
once) combined into the one result its record holds. Pure: no Ray, no vLLM.

What a whole machine gives is the sum of what its replicas give: decode and prefill tokens/s,
RssAnon, KV tokens are summed (``SUMMED``; each also kept per replica as ``<key>_replicas``).
Start-up and latency figures are the slowest replica's (``SLOWEST``). The sum of the replicas'
peaks (``peak_rss_anon_mb``) bounds the peak of their sum from above. ``replica_overlap`` is
the share of the replicas' measuring windows that all of them spent measuring at once: a sum
of throughputs measured one after the other would not be a machine's throughput.
"""

from __future__ import annotations

from collections.abc import Sequence

SUMMED = ("decode_tok_s", "prefill_tok_s", "rss_anon_tree_mb", "peak_rss_anon_mb",
          "peak_rss_anon_during_load_mb", "rss_anon_at_context_mb", "kv_cache_tokens",
          # each replica's slot was probed on its own: the machine's bound is their sum
          "sol_bandwidth_gb_s", "decode_sol_tok_s")
SLOWEST = ("ready_s", "init_s", "import_s", "ttft_s", "decode_ms_per_token",
           "neighbour_cpu_frac")  # the most disturbed replica speaks for the arm
SAME = ("decode_regime", "weight_bytes_per_token", "decode_weight_bytes_per_token",
        "llc_bytes")  # kept when every replica agrees


def overlap(windows: Sequence[tuple[float, float] | None]) -> float | None:
    """The time all windows share, as a share of the mean window; None without every window."""
    if not windows or any(w is None for w in windows):
        return None
    shared = min(end for _s, end in windows) - max(start for start, _e in windows)
    mean = sum(end - start for start, end in windows) / len(windows)
    return max(0.0, shared) / mean if mean > 0 else None


def aggregate(results: Sequence[dict]) -> dict:
    """The combined result of the replicas' engine results (``launch_arm``'s dicts, in replica
    order): ``status`` ok only when every replica is ok, else the first failure's status and
    error naming the replica; ``measurements`` as the module says; ``pinning`` with every
    replica's pinning and all their violations."""
    per = [r.get("measurements") or {} for r in results]
    failed = [(i, r) for i, r in enumerate(results) if r.get("status") != "ok"]
    m: dict = {"replicas": len(results)}
    for key in SUMMED:
        values = [p.get(key) for p in per]
        if any(v is not None for v in values):
            m[f"{key}_replicas"] = values
            m[key] = None if failed or None in values else sum(values)
    for key in SLOWEST:
        values = [p.get(key) for p in per]
        if any(v is not None for v in values):
            m[key] = None if failed or None in values else max(values)
    for key in SAME:
        values = {repr(p.get(key)) for p in per}
        if len(values) == 1 and per and per[0].get(key) is not None:
            m[key] = per[0][key]
    if any(p.get("sol_probe") for p in per):
        m["sol_probe_replicas"] = [p.get("sol_probe") for p in per]
    if m.get("decode_tok_s") and m.get("decode_sol_tok_s"):
        from omni_ray.measure.speed_of_light import percent_text

        m["decode_sol_frac"] = m["decode_tok_s"] / m["decode_sol_tok_s"]
        m["decode_sol_text"] = percent_text(
            m["decode_sol_frac"], m.get("decode_regime"), m.get("decode_weight_bytes_per_token"),
            m.get("llc_bytes"), against="the replicas' probes summed")
    m["replica_overlap"] = overlap([
        (p["measured_from"], p["measured_to"]) if "measured_from" in p and "measured_to" in p
        else None for p in per])
    pinnings = [r.get("pinning") or {} for r in results]
    out = {"status": "ok", "measurements": m,
           "pinning": {"replicas": pinnings,
                       "violations": [v for p in pinnings for v in p.get("violations") or ()]},
           "wall_s": max((r.get("wall_s") or 0.0 for r in results), default=0.0)}
    if failed:
        i, first = failed[0]
        out.update(status=first.get("status") or "failed",
                   error=f"replica {i} of {len(results)}: {first.get('error')}",
                   stderr_tail=first.get("stderr_tail"))
    return out
