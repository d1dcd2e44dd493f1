"""The checkpoint format: nibble packing and the asymmetric min/max grid."""

import pytest
import torch

from vllm_omni.quantization import grid


def test_nibble_pack_round_trip_low_nibble_first():
    codes = torch.randint(0, 16, (48, 256), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(1))
    packed = grid.pack_nibbles(codes)
    assert packed.shape == (48, 128) and packed.dtype == torch.uint8
    assert torch.equal(grid.unpack_nibbles(packed), codes)
    assert int(packed[0, 0]) == int(codes[0, 0]) | (int(codes[0, 1]) << 4)


@pytest.mark.parametrize("group_size", grid.GROUP_SIZES)
def test_error_per_group_bounded_by_half_scale(group_size):
    gen = torch.Generator().manual_seed(group_size)
    w = (torch.randn(64, 512, generator=gen) * torch.rand(64, 1, generator=gen)).bfloat16()
    codes, scale, zero = grid.quantize_codes(w, group_size)
    assert codes.max() <= 15
    assert scale.shape == zero.shape == (64, 512 // group_size)
    back = grid.dequantize_codes(codes, scale, zero, torch.float32)
    err = (back - w.float()).abs().view(64, -1, group_size).amax(-1)
    # scale/2, plus the bf16 rounding of scale (2^-8 relative, times 15 steps) and of zero
    bound = scale.float() / 2 * (1 + 15 * 2 ** -8) + zero.float().abs() * 2 ** -8 + 1e-6
    assert (err <= bound).all(), (err / bound).max()


def test_constant_group_is_exact_and_zero_scale():
    w = torch.full((16, 128), 0.25, dtype=torch.bfloat16)
    qw = grid.quantize(w, 128)
    assert torch.equal(qw.scale, torch.zeros_like(qw.scale))
    assert torch.equal(grid.dequantize(qw), w)


def test_formula_matches_spec():
    w = torch.linspace(-1, 2, 128).bfloat16().unsqueeze(0).repeat(16, 1)
    codes, scale, zero = grid.quantize_codes(w, 128)
    s = (w.float().max() - w.float().min()) / 15
    assert scale[0, 0].float() == pytest.approx(s.item(), rel=2 ** -8)
    assert zero[0, 0].float() == pytest.approx((w.float().min() + 8 * s).item(), rel=2 ** -7)
    assert codes[0, 0] == 0 and codes[0, -1] == 15


def test_k_not_divisible_by_group_is_rejected():
    with pytest.raises(ValueError, match="group_size=128"):
        grid.quantize_codes(torch.zeros(16, 96), 128)
