"""What vllm_omni reports to whoever reads the engine log: one structured line per event.

Each event is logged twice on the ``vllm.omni`` logger: the human-readable message as before,
then ``vllm_omni-event {json}`` with the event's name, the process id and its fields. Readers
(``omni_ray.engine.launch.scan_log``) parse the JSON lines with :func:`parse`, never the
wording, so a message can be reworded without losing a result field.

Events (``name``: fields):

- ``kv_explicit_kept``: ``bytes``, ``variable``, ``value`` (kv_budget)
- ``inductor_config_kept``: ``key``, ``value``, ``platform_value`` (inductor_config)
- ``cpu_attention_short_path``: ``kernels`` ("cpp" or "python"), and ``layers`` or ``first``
- ``cpu_attention_no_gil``: ``calls`` in the first forward
- ``greedy_argmax``: none (step_overhead's argmax in use)
- ``compiled_call_replay``: ``function``, ``graph_inputs``, ``from_arguments``, ``path``
  ("entry" or "graph"), ``why_not_entry``
- ``malloc_trim``: ``step``, ``before_mb``, ``after_mb``, ``released_mb`` (release_memory)
- ``weight_arena``: ``chunk_mib`` (cpu_int4's packed weights go to huge-page mappings; once)
"""

from __future__ import annotations

import json
import logging
import os

PREFIX = "vllm_omni-event "
logger = logging.getLogger("vllm.omni")


def emit(name: str, message: str, *args, **fields) -> None:
    """Log ``message % args`` for people, then the event ``name`` with ``fields`` as JSON."""
    logger.info(message, *args)
    logger.info("%s", line(name, **fields))


def line(name: str, **fields) -> str:
    """The structured line of one event (values JSON can't hold are written as their repr)."""
    return PREFIX + json.dumps({"event": name, "pid": os.getpid(), **fields}, default=repr,
                               sort_keys=True)


def parse(text: str) -> list[dict]:
    """Every event in a log, in order; a line cut short (a killed process) is skipped."""
    out = []
    for raw in text.splitlines():
        at = raw.find(PREFIX)
        if at < 0:
            continue
        try:
            event = json.loads(raw[at + len(PREFIX):])
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "event" in event:
            out.append(event)
    return out
