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
@pytest.mark.parametrize("vnni", [True, False])
@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 9])
def test_gemv_matches_the_fp32_reference(group_size, rows, vnni):
    packed, sz, w = _layer(group_size)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).bfloat16()
    ref = F.linear(x.float(), w.float())
    y = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, group_size, vnni)
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


needs_vnni = pytest.mark.skipif(not set(native.DOT_FLAGS) <= native.cpu_flags(),
                                reason="no AVX512_VNNI + AVX512_VBMI")


@needs_vnni
def test_both_gemv_loops_agree_on_a_real_shape():
    """The int16-VNNI loop (x in fixed point) and the fp32 loop (exact products), on a
    qwen2.5-0.5b down_proj shape: 14 blocks of 64 rows, K 4864 (38 groups)."""
    w = torch.randn(896, 4864, generator=torch.Generator().manual_seed(1)).bfloat16()
    qw = grid.quantize(w, 128)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    x = torch.randn(3, 4864, generator=torch.Generator().manual_seed(2)).bfloat16()
    vnni = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, 128, True).float()
    fp32 = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, 128, False).float()
    ref = F.linear(x.float(), grid.dequantize(qw).float())
    assert native.gemv_variant() == "int16-vnni"
    assert (vnni - fp32).abs().max() <= ref.abs().max() * 2 ** -7
    assert (vnni - ref).abs().max() <= ref.abs().max() * 2 ** -7


@needs_vnni
def test_weight_prefetch_mode_changes_no_value():
    """The VNNI loop's prefetch switch (a benchmark knob) gives bitwise the same output, says
    which mode was on, and refuses a mode it does not know."""
    packed, sz, _ = _layer(128)
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(5)).bfloat16()
    set_prefetch = torch.ops.vllm_omni_C.set_weight_prefetch
    assert set_prefetch("l2") == "l2"  # the default
    l2 = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, 128, True)
    try:
        assert set_prefetch("nta") == "l2"
        nta = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, 128, True)
        with pytest.raises(RuntimeError, match="must be 'nta' or 'l2', got 'L1'"):
            set_prefetch("L1")
        assert set_prefetch("l2") == "nta"
    finally:
        set_prefetch("l2")
    assert torch.equal(l2, nta)


def _fixed_point_reference(x, w, group_size):
    """What the VNNI loop computes, in float64: x rounded to 15-bit fixed point per group
    (step = max|x| / 16383), times the dequantized weight."""
    xg = x.double().reshape(x.shape[0], -1, group_size)
    step = xg.abs().amax(-1, keepdim=True) / 16383
    fixed = torch.where(step > 0, torch.round(xg / step.clamp_min(1e-300)) * step, 0.0)
    return fixed.reshape(x.shape) @ w.double().t()


@needs_vnni
@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
def test_vnni_loop_rounds_only_x_and_only_to_its_fixed_point(group_size):
    """The VNNI loop's one rounding besides the bf16 output's is x to fixed point. With a wide
    range of x inside one group (1e-4 next to 30) it stays within 2^-8 of the largest output
    of the exact product, which bf16 output rounding alone reaches 2^-9; x rounded to int8
    instead of 15 bits lands near 2^-6 here and fails."""
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(group_size)).bfloat16()
    qw = grid.quantize(w, group_size)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    w = grid.dequantize(qw, torch.float32)  # the kernel's weights: not rounded to bf16
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(3))
    x[0, ::7] *= 1e-4
    x[1, 5] = 30.0
    x = x.bfloat16()
    y = torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, group_size, True).double()
    fixed = _fixed_point_reference(x, w, group_size)
    assert (y - fixed).abs().max() <= fixed.abs().max() * 2 ** -8
    exact = x.double() @ w.double().t()
    assert (y - exact).abs().max() <= exact.abs().max() * 2 ** -8
    zero = torch.ops.vllm_omni_C.int4_gemv(torch.zeros(1, K).bfloat16(), packed, sz, group_size)
    assert torch.equal(zero, torch.zeros(1, N).bfloat16())


@needs_isa
def test_kernels_refuse_what_they_cannot_read():
    packed, sz, _ = _layer(128, n=208)  # a 16-row tail block
    with pytest.raises(RuntimeError, match="multiple of 64"):
        torch.ops.vllm_omni_C.int4_gemv(torch.randn(1, K).bfloat16(), packed, sz, 128)
    packed, sz, _ = _layer(128)
    with pytest.raises(RuntimeError, match="n_begin"):
        torch.ops.vllm_omni_C.int4_dequant_t(packed, sz, 128, 32, 192)


def _python_op(*args, native_ok=True, monkeypatch=None):
    """The Python kernel of the op, with the native kernels usable from it or not."""
    if not native_ok:
        monkeypatch.setattr(native, "available", lambda: False)
    try:
        return int4_linear.cpu_int4_linear(*args)
    finally:
        if not native_ok:
            monkeypatch.undo()


@needs_isa
def test_the_ops_cpu_kernels_are_the_native_ones_when_they_load():
    int4_linear.register()
    assert int4_linear.kernels() == "native"
    for name in (int4_linear.OP_NAME, int4_linear.EMBEDDING_OP_NAME):
        dump = torch._C._dispatch_dump(f"{int4_linear.NAMESPACE}::{name}")
        cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
        assert len(cpu) == 1 and "int4_cpu.cpp" in cpu[0], dump


@needs_isa
@pytest.mark.parametrize("rows,threshold", [(1, 16), (5, 16), (16, 16), (64, 0), (70, 0)])
def test_native_op_equals_its_python_twin(rows, threshold, monkeypatch):
    op = int4_linear.op()
    packed, sz, _ = _layer(64)
    x = torch.randn(rows, K).bfloat16()
    bias = torch.randn(N).bfloat16()
    fast = op(x, packed, sz, 64, threshold, bias)
    assert torch.equal(fast, _python_op(x, packed, sz, 64, threshold, bias))
    if rows < threshold:
        assert torch.equal(fast, torch.ops.vllm_omni_C.int4_gemv(x, packed, sz, 64) + bias)
    else:
        wt = torch.ops.vllm_omni_C.int4_dequant_t(packed, sz, 64, 0, N)
        assert torch.equal(fast, torch.mm(x, wt) + bias)
    # leading dimensions and a float32 input come back as they went in
    x3 = x.float().view(1, rows, K)
    y3 = op(x3, packed, sz, 64, threshold)
    assert y3.shape == (1, rows, N) and y3.dtype == torch.float32
    assert torch.equal(y3, _python_op(x3, packed, sz, 64, threshold, None))
    # without the native library: torch's int4 GEMM, or the Python unpacking, within rounding
    slow = _python_op(x, packed, sz, 64, threshold, bias, native_ok=False, monkeypatch=monkeypatch)
    if rows < threshold:
        ref = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, sz) + bias
        assert torch.equal(slow, ref)
    assert (fast.float() - slow.float()).abs().max() <= slow.float().abs().max() * 2 ** -6


@needs_isa
def test_native_op_chunks_the_many_row_path_like_python(monkeypatch):
    """A weight wider than one dequantized chunk: the C++ loop over chunks must fill every
    column (int4_pack.chunk_rows(K) rows per chunk: 64 MiB / 4K = 32768 rows here)."""
    n = int4_pack.chunk_rows(K) + 192
    packed, sz, w = _layer(128, n=n)
    x = torch.randn(40, K).bfloat16()
    y = int4_linear.op()(x, packed, sz, 128, 32)
    assert torch.equal(y, _python_op(x, packed, sz, 128, 32, None))


@needs_isa
@pytest.mark.parametrize("rows,threshold", [(1, 16), (40, 16)])
def test_native_op_on_a_partial_last_block(rows, threshold):
    """N = 208: three full blocks and a 16-row tail, which only torch's GEMM reads natively."""
    packed, sz, w = _layer(128, n=208)
    x = torch.randn(rows, K).bfloat16()
    y = int4_linear.op()(x, packed, sz, 128, threshold)
    ref = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 128, sz)
    assert torch.equal(y, ref)
    py = _python_op(x, packed, sz, 128, threshold, None)
    assert (y.float() - py.float()).abs().max() <= py.float().abs().max() * 2 ** -6


@needs_isa
@pytest.mark.parametrize("n", [N, 208])
def test_native_embedding_equals_the_python_lookup(n):
    packed, sz, w = _layer(64, n=n)
    ids = torch.tensor([[0, 31, 32, 63], [64, 191, n - 1, n - 16]])
    rows = int4_linear.embedding_op()(ids, packed, sz, K)
    assert rows.shape == (2, 4, K) and rows.dtype == torch.bfloat16
    assert torch.equal(rows, int4_linear.cpu_int4_embedding(ids, packed, sz, K))
    assert torch.equal(rows.view(-1, K), w[ids.view(-1)])
    with pytest.raises(RuntimeError, match="out of"):
        int4_linear.embedding_op()(torch.tensor([n]), packed, sz, K)


def test_without_the_native_library_the_python_kernels_run(tmp_path):
    """A fresh process with the library switched off registers the Python functions."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from vllm_omni.ops import int4_linear\n"
        "int4_linear.register()\n"
        "print(int4_linear.kernels())\n"
        "print([l for l in torch._C._dispatch_dump('vllm_omni::cpu_int4_linear').splitlines()"
        " if l.startswith('CPU:')][0])\n")
    env = dict(__import__("os").environ, **{envs.VLLM_OMNI_DISABLE_NATIVE_INT4: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[0] == "python" and "int4_linear.py" in out[1], out


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


def _logits(rows, vocab, dtype, seed):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)).to(dtype)


@needs_isa
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 33, 32000])
def test_greedy_argmax_picks_what_vllms_does(dtype, vocab):
    """vLLM's CPU sampler: fp32 logits into _C::greedy_argmax. The native one reads bf16 as is,
    and must give the same index, ties (the first) and infinities included."""
    import vllm._custom_ops  # noqa: F401  registers torch.ops._C

    assert native.available()
    cases = [_logits(3, vocab, dtype, vocab)]
    tied = _logits(3, vocab, dtype, vocab + 1)
    tied[:, vocab // 2] = tied[:, -1] = tied.max() + 1
    cases.append(tied)
    edge = _logits(3, vocab, dtype, vocab + 2)
    edge[0] = float("-inf")
    edge[1, vocab - 1] = float("inf")
    cases.append(edge)
    for x in cases:
        want = torch.ops._C.greedy_argmax(x.float()).view(-1)
        got = torch.ops.vllm_omni_C.greedy_argmax(x)
        assert got.dtype == torch.int64 and torch.equal(got, want), (x, got, want)


@needs_isa
def test_greedy_argmax_returns_nothing_for_logits_with_a_nan():
    assert native.available()
    x = _logits(2, 100, torch.bfloat16, 0)
    x[1, 40] = float("nan")
    assert torch.ops.vllm_omni_C.greedy_argmax(x).numel() == 0
    assert torch.ops.vllm_omni_C.greedy_argmax(x[:1]).tolist() == [int(x[0].float().argmax())]
