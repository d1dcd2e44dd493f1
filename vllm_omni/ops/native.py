"""The native cpu_int4 kernels (``csrc/int4_cpu.cpp``): built once per machine, loaded per process.

``load()`` compiles the source with torch's C++ extension builder into a cache directory keyed on
the source, the torch version and the flags (``$VLLM_OMNI_CACHE``, default
``~/.cache/vllm_omni``), then loads it, which registers ``torch.ops.vllm_omni_C.int4_gemv`` and
``int4_dequant_t`` (and ``greedy_argmax``, the step_overhead patch's sampler). A build takes about 10 s; later processes only load the library. The build
runs under an exclusive file lock, so the EngineCore and its workers never build at once, and a
build killed half way leaves nothing that blocks the next one.

The kernels read torch's AVX-512 int4 pack with AVX-512 instructions. When the CPU or the pack
lacks them, when the build fails, or when ``VLLM_OMNI_DISABLE_NATIVE_INT4`` is set, ``load()``
says why and cpu_int4 runs on torch's own kernels instead (slower, same results up to rounding).
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import logging
import sys
from pathlib import Path

from vllm_omni import envs

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "int4_cpu.cpp"
NAME = "vllm_omni_int4_cpu"
CFLAGS = ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma")
LDFLAGS = ("-fopenmp",)
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma")
# With these as well, the GEMV uses int8 dot products (the C++ side checks them at run time).
DOT_FLAGS = ("avx512_vnni", "avx512vbmi")


@dataclasses.dataclass(frozen=True)
class Status:
    available: bool
    reason: str  # why not, or where the library is
    path: str | None = None


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def build_dir(name: str = NAME, source: Path = SOURCE, cflags: tuple[str, ...] = CFLAGS) -> Path:
    """Where this source, torch and flag combination is built (one directory per key)."""
    import torch

    key = hashlib.sha256()
    for part in (source.read_bytes(), torch.__version__.encode(), " ".join(cflags).encode(),
                 sys.version.encode()):
        key.update(part)
    return envs.cache_root() / "ext" / f"{name}-{key.hexdigest()[:16]}"


def _unavailable() -> str | None:
    """Why the native kernels cannot be used here, or None."""
    var = envs.native_int4_disabled()
    if var:
        return f"disabled by {var}"
    missing = [f for f in CPU_FLAGS if f not in cpu_flags()]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    from vllm_omni.ops import int4_pack

    if int4_pack.layout() != int4_pack.PackLayout(64, True):
        return f"torch's int4 pack is not the AVX-512 layout ({int4_pack.layout()})"
    return None


def _build(where: Path, name: str, source: Path, cflags: tuple[str, ...],
           ldflags: tuple[str, ...], python_module: bool):
    """Build (if not built) and load ``source``; returns the Python module if ``python_module``."""
    from torch.utils import cpp_extension

    where.mkdir(parents=True, exist_ok=True)
    with open(where / "omni.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even on a kill
        # torch's own build lock: a build killed half way leaves it behind and every later
        # build would wait on it forever. Holding ours, nobody else is building here.
        (where / "lock").unlink(missing_ok=True)
        return cpp_extension.load(name=name, sources=[str(source)], build_directory=str(where),
                                  extra_cflags=list(cflags), extra_ldflags=list(ldflags),
                                  is_python_module=python_module, verbose=False)


def _build_failed(where: Path, exc: Exception) -> str:
    """The reason a build failed: where, and the first line of the compiler's error."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"build in {where} failed: {first}"


def _build_and_load(where: Path) -> str:
    _build(where, NAME, SOURCE, CFLAGS, LDFLAGS, python_module=False)
    return str(where / f"{NAME}.so")


@functools.cache
def load() -> Status:
    """Build (once per machine) and load the kernels in this process; never raises."""
    reason = _unavailable()
    if reason:
        return Status(False, reason)
    where = build_dir()
    try:
        path = _build_and_load(where)
    except Exception as exc:  # a compiler error must not stop a model from loading
        reason = _build_failed(where, exc)
        logger.warning("vllm_omni: native int4 kernels unavailable, using torch's (%s)", reason)
        return Status(False, reason)
    return Status(True, f"loaded {path} ({gemv_variant()} GEMV)", path)


def available() -> bool:
    return load().available


def gemv_variant() -> str:
    """Which inner loop the native GEMV runs here: "int16-vnni" or "fp32"."""
    return "int16-vnni" if set(DOT_FLAGS) <= cpu_flags() else "fp32"


# ------------------------------------------------------------------ the cpu_attention kernels

ATTENTION_SOURCE = SOURCE.with_name("cpu_attention.cpp")
ATTENTION_NAME = "vllm_omni_cpu_attention"
ATTENTION_CFLAGS = ("-O2",)


@functools.cache
def attention_kernels():
    """(module, reason): the cpu_attention patch's C++ kernels (``csrc/cpu_attention.cpp``),
    built once per machine like the int4 ones, or (None, why not). Never raises."""
    var = envs.native_attention_disabled()
    if var:
        return None, f"disabled by {var}"
    where = build_dir(ATTENTION_NAME, ATTENTION_SOURCE, ATTENTION_CFLAGS)
    try:
        module = _build(where, ATTENTION_NAME, ATTENTION_SOURCE, ATTENTION_CFLAGS, (),
                        python_module=True)
    except Exception as exc:  # a compiler error must not stop a model from loading
        return None, _build_failed(where, exc)
    return module, f"loaded from {where}"
