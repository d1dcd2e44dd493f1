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
        self.sent_at: list[float] = []  # when each streamed chunk was written

    def __call__(self, rows: Rows, *, final: bool = False) -> None:
        if self.path is None:
            return
        have = min(len(r) for r in rows)
        if final or (self.window and have >= self.sent + self.window):
            self.sent = have - have % self.window if self.window and not final else have
            write_tokens(self.path, rows, final=final)
            if not final:
                self.sent_at.append(self.clock())
