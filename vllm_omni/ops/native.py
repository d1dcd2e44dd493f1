"""cpu_int4's native kernel sets (``csrc/int4_*.cpp``): chosen by the CPU, built once, loaded.

Five sets read the one layout of :mod:`vllm_omni.ops.int4_pack` and give the same bits
(``csrc/int4_base.h`` defines the arithmetic):

- ``amx``: the avx512 set with its GEMM (prefill) on AMX tiles, and W4A16's many-row bf16 product
  (``dequant_rows``) on AMX bf16 tiles: the avx512 flags and AMX-TILE, AMX-INT8, AMX-BF16 (Intel
  Sapphire Rapids and later);
- ``avx512bf16``: the avx512 set with W4A16's many-row bf16 product (``dequant_rows``) on
  AVX512_BF16 registers: the avx512 flags and AVX512_BF16 (AMD Zen 4 and later, Intel Cooper
  Lake; Sapphire Rapids and later take the amx set);
- ``avx512``: AVX-512 F/BW/VL/DQ with AVX512_VNNI and AVX512_VBMI (Intel Ice Lake and later,
  AMD Zen 4 and later);
- ``avx2``: AVX2 and FMA (every other x86-64 CPU of the last decade, and AVX-512 CPUs without
  VNNI/VBMI);
- ``portable``: plain C++ for any other CPU (aarch64, ppc64le, old x86), slower.

:func:`select` picks the first set whose CPU flags the CPU has (``/proc/cpuinfo``), or the one
``VLLM_OMNI_INT4_ISA`` names; a named set the CPU cannot run is refused with a warning naming the
missing flags, and the best set it can run is used. :func:`load` compiles the chosen set with
torch's C++ extension builder into a cache directory keyed on the sources, torch, Python and the
flags (``$VLLM_OMNI_CACHE``, default ``~/.cache/vllm_omni``; about 10 s, once per machine), then
loads it: it registers ``torch.ops.vllm_omni_<set>.int4_gemv``, ``int4_dequant_t``,
``greedy_argmax`` (the step_overhead patch's sampler) and ``register_kernels``. A set whose build
fails falls back to the next one it can run; when none builds, or ``VLLM_OMNI_DISABLE_NATIVE_INT4``
is set, cpu_int4 runs on its Python kernels (slower, same results up to rounding). Nothing here
raises. The build runs under an exclusive file lock, so the EngineCore and its workers never build
at once, and a build killed half way leaves nothing that blocks the next one. Every set's library
can be loaded into one process (each has its own namespace): tests run all that the CPU can.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import logging
import platform
import sys
from pathlib import Path

from vllm_omni import envs

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
HEADERS = (CSRC / "int4_base.h", CSRC / "int4_ops.h")
LDFLAGS = ("-fopenmp",)
# -ffp-contract=off: no multiply and add that the sources keep apart may be fused, or the sets
# would stop giving the same bits.
BASE_CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")


@dataclasses.dataclass(frozen=True)
class KernelSet:
    name: str
    cpu_flags: tuple[str, ...]  # as /proc/cpuinfo spells them; () = any CPU
    isa_cflags: tuple[str, ...]
    x86_only: bool
    includes: tuple[str, ...] = ()  # other sources of csrc/ its source includes (build key)

    @property
    def source(self) -> Path:
        return CSRC / f"int4_{self.name}.cpp"

    @property
    def library(self) -> str:
        return f"vllm_omni_int4_{self.name}"

    @property
    def namespace(self) -> str:
        return f"vllm_omni_{self.name}"

    @property
    def cflags(self) -> tuple[str, ...]:
        return (*BASE_CFLAGS, *self.isa_cflags, f"-DOMNI_NS={self.namespace}")


_AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512vbmi", "fma")
_AVX512_CFLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni",
                  "-mavx512vbmi", "-mfma")

# In order of preference.
KERNEL_SETS = (
    KernelSet("amx", (*_AVX512_FLAGS, "amx_tile", "amx_int8", "amx_bf16"),
              (*_AVX512_CFLAGS, "-mamx-tile", "-mamx-int8", "-mamx-bf16"), x86_only=True,
              includes=("int4_avx512.cpp",)),
    KernelSet("avx512bf16", (*_AVX512_FLAGS, "avx512_bf16"), (*_AVX512_CFLAGS, "-mavx512bf16"),
              x86_only=True, includes=("int4_avx512.cpp",)),
    KernelSet("avx512", _AVX512_FLAGS, _AVX512_CFLAGS, x86_only=True),
    KernelSet("avx2", ("avx2", "fma"), ("-mavx2", "-mfma"), x86_only=True),
    KernelSet("portable", (), (), x86_only=False),
)
BY_NAME = {ks.name: ks for ks in KERNEL_SETS}


@dataclasses.dataclass(frozen=True)
class Status:
    available: bool
    reason: str  # why not, or where the library is
    path: str | None = None
    kernel_set: str | None = None  # the set loaded, None when the Python kernels run


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def missing_flags(ks: KernelSet, flags: set[str] | None = None, x86: bool | None = None
                  ) -> list[str]:
    """What this CPU lacks for ``ks`` (empty: it can run it)."""
    if ks.x86_only and not (is_x86() if x86 is None else x86):
        return [f"an x86-64 CPU (this is {platform.machine()})"]
    have = cpu_flags() if flags is None else flags
    return [f for f in ks.cpu_flags if f not in have]


def runnable(flags: set[str] | None = None, x86: bool | None = None) -> list[KernelSet]:
    """The kernel sets this CPU can run, best first."""
    return [ks for ks in KERNEL_SETS if not missing_flags(ks, flags, x86)]


def select(flags: set[str] | None = None, x86: bool | None = None) -> tuple[KernelSet, str]:
    """(the set to use, why): ``VLLM_OMNI_INT4_ISA`` if this CPU can run it, else the best it can."""
    can = runnable(flags, x86)
    wanted = envs.int4_isa()
    if wanted is None:
        return can[0], f"the best set this CPU runs ({_flags_text(can[0])})"
    if wanted not in BY_NAME:
        logger.warning("vllm_omni: %s=%r is not a kernel set (%s); using %s",
                       envs.VLLM_OMNI_INT4_ISA, wanted, ", ".join(BY_NAME), can[0].name)
        return can[0], f"{envs.VLLM_OMNI_INT4_ISA}={wanted!r} unknown; the best set this CPU runs"
    ks = BY_NAME[wanted]
    missing = missing_flags(ks, flags, x86)
    if missing:
        logger.warning("vllm_omni: %s=%s, but the CPU lacks %s; cpu_int4 uses the %s kernels",
                       envs.VLLM_OMNI_INT4_ISA, wanted, ", ".join(missing), can[0].name)
        return can[0], (f"{envs.VLLM_OMNI_INT4_ISA}={wanted} refused: the CPU lacks "
                        f"{', '.join(missing)}; the best set this CPU runs")
    return ks, f"forced by {envs.VLLM_OMNI_INT4_ISA}={wanted}"


def _flags_text(ks: KernelSet) -> str:
    return "needs " + ", ".join(ks.cpu_flags) if ks.cpu_flags else "needs nothing of the CPU"


def build_dir(name: str, sources: tuple[Path, ...], cflags: tuple[str, ...]) -> Path:
    """Where these sources, torch and flag combination are built (one directory per key).

    The sources' paths count too: torch's builder writes them into the directory's build.ninja,
    so two checkouts of the same sources sharing one directory rebuilt it (~15 s) at every switch
    from one to the other (seen as a 21 s import of every other engine start in an A/B between
    two work trees).
    """
    import torch

    key = hashlib.sha256()
    for part in (*(s.read_bytes() for s in sources), *(str(s.resolve()).encode() for s in sources),
                 torch.__version__.encode(),
                 " ".join(cflags).encode(), sys.version.encode()):
        key.update(part)
    return envs.cache_root() / "ext" / f"{name}-{key.hexdigest()[:16]}"


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


def set_dir(ks: KernelSet) -> Path:
    return build_dir(ks.library, (ks.source, *HEADERS, *(CSRC / i for i in ks.includes)),
                     ks.cflags)


def _build_and_load(ks: KernelSet) -> str:
    where = set_dir(ks)
    _build(where, ks.library, ks.source, ks.cflags, LDFLAGS, python_module=False)
    return str(where / f"{ks.library}.so")


@functools.cache
def load_set(name: str) -> Status:
    """Build (once per machine) and load one kernel set in this process; never raises. A set
    the CPU cannot run is refused without building it."""
    ks = BY_NAME[name]
    missing = missing_flags(ks)
    if missing:
        return Status(False, f"the CPU lacks {', '.join(missing)}")
    try:
        path = _build_and_load(ks)
    except Exception as exc:  # a compiler error must not stop a model from loading
        return Status(False, _build_failed(set_dir(ks), exc))
    return Status(True, f"loaded {path}", path, ks.name)


@functools.cache
def load() -> Status:
    """The kernel set cpu_int4 uses in this process (see :func:`select`), loaded; a set whose build
    fails gives way to the next one the CPU runs. Never raises."""
    var = envs.native_int4_disabled()
    if var:
        return Status(False, f"disabled by {var}")
    chosen, why = select()
    failed = []
    for ks in runnable()[[k.name for k in runnable()].index(chosen.name):]:
        st = load_set(ks.name)
        if st.available:
            note = f"; {'; '.join(failed)}" if failed else ""
            return dataclasses.replace(st, reason=f"{ks.name} kernels, {why}: {st.reason}{note}")
        failed.append(f"{ks.name}: {st.reason}")
        why = f"the {ks.name} set failed to build"
    reason = "; ".join(failed)
    logger.warning("vllm_omni: native int4 kernels unavailable, using Python ones (%s)", reason)
    return Status(False, reason)


def available() -> bool:
    return load().available


def ops(name: str | None = None):
    """``torch.ops.vllm_omni_<set>``: the ops of set ``name`` (default: the one in use), loaded."""
    import torch

    st = load_set(name) if name else load()
    if not st.available:
        raise RuntimeError(f"vllm_omni: int4 kernel set {name or 'in use'} unavailable: {st.reason}")
    return getattr(torch.ops, BY_NAME[st.kernel_set].namespace)


def kernel_set() -> str:
    """What cpu_int4's ops run here: a native set's name, or "python"."""
    st = load()
    return st.kernel_set if st.available else "python"


# ------------------------------------------------------------------ the cpu_attention kernels

ATTENTION_SOURCE = CSRC / "cpu_attention.cpp"
ATTENTION_NAME = "vllm_omni_cpu_attention"
ATTENTION_CFLAGS = ("-O2",)


@functools.cache
def attention_kernels():
    """(module, reason): the cpu_attention patch's C++ kernels (``csrc/cpu_attention.cpp``),
    built once per machine like the int4 ones, or (None, why not). Never raises."""
    var = envs.native_attention_disabled()
    if var:
        return None, f"disabled by {var}"
    where = build_dir(ATTENTION_NAME, (ATTENTION_SOURCE,), ATTENTION_CFLAGS)
    try:
        module = _build(where, ATTENTION_NAME, ATTENTION_SOURCE, ATTENTION_CFLAGS, (),
                        python_module=True)
    except Exception as exc:  # a compiler error must not stop a model from loading
        return None, _build_failed(where, exc)
    return module, f"loaded from {where}"
