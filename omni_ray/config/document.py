"""Sweep documents: safe YAML reading with located errors, and ``include:`` merging.

Only plain YAML is read (``yaml.SafeLoader``): a tag that would build a Python object is a
ConfigError like any other. A key written twice in one mapping is an error too (PyYAML would
silently keep the last one). Fragments merge first, in order, then the file itself: mappings
merge key by key, anything else (lists included) is replaced; the file wins.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import yaml

from omni_ray.config.fields import Origin
from omni_ray.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated within one mapping."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:  # unhashable key: SafeLoader reports it below
                    continue
                if repeated:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice in this mapping",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _yaml_error(source: str, exc: yaml.YAMLError) -> ConfigError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark != mark:
        context += f" (from line {context_mark.line + 1}, column {context_mark.column + 1})"
    parts = [context, getattr(exc, "problem", None)]
    problem = "; ".join(p for p in parts if p) or str(exc)
    if "could not determine a constructor for the tag" in problem:
        problem = problem.replace("could not determine a constructor for the tag",
                                  "YAML tag not allowed (plain YAML only, no Python objects):")
    return ConfigError(source, where, " ".join(f"YAML: {problem}".split()))


def read_yaml(path: str, source: str) -> Any:
    """The one document in ``path``; ``source`` is how messages name the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        raise ConfigError(source, "", f"cannot read file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(source, "", "cannot read file: not UTF-8 text") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise _yaml_error(source, e) from None
    if data is None:
        raise ConfigError(source, "", "file is empty")
    return data


@dataclasses.dataclass
class Document:
    """A sweep mapping after includes: the merged data, who supplied each key, the fragments."""

    data: dict[str, Any]
    origins: dict[tuple, Origin]
    includes: tuple[str, ...]


def _origins_of(data: Mapping, origin: Origin, prefix: tuple = ()) -> dict[tuple, Origin]:
    out = {}
    for key, value in data.items():
        out[prefix + (key,)] = origin
        if isinstance(value, Mapping):
            out.update(_origins_of(value, origin, prefix + (key,)))
    return out


def _merge(dst: dict, dst_origins: dict, src: Mapping, src_origins: Mapping,
           prefix: tuple = ()) -> None:
    """Merge ``src`` into ``dst`` (src wins), keeping ``dst_origins`` in step."""
    for key, value in src.items():
        at = prefix + (key,)
        if isinstance(value, Mapping) and isinstance(dst.get(key), Mapping):
            dst[key] = dict(dst[key])  # never mutate a fragment's own mapping
            _merge(dst[key], dst_origins, value, src_origins, at)
            continue
        dst[key] = value
        for stale in [k for k in dst_origins if k[:len(at)] == at]:
            del dst_origins[stale]
        dst_origins.update({k: o for k, o in src_origins.items() if k[:len(at)] == at})


def _display(including: Origin, item: str) -> str:
    """How a fragment is named in messages: relative like the file that includes it."""
    if os.path.isabs(item) or including.source.startswith("<"):
        return os.path.normpath(os.path.join(including.base_dir, item))
    return os.path.normpath(os.path.join(os.path.dirname(including.source), item))


def expand_includes(data: Mapping, origin: Origin,
                    chain: tuple[tuple[str, str], ...] = ()) -> Document:
    """Merge the fragments that ``data['include']`` names (recursively) under ``data``.

    ``chain`` holds (real path, display name) of the files being included, to find cycles.
    """
    raw = data.get("include", [])
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise ConfigError(origin.source, "include", "must be a list of file paths", raw)
    merged: dict[str, Any] = {}
    origins: dict[tuple, Origin] = {}
    included: list[str] = []
    for i, item in enumerate(items):
        spot = f"include[{i}]" if isinstance(raw, list) else "include"
        if not isinstance(item, str) or not item:
            raise ConfigError(origin.source, spot, "must be a file path", item)
        path = os.path.normpath(os.path.join(origin.base_dir, os.path.expanduser(item)))
        display = _display(origin, item)
        real = os.path.realpath(path)
        if real in [r for r, _ in chain]:
            names = [d for _, d in chain] + [display]
            raise ConfigError(origin.source, spot, f"include cycle: {' -> '.join(names)}")
        if not os.path.isfile(path):
            raise ConfigError(origin.source, spot, "no such file", item)
        fragment = read_yaml(path, display)
        if not isinstance(fragment, Mapping):
            raise ConfigError(display, "", f"a fragment must be a mapping, not a "
                                           f"{type(fragment).__name__}")
        sub = expand_includes(fragment, Origin(display, os.path.dirname(path)),
                              chain + ((real, display),))
        _merge(merged, origins, sub.data, sub.origins)
        included += [*sub.includes, path]
    own = {k: v for k, v in data.items() if k != "include"}
    _merge(merged, origins, own, _origins_of(own, origin))
    return Document(merged, origins, tuple(dict.fromkeys(included)))


def read_document(path: str) -> Document:
    """Read a sweep file and merge its includes; messages name it as ``path`` was given."""
    source = os.fspath(path)
    data = read_yaml(source, source)
    if not isinstance(data, Mapping):
        raise ConfigError(source, "", f"must be a mapping of sweep fields at the top level, "
                                      f"not a {type(data).__name__}")
    absolute = os.path.abspath(source)
    return expand_includes(data, Origin(source, os.path.dirname(absolute)),
                           ((os.path.realpath(absolute), source),))
