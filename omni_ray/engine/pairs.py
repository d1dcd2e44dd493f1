"""A paired comparison (``compare:``, docs/compare.md): two arms' engines loaded on one slot at
once, taking turns seconds apart, so both sides of a pair see nearly the same machine.

Both engine processes start together, each pinned to the whole slot, and load; when both say
"waiting", the launcher lets them run their workload in turn: pair k runs (A, B) when k is even
and (B, A) when it is odd, so neither side always goes first. A side writes each turn's figures
as it ends (``engine.runner.take_turns``) and the other side's turn starts at once. Used from
the stage actor and directly (no Ray).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from omni_ray.engine.launch import launch_arm, log_phase
from omni_ray.engines.request import EngineRequest

SIDES = ("a", "b")
POLL_S = 0.01


def turn_order(pairs: int) -> list[tuple[int, int]]:
    """(pair, side) in the order they run: A then B, then B then A, alternating."""
    return [(k, side) for k in range(pairs) for side in ((0, 1) if k % 2 == 0 else (1, 0))]


def launch_pair(reqs: tuple[EngineRequest, EngineRequest], workdir: Path, name: str, *,
                pairs: int, timeout_s: float,
                on_poll: Callable[..., None] | None = None) -> dict:
    """Run ``pairs`` turns of each side; returns {status, error?, sides: [result a, result b],
    order: [[pair, side], ...]}. Never raises for a side's failure: the other side's engine is
    killed with its process group, and the result names the side that failed."""
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    dirs = [workdir / f"{name}.{s}.turns" for s in SIDES]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    reqs = tuple(dataclasses.replace(r, turns=pairs, turns_dir=str(d), go_timeout_s=timeout_s)
                 for r, d in zip(reqs, dirs))
    results: list[dict | None] = [None, None]
    pids: dict[int, int] = {}

    def run(i: int) -> None:
        def poll(pid: int) -> None:
            pids[i] = pid
            if on_poll is not None:
                on_poll(*pids.values())
        results[i] = launch_arm(reqs[i], workdir, f"{name}.{SIDES[i]}", timeout_s=timeout_s,
                                warm_start=reqs[i].stage.warm_start, on_poll=poll)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in (0, 1)]
    for t in threads:
        t.start()
    order: list[list[int]] = []
    error = None
    either_ended = lambda: any(r is not None for r in results)  # noqa: E731
    if _wait(lambda: all(log_phase(workdir / f"{name}.{s}.log") == "waiting" for s in SIDES),
             either_ended, t0 + timeout_s):
        for k, side in turn_order(pairs):
            (dirs[side] / f"{k}.go").touch()
            done = dirs[side] / f"{k}.done.json"
            # the other side ends once its last turn is done: only this side's end, or a
            # failure of either, stops the wait
            stop = (lambda side=side: results[side] is not None  # noqa: E731
                    or any(r is not None and r["status"] != "ok" for r in results))
            if not _wait(done.exists, stop, t0 + timeout_s):
                error = f"pair {k}: side {SIDES[side]} did not finish its turn"
                break
            order.append([k, side])
    else:
        error = "the engines did not both load"
    killed = set()
    if error is not None:  # a side still waiting for a turn that will not come: end it
        for i, pid in pids.items():
            if results[i] is None:
                killed.add(i)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
    for t in threads:
        t.join(max(1.0, t0 + timeout_s + 30 - time.monotonic()))
    sides = [r or {"status": "failed", "error": "no result"} for r in results]
    out = {"status": "ok", "sides": sides, "order": order,
           "wall_s": time.monotonic() - t0}
    # the side that failed on its own, not the one ended for it
    bad = sorted((i for i, r in enumerate(sides) if r["status"] != "ok"),
                 key=lambda i: i in killed)
    if bad or error:
        i = bad[0] if bad else None
        why = sides[i].get("error") if i is not None else error
        out.update(status="failed", error=(f"side {SIDES[i]} ({reqs[i].stage.model}, "
                                           f"{reqs[i].stage.engine}): {why}" if i is not None
                                           else why),
                   stderr_tail=sides[i].get("stderr_tail") if i is not None else None)
    return out


def _wait(cond: Callable[[], bool], stop: Callable[[], bool], deadline: float) -> bool:
    """Until ``cond()`` (True), or ``stop()`` or the deadline (then ``cond()`` once more)."""
    while not cond():
        if stop() or time.monotonic() > deadline:
            return cond()
        time.sleep(POLL_S)
    return True
