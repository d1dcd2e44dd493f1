"""What every benchmark script shares: a timestamped, atomically written result with provenance."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

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


def save(out_dir: str | os.PathLike, kind: str, body: dict, command: list[str]) -> Path:
    path = Path(out_dir) / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    write_json_atomic(path, {"kind": kind, "command": " ".join(command), **body,
                             "load_average_after": os.getloadavg(), "provenance": collect()})
    return path
