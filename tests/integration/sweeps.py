"""What the sweep tests share: a small sweep on the tiny model, and this machine's slots."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from omni_ray.topology import local_slots

ONE_CORE = local_slots(1)  # this machine's one-core slots, as a sweep cuts them
needs_two_slots = pytest.mark.skipif(
    len(ONE_CORE) < 2, reason=f"needs two one-core slots, this machine has {len(ONE_CORE)}")


# A bound, not an expectation: a tiny engine is ready in 10-40 s on an idle core, and took
# 170-270 s on a core that other users' engines kept at 100 % (this shared 2-core machine).
ARM_TIMEOUT_S = 600


def sweep(name: str, **fields) -> dict:
    base = {"name": name, "model": "tiny", "passes": 1, "timeout_s": ARM_TIMEOUT_S,
            "placement": {"slot_cores": 1},
            "stage": {"kv_cache_mib": 32, "max_model_len": 256},
            "workload": {"prompt_len": 16, "output_len": 8, "warmup": 0, "repeats": 1}}
    for key, value in fields.items():
        base[key] = base[key] | value if isinstance(value, dict) and key in base else value
    return base


def wait_for(condition: Callable[[], object], timeout_s: float, what: str,
             every_s: float = 0.1):
    """``condition()``'s first true value, asked every ``every_s``; fails naming ``what`` after
    ``timeout_s``. The one way these tests wait: on a condition, with a bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)


def phase_seen(log: Path, phase: str) -> bool:
    """The engine runner has logged ``omni-ray phase: <phase>`` (engine/launch.PHASE_MARK)."""
    from omni_ray.engine.launch import PHASE_MARK

    return log.exists() and f"{PHASE_MARK}{phase}" in log.read_text(errors="replace")
