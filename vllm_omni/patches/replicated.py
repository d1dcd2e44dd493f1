"""The guard of patches that reproduce vLLM code: the source of each function they stand in for,
fingerprinted as of the vLLM checked, so a vLLM that changed any of them is refused by name."""

from __future__ import annotations

import hashlib
import importlib
import inspect


def resolve(dotted: str):
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def source_fingerprint(source: str) -> str:
    """sha256 (first 16 hex digits) of a function's source text."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def fingerprint(fn) -> str:
    """sha256 (first 16 hex digits) of the function's source, under any functools.wraps."""
    return source_fingerprint(inspect.getsource(inspect.unwrap(fn)))


def check(replicated: dict[str, str], owner: str = "vLLM") -> None:
    """Raise LookupError naming every function in ``replicated`` (dotted path -> fingerprint)
    that is gone, has no source, or differs from its fingerprint (``owner``: whose code it is)."""
    changed = []
    for name, digest in replicated.items():
        try:
            found = fingerprint(resolve(name))
        except (ImportError, AttributeError, OSError, TypeError) as exc:  # gone, or no source
            raise LookupError(f"cannot read {name}: {exc}") from exc
        if found != digest:
            changed.append(name)
    if changed:
        raise LookupError(f"{owner} changed code this patch reproduces: " + ", ".join(changed)
                          + " (python -m vllm_omni.patches.upstream check shows the diffs)")
