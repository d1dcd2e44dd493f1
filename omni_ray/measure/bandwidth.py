"""Memory read bandwidth of a slot's cores: the probe behind the decode speed of light.

``measure_bandwidth`` reads a buffer with ``len(cpus)`` torch threads pinned to ``cpus``: the
sum of a bf16 tensor, the sum of an fp32 tensor (both read-only) and a copy (read + write
bytes, over half the buffer each way, so the probe holds ``size_bytes`` at most), best of
``repeats`` after one warm-up call each. ``ceiling_gb_s`` is the best of the three, the most
generous ceiling, which fractions are taken against (so they are conservative).

A sweep probes each slot once per run and regime (``probe_slot``): in a fresh interpreter
started by the engine runner after it has pinned itself and bound its memory, before the
engine loads and before the tree sampler starts, so the probe inherits the slot and never runs
in a measured window; its result is cached in the run's directory by host, CPUs, regime and
buffer size, so the slot's later arms read it back (``cached: true``). Buffer sizes:
``speed_of_light.probe_sizes`` (DRAM: max(1 GiB, 8x LLC); cache: a quarter of the LLC).

``python -m omni_ray.measure.bandwidth --cpus 0,1 [--size-bytes N] [--regimes]`` pins itself,
measures and prints JSON. torch is imported only when a probe runs, in the probing process.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND
from omni_ray.measure.speed_of_light import GiB, MiB, probe_sizes

# Repeats of a sweep's probe, after one warm-up call per kernel: a DRAM pass over 1 GiB takes
# ~50 ms at 20 GB/s, a cache pass over 8 MiB well under a millisecond, so the cache probe
# repeats more. The whole probe, with the interpreter and torch import, takes a few seconds.
SWEEP_REPEATS = {DRAM_BOUND: 3, CACHE_RESIDENT: 30}
PROBE_TIMEOUT_S = 120.0


def _best_seconds(fn, repeats: int) -> tuple[float, list[float]]:
    fn()  # first touch / warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def measure_bandwidth(cpus: list[int], size_bytes: int = GiB, repeats: int = 5) -> dict:
    """Read bandwidth with ``len(cpus)`` torch threads on ``cpus``: best of ``repeats``.

    ``read_gb_s`` is the best read-only figure, ``ceiling_gb_s`` the best of all three kernels
    and ``kernel`` the one that gave it. At most ``size_bytes`` are held at once.
    """
    os.sched_setaffinity(0, set(cpus))
    import torch

    torch.set_num_threads(len(cpus))
    out: dict = {"cpus": list(cpus), "threads": torch.get_num_threads(),
                 "size_bytes": size_bytes, "repeats": repeats, "unit": "GB/s (1e9 bytes)"}
    a = torch.ones(size_bytes // 2, dtype=torch.bfloat16)
    best, times = _best_seconds(lambda: a.sum(), repeats)
    out["sum_bf16_gb_s"] = size_bytes / best / 1e9
    out["sum_bf16_times_s"] = times
    a = None  # free the buffer before the next one is allocated
    f = torch.ones(size_bytes // 4, dtype=torch.float32)
    best, times = _best_seconds(lambda: f.sum(), repeats)
    out["sum_fp32_gb_s"] = size_bytes / best / 1e9
    out["sum_fp32_times_s"] = times
    f = None
    half = size_bytes // 2
    src = torch.ones(half // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best, times = _best_seconds(lambda: dst.copy_(src), repeats)
    out["copy_gb_s"] = 2 * half / best / 1e9
    out["copy_times_s"] = times
    kernels = {"sum_bf16": out["sum_bf16_gb_s"], "sum_fp32": out["sum_fp32_gb_s"],
               "copy": out["copy_gb_s"]}
    out["read_gb_s"] = max(out["sum_bf16_gb_s"], out["sum_fp32_gb_s"])
    out["kernel"] = max(kernels, key=kernels.get)
    out["ceiling_gb_s"] = kernels[out["kernel"]]
    return out


def measure_regimes(cpus: list[int], llc_bytes: int | None, repeats: int = 5) -> dict:
    """One probe per regime (``probe_sizes``); the cache probe repeats 10x more (it is short)."""
    out = {}
    for label, size in probe_sizes(llc_bytes).items():
        out[label] = measure_bandwidth(cpus, size, repeats * (10 if label == CACHE_RESIDENT
                                                              else 1))
    return out


def cache_path(cache_dir: str | os.PathLike, cpus: list[int], label: str, size: int) -> Path:
    """The cached probe of (this host, ``cpus``, regime, buffer size) in a run's directory."""
    where = "-".join(map(str, sorted(cpus))) if cpus else "any"
    tag = "dram" if label == DRAM_BOUND else "cache"
    return Path(cache_dir) / f"{socket.gethostname()}.cpus{where}.{tag}.{size}.json"


def probe_command(cpus: list[int], size_bytes: int, repeats: int) -> list[str]:
    return [sys.executable, "-m", "omni_ray.measure.bandwidth", "--cpus",
            ",".join(map(str, cpus)), "--size-bytes", str(size_bytes), "--repeats",
            str(repeats)]


def probe_slot(cpus: list[int] | None, label: str, llc_bytes: int | None, *,
               cache_dir: str | os.PathLike | None = None,
               memory_limit_mib: int | None = None,
               timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """The ``label`` regime's probe on ``cpus`` (None: the CPUs this process may use), read
    from ``cache_dir`` when this run has measured it already, else measured in a child
    interpreter (which inherits this process's pinning and memory binding) and cached.

    Never raises: a probe that cannot run or fails is a dict with ``error`` and no
    ``ceiling_gb_s``. With ``memory_limit_mib`` (the stage's, enforced on the engine tree,
    which the probe is part of) a buffer over half of it is not allocated: skipped, saying so.
    """
    from omni_ray.measure.cpuload import NeighbourLoad

    cpus = sorted(cpus) if cpus else sorted(os.sched_getaffinity(0))
    size = probe_sizes(llc_bytes).get(label)
    base = {"regime": label, "size_bytes": size, "cpus": cpus}
    if size is None:
        return base | {"error": f"no {label} probe without the LLC size"}
    if memory_limit_mib is not None and size > memory_limit_mib * MiB // 2:
        return base | {"error": f"skipped: the probe's {size / MiB:g} MiB buffer would count "
                                f"against memory_limit_mib={memory_limit_mib}"}
    path = cache_path(cache_dir, cpus, label, size) if cache_dir else None
    if path is not None and path.is_file():
        try:
            return json.loads(path.read_text()) | {"cached": True}
        except ValueError:
            pass  # a torn file: measure again
    repeats = SWEEP_REPEATS[label]
    neighbours = NeighbourLoad(os.getpid(), cpus)
    t0, at = time.monotonic(), time.time()
    try:
        proc = subprocess.run(probe_command(cpus, size, repeats), capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return base | {"error": f"the probe took over {timeout_s:g} s"}
    probe_s = time.monotonic() - t0
    load = neighbours.stop()
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return base | {"error": f"the probe exited with {proc.returncode}: {tail}"}
    try:
        out = json.loads((proc.stdout.strip().splitlines() or [""])[-1])
    except ValueError:
        return base | {"error": f"the probe printed no JSON: {proc.stdout[-200:]!r}"}
    out |= {"regime": label, "probe_s": round(probe_s, 3), "probed_at": at, "cached": False,
            "neighbour_cpu_frac": load["neighbour_cpu_frac"]}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, path)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="memory read bandwidth on the given CPUs (JSON)")
    p.add_argument("--cpus", default="0,1")
    p.add_argument("--size-bytes", type=int, default=None,
                   help="the buffer (default: --size-mib)")
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--regimes", action="store_true",
                   help="also probe each regime (DRAM: a buffer several times the LLC; cache: "
                        "a quarter of it), the LLC read from sysfs; under 'regimes'")
    a = p.parse_args(argv)
    cpus = [int(c) for c in a.cpus.split(",") if c.strip()]
    os.environ.setdefault("OMP_NUM_THREADS", str(len(cpus)))
    out = measure_bandwidth(cpus, a.size_bytes or a.size_mib << 20, a.repeats)
    if a.regimes:
        from omni_ray.topology.caches import detect_llc

        llc = detect_llc()
        llc_bytes = llc.bytes_for(cpus) if llc else None
        out["llc"] = llc.to_dict() | {"bytes_for_cpus": llc_bytes} if llc else None
        out["regimes"] = measure_regimes(cpus, llc_bytes, a.repeats)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
