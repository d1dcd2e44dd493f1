"""What every benchmark script shares: a timestamped, atomically written result with provenance."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import NoReturn

from omni_ray import envs
from omni_ray.results.provenance import collect
from omni_ray.results.store import write_json_atomic


# --isa avx2: what an AVX2-only CPU would run, forced on a bigger x86 one. vllm_omni's int4
# kernels (VLLM_OMNI_INT4_ISA) and torch's ATen kernels (ATEN_CPU_CAPABILITY, read when torch is
# imported) in the vLLM engines, and an AVX2-only build of llama.cpp (OMNI_RAY_LLAMACPP_ISA).
# oneDNN (vLLM bf16's matmuls) and vLLM's own C++ ops keep the machine's instructions: the bf16
# baseline is the faster for it, never the slower.
ISAS = ("native", "avx2")
ENGINE_ISA_ENV = {"native": {}, "avx2": {"VLLM_OMNI_INT4_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2"}}


def force_isa(isa: str) -> dict[str, str]:
    """Make this process's llama.cpp builds and runs use ``isa``; returns what the vLLM engines'
    environment needs for it (empty for "native")."""
    os.environ[envs.OMNI_RAY_LLAMACPP_ISA] = isa
    return dict(ENGINE_ISA_ENV[isa])


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
