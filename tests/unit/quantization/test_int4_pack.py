"""torch's CPU int4 pack: our exact unpacking, row gathers, chunked repack."""

import pytest
import torch

from vllm_omni.ops import int4_pack
from vllm_omni.quantization import grid


def _codes(n, k, seed=0):
    return torch.randint(0, 16, (n, k), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


def test_layout_is_recognised():
    assert int4_pack.layout() in int4_pack.CANDIDATES


@pytest.mark.parametrize("n,k", [(16, 64), (48, 128), (80, 64), (128, 256), (336, 128)])
def test_unpack_is_exact_inverse_of_the_pack_op(n, k):
    codes = _codes(n, k)
    packed = int4_pack._convert(codes)
    assert packed.shape == (n, k // 2)
    assert torch.equal(int4_pack.unpack_codes(packed, n, k), codes)


@pytest.mark.parametrize("n", [64, 80, 336])
def test_gather_rows_matches_unpack(n):
    codes = _codes(n, 128, seed=n)
    packed = int4_pack._convert(codes)
    rows = torch.tensor([0, 1, 31, 32, 63, n - 1, n - 2, 5])
    assert torch.equal(int4_pack.gather_codes(packed, rows, n, 128), codes[rows])


def test_chunked_repack_equals_one_shot():
    n, k = 336, 256  # 5 full blocks and a 16-row tail
    qw = grid.quantize(torch.randn(n, k).bfloat16(), 64)
    whole = int4_pack._convert(grid.unpack_nibbles(qw.packed))
    block = int4_pack.layout().block_n
    packed, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero, chunk_bytes=block * 4 * k)
    assert int4_pack.chunk_rows(k, block * 4 * k) == block
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
