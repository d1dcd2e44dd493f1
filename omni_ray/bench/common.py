"""What every benchmark script shares: a timestamped, atomically written result with provenance."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import NoReturn

from omni_ray.results.provenance import collect
from omni_ray.results.store import write_json_atomic


def median_of(records: list[dict], metric: str) -> float | None:
    vals = [r["measurements"][metric] for r in records
            if r.get("status") == "ok" and r.get("measurements", {}).get(metric) is not None]
    return statistics.median(vals) if vals else None


def spread_pct(values: list[float]) -> float | None:
    if not values or not statistics.median(values):
        return None
    return (max(values) - min(values)) / statistics.median(values) * 100


def pairwise(a: list[float], b: list[float]) -> tuple[list[float], float, int]:
    """Interleaved pairs of two sides: a[i] / b[i] for each pair, their median, and in how many
    pairs the ratio is above 1."""
    ratios = [x / y for x, y in zip(a, b)]
    return ratios, statistics.median(ratios), sum(r > 1 for r in ratios)


def save(out_dir: str | os.PathLike, kind: str, body: dict, command: list[str]) -> Path:
    from omni_ray.results.summary import hardware

    path = Path(out_dir) / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    provenance = collect()
    write_json_atomic(path, {"kind": kind, "command": " ".join(command), **body,
                             "load_average_after": os.getloadavg(), "provenance": provenance,
                             # CPU model, ISA and LLC in one line: what every figure ran on
                             "hardware": hardware(provenance)})
    return path


def save_and_exit(out_dir: str | os.PathLike, kind: str, body: dict, module: str,
                  argv: list[str] | None, line: str) -> NoReturn:
    """For a benchmark that ran vLLM in its own process: save, print ``line`` and the path, and
    exit at once (vLLM leaves non-daemon threads behind; the result is on disk)."""
    path = save(out_dir, kind, body,
                [sys.executable, "-m", module, *(sys.argv[1:] if argv is None else argv)])
    print(f"{line}  -> {path}", flush=True)
    os._exit(0)
