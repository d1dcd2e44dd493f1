"""cpu_int4's kernel sets on CPUs this machine is not: run under QEMU's user-mode emulation of an
AVX2-only CPU (``qemu-x86_64 -cpu Haswell``; Debian's ``qemu-user``), where an AVX-512
instruction is an illegal instruction. The avx2 and portable sets must run there and give the
bits the host's own set gives; the avx512 set must die there, which shows the emulation is real
(and that this test would catch an AVX-512 instruction in the avx2 set)."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates an x86-64 CPU"),
    pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                       reason="needs qemu-x86_64: apt-get install qemu-user (.ci/run does)"),
]

CHILD = """
import sys, torch
from vllm_omni.ops import int4_pack, native
torch.manual_seed(0)
name, out = sys.argv[1], sys.argv[2]
ops = native.ops(name)
w = torch.randn(208, 512).bfloat16()  # 3 full 64-row blocks and a 16-row tail
packed, sz = int4_pack.quantize_and_pack(w, 128)
x = torch.randn(3, 512).bfloat16()
torch.save({"capability": torch.backends.cpu.get_cpu_capability(),
            "gemv": ops.int4_gemv(x, packed, sz, 128),
            "dequant": ops.int4_dequant_t(packed, sz, 128, 0, 208),
            "argmax": ops.greedy_argmax(torch.randn(3, 1000).bfloat16())}, out)
"""


def _run(tmp: Path, name: str, emulate: bool) -> subprocess.CompletedProcess:
    out = tmp / f"{name}-{'emulated' if emulate else 'host'}.pt"
    cmd = [sys.executable, "-c", CHILD, name, str(out)]
    if emulate:
        cmd = ["qemu-x86_64", "-cpu", "Haswell", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])),
                          preexec_fn=_no_core_file)


def _no_core_file() -> None:
    """The avx512 child dies of SIGILL on purpose: no core file anywhere."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The host's own kernel set (built and loaded natively first, so the emulated children
    only load the libraries)."""
    from vllm_omni.ops import native

    tmp = tmp_path_factory.mktemp("emulated")
    for ks in native.runnable():
        assert native.load_set(ks.name).available
    name = native.runnable()[0].name
    proc = _run(tmp, name, emulate=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp, torch.load(tmp / f"{name}-host.pt")


@pytest.mark.parametrize("name", ["avx2", "portable"])
def test_a_set_runs_on_an_emulated_avx2_cpu_and_gives_the_hosts_bits(host, name):
    from vllm_omni.ops import native

    if name not in [ks.name for ks in native.runnable()]:
        pytest.skip(f"this CPU cannot run the {name} set natively either")
    tmp, want = host
    proc = _run(tmp, name, emulate=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = torch.load(tmp / f"{name}-emulated.pt")
    assert got["capability"] == "AVX2"  # torch itself saw an AVX2-only CPU
    for key in ("gemv", "dequant", "argmax"):
        assert torch.equal(got[key], want[key]), key


def test_the_avx512_set_dies_on_the_emulated_cpu(host):
    from vllm_omni.ops import native

    if "avx512" not in [ks.name for ks in native.runnable()]:
        pytest.skip("the avx512 set is not built on this CPU")
    tmp, _ = host
    proc = _run(tmp, "avx512", emulate=True)
    assert proc.returncode == -signal.SIGILL or "Illegal instruction" in proc.stderr, (
        proc.returncode, proc.stderr[-2000:])
