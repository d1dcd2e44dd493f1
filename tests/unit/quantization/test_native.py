"""vllm_omni's native int4 kernels: equal to the Python/torch paths, used when they load, and a
machine that cannot build or run them falls back with a reason instead of failing."""

import pytest
import torch
import torch.nn.functional as F

from vllm_omni import envs
from vllm_omni.ops import int4_linear, int4_pack, native
from vllm_omni.quantization import grid

N, K = 192, 512  # 3 full 64-row blocks
HAS_ISA = set(native.CPU_FLAGS) <= native.cpu_flags()
needs_isa = pytest.mark.skipif(not HAS_ISA, reason="the CPU lacks AVX-512")


def _layer(group_size, n=N, seed=0):
    w = torch.randn(n, K, generator=torch.Generator().manual_seed(seed + group_size)).bfloat16()
    qw = grid.quantize(w, group_size)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    return packed, sz, grid.dequantize(qw)


@needs_isa
def test_loads_on_an_avx512_machine():
    status = native.load()
    assert status.available, status.reason
    assert hasattr(torch.ops.vllm_omni_C, "int4_gemv")


@needs_isa
@pytest.mark.parametrize("bf16_dot", [True, False])
@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 9])
def test_gemv_matches_the_fp32_reference(group_size, rows, bf16_dot):
    packed, sz, w = _layer(group_size)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).bfloat16()
    ref = F.linear(x.float(), w.float())
    y = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, group_size, bf16_dot)
    assert y.shape == (rows, N) and y.dtype == torch.bfloat16
    # summing per group before scaling reorders fp32 additions: within bf16 output rounding
    assert (y.float() - ref).abs().max() <= ref.abs().max() * 2 ** -7
    torch_kernel = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, sz)
    assert (y.float() - torch_kernel.float()).abs().max() <= ref.abs().max() * 2 ** -6


@needs_isa
@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
def test_dequant_is_exactly_the_python_unpacking(group_size):
    packed, sz, w = _layer(group_size)
    wt = torch.ops.vllm_omni_C.int4_dequant_t(packed, sz, group_size, 0, N)
    assert torch.equal(wt, int4_pack.dequantize_t(packed, sz, K))
    assert torch.equal(wt.t(), w)  # and the checkpoint's own dequantization
    part = torch.ops.vllm_omni_C.int4_dequant_t(packed, sz, group_size, 64, 192)
    assert torch.equal(part, wt[:, 64:192])


@pytest.mark.skipif(not set(native.DOT_FLAGS) <= native.cpu_flags(), reason="no AVX512_BF16")
def test_both_gemv_loops_agree_on_a_real_shape():
    """The bf16-dot loop (rows in nibble order, put back at the end) and the fp32 loop, on a
    qwen2.5-0.5b down_proj shape: 14 blocks of 64 rows, K 4864 (38 groups)."""
    w = torch.randn(896, 4864, generator=torch.Generator().manual_seed(1)).bfloat16()
    qw = grid.quantize(w, 128)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    x = torch.randn(3, 4864, generator=torch.Generator().manual_seed(2)).bfloat16()
    dot = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, 128, True).float()
    fp32 = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, 128, False).float()
    ref = F.linear(x.float(), grid.dequantize(qw).float())
    assert native.gemv_variant() == "bf16-dot"
    assert (dot - fp32).abs().max() <= ref.abs().max() * 2 ** -7
    assert (dot - ref).abs().max() <= ref.abs().max() * 2 ** -7


@needs_isa
def test_kernels_refuse_what_they_cannot_read():
    packed, sz, _ = _layer(128, n=208)  # a 16-row tail block
    with pytest.raises(RuntimeError, match="multiple of 64"):
        torch.ops.vllm_omni_C.int4_gemv(torch.randn(1, K).bfloat16(), packed, sz, 128)
    packed, sz, _ = _layer(128)
    with pytest.raises(RuntimeError, match="n_begin"):
        torch.ops.vllm_omni_C.int4_dequant_t(packed, sz, 128, 32, 192)


@needs_isa
@pytest.mark.parametrize("rows,threshold", [(1, 16), (5, 16), (16, 16), (64, 0)])
def test_op_uses_the_native_kernels_when_they_load(rows, threshold, monkeypatch):
    op = int4_linear.op()
    packed, sz, _ = _layer(64)
    x = torch.randn(rows, K).bfloat16()
    fast = op(x, packed, sz, 64, threshold)
    if rows < threshold:
        assert torch.equal(fast, torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, 64))
    else:
        wt = torch.ops.vllm_omni_C.int4_dequant_t(packed, sz, 64, 0, N)
        assert torch.equal(fast, torch.mm(x, wt))
    monkeypatch.setattr(native, "available", lambda: False)
    slow = op(x, packed, sz, 64, threshold)
    if rows < threshold:
        assert torch.equal(slow, torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, sz))
    assert (fast.float() - slow.float()).abs().max() <= slow.float().abs().max() * 2 ** -6


def test_off_switch_and_missing_isa_give_reasons(monkeypatch):
    monkeypatch.setenv(envs.VLLM_OMNI_DISABLE_NATIVE_INT4, "1")
    status = native.load.__wrapped__()
    assert not status.available and envs.VLLM_OMNI_DISABLE_NATIVE_INT4 in status.reason
    monkeypatch.delenv(envs.VLLM_OMNI_DISABLE_NATIVE_INT4)
    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "fma"})
    status = native.load.__wrapped__()
    assert not status.available and "avx512f" in status.reason


def test_a_failed_build_falls_back_with_the_compiler_error(monkeypatch, tmp_path):
    monkeypatch.setenv(envs.VLLM_OMNI_CACHE, str(tmp_path))
    monkeypatch.setattr(native, "_unavailable", lambda: None)

    def broken(where):
        raise RuntimeError("Error building extension 'vllm_omni_int4_cpu'\nint4_cpu.cpp:1: boom")

    monkeypatch.setattr(native, "_build_and_load", broken)
    status = native.load.__wrapped__()
    assert not status.available
    assert str(tmp_path) in status.reason and "Error building extension" in status.reason


def test_build_dir_is_keyed_on_source_and_torch(monkeypatch, tmp_path):
    monkeypatch.setenv(envs.VLLM_OMNI_CACHE, str(tmp_path))
    a = native.build_dir()
    assert a.parent == tmp_path / "ext" and a.name.startswith(native.NAME)
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert native.build_dir() != a
