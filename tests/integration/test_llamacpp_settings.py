"""llama.cpp at its best, for real: one llama-bench run over -fa on/off and the slot's thread
counts on the tiny shape's Q4_0 GGUF, and the best record per test is the fastest one. The
GGUF's two build steps (convert, quantize) left their records beside the files.

Builds llama.cpp into the test's cache once when there is none (``llamacpp.ensure_built``: 4-6
minutes of both cores; later runs reuse it); skips, saying so, only where the build tools
(cmake, a C++ compiler) are missing.
"""

import os
import shutil

import pytest

from omni_ray import envs
from omni_ray.peers import llamacpp

pytestmark = pytest.mark.integration

WORK = envs.cache_dir() / "llama.cpp" / llamacpp.PYDIST_VERSION
BENCH = WORK / "build" / "bin" / "llama-bench"


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory):
    missing = [t for t in ("cmake", "c++") if shutil.which(t) is None]
    built = all(os.access(WORK / "build" / "bin" / b, os.X_OK) for b in llamacpp.BINARIES)
    if missing and not built:
        pytest.skip(f"no llama.cpp build at {WORK / 'build' / 'bin'} and no {', '.join(missing)} "
                    "to build one (apt-get install cmake g++)")
    llamacpp.ensure_built()
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    from omni_ray.models.build import ensure_model

    d = tmp_path_factory.mktemp("gguf")
    bf16 = llamacpp.convert(ensure_model("tiny", progress=None), d / "tiny-bf16.gguf", "bf16")
    return llamacpp.quantize(bf16, d / "tiny-Q4_0.gguf", "Q4_0")


@pytest.mark.timeout(1800)  # the first run builds llama.cpp in its fixture
def test_the_best_setting_per_depth_is_the_fastest_tried(q4_gguf):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    best = llamacpp.bench_best(q4_gguf, cpus=cpus, n_prompt=(0,), n_gen=16, n_depth=(0, 64),
                               repetitions=2, timeout=600)
    assert [b["n_depth"] for b in best] == [0, 64]
    n_settings = len(llamacpp.TUNED_FLASH_ATTN) * len(llamacpp.thread_candidates(len(cpus)))
    for b in best:
        assert len(b["tried"]) == n_settings
        assert b["avg_ts"] == max(t["avg_ts"] for t in b["tried"])
        assert b["setting"]["flash_attn"] in llamacpp.TUNED_FLASH_ATTN
        assert b["setting"]["threads"] in llamacpp.thread_candidates(len(cpus))


def test_the_gguf_steps_record_their_time_and_peak_rss(q4_gguf):
    records = llamacpp.build_records(q4_gguf)
    assert [r["step"] for r in records] == ["convert", "quantize"]
    assert records[1]["output"] == str(q4_gguf) and records[1]["input"] == records[0]["output"]
    for r in records:
        assert r["output_bytes"] == os.path.getsize(r["output"])
        assert 10 << 20 < r["peak_rss_bytes"] < 4 << 30, r  # a process, not the machine
        assert r["seconds"] > 0
