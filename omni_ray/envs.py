"""Every environment variable that omni_ray itself reads, with what it does."""

from __future__ import annotations

import os
from pathlib import Path

# Where built models, compile caches and peer builds are kept (default ~/.cache/omni-ray).
OMNI_RAY_CACHE = "OMNI_RAY_CACHE"
# What llama.cpp (the peer) is built for: "native" (default: GGML_NATIVE, this CPU's every
# instruction) or "avx2" (AVX2, FMA, F16C and BMI2 only: the peer an AVX2-only CPU gets, to
# compare with cpu_int4's avx2 kernel set on any x86 machine). Each has its own build directory.
OMNI_RAY_LLAMACPP_ISA = "OMNI_RAY_LLAMACPP_ISA"
LLAMACPP_ISAS = ("native", "avx2")
# A sysfs tree (DIR/devices/system/{node,cpu}) whose NUMA nodes this process takes for the
# machine's: simulated sockets made of this machine's own CPUs (``omni-ray topology --simulate N
# --write DIR``). Everything reads it through ``topology.detect()``: the slots a local Ray or a
# raylet advertises, the stage actor's slot, the engine runner's memory binding. Ray workers and
# engine processes inherit it from the raylet (or the local Ray's driver) that starts them.
OMNI_RAY_SYSFS_ROOT = "OMNI_RAY_SYSFS_ROOT"


def cache_dir() -> Path:
    return Path(os.environ.get(OMNI_RAY_CACHE) or Path.home() / ".cache" / "omni-ray")


def llamacpp_isa() -> str:
    """OMNI_RAY_LLAMACPP_ISA, checked: one of LLAMACPP_ISAS."""
    value = os.environ.get(OMNI_RAY_LLAMACPP_ISA, "").strip().lower() or "native"
    if value not in LLAMACPP_ISAS:
        raise ValueError(f"{OMNI_RAY_LLAMACPP_ISA}: must be one of {', '.join(LLAMACPP_ISAS)}, "
                         f"got {value!r}")
    return value


def sysfs_root() -> str | None:
    """OMNI_RAY_SYSFS_ROOT, or None when unset or blank (the machine's own /sys)."""
    return os.environ.get(OMNI_RAY_SYSFS_ROOT, "").strip() or None
