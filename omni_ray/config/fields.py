"""Field checkers: each takes a raw value and where it sits, returns it normalised or raises.

A checker is ``check(value, where) -> value``. ``where`` knows the file, the field path and the
directory relative paths resolve against, so every error reads
``configs/x.yaml: matrix.kv_cache_mib[2]: must be > 0, got -1``. The same checkers validate a
scalar field, each value of a matrix axis, and a dataclass built directly from Python.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from omni_ray.errors import ConfigError
from omni_ray.models.shapes import SHAPES

Check = Callable[[Any, "Where"], Any]


class FrozenDict(dict):
    """A dict that refuses changes: lets frozen configs hold mappings and stay hashable.

    It is a real ``dict`` (JSON-able, equal to a plain dict with the same items); mutators raise.
    """

    def _read_only(self, *args: object, **kwargs: object) -> None:
        raise TypeError("config mappings are read-only; use dataclasses.replace on the config")

    __setitem__ = __delitem__ = _read_only
    clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(canonical_json(self))

    def __reduce__(self) -> tuple:
        # pickle would otherwise refill the dict through __setitem__ (Ray pickles arms).
        return (type(self), (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


def canonical_json(value: object) -> str:
    """Sorted keys, no spaces, ASCII, no NaN: the same value always gives the same text."""
    return json.dumps(thaw(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def freeze(value: object) -> object:
    """Plain JSON-like data -> the same data with dicts as FrozenDict and lists as tuples."""
    if isinstance(value, Mapping):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: object) -> object:
    """The inverse of :func:`freeze`: plain, mutable, JSON-able dicts and lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class Origin:
    """The file a value came from (as shown in messages) and the directory its paths resolve in."""

    source: str
    base_dir: str


@dataclasses.dataclass(frozen=True, eq=False)
class Where:
    """A position in a config: the file, the key path, and which file supplied each key.

    ``origins`` maps key-path prefixes to the fragment that supplied them (after ``include:``
    merging); the longest matching prefix decides which file an error names and which directory
    a relative path resolves in. Without an entry, ``source`` and ``base_dir`` apply.
    """

    source: str
    base_dir: str
    keys: tuple[str | int, ...] = ()
    origins: Mapping[tuple, Origin] = dataclasses.field(default_factory=dict)

    def __truediv__(self, key: str | int) -> Where:
        return dataclasses.replace(self, keys=self.keys + (key,))

    @property
    def path(self) -> str:
        out = ""
        for key in self.keys:
            out += f"[{key}]" if isinstance(key, int) else (("." if out else "") + str(key))
        return out

    def origin(self) -> Origin:
        for n in range(len(self.keys), -1, -1):
            found = self.origins.get(self.keys[:n])
            if found is not None:
                return found
        return Origin(self.source, self.base_dir)

    def error(self, problem: str, value: object = ...) -> ConfigError:
        return ConfigError(self.origin().source, self.path, problem, value)


def unknown_key(where: Where, key: object, allowed: Iterable[str], hint: str | None = None,
                ) -> ConfigError:
    """The error for a key the schema does not have: names the key and every allowed key."""
    allowed = list(allowed)
    if hint is None and isinstance(key, str):
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean {close[0]!r}?" if close else None
    problem = "unknown key" + (f" ({hint})" if hint else "") + f"; allowed: {', '.join(allowed)}"
    return (where / (key if isinstance(key, str) else repr(key))).error(problem)


def parse_mapping(data: object, where: Where, table: Mapping[str, Check],
                  hints: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Check every key of ``data`` against ``table``; return the normalised values."""
    if not isinstance(data, Mapping):
        raise where.error("must be a mapping", data)
    out = {}
    for key, value in data.items():
        if key not in table:
            raise unknown_key(where, key, table, (hints or {}).get(key) if isinstance(key, str)
                              else None)
        out[key] = table[key](value, where / key)
    return out


# --- scalar checkers -----------------------------------------------------------------------

def integer(*, gt: int | None = None, ge: int | None = None) -> Check:
    def check(value: object, where: Where) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.error("must be an integer", value)
        if gt is not None and not value > gt:
            raise where.error(f"must be > {gt}", value)
        if ge is not None and not value >= ge:
            raise where.error(f"must be >= {ge}", value)
        return value
    return check


def number(*, gt: float | None = None, ge: float | None = None) -> Check:
    def check(value: object, where: Where) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise where.error("must be a number", value)
        if not math.isfinite(value):
            raise where.error("must be a finite number", value)
        if gt is not None and not value > gt:
            raise where.error(f"must be > {gt:g}", value)
        if ge is not None and not value >= ge:
            raise where.error(f"must be >= {ge:g}", value)
        return float(value)
    return check


def boolean(value: object, where: Where) -> bool:
    if not isinstance(value, bool):
        raise where.error("must be true or false", value)
    return value


def choice(*options: str) -> Check:
    def check(value: object, where: Where) -> str:
        if not isinstance(value, str) or value not in options:
            raise where.error(f"must be one of {', '.join(options)}", value)
        return value
    return check


def optional(inner: Check) -> Check:
    def check(value: object, where: Where) -> object:
        return None if value is None else inner(value, where)
    return check


_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def name(value: object, where: Where) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise where.error("must be a name of letters, digits, '_', '.' or '-'", value)
    return value


# --- stage checkers ------------------------------------------------------------------------

def model(value: object, where: Where) -> str:
    """A shape name from SHAPES stays as is; anything else must be a directory (-> absolute).

    A relative path resolves in the directory of the file that wrote it. A shape name wins over
    a directory of the same name; write ``./tiny`` to mean the directory.
    """
    if isinstance(value, str) and value in SHAPES:
        return value
    if isinstance(value, str) and value:
        path = os.path.join(where.origin().base_dir, os.path.expanduser(value))
        if os.path.isdir(path):
            return os.path.abspath(path)
    raise where.error(f"not a directory and not a shape ({', '.join(SHAPES)})", value)


# vllm_omni's patches, in its apply order, and its off switches. Written out so a sweep file
# validates without importing vllm_omni (config imports neither vLLM nor its plugin);
# tests/unit/patches/test_names.py fails when vllm_omni.patches.PATCHES or vllm_omni.envs differ.
PATCHES = ("aot_cache", "kv_budget", "inductor_config", "release_memory", "cpu_attention",
           "step_overhead", "compiled_call")
PATCHES_OFF = "VLLM_OMNI_DISABLE"           # vllm_omni.envs.VLLM_OMNI_DISABLE: every patch off
PATCH_OFF_PREFIX = "VLLM_OMNI_DISABLE_"     # vllm_omni.envs.DISABLE_PREFIX + NAME.upper()


def patch_names(value: object, where: Where) -> tuple[str, ...]:
    """A list of vllm_omni patch names to switch off -> a sorted tuple (order has no meaning)."""
    if not isinstance(value, (list, tuple)):
        raise where.error(f"must be a list of patch names ({', '.join(PATCHES)})", value)
    seen: list[str] = []
    for i, item in enumerate(value):
        choice(*PATCHES)(item, where / i)
        if item in seen:
            raise (where / i).error("listed twice", item)
        seen.append(item)
    return tuple(sorted(seen))


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Variables that would silently override a typed field: each names the field to use instead.
# VLLM_CPU_KVCACHE_SPACE stays allowed: with vllm_omni's kv_budget patch the explicit budget wins
# over it, and configs/patches_ab.yaml sets it on purpose to show what happens without the patch.
_ENV_OWNED = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "multiprocessing",
    PATCHES_OFF: "disable_patches",
    **{PATCH_OFF_PREFIX + name.upper(): "disable_patches" for name in PATCHES},
}


def env(value: object, where: Where) -> FrozenDict:
    """Extra environment for the engine process: names -> strings (ints become strings)."""
    if not isinstance(value, Mapping):
        raise where.error("must be a mapping of variable names to strings", value)
    out = {}
    for key, item in value.items():
        at = where / (key if isinstance(key, str) else repr(key))
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise at.error("not an environment variable name", key)
        if key in _ENV_OWNED:
            raise at.error(f"set by the typed field stage.{_ENV_OWNED[key]}; use that instead")
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise at.error("must be a string or an integer", item)
        out[key] = str(item)
    return FrozenDict(sorted(out.items()))


# engine_args keys that duplicate a typed field -> the field to use instead.
_ENGINE_ARGS_OWNED = {
    "model": "model",
    "kv_cache_memory_bytes": "stage.kv_cache_mib",
    "max_model_len": "stage.max_model_len",
    "enforce_eager": "stage.enforce_eager",
    "quantization": "stage.quantization",
    "dtype": "stage.dtype",
    "max_num_seqs": "stage.max_num_seqs",
}
# engine_args.compilation_config.inductor_compile_config keys a typed stage field sets
_INDUCTOR_OWNED = {
    "cpp_wrapper": "stage.cpp_wrapper",
    "cpp.threads": "stage.serial_kernels",
    "cpp.dynamic_threads": "stage.serial_kernels",
}


def _json_value(value: object, where: Where) -> object:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return number()(value, where)
    if isinstance(value, (list, tuple)):
        return tuple(_json_value(v, where / i) for i, v in enumerate(value))
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise where.error("keys must be strings", key)
            out[key] = _json_value(item, where / key)
        return FrozenDict(out)
    raise where.error("must be plain data (null, bool, number, string, list, mapping)", value)


def engine_args(value: object, where: Where) -> FrozenDict:
    """Pass-through keyword arguments for ``vllm.LLM``, minus those a typed field owns."""
    if not isinstance(value, Mapping):
        raise where.error("must be a mapping of vllm.LLM keyword arguments", value)
    for key in value:
        if key in _ENGINE_ARGS_OWNED:
            raise (where / key).error(
                f"duplicates a typed field; set {_ENGINE_ARGS_OWNED[key]} instead")
    inductor = (value.get("compilation_config") or {})
    inductor = inductor.get("inductor_compile_config") if isinstance(inductor, Mapping) else None
    for key in inductor if isinstance(inductor, Mapping) else ():
        if key in _INDUCTOR_OWNED:
            raise (where / "compilation_config" / "inductor_compile_config" / key).error(
                f"duplicates a typed field; set {_INDUCTOR_OWNED[key]} instead", inductor[key])
    return _json_value(value, where)  # type: ignore[return-value]


# --- placement checkers --------------------------------------------------------------------

def node_list(value: object, where: Where) -> tuple[int, ...]:
    """NUMA node ids -> a sorted tuple (a set of nodes; order has no meaning)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise where.error("must be a non-empty list of NUMA node ids", value)
    seen: list[int] = []
    for i, item in enumerate(value):
        integer(ge=0)(item, where / i)
        if item in seen:
            raise (where / i).error("listed twice", item)
        seen.append(item)
    return tuple(sorted(seen))


def ray_node_list(value: object, where: Where) -> tuple[str, ...]:
    """Ray node selectors -> a sorted tuple: each a label ``key=value``, a host name, an
    address or a node id (``placement/schedule.node_matches``)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise where.error("must be a non-empty list of Ray node labels (key=value), host "
                          "names, addresses or node ids", value)
    seen: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or item != item.strip():
            raise (where / i).error("must be a non-empty string without surrounding spaces",
                                    item)
        key, eq, val = item.partition("=")
        if eq and (not key or not val):
            raise (where / i).error("a label selector is key=value, both non-empty", item)
        if item in seen:
            raise (where / i).error("listed twice", item)
        seen.append(item)
    return tuple(sorted(seen))


def replicas(value: object, where: Where) -> int | str:
    """How many engines one arm runs at once: 1, or "per_node" (one on each NUMA node of the
    slot pool, their throughput summed: ``results/replicas.py``)."""
    if (type(value) is int and value == 1) or value == "per_node":
        return value
    raise where.error("must be 1 or per_node (one replica on each NUMA node, at once)", value)


# --- serving workload checkers -------------------------------------------------------------

def _rate(value: object, where: Where) -> float | str:
    """A request rate in requests per second: a number > 0, or ``inf`` (all at once), kept as
    the string "inf" so the config stays canonical JSON (which has no infinity)."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return "inf"
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return "inf"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise where.error("must be a number of requests per second > 0, or inf", value)
    if not value > 0:
        raise where.error("must be > 0 (requests per second), or inf", value)
    return float(value)


def load_points(one: Check, what: str) -> Check:
    """One load point (``one`` checks it), or a list of them served one after another on one
    engine start, none twice; ``what`` names one in the error for an empty list."""
    def check(value: object, where: Where) -> tuple:
        if not isinstance(value, (list, tuple)):
            return (one(value, where),)
        if not value:
            raise where.error(f"must list at least one {what}", value)
        points = tuple(one(v, where / i) for i, v in enumerate(value))
        for i, x in enumerate(points):
            if x in points[:i]:
                raise (where / i).error("listed twice", value[i])
        return points
    return check


# Request rates (req/s, or inf) and a closed loop's user counts (whole numbers > 0).
request_rates = load_points(_rate, "rate")
user_counts = load_points(integer(gt=0), "number of users")


def percentiles(value: object, where: Where) -> tuple[float, ...]:
    """Percentiles reported besides mean and median: each strictly between 0 and 100."""
    if not isinstance(value, (list, tuple)) or not value:
        raise where.error("must be a non-empty list of numbers in (0, 100)", value)
    out: list[float] = []
    for i, p in enumerate(value):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 100:
            raise (where / i).error("must be a number in (0, 100)", p)
        if float(p) in out:
            raise (where / i).error("listed twice", p)
        out.append(float(p))
    return tuple(sorted(out))


SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")  # omni_ray.workload.serving.SLO_METRICS


def slo(value: object, where: Where) -> FrozenDict:
    """Service-level objectives: metric -> milliseconds (> 0), metrics from ``SLO_KEYS``."""
    if not isinstance(value, Mapping):
        raise where.error(f"must be a mapping of {', '.join(SLO_KEYS)} to milliseconds", value)
    out = {}
    for key, limit in value.items():
        if key not in SLO_KEYS:
            raise (where / str(key)).error(
                f"not a metric with an SLO (metrics: {', '.join(SLO_KEYS)})", limit)
        out[key] = number(gt=0)(limit, where / key)
    return FrozenDict(sorted(out.items()))


def prompt_file(value: object, where: Where) -> str:
    """A text file of prompts, one per line (relative to the config file) -> absolute path.
    It must exist and hold at least one prompt."""
    if not isinstance(value, str) or not value:
        raise where.error("must be the path of a prompt file", value)
    path = os.path.abspath(os.path.join(where.origin().base_dir, os.path.expanduser(value)))
    if not os.path.isfile(path):
        raise where.error("no such prompt file", value)
    try:
        with open(path, encoding="utf-8") as fh:
            has_prompt = any(ln.strip() and not ln.lstrip().startswith("#") for ln in fh)
    except (OSError, UnicodeDecodeError) as exc:
        raise where.error(f"cannot read it ({type(exc).__name__})", value) from None
    if not has_prompt:
        raise where.error("holds no prompt (one per non-blank line)", value)
    return path


_SEARCH_KEYS = ("over", "percentile", "low", "high", "steps")
# What a search may bisect over: the open loop's rate, its requests in flight, a closed loop's users.
SEARCH_OVER = ("request_rate", "max_concurrency", "users")


def search(value: object, where: Where) -> FrozenDict:
    """``{over, percentile, low, high, steps}``: bisect the highest load in [low, high] whose
    ``percentile`` of each SLO metric meets the SLO (``steps`` midpoints, default 5). ``over``
    (default ``request_rate``) is the load bisected: a rate, or a count (``max_concurrency``,
    ``users``) whose ends are integers. ``over`` at its default stays out of the result, so
    the arms of earlier searches keep their ids."""
    if not isinstance(value, Mapping):
        raise where.error(f"must be a mapping with keys {', '.join(_SEARCH_KEYS)}", value)
    for key in value:
        if key not in _SEARCH_KEYS:
            raise unknown_key(where, key, _SEARCH_KEYS)
    for key in ("percentile", "low", "high"):
        if key not in value:
            raise (where / key).error("required field missing")
    over = choice(*SEARCH_OVER)(value.get("over", "request_rate"), where / "over")
    p = value["percentile"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 100:
        raise (where / "percentile").error("must be a number in (0, 100)", p)
    if over == "request_rate":
        low, high = (_rate(value[k], where / k) for k in ("low", "high"))
        for key, rate in (("low", low), ("high", high)):
            if rate == "inf":
                raise (where / key).error("must be a finite rate", value[key])
    else:
        low, high = (integer(gt=0)(value[k], where / k) for k in ("low", "high"))
    if not high > low:
        raise (where / "high").error(f"must be > low {low:g}", value["high"])
    steps = integer(gt=0)(value.get("steps", 5), where / "steps")
    head = {} if over == "request_rate" else {"over": over}
    return FrozenDict(**head, percentile=float(p), low=low, high=high, steps=steps)


# workload.quality (omni_ray/workload/quality.py): greedy tokens generated, and the length of
# the fixed id sequence whose log-probabilities are read teacher-forced.
QUALITY_DEFAULTS = {"tokens": 32, "sequence_len": 128}
QUALITY_MIN = {"tokens": 1, "sequence_len": 2}


def quality(value: object, where: Where) -> FrozenDict | None:
    """``true`` (the defaults), ``false``/``null`` (off), or ``{tokens, sequence_len}``: after
    its speed, the arm's engine runs the fixed quality probe; every key is filled in, so equal
    probes read the same."""
    if value is None or value is False:
        return None
    if value is True:
        return FrozenDict(QUALITY_DEFAULTS)
    if not isinstance(value, Mapping):
        raise where.error("must be true, false or a mapping with keys "
                          f"{', '.join(QUALITY_DEFAULTS)}", value)
    for key in value:
        if key not in QUALITY_DEFAULTS:
            raise unknown_key(where, key, QUALITY_DEFAULTS)
    return FrozenDict({k: integer(ge=QUALITY_MIN[k])(value.get(k, d), where / k)
                       for k, d in QUALITY_DEFAULTS.items()})
