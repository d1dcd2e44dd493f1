"""A pipeline arm (docs/pipelines.md): one fresh engine process per stage, each pinned to its
own share of its node's slot CPUs, stage i+1 fed stage i's output token ids.

A serving workload (docs/pipelines.md, "Serving") runs the same way, each stage an AsyncLLM:
stage 0 serves the load and every request goes on through the stages' inboxes (JSON lines,
engines/handover.py), the last stage replying to stage 0; the launcher says go, tells the
stages to give up when one fails, and turns the stages' traces into each stage's figures.

Every stage's engine is started at once and loads, warms up and reports "waiting"; when all
wait, the launcher writes stage 0's prompts, and each stage writes its output ids straight into
the next stage's input file (mapped there by ``id % vocab_size``; with a ``window``, in chunks
as they are produced: engines/handover.py), so a hand-over costs no process exit. A stage that
fails before its input is complete gets the stages still waiting an error input, and the arm
fails naming the stage. Used from the stage actor and directly (no Ray).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

from omni_ray.config.schema import MAP_RULE, place_stages
from omni_ray.engine.launch import launch_arm, log_phase
from omni_ray.engines import handover
from omni_ray.engines.request import EngineRequest
from omni_ray.measure.sampler import tree_rss
from omni_ray.results.store import write_json_atomic
from omni_ray.workload import serving as sv
from omni_ray.workload.prompts import token_prompts
from omni_ray.workload.quality import vocab_size_of

# What each stage's record keeps from its runner's measurements.
STAGE_FIGURES = ("ready_s", "init_s", "rss_anon_tree_mb", "peak_rss_anon_during_load_mb",
                 "peak_rss_anon_mb", "kv_cache_tokens", "kv_cache_tokens_budget", "ttft_s",
                 "prefill_tok_s", "decode_tok_s", "decode_ms_per_token", "generate_s",
                 "busy_fraction", "window", "input_at", "chunk_at", "first_token_at",
                 "sent_at", "output_at", "output_token_ids", "neighbour_cpu_frac",
                 "neighbour_window_s", "kv_cache", "serving_trace")
# What a serving pipeline's measurements take from stage 0's: the load points and the search,
# whose figures are the pipeline's (its requests' replies come from the last stage).
SERVING_KEYS = ("serving", "serving_search", "capacity_req_s", "capacity_concurrency",
                "capacity_users")
# What a load point of stage 0 measured of stage 0 alone: moved under its stages[0].
STAGE0_POINT_KEYS = ("kv_cache", "cpu", "peak_rss_anon_mb")


def stage_requests(req: EngineRequest, workdir: Path, name: str) -> list[EngineRequest]:
    """One request per stage: its node and CPUs (the stages on one node split its slot's CPUs:
    ``req.cpus`` on ``req.node``, ``req.node_cpus`` on the others), its input and output file.
    Stage i >= 1 reads ``output_len`` tokens, so that is its workload's prompt length."""
    if not req.cpus:
        raise ValueError("a pipeline needs the slot's CPUs to split between its stages")
    placed = place_stages(req.stages, req.node,
                          {req.node: list(req.cpus), **{n: list(c) for n, c in req.node_cpus}})
    wl = req.workload
    serving = wl.mode == "serving"
    n = len(req.stages)

    def inbox(i: int) -> str:  # serving: a file of JSON lines; the last stage replies to 0's
        return str(workdir / f"{name}.s{i % n}.in.json{'l' if serving else ''}")

    later = dataclasses.replace(wl, prompt_len=wl.output_len)
    if serving:  # reads the ids the previous stage writes, as many as that request's output
        later = dataclasses.replace(later, prompt_len_max=wl.output_len_max, prompt_file=None)
    out = []
    for i, (ps, (node, cpus)) in enumerate(zip(req.stages, placed)):
        last = i == n - 1
        out.append(EngineRequest(
            stage=ps.stage, seed=req.seed, cpus=tuple(cpus), node=node,
            simulated=req.simulated, live_stats=req.live_stats,
            workload=wl if i == 0 else later, inputs_path=inbox(i),
            outputs_path=inbox(i + 1) if serving or not last else None,
            window=ps.window if i else None,
            out_window=None if last else req.stages[i + 1].window,
            stage_index=i, stage_count=n))
    return out


def launch_pipeline(req: EngineRequest, workdir: Path, name: str, *, timeout_s: float,
                    on_poll: Callable[..., None] | None = None) -> dict:
    """Run a pipeline arm; returns one result (per-stage figures under ``stages``). Never
    raises for a stage's failure: it becomes the arm's status and error, naming the stage."""
    from omni_ray.models.build import resolve_model

    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    serving = req.workload.mode == "serving"
    try:
        reqs = stage_requests(req, workdir, name)
        prompts = [] if serving else token_prompts(
            req.workload.batch, req.workload.prompt_len,
            vocab_size_of(str(resolve_model(req.stages[0].stage.model))), seed=req.seed)
    except (ValueError, OSError) as exc:
        return {"status": "failed", "error": f"pipeline: {exc}"}
    for r in reqs:
        Path(r.inputs_path).unlink(missing_ok=True)
    results: list[dict | None] = [None] * len(reqs)
    pids: dict[int, int] = {}

    def run(i: int) -> None:
        def poll(pid: int) -> None:
            pids[i] = pid
        results[i] = launch_arm(reqs[i], workdir, f"{name}.s{i}", timeout_s=timeout_s,
                                warm_start=reqs[i].stage.warm_start, on_poll=poll)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(reqs))]
    for t in threads:
        t.start()
    started = False
    told: set[str] = set()
    total_peak = 0.0
    while any(t.is_alive() for t in threads):
        failed = [i for i, r in enumerate(results) if r is not None and r["status"] != "ok"]
        if failed:
            for r in reqs:  # the stages still waiting give up instead of timing out
                if r.inputs_path in told:
                    continue
                error = {"error": f"stage {failed[0]} failed"}
                if serving:  # every stage may wait for more: a line in each inbox
                    handover.append_line(r.inputs_path, error)
                elif not (handover.read_edge(r.inputs_path) or {}).get("final"):
                    write_json_atomic(Path(r.inputs_path), error)
                else:
                    continue
                told.add(r.inputs_path)
        elif not started and all(log_phase(workdir / f"{name}.s{i}.log") == "waiting"
                                 for i in range(len(reqs))):
            if serving:  # stage 0 serves its load from now on
                handover.append_line(reqs[0].inputs_path, {"go": True})
            else:
                handover.write_tokens(reqs[0].inputs_path, prompts, final=True)
            started = True
        now = 0.0
        running = [pid for i, pid in list(pids.items()) if results[i] is None]
        for pid in running:  # the pipeline's RssAnon: every stage tree, one clock
            try:
                now += tree_rss(pid)[0]
            except (ProcessLookupError, FileNotFoundError):
                pass
        total_peak = max(total_peak, now)
        if on_poll is not None and running:
            on_poll(*running)  # the stage actor's slot gauges: every stage
        time.sleep(0.1)
    done = [r or {"status": "failed", "error": "no result"} for r in results]
    return (summarise_serving if serving else summarise)(reqs, done, total_peak) | {
        "wall_s": time.monotonic() - t0}




def _stages(reqs: list[EngineRequest], results: list[dict]) -> tuple[list[dict], dict]:
    """Each stage's entry, and the arm's result so far: failed, naming the stage that failed
    first on its own (not one that was told to give up), when one did."""
    stages = []
    for i, (r, res) in enumerate(zip(reqs, results)):
        m = res.get("measurements", {})
        stages.append({"stage": i, "model": r.stage.model, "cpus": list(r.cpus),
                       "kv_cache_mib": r.stage.kv_cache_mib, "status": res["status"],
                       "error": res.get("error"), "pinning": res.get("pinning"),
                       "log_path": res.get("log_path"),
                       **{k: m[k] for k in STAGE_FIGURES if k in m}})
    bad = [i for i, res in enumerate(results) if res["status"] != "ok"]
    out: dict = {"status": "ok", "stages": stages, "map_rule": MAP_RULE}
    if bad:
        own = [i for i in bad if "no input: stage" not in str(results[i].get("error"))] or bad
        i = own[0]
        out.update(status=results[i]["status"],
                   error=f"stage {i} ({reqs[i].stage.model}): {results[i].get('error')}",
                   stderr_tail=results[i].get("stderr_tail"))
    return stages, out


def _pinning(stages: list[dict]) -> dict:
    pins = [s["pinning"] or {} for s in stages]
    return {"threads": sum(p.get("threads", 0) for p in pins),
            "processes": sum(p.get("processes", 0) for p in pins),
            "allowed_cpus": sorted({c for p in pins for c in p.get("allowed_cpus", [])}),
            "violations": [v for p in pins for v in p.get("violations", [])]}


def summarise(reqs: list[EngineRequest], results: list[dict], total_peak_mb: float) -> dict:
    """The arm's result: per-stage figures, then the pipeline's own (end to end, first token of
    the last stage, total RssAnon, the bottleneck stage)."""
    stages, out = _stages(reqs, results)
    if out["status"] != "ok":
        return out
    first, last = stages[0], stages[-1]
    t0 = first["input_at"]
    gen = [s["generate_s"] for s in stages]
    # each edge: when its first chunk reached the next stage, and how long before the previous
    # stage finished (> 0: the next stage started while the previous one still generated)
    out["edges"] = [{"from": i - 1, "to": i, "window": reqs[i].window,
                     "first_chunk_s": s["input_at"] - t0,
                     "from_done_s": stages[i - 1]["output_at"] - t0,
                     "overlap_s": stages[i - 1]["output_at"] - s["input_at"]}
                    for i, s in enumerate(stages) if i]
    out["measurements"] = {
        "pipeline_e2e_s": last["output_at"] - t0,
        "last_stage_first_token_s": last["first_token_at"] - t0,
        "last_stage_decode_tok_s": last.get("decode_tok_s"),
        "rss_anon_tree_mb": sum(s["rss_anon_tree_mb"] for s in stages),
        "pipeline_peak_rss_anon_mb": total_peak_mb,
        "bottleneck_stage": gen.index(max(gen)),
        "output_token_ids": last["output_token_ids"],
        "ready_s": max(s["ready_s"] for s in stages),
        "neighbour_cpu_frac": max((s["neighbour_cpu_frac"] for s in stages
                                   if s.get("neighbour_cpu_frac") is not None), default=None),
    }
    out["pinning"] = _pinning(stages)
    return out


def stage_figures(label: str, traces: list[dict], percentiles) -> list[dict]:
    """Each stage's side of the requests of one load point (ids ``<label>.<i>``), from the
    stages' traces (``vllm_pipeline_serving.Trace``), in milliseconds: ``ttft_ms`` its input
    (stage 0: the request) -> its first token (its queue and prefill), ``e2e_ms`` its input ->
    its last token, and for a later stage ``handover_ms``: the previous stage handed the request
    on -> this stage read it. Mean, median and ``percentiles`` of each."""
    rows = []
    for t in traces:
        cols = [c for c in ("in", "first", "out", "done") if c in t]
        rows.append({rid: dict(zip(cols, vals)) for rid, *vals
                     in zip(t["id"], *(t[c] for c in cols)) if rid.startswith(f"{label}.")})

    def ms(pairs) -> list[float]:
        return [(b - a) * 1e3 for a, b in pairs if a is not None and b is not None]

    out = []
    for k, mine in enumerate(rows):
        fig = {"stage": k, "requests": len(mine),
               "ttft_ms": sv.stats(ms((r.get("in"), r.get("first")) for r in mine.values()),
                                   percentiles),
               "e2e_ms": sv.stats(ms((r.get("in"), r.get("done")) for r in mine.values()),
                                  percentiles)}
        if k:
            fig["handover_ms"] = sv.stats(ms((rows[k - 1].get(rid, {}).get("out"), r.get("in"))
                                             for rid, r in mine.items()), percentiles)
        out.append(fig)
    return out


def serving_point(point: dict, traces: list[dict], percentiles) -> dict:
    """A load point of stage 0's serving (whose figures are the pipeline's) with each stage's
    figures under ``stages``; what stage 0 measured of itself alone goes under its entry."""
    point = dict(point)
    per = stage_figures(point["label"], traces, percentiles)
    per[0].update({k: point.pop(k) for k in STAGE0_POINT_KEYS if k in point})
    return point | {"stages": per}


def summarise_serving(reqs: list[EngineRequest], results: list[dict],
                      total_peak_mb: float) -> dict:
    """A serving pipeline's result: stage 0's load points and search (the pipeline's figures),
    each with every stage's side of its requests; the start figures of the pipeline (the
    slowest stage ready, the stages' RssAnon summed, their sampled peak together)."""
    stages, out = _stages(reqs, results)
    if out["status"] != "ok":
        return out
    wl = reqs[0].workload
    traces = [s.get("serving_trace") or {"id": []} for s in stages]
    m0 = results[0]["measurements"]
    m = {k: m0[k] for k in SERVING_KEYS if k in m0}
    m["serving"] = [serving_point(p, traces, wl.percentiles) for p in m0.get("serving", [])]
    if "serving_search" in m:
        m["serving_search"] = dict(m["serving_search"], probes=[
            serving_point(p, traces, wl.percentiles) for p in m["serving_search"]["probes"]])
    m.update(ready_s=max(s["ready_s"] for s in stages),
             rss_anon_tree_mb=sum(s["rss_anon_tree_mb"] for s in stages),
             pipeline_peak_rss_anon_mb=total_peak_mb,
             neighbour_cpu_frac=max((s["neighbour_cpu_frac"] for s in stages
                                     if s.get("neighbour_cpu_frac") is not None), default=None))
    out["measurements"] = m
    out["edges"] = [{"from": i - 1, "to": i, "window": reqs[i].window}
                    for i in range(1, len(stages))]
    out["pinning"] = _pinning(stages)
    return out
