"""The edge between two pipeline stages (docs/pipelines.md): a file of token ids, and the rule
by which the receiving stage turns them into its generations. Pure: no vLLM.

The file (``inputs_path`` of the receiving stage) holds ``{"token_ids": rows, "final": bool}``,
every row the tokens stage i has produced *so far* (or the launcher's prompts for stage 0),
rewritten atomically as they grow; or ``{"error": ...}`` when the launcher tells a waiting
stage to give up. Without a ``window`` stage i writes it once, when it has finished.

The rule (``chunk_plan``): stage i+1 with ``window: W`` reads its ``input_len`` tokens in
``K = input_len / W`` chunks and generates ``output_len / K`` greedy tokens after each, on the
prompt ``c1 o1 c2 o2 ... ck``: every chunk so far (mapped ``id % vocab_size``), interleaved
with its own output so far. Without a window, K = 1: the prompt is the whole input and it
generates ``output_len`` tokens. Which chunk is read when depends on nothing but the tokens, so
the last stage's tokens are the same however fast the stages run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

Rows = list[list[int]]


def chunk_plan(input_len: int, output_len: int, window: int | None) -> list[tuple[int, int]]:
    """``[(input tokens needed, tokens to generate), ...]``, one pair per chunk."""
    w = window or input_len
    if w <= 0 or input_len % w or output_len % (input_len // w):
        raise ValueError(f"window {w} must divide the input ({input_len} tokens) into chunks "
                         f"that divide the output ({output_len} tokens)")
    k = input_len // w
    return [(w * (i + 1), output_len // k) for i in range(k)]


def map_tokens(rows: Rows, vocab_size: int) -> Rows:
    """The declared rule (``config.schema.MAP_RULE``): each id becomes ``id % vocab_size``."""
    return [[int(t) % vocab_size for t in row] for row in rows]


def interleave(prompt: Rows, chunk: Rows) -> Rows:
    """The next chunk's prompt: the prompt so far (chunks and outputs) with the chunk after."""
    return [p + c for p, c in zip(prompt, chunk)]


def write_tokens(path: str, rows: Rows, *, final: bool) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"token_ids": rows, "final": final}, f)
    os.replace(tmp, path)


def read_edge(path: str) -> dict | None:
    """The edge file as it is now, None before it exists."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def wait_for_tokens(path: str, need: int, poll_s: float = 0.005) -> Rows:
    """The first ``need`` tokens of every row, once the edge file holds them (the launcher's
    timeout, or its error, bounds the wait)."""
    while True:
        data = read_edge(path)
        if data is not None:
            if "error" in data:
                raise RuntimeError(f"no input: {data['error']}")
            rows = data["token_ids"]
            if min(len(r) for r in rows) >= need:
                return [r[:need] for r in rows]
            if data.get("final"):
                raise RuntimeError(f"input ended at {min(len(r) for r in rows)} tokens, "
                                   f"short of {need}")
        time.sleep(poll_s)


class Outbox:
    """Where a stage's output goes as it is produced: the next stage's edge file, rewritten each
    time every row has passed another ``window`` tokens (None: only once, when final)."""

    def __init__(self, path: str | None, window: int | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path, self.window, self.clock = path, window, clock
        self.sent = 0
        # when each streamed chunk was ready: read before it is written, so that a reader, which
        # can see the file before the writer reads its clock again, never gets it earlier
        self.sent_at: list[float] = []

    def __call__(self, rows: Rows, *, final: bool = False) -> None:
        if self.path is None:
            return
        have = min(len(r) for r in rows)
        if final or (self.window and have >= self.sent + self.window):
            self.sent = have - have % self.window if self.window and not final else have
            if not final:
                self.sent_at.append(self.clock())
            write_tokens(self.path, rows, final=final)


# A serving pipeline (docs/pipelines.md, "Serving"): requests come and go, so an edge is not one
# file rewritten but a stream of lines, each stage's inbox (its ``inputs_path``), one JSON
# object a line, appended by one writer in one ``write`` each:
#   stage i >= 1:  {"id", "output_len", "tokens", "final"}: the next tokens of a request from
#                  stage i-1 (unmapped; the receiver maps them), every ``window`` tokens or at
#                  once when it is done; {"id", "error"}: that request failed upstream;
#                  {"end": true}: stage 0 sent its last request
#   stage 0:       the launcher's {"go": true} once every stage waits, then the last stage's
#                  replies {"id", "n" (new tokens), "at" (wall clock), "final"} or {"id", "error"}
#   any stage:     {"error": "..."}: the launcher says a stage failed; give up
# so the last stage's outputs come back to the load generator (a ring), whose figures are then
# the pipeline's.


class LineWriter:
    """Appends JSON lines to an inbox, each in one ``write`` of an O_APPEND descriptor (the
    launcher may append an error line beside the writer)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, obj: dict) -> None:
        os.write(self.fd, (json.dumps(obj) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def append_line(path: str, obj: dict) -> None:
    """One line appended to an inbox (the launcher's go and error)."""
    writer = LineWriter(path)
    try:
        writer(obj)
    finally:
        writer.close()


class LineReader:
    """An inbox read as it grows, by whole lines (nothing before the file exists). The file
    stays open: each poll is one ``read`` of what was appended since the last."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = None
        self._rest = b""  # a line being written waits for its end

    def read(self) -> list[dict]:
        if self._file is None:
            try:
                self._file = open(self.path, "rb", buffering=0)
            except FileNotFoundError:
                return []
        data = self._rest + (self._file.read() or b"")
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        return [json.loads(line) for line in data[:cut].splitlines() if line.strip()]


class RequestOutbox:
    """Where a serving stage's outputs go on: for each request, a line with its next tokens
    every time its output has passed another ``window`` tokens (None: one line when done)."""

    def __init__(self, write: Callable[[dict], None], window: int | None) -> None:
        self.write, self.window = write, window
        self.sent: dict[str, int] = {}

    def __call__(self, rid: str, output_len: int, tokens: list[int], *,
                 final: bool = False) -> bool:
        """Hand on what is due of ``tokens`` (the request's output so far); True if a line
        was written."""
        have, sent = len(tokens), self.sent.get(rid, 0)
        upto = have if final else (have - have % self.window if self.window else 0)
        if upto <= sent and not final:
            return False
        self.write({"id": rid, "output_len": output_len, "tokens": tokens[sent:upto],
                    "final": final})
        if final:
            self.sent.pop(rid, None)
        else:
            self.sent[rid] = upto
        return True
