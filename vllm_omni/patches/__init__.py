"""Guarded runtime patches to stock vLLM on CPU, one module per upstream target.

Each patch module defines ``NAME``, ``TARGET`` (what it wraps, for reports), ``find_target()``
(raises ``LookupError`` naming what is missing) and ``apply(target)``. The wrapper it installs
carries the patch's name under ``MARKER`` so applying twice (vLLM loads plugins in every process,
sometimes more than once) is a no-op; two patches may wrap the same target, each marks its own
name (``functools.wraps`` carries the inner wrapper's names to the outer one). A patch whose
target is gone logs a warning and reports why: a stale patch must show up as a missing
optimisation in ``patch_report()``, not as a crash or silence.

Ablations (benchmarks only): a patch that can be flipped within a running process also defines
``ABLATIONS`` (switch -> its two sides, A first) and ``ablate(switch, side)``, and ``remove()``
to undo ``apply``. Callers use :func:`ablate` here, never a patch's module state:

    from vllm_omni import patches
    patches.ablations()                      # {"cpu_attention": ("vllm", "vllm_omni"), ...}
    patches.ablate("cpu_attention", "vllm")  # vLLM's own attention ops from now on
    with patches.ablated("compiled_entry", "graph", back="entry"): ...

``omni_ray.bench.step_ab`` is the user; an engine never calls these.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from vllm_omni import envs
from vllm_omni.patches import (aot_cache, compiled_call, cpu_attention, inductor_config,
                                kv_budget, release_memory, step_overhead)

logger = logging.getLogger("vllm.omni")

MARKER = "__vllm_omni_patch__"
PATCHES = (aot_cache, kv_budget, inductor_config, release_memory, cpu_attention,
           step_overhead, compiled_call)


@dataclasses.dataclass(frozen=True)
class PatchStatus:
    name: str
    target: str
    applied: bool
    reason: str


_status: dict[str, PatchStatus] = {}


def is_marked(fn: object, name: str) -> bool:
    return name in getattr(fn, MARKER, ())


def mark(fn, name: str):
    setattr(fn, MARKER, frozenset(getattr(fn, MARKER, ())) | {name})
    return fn


def unmark(fn, name: str) -> None:
    setattr(fn, MARKER, frozenset(getattr(fn, MARKER, ())) - {name})


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _apply_one(patch) -> PatchStatus:
    def status(applied: bool, reason: str) -> PatchStatus:
        return PatchStatus(patch.NAME, patch.TARGET, applied, reason)

    off = envs.patch_disabled(patch.NAME)
    if off:
        return status(False, f"disabled by {off}=1")
    if not _on_cpu():
        return status(False, "not the CPU platform")
    try:
        target = patch.find_target()
    except (ImportError, LookupError) as exc:
        logger.warning("vllm_omni: patch %s NOT applied, target %s missing: %s",
                       patch.NAME, patch.TARGET, exc)
        return status(False, f"target missing: {exc}")
    if is_marked(target, patch.NAME):
        return status(True, "applied")
    patch.apply(target)
    logger.debug("vllm_omni: patch %s applied to %s", patch.NAME, patch.TARGET)
    return status(True, "applied")


def apply_all() -> list[PatchStatus]:
    """Apply every patch (idempotent); returns and remembers each one's status."""
    for patch in PATCHES:
        _status[patch.NAME] = _apply_one(patch)
    return [_status[p.NAME] for p in PATCHES]


def ablations() -> dict[str, tuple[str, str]]:
    """Every run-time switch of the patches: name -> (side A, side B)."""
    return {switch: sides for patch in PATCHES for switch, sides in
            getattr(patch, "ABLATIONS", {}).items()}


def ablate(switch: str, side: str) -> None:
    """Put this process on ``side`` of the patch switch ``switch`` (see :func:`ablations`)."""
    for patch in PATCHES:
        sides = getattr(patch, "ABLATIONS", {}).get(switch)
        if sides is None:
            continue
        if side not in sides:
            raise ValueError(f"ablation {switch}: side must be one of {list(sides)}, got {side!r}")
        patch.ablate(switch, side)
        return
    raise ValueError(f"no ablation {switch!r}; known: {sorted(ablations())}")


@contextlib.contextmanager
def ablated(switch: str, side: str, *, back: str):
    """``ablate(switch, side)`` for the block, then ``ablate(switch, back)``."""
    ablate(switch, side)
    try:
        yield
    finally:
        ablate(switch, back)


def report() -> list[PatchStatus]:
    """The status of each patch in this process, without applying anything."""
    out = []
    for patch in PATCHES:
        st = _status.get(patch.NAME)
        if st is None:
            st = PatchStatus(patch.NAME, patch.TARGET, False,
                             "not attempted: vllm_omni.register() has not run in this process")
        out.append(st)
    return out
