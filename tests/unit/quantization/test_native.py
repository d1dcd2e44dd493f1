"""vllm_omni's native int4 kernel sets: each set this CPU can run is tested here (an AVX-512
machine runs the avx512, avx2 and portable sets, and amx where the CPU has AMX; an AVX2 one
avx2 and portable; any other CPU portable), all of them give the same bits, they equal the
Python paths, the ops use the set the CPU selects, and a machine that cannot build or run one
falls back with a reason."""

import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from vllm_omni import envs
from vllm_omni.ops import int4_linear, int4_pack, native
from vllm_omni.quantization import grid

pytestmark = pytest.mark.native  # builds or loads vllm_omni's C++ kernel sets

N, K = 192, 512  # 3 full 64-row blocks
SETS = [ks.name for ks in native.runnable()]
VECTOR_SETS = [s for s in SETS if s != "portable"]
BF16_MM_SETS = [s for s in SETS if s in ("amx", "avx512bf16")]  # those with int4_tile_mm
# How many blocks of weights each set's GEMV of one row of x reads at once by default
# (kGemvStreams): 4 where the Intel Xeon measured it faster, 1 on AMD Zen 5's set, where the
# inner loop of 4 spills (int4_avx512.cpp's head comment).
GEMV_STREAMS_BY_SET = {"amx": 4, "avx512": 4, "avx512bf16": 1, "avx2": 1, "portable": 1}
AVX512_FLAGS = set(native.BY_NAME["avx512"].cpu_flags)


def _layer(group_size, n=N, seed=0, k=K):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed + group_size)).bfloat16()
    qw = grid.quantize(w, group_size)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    return packed, sz, grid.dequantize(qw)


def _x(rows, seed, k=K):
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("name", SETS)
def test_every_set_the_cpu_runs_loads(name):
    status = native.load_set(name)
    assert status.available and status.kernel_set == name, status.reason
    assert native.ops(name).kernel_set() == name


def test_the_set_in_use_is_the_best_the_cpu_runs():
    if os.environ.get(envs.VLLM_OMNI_INT4_ISA) or os.environ.get(envs.VLLM_OMNI_DISABLE_NATIVE_INT4):
        pytest.skip("the environment chooses the set")
    assert native.load().available and native.kernel_set() == SETS[0]


def _fixed_point_reference(x, w, group_size):
    """What every set computes, in float64: x rounded to 15-bit fixed point per group
    (step = max|x| / 16383), times the dequantized weight."""
    xg = x.double().reshape(x.shape[0], -1, group_size)
    step = xg.abs().amax(-1, keepdim=True) / 16383
    fixed = torch.where(step > 0, torch.round(xg / step.clamp_min(1e-300)) * step, 0.0)
    return fixed.reshape(x.shape) @ w.double().t()


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_gemv_rounds_only_x_and_only_to_its_fixed_point(name, group_size, rows):
    """The GEMV's one rounding besides the bf16 output's is x to fixed point. With a wide range
    of x inside one group (1e-4 next to 30) it stays within 2^-8 of the largest output of the
    exact product, which bf16 output rounding alone reaches 2^-9; x rounded to int8 instead of
    15 bits lands near 2^-6 here and fails."""
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(group_size)).bfloat16()
    qw = grid.quantize(w, group_size)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    w = grid.dequantize(qw, torch.float32)  # the kernel's weights: not rounded to bf16
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(3))
    x[0, ::7] *= 1e-4
    x[-1, 5] = 30.0
    x = x.bfloat16()
    y = native.ops(name).int4_gemv(x, packed, sz, group_size)
    assert y.shape == (rows, N) and y.dtype == torch.bfloat16
    y = y.double()
    fixed = _fixed_point_reference(x, w, group_size)
    assert (y - fixed).abs().max() <= fixed.abs().max() * 2 ** -8
    exact = x.double() @ w.double().t()
    assert (y - exact).abs().max() <= exact.abs().max() * 2 ** -8
    zero = native.ops(name).int4_gemv(torch.zeros(1, K).bfloat16(), packed, sz, group_size)
    assert torch.equal(zero, torch.zeros(1, N).bfloat16())


# (N, K, group, rows): full blocks, a 16- and a 48-row tail, a real down_proj shape (K 4864,
# 38 groups), the qwen2.5 vocabulary head's width modulo 64 (151936 = 2374 * 64) on a short K.
SHAPES = [(192, 512, 128, 1), (208, 256, 64, 2), (336, 128, 128, 3), (896, 4864, 128, 1),
          (4864, 896, 128, 5), (2432, 64, 64, 1)]


@pytest.mark.parametrize("n,k,group_size,rows", SHAPES)
def test_every_set_gives_the_same_bits(n, k, group_size, rows):
    """One arithmetic on every CPU (csrc/int4_base.h): the GEMV, the GEMM, the dequantization and
    the argmax of every set this CPU runs are bitwise equal, so greedy tokens cannot depend on the
    kernel set."""
    if len(SETS) < 2:
        pytest.skip(f"only the {SETS[0]} set runs on this CPU: nothing to compare it with")
    packed, sz, _ = _layer(group_size, n=n, k=k)
    x = _x(rows, n, k)
    logits = torch.randn(rows, n, generator=torch.Generator().manual_seed(k)).bfloat16()
    first = native.ops(SETS[0])
    want = (first.int4_gemv(x, packed, sz, group_size), first.int4_gemm(x, packed, sz, group_size),
            first.int4_dequant_t(packed, sz, group_size, 0, n), first.greedy_argmax(logits))
    for name in SETS[1:]:
        ops = native.ops(name)
        got = (ops.int4_gemv(x, packed, sz, group_size), ops.int4_gemm(x, packed, sz, group_size),
               ops.int4_dequant_t(packed, sz, group_size, 0, n), ops.greedy_argmax(logits))
        for a, b, what in zip(want, got, ("gemv", "gemm", "dequant", "argmax")):
            assert torch.equal(a, b), f"{name} {what} differs from {SETS[0]}"


# (N, K, group): tail blocks of 16 and 48 rows (N % 64), group counts that no tile divides
# (K / group = 3, 38), a real gate_up shape.
GEMM_SHAPES = [(208, 96, 32), (240, 4864, 128), (9728, 896, 128), (192, 512, 64), (192, 48, 16)]


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("n,k,group_size", GEMM_SHAPES)
@pytest.mark.parametrize("rows", [1, 7, 128])
def test_gemm_gives_each_row_the_bits_of_that_row_alone(name, n, k, group_size, rows):
    """Prefill and decode are one arithmetic: row r of an int4_gemm of many rows has the bits the
    GEMV gives for row r alone, whatever the tile (6 rows on avx512, 2 on avx2) does with the
    others, and the bits of the portable set."""
    packed, sz, _ = _layer(group_size, n=n, k=k)
    x = _x(rows, n + rows, k)
    x[0, ::5] *= 1e-4  # a wide range inside a group
    ops = native.ops(name)
    y = ops.int4_gemm(x, packed, sz, group_size)
    assert y.shape == (rows, n) and y.dtype == torch.bfloat16
    for r in {0, rows // 2, rows - 1}:
        assert torch.equal(y[r:r + 1], ops.int4_gemv(x[r:r + 1], packed, sz, group_size)), r
        assert torch.equal(y[r:r + 1], ops.int4_gemm(x[r:r + 1], packed, sz, group_size)), r
    assert torch.equal(y, ops.int4_gemv(x, packed, sz, group_size))
    if name != "portable":
        assert torch.equal(y, native.ops("portable").int4_gemm(x, packed, sz, group_size))


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("rows", [300, 600])
def test_gemm_rows_past_one_pass_over_the_block(name, rows):
    """More rows than one pass over a block's groups keeps in its fp32 buffer (256 rounded up
    to whole tiles; 300 rows are two passes): the second pass starts from zero, at its own
    rows' code pairs, and lands in its own rows (a pass of 256 rows once read the wrong pairs on
    avx512, whose tiles are 6)."""
    packed, sz, _ = _layer(64, n=N, k=128)
    x = _x(rows, 9, 128)  # 600: three passes on every set (204 + 204 + 192 rows on avx512)
    y = native.ops(name).int4_gemm(x, packed, sz, 64)
    assert torch.equal(y, native.ops(name).int4_gemv(x, packed, sz, 64))


@pytest.mark.parametrize("name", SETS)
def test_gemm_and_gemv_of_no_rows(name):
    """An empty batch (a linear with row_threshold 0 sends every call to the GEMM) is an empty
    result, not a division by zero passes (SIGFPE, the engine gone)."""
    packed, sz, _ = _layer(128)
    ops = native.ops(name)
    for mul in (ops.int4_gemm, ops.int4_gemv):
        y = mul(_x(0, 3), packed, sz, 128)
        assert y.shape == (0, N) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("name", SETS)
def test_gemm_is_the_fixed_point_product(name):
    """Not only equal to the GEMV: within the GEMV's bound of the exact product of x in fixed
    point and the dequantized weight."""
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(4)).bfloat16()
    qw = grid.quantize(w, 128)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    x = _x(40, 11)
    x[3, 7] = 30.0
    y = native.ops(name).int4_gemm(x, packed, sz, 128).double()
    fixed = _fixed_point_reference(x, grid.dequantize(qw, torch.float32), 128)
    assert (y - fixed).abs().max() <= fixed.abs().max() * 2 ** -8


def _w4a8_reference(x, qw, group_size):
    """W4A8 in float64 (csrc/int4_base.h): the products on x rounded to int8 per group
    (round(x * 127 / max|x|)), the zeros on x's own sum."""
    xg = x.double().reshape(x.shape[0], -1, group_size)
    amax = xg.abs().amax(-1, keepdim=True)
    codes = torch.where(amax > 0, torch.round(xg * 127 / amax.clamp_min(1e-300)), 0.0)
    xq = (codes * amax / 127).reshape(x.shape)
    scale = qw.scale.double().repeat_interleave(group_size, -1)
    zero = qw.zero.double().repeat_interleave(group_size, -1)
    q = grid.dequantize(qw, torch.float32).double()
    codes_w = (q - zero) / scale  # (q - 8), exact enough in float64
    return xq @ (codes_w * scale).t() + x.double() @ zero.t()


# ... and a group of 16 (the smallest the kernels take: 4 quads, two of the avx2 tile's steps)
W4A8_SHAPES = [(192, 512, 128, 7), (208, 96, 32, 13), (240, 4864, 128, 128), (9728, 896, 128, 40),
               (192, 512, 64, 600), (208, 96, 16, 5)]


@pytest.mark.parametrize("n,k,group_size,rows", W4A8_SHAPES)
def test_w4a8_gives_the_same_bits_on_every_set_and_in_both_ops(n, k, group_size, rows):
    """activation_bits 8: one arithmetic again. The avx512 and avx2 sets take kernels of their
    own (8-bit products), the portable set its 15-bit kernels on the same codes; the GEMM gives
    every row the GEMV's bits (600 rows: three passes), every set the same bits."""
    packed, sz, _ = _layer(group_size, n=n, k=k)
    x = _x(rows, seed=n, k=k)
    x[0, ::5] *= 1e-4
    want = None
    for name in SETS:
        ops = native.ops(name)
        y = ops.int4_gemm(x, packed, sz, group_size, 8)
        assert torch.equal(y, ops.int4_gemv(x, packed, sz, group_size, 8)), name
        assert torch.equal(y[-1:], ops.int4_gemm(x[-1:], packed, sz, group_size, 8)), name
        want = y if want is None else want
        assert torch.equal(y, want), f"{name} differs from {SETS[0]}"


@pytest.mark.parametrize("name", SETS)
def test_w4a8_rounds_x_to_int8_and_only_that(name):
    """Within 2^-8 of the largest output of the exact W4A8 product (x to int8 per group, the
    zeros on x's own sum), and not the 15-bit result: the switch is not ignored."""
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(5)).bfloat16()
    qw = grid.quantize(w, 128)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    x = _x(9, 12)
    x[2, 7] = 30.0
    ops = native.ops(name)
    for mul in (ops.int4_gemv, ops.int4_gemm):
        y = mul(x, packed, sz, 128, 8).double()
        ref = _w4a8_reference(x, qw, 128)
        assert (y - ref).abs().max() <= ref.abs().max() * 2 ** -8
        a16 = mul(x, packed, sz, 128, 16).double()
        assert (y - a16).abs().max() > ref.abs().max() * 2 ** -10
    with pytest.raises(RuntimeError, match="activation_bits must be 16 or 8, got 4"):
        ops.int4_gemv(x, packed, sz, 128, 4)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
@pytest.mark.parametrize("n", [N, 208])
def test_dequant_is_exactly_the_python_unpacking(name, group_size, n):
    packed, sz, w = _layer(group_size, n=n)
    ops = native.ops(name)
    wt = ops.int4_dequant_t(packed, sz, group_size, 0, n)
    assert torch.equal(wt, int4_pack.dequantize_t(packed, sz, K))
    assert torch.equal(wt.t(), w)  # and the checkpoint's own dequantization
    assert torch.equal(ops.int4_dequant_t(packed, sz, group_size, 64, 192), wt[:, 64:192])
    assert torch.equal(ops.int4_dequant_t(packed, sz, group_size, 128, n), wt[:, 128:n])


@pytest.mark.parametrize("name", VECTOR_SETS)
def test_gemv_streams_change_no_value(name):
    """Reading up to 4 blocks at once (in a set that can) gives bitwise what one at a time
    gives, for one row of x on 11 full blocks and a tail (each thread's blocks go in groups of
    4, 3 and 2 with some left over), at 16 and 8 activation bits; each set starts at its own
    default (GEMV_STREAMS_BY_SET); the switch says what was on and refuses a count it does not
    know."""
    packed, sz, _ = _layer(128, n=11 * 64 + 32)
    x = _x(1, 5)
    ops = native.ops(name)
    default = ops.set_gemv_streams(4)
    try:
        assert default == GEMV_STREAMS_BY_SET[name]
        out = {}
        for n in (1, 2, 3, 4):
            assert ops.set_gemv_streams(n) in (1, 2, 3, 4)
            out[n] = [ops.int4_gemv(x, packed, sz, 128, bits) for bits in (16, 8)]
        assert ops.set_gemv_streams(2) == 4
        for bad in (0, 5):
            with pytest.raises(RuntimeError, match=f"must be 1 to 4, got {bad}"):
                ops.set_gemv_streams(bad)
    finally:
        ops.set_gemv_streams(default)
    for n in (2, 3, 4):
        for a, b in zip(out[1], out[n]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", VECTOR_SETS)
def test_weight_prefetch_mode_changes_no_value(name):
    """The prefetch switch (a benchmark knob) gives bitwise the same output, says which mode
    was on, and refuses a mode it does not know."""
    packed, sz, _ = _layer(128)
    x = _x(2, 5)
    ops = native.ops(name)
    assert ops.set_weight_prefetch("l2") == "l2"  # the default
    l2 = [ops.int4_gemv(x, packed, sz, 128, bits) for bits in (16, 8)]
    try:
        assert ops.set_weight_prefetch("nta") == "l2"
        nta = [ops.int4_gemv(x, packed, sz, 128, bits) for bits in (16, 8)]
        with pytest.raises(RuntimeError, match="must be 'nta' or 'l2', got 'L1'"):
            ops.set_weight_prefetch("L1")
        assert ops.set_weight_prefetch("l2") == "nta"
    finally:
        ops.set_weight_prefetch("l2")
    assert all(torch.equal(a, b) for a, b in zip(l2, nta))


@pytest.mark.parametrize("name", SETS)
def test_kernels_refuse_what_they_cannot_read(name):
    ops = native.ops(name)
    packed, sz, _ = _layer(128, n=208)
    with pytest.raises(RuntimeError, match="n_begin"):
        ops.int4_dequant_t(packed, sz, 128, 32, 192)
    with pytest.raises(RuntimeError, match="n_begin"):
        ops.int4_dequant_t(packed, sz, 128, 64, 200)
    with pytest.raises(RuntimeError, match="N \\* K / 2 bytes"):
        ops.int4_gemv(_x(1, 0), packed[:-16], sz, 128)
    with pytest.raises(RuntimeError, match="G \\* group_size"):
        ops.int4_gemv(_x(1, 0, 256), packed, sz, 128)
    with pytest.raises(RuntimeError, match="G \\* group_size"):  # K not a multiple of the group
        ops.int4_gemm(_x(3, 0, K + 32), packed, sz, 128)
    with pytest.raises(RuntimeError, match="N \\* K / 2 bytes"):
        ops.int4_gemm(_x(3, 0), packed[:-16], sz, 128)


def _python_op(*args, native_ok=True, monkeypatch=None):
    """The Python kernel of the op, with the native kernels usable from it or not."""
    if not native_ok:
        monkeypatch.setattr(native, "available", lambda: False)
    try:
        return int4_linear.cpu_int4_linear(*args)
    finally:
        if not native_ok:
            monkeypatch.undo()


def test_the_ops_cpu_kernels_are_the_selected_set():
    int4_linear.register()
    assert int4_linear.kernels() == native.kernel_set()
    for name in (int4_linear.OP_NAME, int4_linear.EMBEDDING_OP_NAME):
        dump = torch._C._dispatch_dump(f"{int4_linear.NAMESPACE}::{name}")
        cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
        where = "int4_ops.h" if native.available() else "int4_linear.py"
        assert len(cpu) == 1 and where in cpu[0], dump


needs_native = pytest.mark.skipif(not native.available(), reason=f"no native set here: "
                                  f"{native.load().reason}")


@needs_native
@pytest.mark.parametrize("rows,threshold", [(1, 16), (5, 16), (16, 16), (64, 0), (70, 0)])
@pytest.mark.parametrize("n", [N, 208])
def test_native_op_equals_its_python_twin(rows, threshold, n, monkeypatch):
    op = int4_linear.op()
    ops = native.ops()
    packed, sz, _ = _layer(64, n=n)
    x = torch.randn(rows, K).bfloat16()
    bias = torch.randn(n).bfloat16()
    fast = op(x, packed, sz, 64, threshold, bias)
    assert torch.equal(fast, _python_op(x, packed, sz, 64, threshold, bias))
    if rows < threshold:
        assert torch.equal(fast, ops.int4_gemv(x, packed, sz, 64) + bias)
    else:
        assert torch.equal(fast, ops.int4_gemm(x, packed, sz, 64) + bias)
    # either branch: the same bits
    assert torch.equal(fast, op(x, packed, sz, 64, 0 if rows < threshold else 10 ** 6, bias))
    # leading dimensions and a float32 input come back as they went in
    x3 = x.float().view(1, rows, K)
    y3 = op(x3, packed, sz, 64, threshold)
    assert y3.shape == (1, rows, n) and y3.dtype == torch.float32
    assert torch.equal(y3, _python_op(x3, packed, sz, 64, threshold, None))
    # without a native set: torch's int4 GEMM where torch reads the layout, else the Python
    # unpacking and a bf16 matmul; within rounding of each other
    slow = _python_op(x, packed, sz, 64, threshold, bias, native_ok=False, monkeypatch=monkeypatch)
    if rows < threshold and n % 64 == 0 and int4_pack.torch_reads_pack():
        ref = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, sz) + bias
        assert torch.equal(slow, ref)
    assert (fast.float() - slow.float()).abs().max() <= slow.float().abs().max() * 2 ** -6


@needs_native
@pytest.mark.parametrize("rows,threshold", [(1, 16), (70, 0)])
def test_w4a8_op_equals_its_kernels_and_the_python_path(rows, threshold, monkeypatch):
    op = int4_linear.op()
    packed, sz, _ = _layer(64, n=208)
    x = _x(rows, 21)
    bias = _x(1, 22, 208)[0]
    fast = op(x, packed, sz, 64, threshold, bias, 8)
    assert torch.equal(fast, _python_op(x, packed, sz, 64, threshold, bias, 8))
    assert torch.equal(fast, native.ops().int4_gemv(x, packed, sz, 64, 8) + bias)
    slow = _python_op(x, packed, sz, 64, threshold, bias, 8, native_ok=False,
                      monkeypatch=monkeypatch)
    assert (fast.float() - slow.float()).abs().max() <= slow.float().abs().max() * 2 ** -6
    a16 = op(x, packed, sz, 64, threshold, bias)
    assert not torch.equal(fast, a16)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("n", [208, 592])  # one chunk; three, the last a part one
def test_dequant_mm_is_a_bf16_matmul_on_each_chunk_of_the_dequantized_weight(name, n):
    packed, sz, w = _layer(64, n=n)
    x = _x(40, 31)
    ops = native.ops(name)
    chunks = [torch.mm(x, ops.int4_dequant_t(packed, sz, 64, r, min(n, r + 256)))
              for r in range(0, n, 256)]
    y = ops.int4_dequant_mm(x, packed, sz, 64)
    assert torch.equal(y, torch.cat(chunks, 1))
    # the dequantized weights' product, not the GEMM's bits: within bf16 rounding of it
    ref = x.float() @ w.float().t()
    assert (y.float() - ref).abs().max() <= ref.abs().max() * 2 ** -7
    assert not torch.equal(y, ops.int4_gemm(x, packed, sz, 64))


@pytest.mark.skipif(not BF16_MM_SETS, reason="neither AMX-BF16 nor AVX512_BF16 on this CPU")
@pytest.mark.parametrize("name", BF16_MM_SETS)
@pytest.mark.parametrize("n,k,gs,rows", [
    # 3 panels, the last one block and a 16-output tail; k-panels 512, 512, 256 (amx), 5 x 256
    (592, 1280, 128, 77),
    (192, 512, 32, 33),  # the smallest group it takes, one panel of 3 blocks
    (64, 256, 64, 1),
    (128, 256, 64, 2100)])  # two passes of rows: 1,056 and 1,044 (amx), 1,050 each
def test_tile_mm_is_the_product_of_the_dequantized_weights(name, n, k, gs, rows):
    """int4_tile_mm (AMX-BF16 tiles in the amx set, AVX512_BF16 registers in the avx512bf16
    set): fp32 sums of the dequantized bf16 weights times x, rounded to bf16 once: within one
    bf16 rounding (and the products' fp32 order) of the exact product, as int4_dequant_mm
    (torch.mm on the same weights) is."""
    ops = native.ops(name)
    packed, sz, _ = _layer(gs, n=n, k=k)
    x = _x(rows, 41, k=k)
    wt = ops.int4_dequant_t(packed, sz, gs, 0, n).double()
    exact = x.double() @ wt
    y = ops.int4_tile_mm(x, packed, sz, gs)
    err = (y.double() - exact).abs()
    assert (err <= exact.abs() * 2 ** -8 + exact.abs().max() * 2 ** -20).all(), err.max()
    mm = ops.int4_dequant_mm(x, packed, sz, gs)
    assert (y.double() - mm.double()).abs().max() <= exact.abs().max() * 2 ** -7


@pytest.mark.skipif(not BF16_MM_SETS, reason="neither AMX-BF16 nor AVX512_BF16 on this CPU")
@pytest.mark.parametrize("name", BF16_MM_SETS)
def test_tile_mm_takes_dequant_mm_where_its_tiles_do_not_fit(name):
    """A group of 16 k (not a multiple of the products' 32): int4_dequant_mm's bits."""
    ops = native.ops(name)
    packed, sz, _ = _layer(16, n=128, k=256)
    x = _x(40, 5, k=256)
    assert torch.equal(ops.int4_tile_mm(x, packed, sz, 16), ops.int4_dequant_mm(x, packed, sz, 16))


@needs_native
@pytest.mark.parametrize("rows,dequant_rows,bits,branch", [
    (40, 40, 16, "dequant_mm"), (41, 40, 16, "dequant_mm"), (39, 40, 16, "gemm"),
    (40, 0, 16, "gemm"), (3, 40, 16, "gemv"), (40, 40, 8, "gemm")])
def test_the_op_dequantizes_from_dequant_rows_on_for_w4a16_only(rows, dequant_rows, bits, branch):
    op = int4_linear.op()
    ops = native.ops()
    packed, sz, _ = _layer(64, n=208)
    x = _x(rows, 32)
    bias = _x(1, 33, 208)[0]
    want = {"dequant_mm": lambda: int4_linear.dequant_mm(ops)(x, packed, sz, 64),
            "gemm": lambda: ops.int4_gemm(x, packed, sz, 64, bits),
            "gemv": lambda: ops.int4_gemv(x, packed, sz, 64, bits)}[branch]() + bias
    fast = op(x, packed, sz, 64, 16, bias, bits, dequant_rows)
    assert torch.equal(fast, want)
    assert torch.equal(fast, _python_op(x, packed, sz, 64, 16, bias, bits, dequant_rows))


@needs_native
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


def _fresh(code: str, **env) -> list[str]:
    full = dict(os.environ, **env)
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                         timeout=300, check=True)
    return out.stdout.splitlines()


# A fresh process in which Linux refuses AMX's tile data: a seccomp filter, installed before
# anything else runs (so every later thread has it), makes arch_prctl(ARCH_REQ_XCOMP_PERM, ...)
# fail with EPERM, as a kernel before 5.16 or a sandbox would.
_REFUSE_AMX = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
LOAD, JEQ, RET = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
ALLOW, EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
code = [(LOAD, 0, 0, 4), (JEQ, 0, 5, 0xC000003E),  # seccomp_data.arch == AUDIT_ARCH_X86_64
        (LOAD, 0, 0, 0), (JEQ, 0, 3, 158),          # .nr == SYS_arch_prctl
        (LOAD, 0, 0, 16), (JEQ, 0, 1, 0x1023),      # .args[0] == ARCH_REQ_XCOMP_PERM
        (RET, 0, 0, EPERM), (RET, 0, 0, ALLOW)]
prog = Program(len(code), (Filter * len(code))(*[Filter(*c) for c in code]))
if libc.prctl(38, 1, 0, 0, 0) or libc.syscall(317, 1, 1, ctypes.byref(prog)):
    print("no seccomp here")  # PR_SET_NO_NEW_PRIVS; seccomp(SET_MODE_FILTER, TSYNC)
    raise SystemExit(0)
assert libc.syscall(158, 0x1023, 18) == -1 and ctypes.get_errno() == errno.EPERM
"""


@pytest.mark.skipif("amx" not in SETS, reason="the CPU has no AMX: no amx set to refuse")
def test_the_amx_set_refused_its_tiles_runs_its_gemm_on_the_avx512_tiles():
    """Linux gives a process AMX's tile data only once it asks; refused, the amx set's GEMM takes
    the avx512 set's tiles (amx_ready). A tile instruction run without the permission would end
    the process with SIGILL; here it gives the avx512 set's bits, prefill rows and decode rows."""
    out = _fresh(_REFUSE_AMX + (
        "import torch\n"
        "from vllm_omni.ops import int4_pack, native\n"
        "from vllm_omni.quantization import grid\n"
        "g = torch.Generator().manual_seed(0)\n"
        "qw = grid.quantize(torch.randn(240, 4864, generator=g).bfloat16(), 128)\n"
        "packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)\n"
        "for rows in (1, 40, 300):\n"
        "    x = torch.randn(rows, 4864, generator=g).bfloat16()\n"
        "    amx, avx512 = native.ops('amx'), native.ops('avx512')\n"
        "    same = all(torch.equal(getattr(amx, op)(x, packed, sz, 128),\n"
        "                           getattr(avx512, op)(x, packed, sz, 128))\n"
        "               for op in ('int4_gemm', 'int4_gemv'))\n"
        "    print(rows, amx.kernel_set(), same)\n"))
    if out == ["no seccomp here"]:
        pytest.skip("this kernel refuses a seccomp filter: no way to refuse AMX here")
    assert out == ["1 amx True", "40 amx True", "300 amx True"], out


def test_without_the_native_library_the_python_kernels_run():
    """A fresh process with the native sets switched off registers the Python functions."""
    out = _fresh(
        "import torch\n"
        "from vllm_omni.ops import int4_linear\n"
        "int4_linear.register()\n"
        "print(int4_linear.kernels())\n"
        "print([l for l in torch._C._dispatch_dump('vllm_omni::cpu_int4_linear').splitlines()"
        " if l.startswith('CPU:')][0])\n", **{envs.VLLM_OMNI_DISABLE_NATIVE_INT4: "1"})
    assert out[0] == "python" and "int4_linear.py" in out[1], out


@pytest.mark.parametrize("name", SETS)
def test_the_environment_forces_a_set_the_cpu_runs(name):
    """VLLM_OMNI_INT4_ISA makes a fresh process's ops run that set: how an AVX-512 machine runs
    the kernels an AVX2-only one gets."""
    out = _fresh("from vllm_omni.ops import int4_linear\n"
                 "int4_linear.register()\n"
                 "print(int4_linear.kernels())\n", **{envs.VLLM_OMNI_INT4_ISA: name})
    assert out == [name]


# ------------------------------------------------------------------------ selection, pure

X86_AVX2 = {"sse4_2", "avx", "avx2", "fma", "f16c"}


@pytest.mark.parametrize("flags,x86,want", [
    (X86_AVX2 | AVX512_FLAGS | {"avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}, True,
     "amx"),  # Sapphire Rapids
    (X86_AVX2 | AVX512_FLAGS | {"amx_tile"}, True, "avx512"),  # tiles without their int8 products
    (X86_AVX2 | AVX512_FLAGS | {"amx_tile", "amx_int8"}, True, "avx512"),  # nor bf16 ones
    (X86_AVX2 | AVX512_FLAGS | {"avx512_bf16", "amx_tile", "amx_int8"}, True, "avx512bf16"),
    (X86_AVX2 | AVX512_FLAGS | {"avx512_bf16"}, True, "avx512bf16"),  # Zen 4, Zen 5
    (X86_AVX2 | AVX512_FLAGS, True, "avx512"),  # Ice Lake
    (X86_AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, True, "avx2"),  # Skylake-SP
    (X86_AVX2, True, "avx2"),  # Zen 2/3, Haswell
    ({"sse4_2", "avx"}, True, "portable"),  # Sandy Bridge
    (set(), False, "portable"),  # aarch64
    (X86_AVX2 | AVX512_FLAGS, False, "portable"),  # flags of no use off x86
])
def test_selection_by_cpu_flags(flags, x86, want, monkeypatch):
    monkeypatch.delenv(envs.VLLM_OMNI_INT4_ISA, raising=False)
    ks, why = native.select(flags, x86)
    assert ks.name == want and "best set" in why


def test_a_forced_set_the_cpu_cannot_run_is_refused_naming_the_flags(monkeypatch, caplog):
    monkeypatch.setenv(envs.VLLM_OMNI_INT4_ISA, "avx512")
    with caplog.at_level(logging.WARNING, logger=native.logger.name):
        ks, why = native.select(X86_AVX2, True)
    assert ks.name == "avx2"
    assert "refused: the CPU lacks avx512f, avx512bw" in why
    assert "avx512_vnni, avx512vbmi; cpu_int4 uses the avx2 kernels" in caplog.text
    monkeypatch.setenv(envs.VLLM_OMNI_INT4_ISA, "AVX2")  # any case
    assert native.select(X86_AVX2 | AVX512_FLAGS, True)[0].name == "avx2"
    monkeypatch.setenv(envs.VLLM_OMNI_INT4_ISA, "neon")
    with caplog.at_level(logging.WARNING, logger=native.logger.name):
        assert native.select(X86_AVX2, True)[0].name == "avx2"
    assert "'neon' is not a kernel set (amx, avx512bf16, avx512, avx2, portable)" in caplog.text
    monkeypatch.setenv(envs.VLLM_OMNI_INT4_ISA, "auto")
    assert native.select(X86_AVX2 | AVX512_FLAGS, True)[0].name == "avx512"


def test_off_switch_gives_its_reason(monkeypatch):
    monkeypatch.setenv(envs.VLLM_OMNI_DISABLE_NATIVE_INT4, "1")
    status = native.load.__wrapped__()
    assert not status.available and envs.VLLM_OMNI_DISABLE_NATIVE_INT4 in status.reason


def test_a_failed_build_gives_way_to_the_next_set(monkeypatch, tmp_path):
    """The chosen set's compiler error goes into the reason, the next set the CPU runs loads;
    when every set fails, the Python kernels run and the reason lists each failure."""
    monkeypatch.setenv(envs.VLLM_OMNI_CACHE, str(tmp_path))
    monkeypatch.delenv(envs.VLLM_OMNI_INT4_ISA, raising=False)
    monkeypatch.setattr(native, "cpu_flags", lambda: X86_AVX2 | AVX512_FLAGS)
    monkeypatch.setattr(native, "is_x86", lambda: True)
    built = []

    def build(ks):
        built.append(ks.name)
        if ks.name != "portable":
            raise RuntimeError(f"Error building extension '{ks.library}'\n{ks.name}.cpp:1: boom")
        return f"/fake/{ks.library}.so"

    monkeypatch.setattr(native, "_build_and_load", build)
    native.load_set.cache_clear()
    try:
        status = native.load.__wrapped__()
        assert built == ["avx512", "avx2", "portable"]
        assert status.available and status.kernel_set == "portable"
        assert "avx512: build in" in status.reason and str(tmp_path) in status.reason
        assert "Error building extension 'vllm_omni_int4_avx2'" in status.reason
        monkeypatch.setattr(native, "_build_and_load",
                            lambda ks: (_ for _ in ()).throw(RuntimeError("no compiler")))
        native.load_set.cache_clear()
        status = native.load.__wrapped__()
        assert not status.available and status.reason.count("no compiler") == 3
    finally:
        native.load_set.cache_clear()


def test_build_dir_is_keyed_on_sources_flags_and_torch(monkeypatch, tmp_path):
    monkeypatch.setenv(envs.VLLM_OMNI_CACHE, str(tmp_path))
    ks = native.BY_NAME["avx2"]
    a = native.set_dir(ks)
    assert a.parent == tmp_path / "ext" and a.name.startswith(ks.library)
    assert native.set_dir(native.BY_NAME["portable"]) != a
    assert native.build_dir(ks.library, (ks.source,), ks.cflags) != a  # the headers count
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert native.set_dir(ks) != a


def test_build_dir_is_one_per_checkout(monkeypatch, tmp_path):
    """The same sources at another path (a second work tree) build in a directory of their own:
    a shared one was rebuilt at every switch, its build.ninja naming the other path."""
    monkeypatch.setenv(envs.VLLM_OMNI_CACHE, str(tmp_path / "cache"))
    ks = native.BY_NAME["avx2"]
    copy = tmp_path / "checkout" / ks.source.name
    copy.parent.mkdir()
    copy.write_bytes(ks.source.read_bytes())
    assert native.build_dir(ks.library, (copy,), ks.cflags) != \
        native.build_dir(ks.library, (ks.source,), ks.cflags)
    assert native.build_dir(ks.library, (copy,), ks.cflags) == \
        native.build_dir(ks.library, (copy,), ks.cflags)


# ------------------------------------------------------------------------ the greedy argmax

def _logits(rows, vocab, dtype, seed):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 15, 16, 17, 33, 32000])
def test_greedy_argmax_picks_what_vllms_does(name, dtype, vocab):
    """vLLM's CPU sampler: fp32 logits into _C::greedy_argmax. The native one reads bf16 as is,
    and must give the same index, ties (the first) and infinities included."""
    import vllm._custom_ops  # noqa: F401  registers torch.ops._C

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
        got = native.ops(name).greedy_argmax(x)
        assert got.dtype == torch.int64 and torch.equal(got, want), (x, got, want)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("at", [40, 99])  # in the vector part, in the tail
def test_greedy_argmax_returns_nothing_for_logits_with_a_nan(name, at):
    x = _logits(2, 100, torch.bfloat16, 0)
    x[1, at] = float("nan")
    ops = native.ops(name)
    assert ops.greedy_argmax(x).numel() == 0
    assert ops.greedy_argmax(x[:1]).tolist() == [int(x[0].float().argmax())]
