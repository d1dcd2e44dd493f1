"""Start one arm's engine in a fresh process (``omni_ray.engine.runner``) and collect its result.

Used directly (no Ray) and from inside the Ray stage actor, so both paths measure the same thing.
A crash, a kill or a timeout becomes a result with status, cause and the tail of the log, never
an exception: a sweep goes on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from omni_ray.engines import PHASE_MARK, PROGRESS_MARK  # noqa: F401 - what _PHASE, _PROGRESS read
from omni_ray.engines.request import EngineRequest
from omni_ray.measure.sampler import tree_rss
from omni_ray.results.store import write_json_atomic
from vllm_omni import events

TAIL_LINES = 40

# What the engine log says that the result needs. vllm_omni's own facts come as structured
# events (vllm_omni/events.py: one ``vllm_omni-event {json}`` line each), counted by name: the
# KV budget and inductor settings kept over the CPU platform's, whether decode attention took
# vllm_omni's short path (on its C++ kernels; its ops without the GIL), whether sampling took
# the step_overhead patch's argmax (each once per engine process), how many compiled models'
# forwards the compiled_call patch replays, and the allocator memory returned after load.
# vLLM's own wording is not ours and stays matched as it is (compile cache hits and misses, the
# KV size it allocated); cpu_int4's packed weights going to huge-page mappings (weight_arena) is
# an event too.
_EVENTS = {
    "kv_explicit_kept": lambda e: e["event"] == "kv_explicit_kept",
    "inductor_config_kept": lambda e: e["event"] == "inductor_config_kept",
    "cpu_attention_short_path": lambda e: e["event"] == "cpu_attention_short_path",
    "cpu_attention_native": lambda e: (e["event"] == "cpu_attention_short_path"
                                       and e.get("kernels") == "cpp"),
    "cpu_attention_no_gil": lambda e: e["event"] == "cpu_attention_no_gil",
    "greedy_argmax": lambda e: e["event"] == "greedy_argmax",
    "compiled_call_replay": lambda e: e["event"] == "compiled_call_replay",
    "weight_arena": lambda e: e["event"] == "weight_arena",
}
_MARKERS = {
    "aot_loaded": re.compile(r"Directly load AOT compilation"),
    "aot_load_failed": re.compile(r"Compiling model again due to a load failure"),
}
_KV_TOKENS = re.compile(r"CPU KV cache size: ([\d,]+) tokens")


# The runner says where it is in its log, one line each (PHASE_MARK): "probing" (the slot's
# bandwidth probe, measure/bandwidth.py), "loading" (building the engine) and "measuring" (the
# workload); before the first, the process is "starting" (imports).
_PHASE = re.compile(r"^omni-ray phase: (\w+)$", re.M)


def last_phase(text: str, default: str = "starting") -> str:
    """The last phase line of (a new piece of) an engine log, or ``default`` without one."""
    found = _PHASE.findall(text)
    return found[-1] if found else default


def log_phase(log: Path) -> str | None:
    """The phase an engine's log says it is in ("starting" before its first phase line), or
    None while the log does not exist yet."""
    try:
        return last_phase(log.read_text(errors="replace"), "starting")
    except FileNotFoundError:
        return None


# While it measures, an engine says the figures of its last window (PROGRESS_MARK, a JSON
# object a line: engines.Session.progress); the stage actor sets its live gauges from them.
_PROGRESS = re.compile(r"^omni-ray progress: (\{.*\})$", re.M)
LIVE_FIGURES = ("decode_tok_s", "prefill_tok_s", "kv_tokens_used", "kv_tokens_budget")


def live_figures(text: str) -> dict[str, float]:
    """The latest value of each of ``LIVE_FIGURES`` in the progress lines of (a new piece of)
    an engine log; a line that is not a JSON object is passed over."""
    out: dict[str, float] = {}
    for found in _PROGRESS.findall(text):
        try:
            figures = json.loads(found)
        except ValueError:
            continue
        out |= {k: float(figures[k]) for k in LIVE_FIGURES
                if isinstance(figures.get(k), (int, float))}
    return out


class EngineLog:
    """An engine log read as it grows, by whole lines: the phase it is in and the live figures
    of its newest progress lines. Safe to read from two threads (the actor's run and status)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.phase = path, 0, "starting"
        self._lock = threading.Lock()

    def read(self) -> dict[str, float]:
        """The live figures said since the last read (``phase`` follows the log too)."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    new = f.read()
            except FileNotFoundError:
                return {}
            new = new[:new.rfind(b"\n") + 1]  # a line being written waits for its end
            self.offset += len(new)
            text = new.decode(errors="replace")
            self.phase = last_phase(text, self.phase)
            return live_figures(text)


def scan_log(text: str) -> dict:
    found = events.parse(text)
    out: dict = {name: sum(map(test, found)) for name, test in _EVENTS.items()}
    out |= {name: len(rx.findall(text)) for name, rx in _MARKERS.items()}
    out["kv_cache_tokens_logged"] = [int(m.replace(",", "")) for m in _KV_TOKENS.findall(text)]
    out["malloc_trim"] = [
        {"pid": e["pid"], "step": e["step"], "before_mb": e["before_mb"],
         "after_mb": e["after_mb"], "released_mb": round(e["before_mb"] - e["after_mb"], 1)}
        for e in found if e["event"] == "malloc_trim"
    ]
    return out


def tail(text: str, n: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def _death_cause(code: int) -> str:
    if code < 0:
        sig = signal.Signals(-code).name
        hint = " (out of memory, or killed)" if sig == "SIGKILL" else ""
        return f"engine process killed by {sig}{hint}"
    return f"engine process exited with code {code} before writing a result"


# stage.memory_limit_mib is enforced here, on what omni-ray measures: the RssAnon of the whole
# engine tree, read every POLL_S; over the limit the tree is SIGKILLed and the arm is a failed
# record, "out of memory", with its peak. Not RLIMIT_AS: it limits one process's address space,
# which torch and vLLM reserve by gigabytes they never touch, and vLLM's EngineCore child gets
# its own. Not a cgroup: that needs a writable cgroup hierarchy, which a Ray worker on a shared
# host does not have. The price: an allocation faster than POLL_S can pass the limit before it
# is seen (the peak recorded is what was seen).
POLL_S = 0.2


def _memory_limit(req: EngineRequest | dict) -> int | None:
    if isinstance(req, EngineRequest):
        return req.stage.memory_limit_mib
    return (req.get("stage") or {}).get("memory_limit_mib")  # a developer probe's plain request


def _over_limit(pid: int, limit_mib: int | None, seen: dict) -> bool:
    if limit_mib is None:
        return False
    try:
        anon = tree_rss(pid)[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    seen["peak_rss_anon_mb"] = max(seen.get("peak_rss_anon_mb", 0.0), anon)
    return anon > limit_mib


def _limit_report(limit_mib: int, peak_mb: float | None, *, exceeded: bool) -> dict:
    return {"limit_mib": limit_mib, "exceeded": exceeded, "peak_rss_anon_mb": peak_mb,
            "interval_s": POLL_S, "enforced_by": "omni-ray launcher (tree RssAnon watchdog)"}


def run_engine(req: EngineRequest | dict, workdir: Path, name: str, *, timeout_s: float,
               deadline: float | None = None,
               on_poll: Callable[[int], None] | None = None) -> dict:
    """One engine process for ``req``; returns the runner's result plus exit and log facts.

    The process is killed past ``timeout_s``, or past ``deadline`` (a ``time.monotonic()``)
    when given: what is left of an arm's ``timeout_s`` after an earlier process of it. A
    timeout's error names ``timeout_s``, the limit the config set, not what was left of it."""
    workdir.mkdir(parents=True, exist_ok=True)
    req_path, out_path = workdir / f"{name}.request.json", workdir / f"{name}.result.json"
    log_path = workdir / f"{name}.log"
    write_json_atomic(req_path, req.to_dict() if isinstance(req, EngineRequest) else req)
    out_path.unlink(missing_ok=True)
    t0 = time.monotonic()
    end = t0 + timeout_s if deadline is None else deadline
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "omni_ray.engine.runner", str(req_path), str(out_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},  # a killed engine still leaves its log
            start_new_session=True)
        status, limit, seen = None, _memory_limit(req), {}
        while proc.poll() is None:
            if time.monotonic() > end:
                status = "timeout"
            elif _over_limit(proc.pid, limit, seen):
                status = "oom"
            if status is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            if on_poll is not None:
                on_poll(proc.pid)
            time.sleep(POLL_S)
        _kill_leftovers(proc.pid)
    text = log_path.read_text(errors="replace")
    if status == "timeout":
        result = {"status": "timeout", "error": f"no result within timeout_s={timeout_s:g}"}
    elif status == "oom":
        peak = seen["peak_rss_anon_mb"]
        result = {"status": "failed",
                  "error": f"out of memory: the engine tree's RssAnon reached {peak:.0f} MiB, "
                           f"over memory_limit_mib={limit}; killed",
                  "measurements": {"peak_rss_anon_mb": peak},
                  "memory_limit": _limit_report(limit, peak, exceeded=True)}
    elif out_path.exists():
        result = json.loads(out_path.read_text())
    else:
        result = {"status": "failed", "error": _death_cause(proc.returncode)}
    if limit is not None and "memory_limit" not in result:
        result["memory_limit"] = _limit_report(limit, seen.get("peak_rss_anon_mb"),
                                               exceeded=False)
    result.update(returncode=proc.returncode, wall_s=time.monotonic() - t0,
                  log_path=str(log_path), log=scan_log(text))
    if result["status"] != "ok":
        result["stderr_tail"] = tail(text)
    return result


def _kill_leftovers(pgid: int) -> None:
    """The engine's own children (EngineCore, workers) must not outlive the arm."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def launch_arm(req: EngineRequest | dict, workdir: Path, name: str, *, timeout_s: float,
               warm_start: bool = False,
               on_poll: Callable[[int], None] | None = None) -> dict:
    """Run an arm with a compile cache of its own; ``warm_start`` primes it with one start first.

    A cache of its own means a compiled arm's start is cold or warm because the config says so,
    not because of what ran before it. A plain dict (a developer probe's) becomes the typed
    ``EngineRequest`` here, validated, before anything starts.
    """
    import dataclasses

    cache = workdir / f"{name}.vllm-cache"
    shutil.rmtree(cache, ignore_errors=True)
    req = dataclasses.replace(EngineRequest.coerce(req), compile_cache_dir=str(cache))
    deadline = time.monotonic() + timeout_s
    prime = None
    try:
        if warm_start:
            prime = run_engine(dataclasses.replace(req, workload=None, then=()), workdir,
                               f"{name}.prime", timeout_s=timeout_s, deadline=deadline,
                               on_poll=on_poll)
            if prime["status"] != "ok":
                prime["error"] = f"warm-start priming failed: {prime.get('error')}"
                return prime
        result = run_engine(req, workdir, name, timeout_s=timeout_s,
                            deadline=max(deadline, time.monotonic() + 1.0), on_poll=on_poll)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if prime is not None:
        result["prime"] = {k: prime.get(k) for k in ("wall_s", "log")} | {
            "init_s": prime.get("measurements", {}).get("init_s")}
    return result
