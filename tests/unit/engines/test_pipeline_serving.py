"""A serving pipeline's ring without vLLM: stage 0's ``Head`` and a relaying last stage, each on
its own event loop (the relay in a thread), handing requests on through real inbox files. The
engine is a scripted stand-in for AsyncLLM's ``generate``; the real one runs in
tests/integration/test_pipeline.py."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from omni_ray.config.schema import StageConfig, WorkloadConfig
from omni_ray.engines import handover
from omni_ray.engines.request import EngineRequest
from omni_ray.engines.vllm_pipeline_serving import Head, head, relay
from omni_ray.workload import serving as sv

VOCAB = 7  # the last stage's: stage 0's ids (100..110) map id % 7
TINY = StageConfig(model="tiny", kv_cache_mib=16)
WL = WorkloadConfig(mode="serving", prompt_len=3, output_len=4)


def rule(prompt: list[int], n: int) -> list[int]:
    """What the scripted engine generates: ``n`` tokens from the prompt's sum."""
    return [(sum(prompt) + j) % 11 + 100 for j in range(n)]


class Scripted:
    """``generate`` as AsyncLLM's, streaming one token a delta by ``rule``."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail

    async def generate(self, prompt: dict, n: int, request_id: str):
        if self.fail and self.fail in request_id:
            raise ValueError("too long")
        ids = prompt["prompt_token_ids"]
        for j, t in enumerate(rule(ids, n)):
            await asyncio.sleep(0.001)
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[t])], finished=j == n - 1)


def _requests(tmp_path: Path, window: int | None) -> tuple[EngineRequest, EngineRequest]:
    s0, s1 = str(tmp_path / "s0.in.jsonl"), str(tmp_path / "s1.in.jsonl")
    common = dict(stage=TINY, workload=WL, stage_count=2)
    return (EngineRequest(**common, inputs_path=s0, outputs_path=s1, stage_index=0,
                          out_window=window),
            EngineRequest(**common, inputs_path=s1, outputs_path=s0, stage_index=1,
                          window=window))


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on ``loop`` (an engine process just exits) and close it."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


def _start_relay(req: EngineRequest, engine: Scripted) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = relay(engine, asyncio.new_event_loop(), req, VOCAB, lambda _: None,
                                  params=lambda n: n)
        except Exception as exc:
            out["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("window", [None, 2])
def test_each_request_goes_round_the_ring_and_is_timed_on_the_last_stage(tmp_path, window):
    r0, r1 = _requests(tmp_path, window)
    thread, relayed = _start_relay(r1, Scripted())
    handover.append_line(r0.inputs_path, {"go": True})  # the launcher's, once all wait
    h, loop = Head(Scripted(), r0), asyncio.new_event_loop()
    loop.run_until_complete(h.wait_for_go())
    plan = [sv.Planned([1, 2, i], 4) for i in range(3)]
    timings, _ = loop.run_until_complete(sv.drive(
        lambda i, p: h.stream(f"load0.{i}", p, p.output_len), plan, [0.0, 0.0, 0.0],
        clock=time.time))
    h.end()
    _close(loop)
    thread.join(10)
    trace = relayed["result"]["serving_trace"]
    out1 = dict(zip(trace["id"], trace["token_ids"]))
    in1 = dict(zip(trace["id"], trace["input_ids"]))
    first1 = dict(zip(trace["id"], trace["first"]))
    for i, (p, t) in enumerate(zip(plan, timings)):
        rid = f"load0.{i}"
        mapped = [x % VOCAB for x in rule(p.prompt, 4)]  # stage 0's output, mapped
        assert in1[rid] == mapped
        if window is None:
            assert out1[rid] == rule(mapped, 4)
        else:  # c1, then c1 o1 c2
            o1 = rule(mapped[:2], 2)
            assert out1[rid] == o1 + rule(mapped[:2] + o1 + mapped[2:], 2)
        # the request's figures are the last stage's tokens, at the times it had them
        assert t.error is None and t.tokens == 4 and len(t.chunks) == 4
        assert t.chunks[0] == first1[rid] and t.ttft_ms > 0
    head_trace = h.trace.to_dict()
    assert head_trace["id"] == ["load0.0", "load0.1", "load0.2"]
    assert all(o <= d for o, d in zip(head_trace["out"], head_trace["done"]))


def test_a_request_failing_in_the_last_stage_fails_alone(tmp_path):
    r0, r1 = _requests(tmp_path, None)
    thread, relayed = _start_relay(r1, Scripted(fail="load0.1"))
    handover.append_line(r0.inputs_path, {"go": True})
    h, loop = Head(Scripted(), r0), asyncio.new_event_loop()
    loop.run_until_complete(h.wait_for_go())
    timings, _ = loop.run_until_complete(sv.drive(
        lambda i, p: h.stream(f"load0.{i}", p, p.output_len), [sv.Planned([1], 4)] * 3,
        [0.0] * 3, clock=time.time))
    h.end()
    _close(loop)
    thread.join(10)
    assert [t.error for t in timings] == [
        None, "RuntimeError: pipeline: stage 1: ValueError: too long", None]


def test_the_launcher_s_error_line_ends_stage_0_s_serving_at_once(tmp_path):
    r0, _ = _requests(tmp_path, None)  # no stage 1: nothing ever replies
    handover.append_line(r0.inputs_path, {"go": True})
    loop = asyncio.new_event_loop()

    def serve(h: Head) -> dict:
        threading.Timer(0.2, handover.append_line,
                        (r0.inputs_path, {"error": "stage 1 failed"})).start()
        # requests for 60 s at 1 req/s: the error line must not wait for their arrivals
        loop.run_until_complete(sv.drive(
            lambda i, p: h.stream(f"load0.{i}", p, p.output_len), [sv.Planned([1], 4)] * 60,
            sv.arrival_offsets(60, 1.0, 1.0, seed=0), clock=time.time))
        return {}

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^no input: stage 1 failed$"):
        head(Scripted(), loop, r0, serve, lambda _: None)
    assert time.monotonic() - t0 < 5
    _close(loop)
    # stage 1 was told the end (it may have been waiting for more)
    assert handover.LineReader(r0.outputs_path).read()[-1] == {"end": True}
