"""The Python API: what the CLI calls and what users and tests call.

    import omni_ray
    report = omni_ray.run_sweep("configs/smoke.yaml", out="results")
    print(report.failed, report.summaries["smoke"]["arms"])
    record = omni_ray.run_stage({"model": "tiny", "kv_cache_mib": 64}, {"output_len": 8})
    info = omni_ray.doctor()
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from omni_ray import events
from omni_ray.config import (Arm, StageConfig, SweepConfig, WorkloadConfig, expand, load_sweeps,
                             stage_from_dict, sweep_from_dict, workload_from_dict)
from omni_ray.errors import UserError
from omni_ray.topology.addresses import check_listen

METRICS = ("ready_s", "init_s", "import_s", "rss_anon_tree_mb", "peak_rss_anon_mb",
           "peak_rss_anon_during_load_mb", "rss_anon_at_context_mb", "ttft_s", "prefill_tok_s",
           "decode_tok_s", "kv_cache_tokens", "decode_sol_frac")
# A pipeline arm's own figures (docs/pipelines.md); its per-stage figures stay in the record.
PIPELINE_METRICS = ("ready_s", "rss_anon_tree_mb", "pipeline_peak_rss_anon_mb",
                    "pipeline_e2e_s", "last_stage_first_token_s", "last_stage_decode_tok_s")

# An arm that ran the quality probe (workload.quality) adds its perplexity to the table; the
# pairs against bf16 are summary["quality"] (results/quality.py, docs/quality.md).
QUALITY_METRICS = ("quality_perplexity",)

SweepInput = str | os.PathLike | SweepConfig | dict | Sequence[str | os.PathLike | SweepConfig]


@dataclasses.dataclass
class SweepReport:
    run_id: str
    out_dirs: dict[str, Path]
    arms: list[Arm]
    records: list[dict]
    summaries: dict[str, dict]
    skipped: int = 0
    refused: str | None = None
    dashboard_url: str | None = None
    pairs: list[dict] = dataclasses.field(default_factory=list)  # compare: records

    @property
    def failed(self) -> int:
        return sum(r["status"] != "ok" for r in self.records)


def load_sweep(config_or_paths: SweepInput) -> list[SweepConfig]:
    """Parse and validate without running anything: one SweepConfig per file or dict."""
    items = config_or_paths
    if isinstance(items, (str, os.PathLike, SweepConfig, dict)):
        items = [items]
    paths = [p for p in items if isinstance(p, (str, os.PathLike))]
    out = load_sweeps(paths) if paths else []
    out += [s for s in items if isinstance(s, SweepConfig)]
    out += [sweep_from_dict(d) for d in items if isinstance(d, dict)]
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise UserError(f"two sweeps are named the same: {sorted(names)}")
    return out


def _run_dir(root: Path, sweep: str, run_id: str, resume: bool) -> Path:
    base = root / sweep
    if resume and base.is_dir():
        earlier = sorted(p for p in base.iterdir() if p.is_dir())
        if earlier:
            return earlier[-1]
    return base / run_id


def _records_in(out_dir: Path) -> list[dict]:
    from omni_ray.results.record import upgrade
    from omni_ray.results.store import read_json

    return [upgrade(read_json(p), source=str(p)) for p in sorted(out_dir.glob("*.p*.json"))]


def write_summary(sweep: SweepConfig, arms: Iterable[Arm], out_dir: Path) -> dict:
    from omni_ray.config.grid import baselines
    from omni_ray.results import quality
    from omni_ray.results.pairs import pairs_markdown, summarize_pairs
    from omni_ray.results.store import read_json, write_json_atomic, write_text_atomic
    from omni_ray.results.summary import (serving_markdown, summarize_arms, summarize_serving,
                                          to_csv, to_markdown)

    records = _records_in(out_dir)
    metrics = PIPELINE_METRICS if sweep.stages else METRICS
    probed = any("quality_logprobs" in (r.get("measurements") or {}) for r in records)
    if probed:
        metrics = (*metrics, *QUALITY_METRICS)
    summary = summarize_arms(records, list(metrics), noise_pct=sweep.noise.spread_pct)
    summary["sweep"] = sweep.name
    arms = list(arms)
    summary["labels"] = {a.id: a.label for a in arms}
    summary["baseline"] = sweep.baseline  # one arm's label, or axis=value pairs (grid.baselines)
    summary["baselines"] = baselines(sweep, arms)  # arm label -> the label it is divided by
    serving = summarize_serving(records)
    if serving:
        summary["serving"] = serving
    quality_pairs = quality.pair(records) if probed else []
    if probed:
        summary["quality"] = quality_pairs
    compared = summarize_pairs([read_json(p) for p in sorted(out_dir.glob("pairs/*.json"))])
    if compared:
        summary["pairs"] = compared
    write_json_atomic(out_dir / "summary.json", summary)
    write_text_atomic(out_dir / "summary.csv", to_csv(summary))
    write_text_atomic(out_dir / "summary.md", f"# {sweep.name}\n\n" + to_markdown(summary)
                      + serving_markdown(serving, summary["labels"])
                      + quality.to_markdown(quality_pairs, summary["labels"])
                      + pairs_markdown(compared))
    return summary


def run_sweep(config_or_paths: SweepInput, *, address: str | None = None,
              out: str | os.PathLike | None = None, resume: bool = False,
              passes: int | None = None, dry_run: bool = False, allow_busy: bool = False,
              busy_wait_s: float = 30.0, listen: str | None = None,
              monitor: bool = False, monitor_port: int = 9090,
              on_event: events.Consumer | None = None) -> SweepReport:
    """Run sweeps on every free slot of a local Ray (started here) or of ``address``.

    A local Ray listens on 127.0.0.1 only, unless ``listen`` names an address of this host
    (its node address then; Ray binds every interface).
    ``monitor`` runs a Prometheus (the host's ``prometheus`` binary, on 127.0.0.1:
    ``monitor_port`` or the next free port) on Ray's metrics for the length of the run, its
    data in the first sweep's run directory; ``Monitoring`` says where.

    ``on_event`` receives what the run emits (``omni_ray.events``): the plan of a dry run, each
    arm pass started and recorded, the end. The CLI passes its terminal view.
    """
    emit = on_event or events.ignore
    sweeps = load_sweep(config_or_paths)
    if passes is not None and passes < 1:
        raise UserError(f"--passes: must be >= 1, got {passes}")
    listen = check_listen(listen, address)
    if not 1 <= monitor_port <= 65535:
        raise UserError(f"--monitor-port: must be 1..65535, got {monitor_port}")
    if monitor and not dry_run:
        from omni_ray.monitor import find_prometheus

        find_prometheus()  # not installed: one line, before Ray or any arm starts
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    root = Path(out if out is not None else "results")
    planned = [(s, expand(s), _run_dir(root, s.name, run_id, resume)) for s in sweeps]
    arms = [a for _s, sweep_arms, _o in planned for a in sweep_arms]
    report = SweepReport(run_id, {s.name: o for s, _a, o in planned}, arms, [], {})
    if dry_run:
        emit(events.Planned(tuple((s, tuple(a), o) for s, a, o in planned), passes))
        return report

    from omni_ray.engine.budget import budget_problem
    from omni_ray.placement import cluster
    from omni_ray.placement.coordinator import (
        Coordinator, Events, already_done, host_lock, plan_tasks, resolve_models)

    resolve_models(arms)
    from omni_ray import engines

    for stage in dict.fromkeys(a.stage for a in arms):
        engines.prepare(stage)  # a llama.cpp build or GGUF: once, before any arm's clock runs
    groups = plan_tasks(planned, passes)
    todo = {size: [t for t in tasks if not (resume and already_done(t))]
            for size, tasks in groups.items()}
    report.skipped = sum(len(t) for t in groups.values()) - sum(len(t) for t in todo.values())
    slot_sizes = list(dict.fromkeys(g.slot_cores for g in groups))
    with host_lock(), cluster.session(address, slot_sizes, listen) as ctx, \
            contextlib.ExitStack() as stack:
        report.dashboard_url = getattr(ctx, "dashboard_url", None)
        if monitor:
            from omni_ray.monitor import Prometheus

            prom = stack.enter_context(Prometheus(cluster.session_dir(), planned[0][2] /
                                                  "prometheus", port=monitor_port))
            emit(events.Monitoring(prom.url, prom.graphs, prom.moved))
        coord = Coordinator(
            run_id=run_id, allow_busy=allow_busy, busy_wait_s=busy_wait_s, live_stats=monitor,
            events=Events(on_dispatch=lambda task, slot: emit(events.ArmStarted(task, slot)),
                          on_record=lambda task, record: emit(events.ArmDone(task, record)),
                          on_progress=lambda task, slot, phase, rss: emit(
                              events.ArmProgress(task, slot, phase, rss)),
                          on_note=emit))
        emit(events.Started(sum(len(t) for t in todo.values()), report.skipped,
                            report.dashboard_url))
        try:
            for group, tasks in todo.items():
                runnable = []
                for task in tasks:
                    problem = budget_problem(task.arm.stage)
                    if problem:
                        coord.record_failure(task, problem)
                    else:
                        runnable.append(task)
                if runnable:
                    coord.run_group(runnable, group)
                if coord.refused:
                    break
            for sweep, sweep_arms, out_dir in planned:  # paired comparisons, after the passes
                if sweep.compare is not None and not coord.refused:
                    coord.run_compare(sweep, sweep_arms, out_dir, resume=resume)
        finally:
            report.records = coord.records
            report.pairs = coord.pair_records
            report.refused = coord.refused
            for sweep, sweep_arms, out_dir in planned:
                if out_dir.is_dir():
                    report.summaries[sweep.name] = write_summary(sweep, sweep_arms, out_dir)
    emit(events.Finished(report))
    return report


STAGE_SOURCE = "omni-ray stage"  # where a stage or workload given as a dict is said to come from


def run_stage(stage: StageConfig | dict, workload: WorkloadConfig | dict, *,
              slot_cores: int | None = None, timeout_s: float = 600.0,
              out: str | os.PathLike | None = None,
              workdir: str | os.PathLike | None = None) -> dict:
    """Run one arm directly on the first slot of this machine (no Ray, no sweep file) and
    return its result record (also written to ``out`` when given). ``slot_cores``: the slot's
    size (default: the whole first node). A stage over its memory budget raises UserError; an
    engine that fails is a record with status and error, not an exception."""
    import tempfile

    from omni_ray import engines
    from omni_ray.engine.budget import budget_problem
    from omni_ray.engine.launch import launch_arm
    from omni_ray.engines.request import EngineRequest
    from omni_ray.results.record import make_record
    from omni_ray.results.store import write_json_atomic
    from omni_ray.topology import detect, make_slots

    if isinstance(stage, dict):
        stage = stage_from_dict(stage, STAGE_SOURCE)
    if isinstance(workload, dict):
        workload = workload_from_dict(workload, STAGE_SOURCE)
    problem = budget_problem(stage)
    if problem:
        raise UserError(problem)
    topology = detect()
    slot = make_slots(topology, slot_cores)[0]
    engines.prepare(stage)
    req = EngineRequest(stage=stage, workload=workload, cpus=tuple(slot.cpus), node=slot.node,
                        simulated=topology.simulated)
    work = Path(workdir) if workdir is not None else Path(
        tempfile.mkdtemp(prefix="omni-ray-stage-"))
    result = launch_arm(req, work, "stage", timeout_s=timeout_s)
    record = make_record(kind="stage", config=req.to_dict(), measurements=result.get("measurements") or {},
                         status=result["status"], error=result.get("error"),
                         stderr_tail=result.get("stderr_tail"), pinning=result.get("pinning"),
                         extra={"slot": slot.to_dict(), "log": result.get("log"),
                                "engine_report": result.get("engine_report"),
                                "log_path": result.get("log_path")})
    if out is not None:
        write_json_atomic(out, record)
    return record


def doctor() -> dict:
    """What this installation gives an engine process: versions, each vllm_omni patch applied
    or why not, cpu_int4 and its kernels, changed upstream functions; ``ok`` is whether every
    patch and quantization method is in place (imports vLLM, builds kernels on first use)."""
    from omni_ray.engine import installation

    info = installation.collect()
    return info | {"ok": installation.healthy(info)}
