"""The cpu_int4_linear custom op: both branches against dequantize-then-matmul, for the
registered op (the native C++ kernel where it loads) and for its Python kernel."""

import pytest
import torch
import torch.nn.functional as F

from vllm_omni.ops import int4_linear, int4_pack, native
from vllm_omni.quantization import grid

pytestmark = pytest.mark.native  # builds or loads vllm_omni's C++ kernel sets

N, K = 208, 512  # 3 full 64-row blocks and a 16-row tail


@pytest.fixture(scope="module", params=["registered", "python"])
def op(request):
    registered = int4_linear.op()
    return registered if request.param == "registered" else int4_linear.cpu_int4_linear


def _layer(group_size):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(group_size)).bfloat16()
    qw = grid.quantize(w, group_size)
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    return packed, sz, grid.dequantize(qw)


@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
@pytest.mark.parametrize("rows", [1, 2, 7, 64])
def test_op_equals_dequantize_then_matmul(op, group_size, rows):
    packed, sz, w = _layer(group_size)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).bfloat16()
    ref = F.linear(x.float(), w.float())
    scale = ref.abs().max()
    few = op(x, packed, sz, group_size, 1 << 30)  # below the threshold: the int4 GEMV
    many = op(x, packed, sz, group_size, 0)  # at/above it: the int4 GEMM (or dequantize + matmul)
    assert few.shape == many.shape == (rows, N) and many.dtype == torch.bfloat16
    # both are within bf16 output rounding of the fp32 reference
    assert (few.float() - ref).abs().max() <= scale * 2 ** -7
    assert (many.float() - ref).abs().max() <= scale * 2 ** -7
    if native.available():  # the native sets' two branches are one arithmetic
        assert torch.equal(few, many)


@pytest.mark.parametrize("native_ok,torch_reads,n,rows,want", [
    (True, True, 208, 3, ["native int4_gemv"]),
    (True, False, 192, 4, ["native int4_gemm"]),
    (False, True, 192, 3, ["torch int4 GEMM"]),
    (False, False, 192, 3, ["python dequantize"]),  # torch's build lays blocks out otherwise
    (False, True, 208, 3, ["python dequantize"]),  # a tail block torch cannot read
    (False, True, 192, 4, ["python dequantize"]),
])
def test_the_python_kernel_picks_its_branch(native_ok, torch_reads, n, rows, want, monkeypatch):
    """Below the threshold (4 rows) the int4 GEMV: the native set's, else torch's where torch
    reads the layout; at or above it the native set's int4 GEMM; without a native set, where
    nothing reads the layout or at the threshold, dequantize + matmul."""
    w = torch.randn(n, K, generator=torch.Generator().manual_seed(n)).bfloat16()
    packed, sz = int4_pack.quantize_and_pack(w, 128)
    calls = []
    real_ops = native.ops()

    class Spy:  # the native set's ops, recording which ran
        def __getattr__(self, name):
            real = getattr(real_ops, name)
            return lambda *a: calls.append(f"native {name}") or real(*a)

    real_torch = torch.ops.aten._weight_int4pack_mm_for_cpu
    real_chunks = int4_pack.dequantize_t_chunks
    monkeypatch.setattr(native, "available", lambda: native_ok)
    monkeypatch.setattr(native, "ops", lambda name=None, spy=Spy(): spy)
    monkeypatch.setattr(int4_pack, "torch_reads_pack", lambda: torch_reads)
    monkeypatch.setattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu",
                        lambda *a: calls.append("torch int4 GEMM") or real_torch(*a))
    monkeypatch.setattr(int4_pack, "dequantize_t_chunks",
                        lambda *a, **k: calls.append("python dequantize") or real_chunks(*a, **k))
    y = int4_linear.cpu_int4_linear(torch.randn(rows, K).bfloat16(), packed, sz, 128, 4)
    assert calls == want and y.shape == (rows, n)


def test_bias_and_leading_dims(op):
    packed, sz, w = _layer(64)
    x = torch.randn(2, 3, K).bfloat16()
    bias = torch.randn(N).bfloat16()
    y = op(x, packed, sz, 64, 0, bias)
    assert y.shape == (2, 3, N)
    ref = F.linear(x, w, bias)
    assert (y.float() - ref.float()).abs().max() <= ref.float().abs().max() * 2 ** -6


def test_op_is_opaque_to_torch_compile():
    """One graph, no break, no guard on the row count: the branch lives inside the op."""
    op = int4_linear.op()
    packed, sz, _ = _layer(128)
    torch._dynamo.reset()
    counts = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counts, fullgraph=True, dynamic=True)
    def f(x):
        return op(x, packed, sz, 128, 4) * 2

    # 1 is left out (dynamo specialises sizes 0 and 1); 2 is not first (duck sizing would tie it
    # to the trailing 2 of scales_and_zeros)
    for rows in (3, 4, 9, 2):
        y = f(torch.randn(rows, K).bfloat16())
        assert y.shape == (rows, N)
    assert counts.frame_count == 1


def test_register_is_idempotent():
    int4_linear.register()
    int4_linear.register()
    assert int4_linear.registered()
