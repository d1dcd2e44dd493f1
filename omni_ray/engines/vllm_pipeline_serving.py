"""A serving workload on a pipeline (docs/pipelines.md, "Serving"): every stage a vLLM
``AsyncLLM`` in its own pinned engine process, requests handed on through each stage's inbox
(``engines/handover.py``: a file of JSON lines).

Stage 0 (``Head``) runs single-stage serving's load generator (``vllm_serving.serve``) on its
engine; each request it generates goes on to stage 1 as soon as stage 0 has its output (or
every ``window`` tokens when the edge streams). A later stage (``relay``) starts each request
as its input arrives, generates by the edge rule (``handover.chunk_plan``: the input mapped
``id % vocab_size``, ``output_len`` greedy tokens, per chunk when streamed) and hands its
output on the same way; the last stage sends each output back to stage 0 with the wall-clock
time it had it, so the load generator's figures (TTFT, TPOT, E2E, goodput, the search) are the
pipeline's: from the request's arrival at stage 0 to the last stage's tokens. Every stage keeps
a ``Trace`` of its side of each request; the launcher (engine/pipeline.py) turns the traces
into each stage's figures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from omni_ray.engines import handover
from omni_ray.engines.request import EngineRequest

POLL_S = 0.002  # how often an inbox is read: the hand-over waits half of it on average


class Trace:
    """This stage's side of each request, by request id: ``in`` (its input, or for stage 0
    the request, arrived), ``first`` (its first output token), ``out`` (its first line handed
    on), ``done`` (its last token), all wall clock; its output token ids (and a later stage's
    input ids, mapped into its vocabulary)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def mark(self, rid: str, what: str, at: float | None = None) -> None:
        self.rows.setdefault(rid, {}).setdefault(what, time.time() if at is None else at)

    def tokens(self, rid: str, ids: list[int], key: str = "token_ids") -> None:
        self.rows.setdefault(rid, {})[key] = ids

    def to_dict(self) -> dict:
        """Column-wise, as serving's samples are."""
        ids = list(self.rows)
        cols = ("in", "first", "out", "done")
        out = {"id": ids, **{c: [self.rows[r].get(c) for r in ids] for c in cols},
               "token_ids": [self.rows[r].get("token_ids") for r in ids]}
        if any("input_ids" in row for row in self.rows.values()):
            out["input_ids"] = [self.rows[r].get("input_ids") for r in ids]
        return out


class Head:
    """Stage 0's side: ``stream`` is the ``vllm_serving.serve`` submit of a request through
    the whole pipeline. It generates on this stage's engine, hands the output on to stage 1,
    then yields the last stage's replies as ``(new tokens, when)``."""

    def __init__(self, engine: Any, req: EngineRequest) -> None:
        self.engine = engine
        self.inbox = handover.LineReader(req.inputs_path)
        self.write = handover.LineWriter(req.outputs_path)
        self.outbox = handover.RequestOutbox(self.write, req.out_window)
        self.trace = Trace()
        self.replies: dict[str, asyncio.Queue] = {}
        self.error: str | None = None
        self.went = False
        self._tail: asyncio.Task | None = None

    def start(self) -> None:
        """Read the inbox from now on (call on the running loop)."""
        self._tail = asyncio.ensure_future(self._read())

    async def wait_for_go(self) -> None:
        self.start()
        while not self.went:
            self.check()
            await asyncio.sleep(POLL_S)

    def check(self) -> None:
        if self.error:
            raise RuntimeError(f"no input: {self.error}")

    async def _read(self) -> None:
        while True:
            for line in self.inbox.read():
                if line.get("go"):
                    self.went = True
                elif "id" not in line:  # the launcher: a stage failed. Not one request's
                    # failure, which the load generator counts and goes on from: the run's end,
                    # so stop the loop under whatever it runs (head() says why)
                    self.error = line.get("error", "stage failed")
                    asyncio.get_running_loop().stop()
                    return
                elif line["id"] in self.replies:
                    self.replies[line["id"]].put_nowait(line)
            await asyncio.sleep(POLL_S)

    async def stream(self, rid: str, planned: Any, params: Any):
        self.check()
        self.trace.mark(rid, "in")
        replies = self.replies[rid] = asyncio.Queue()
        out: list[int] = []
        handed = False  # the output handed on in full
        try:
            try:
                async for o in self.engine.generate({"prompt_token_ids": planned.prompt},
                                                    params, request_id=f"omni-{rid}"):
                    out += o.outputs[0].token_ids
                    self.trace.mark(rid, "first")
                    if self.outbox(rid, planned.output_len, out, final=o.finished):
                        self.trace.mark(rid, "out")
                    handed = o.finished
            except Exception as exc:  # stage 1 may hold a chunk of it: it fails there too
                self.write({"id": rid, "error": f"stage 0: {type(exc).__name__}: {exc}"
                                                .splitlines()[0][:200]})
                raise
            if not handed:
                self.outbox(rid, planned.output_len, out, final=True)
                self.trace.mark(rid, "out")
            self.trace.mark(rid, "done")
            self.trace.tokens(rid, out)
            while True:  # the last stage's outputs of this request, as it had them
                line = await replies.get()
                if "error" in line:
                    raise RuntimeError(f"pipeline: {line['error']}")
                yield line["n"], line["at"]
                if line["final"]:
                    return
        finally:
            self.replies.pop(rid, None)

    def end(self) -> None:
        """Stage 0 has sent its last request: the later stages finish and stop."""
        self.write({"end": True})
        if self._tail is not None:
            self._tail.cancel()


class _Incoming:
    """A request's input as it arrives at a later stage."""

    def __init__(self, output_len: int) -> None:
        self.output_len = output_len
        self.tokens: list[int] = []
        self.final = False
        self.error: str | None = None
        self.more = asyncio.Event()


def greedy_params(detokenize: bool) -> Callable[[int], Any]:
    """vLLM's sampling parameters of ``n`` greedy tokens, streamed as deltas, EOS ignored."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    def params(n: int) -> Any:
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True,
                              detokenize=detokenize, output_kind=RequestOutputKind.DELTA)
    return params


def relay(engine: Any, loop: asyncio.AbstractEventLoop, req: EngineRequest, vocab_size: int,
          phase: Callable[[str], None], params: Callable[[int], Any] | None = None) -> dict:
    """Stage i >= 1: each request from its inbox, generated by the edge rule as its input
    arrives, handed on (the last stage: replied to stage 0) until stage 0's end. Returns this
    stage's figures: its ``serving_trace``. ``params(n)``: the sampling parameters of ``n``
    tokens (default ``greedy_params``)."""
    last = req.stage_index == req.stage_count - 1
    params = params or greedy_params(req.workload.detokenize)
    inbox = handover.LineReader(req.inputs_path)
    write = handover.LineWriter(req.outputs_path)
    outbox = handover.RequestOutbox(write, req.out_window)
    trace = Trace()

    async def one(rid: str, inc: _Incoming) -> None:
        try:
            await generate(rid, inc)
        except Exception as exc:  # this request fails downstream too; the stage goes on
            write({"id": rid, "error": f"stage {req.stage_index}: "
                                       f"{type(exc).__name__}: {exc}".splitlines()[0][:200]})

    async def generate(rid: str, inc: _Incoming) -> None:
        # its input is the previous stage's output: output_len tokens, as this stage writes
        plan = handover.chunk_plan(inc.output_len, inc.output_len, req.window)
        prompt: list[int] = []
        out: list[int] = []
        done = False  # the output handed on (replied) in full
        for k, (need, n) in enumerate(plan):
            while len(inc.tokens) < need:
                if inc.error:
                    raise RuntimeError(inc.error)
                if inc.final:
                    raise RuntimeError(f"input ended at {len(inc.tokens)} tokens, short of "
                                       f"{need}")
                inc.more.clear()
                await inc.more.wait()
            prompt += handover.map_tokens([inc.tokens[need - plan[0][0]:need]], vocab_size)[0]
            async for o in engine.generate({"prompt_token_ids": list(prompt)}, params(n),
                                           request_id=f"omni-{rid}.c{k}"):
                new = list(o.outputs[0].token_ids)
                at = time.time()
                out += new
                prompt += new
                trace.mark(rid, "first", at)
                done = bool(o.finished) and k == len(plan) - 1
                if last:
                    write({"id": rid, "n": len(new), "at": at, "final": done})
                    trace.mark(rid, "out", at)
                elif outbox(rid, inc.output_len, out, final=done):
                    trace.mark(rid, "out")
        if not done:  # vLLM's last output said it finished; if it did not, say it here
            if last:
                write({"id": rid, "n": 0, "at": time.time(), "final": True})
            else:
                outbox(rid, inc.output_len, out, final=True)
        trace.mark(rid, "done")
        trace.tokens(rid, out)
        trace.tokens(rid, handover.map_tokens([inc.tokens], vocab_size)[0], "input_ids")

    async def main() -> None:
        incoming: dict[str, _Incoming] = {}
        tasks: list[asyncio.Task] = []
        while True:
            for line in inbox.read():
                if line.get("end"):
                    await asyncio.gather(*tasks)
                    if not last:
                        write({"end": True})
                    return
                if "id" not in line:  # the launcher: a stage failed
                    raise RuntimeError(f"no input: {line.get('error')}")
                rid = line["id"]
                if "error" in line:  # failed upstream: pass it on, once
                    if rid in incoming:
                        incoming[rid].error = line["error"]
                        incoming[rid].more.set()
                    else:
                        write(line)
                    continue
                if rid not in incoming:
                    if not tasks:
                        phase("measuring")
                    trace.mark(rid, "in")
                    incoming[rid] = _Incoming(int(line["output_len"]))
                    tasks.append(asyncio.ensure_future(one(rid, incoming[rid])))
                inc = incoming[rid]
                inc.tokens += line["tokens"]
                inc.final = inc.final or line["final"]
                inc.more.set()
            await asyncio.sleep(POLL_S)

    phase("waiting")
    try:
        loop.run_until_complete(main())
    finally:
        write.close()
    return {"serving_trace": trace.to_dict(), "window": req.window}


def head(engine: Any, loop: asyncio.AbstractEventLoop, req: EngineRequest,
         serve: Callable[[Any], dict], phase: Callable[[str], None]) -> dict:
    """Stage 0: wait until every stage waits (the launcher's go), then serve the workload
    through the pipeline (``serve(head)``: ``vllm_serving.serve``), then tell the later stages
    it has ended. Returns serve's measurements and this stage's ``serving_trace``."""
    h = Head(engine, req)
    phase("waiting")
    try:
        loop.run_until_complete(h.wait_for_go())
        phase("measuring")
        try:
            m = serve(h)
        finally:
            h.end()
            h.write.close()
    except RuntimeError:  # "event loop stopped": the launcher's error line, said as such
        if h.error:
            raise RuntimeError(f"no input: {h.error}") from None
        raise
    return m | {"serving_trace": h.trace.to_dict()}
