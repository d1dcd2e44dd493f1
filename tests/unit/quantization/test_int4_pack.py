"""vllm_omni's int4 layout: its definition, exact unpacking, row gathers, chunked repack, and the
probe of whether torch's own int4 GEMM reads it."""

import subprocess
import sys

import pytest
import torch

from vllm_omni.ops import int4_pack
from vllm_omni.quantization import grid


def _codes(n, k, seed=0):
    return torch.randint(0, 16, (n, k), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


def _byte(n, k, row, kk):
    """(flat byte, shift) of (row, kk), written out from the layout's definition."""
    first = row // 64 * 64
    w = min(64, n - first)
    local = row - first
    return first * k // 2 + kk * (w // 2) + local % (w // 2), 4 * (local >= w // 2)


@pytest.mark.parametrize("n,k", [(16, 64), (48, 128), (64, 32), (80, 64), (336, 128)])
def test_pack_is_the_documented_layout(n, k):
    codes = _codes(n, k, seed=n)
    flat = int4_pack.pack(codes).reshape(-1)
    assert flat.numel() == n * k // 2
    for row in range(n):
        for kk in range(0, k, 7):
            at, shift = _byte(n, k, row, kk)
            assert (int(flat[at]) >> shift) & 0x0F == int(codes[row, kk]), (row, kk)


def test_pack_refuses_rows_not_a_multiple_of_16():
    with pytest.raises(ValueError, match=r"multiple of 16 and K even, got \[40, 64\]"):
        int4_pack.pack(_codes(40, 64))


@pytest.mark.parametrize("n,k", [(16, 64), (48, 128), (80, 64), (128, 256), (336, 128)])
def test_unpack_is_exact_inverse_of_pack(n, k):
    codes = _codes(n, k)
    packed = int4_pack.pack(codes)
    assert packed.shape == (n, k // 2)
    assert torch.equal(int4_pack.unpack_codes(packed, n, k), codes)


@pytest.mark.parametrize("n", [64, 80, 336])
def test_gather_rows_matches_unpack(n):
    codes = _codes(n, 128, seed=n)
    packed = int4_pack.pack(codes)
    rows = torch.tensor([0, 1, 31, 32, 63, n - 1, n - 2, n - 9, 5])
    assert torch.equal(int4_pack.gather_codes(packed, rows, n, 128), codes[rows])


def test_chunked_repack_equals_one_shot():
    n, k = 336, 256  # 5 full blocks and a 16-row tail
    qw = grid.quantize(torch.randn(n, k).bfloat16(), 64)
    whole = int4_pack.pack(grid.unpack_nibbles(qw.packed))
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero, chunk_bytes=64 * 4 * k)
    assert int4_pack.chunk_rows(k, 64 * 4 * k) == 64
    assert torch.equal(packed, whole)
    assert sz.shape == (k // 64, n, 2) and sz.dtype == torch.bfloat16


@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
def test_dequantize_from_pack_equals_checkpoint_dequantize(group_size):
    qw = grid.quantize(torch.randn(208, 256).bfloat16(), group_size)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    ref = grid.dequantize(qw)
    assert torch.equal(int4_pack.dequantize(packed, sz, 256), ref)
    rows = torch.tensor([[3, 200], [64, 0]])
    assert torch.equal(int4_pack.dequantize_rows(packed, sz, rows, 256), ref[rows.reshape(-1)])


def test_quantize_and_pack_equals_checkpoint_route():
    w = torch.randn(144, 256).bfloat16()
    qw = grid.quantize(w, 128)
    a = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    b = int4_pack.quantize_and_pack(w, 128, chunk_bytes=64 * 4 * 256)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def _probe_in_fresh_torch(capability: str) -> str:
    code = ("import torch\nfrom vllm_omni.ops import int4_pack\n"
            "print(torch.backends.cpu.get_cpu_capability(), int4_pack.torch_reads_pack())\n")
    env = {**__import__("os").environ, "ATEN_CPU_CAPABILITY": capability}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()


def test_torch_reads_pack_follows_torchs_kernels():
    """torch's AVX2 and default builds of the int4 pack op lay blocks out otherwise (the cause of
    "cpu_int4 cannot load a model" on AVX2 CPUs): the probe says no there and never raises.
    ATEN_CPU_CAPABILITY makes this process's torch take those kernels on any x86 CPU."""
    assert _probe_in_fresh_torch("default") == "DEFAULT False"
    assert _probe_in_fresh_torch("avx2").endswith(" False")
    if "avx512f" in open("/proc/cpuinfo").read():
        assert _probe_in_fresh_torch("avx512") == "AVX512 True"


def test_torch_reads_pack_is_false_when_the_op_fails(monkeypatch):
    def broken(*args):
        raise RuntimeError("no int4 pack op in this torch")

    monkeypatch.setattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", broken)
    assert int4_pack.torch_reads_pack.__wrapped__() is False
