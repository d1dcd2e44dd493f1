"""The cpu_int4 checkpoint format: an asymmetric 4-bit min/max grid per group of K.

For one group of ``group_size`` weights along K (the input dimension):
``scale = (max - min) / 15``, ``zero = min + 8 * scale``, ``q = clamp(round((w - min) / scale), 0, 15)``
and the weight comes back as ``(q - 8) * scale + zero``. That is the value
``torch.ops.aten._weight_int4pack_mm_for_cpu`` computes from a code, so the same scales and
zeros serve the kernel and every dequantization.

On disk, per linear layer: ``weight_packed`` uint8 [N, K/2] with code k in the low nibble of byte
k // 2 when k is even (low nibble first), ``weight_scale`` and ``weight_zero`` bf16 [N, K/group].
Pure torch; no vLLM import.
"""

from __future__ import annotations

import dataclasses

import torch

GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 128
# Tensor names of one quantized layer in a checkpoint, and their dtypes.
PACKED, SCALE, ZERO = "weight_packed", "weight_scale", "weight_zero"
TENSOR_DTYPES = {PACKED: torch.uint8, SCALE: torch.bfloat16, ZERO: torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """One layer in the checkpoint format."""

    packed: torch.Tensor  # uint8 [N, K/2]
    scale: torch.Tensor  # bf16 [N, K/group]
    zero: torch.Tensor  # bf16 [N, K/group]

    @property
    def group_size(self) -> int:
        return self.packed.shape[1] * 2 // self.scale.shape[1]


def expected_shapes(n: int, k: int, group_size: int) -> dict[str, tuple[int, int]]:
    """The shape of each checkpoint tensor for a weight of shape [n, k]."""
    return {PACKED: (n, k // 2), SCALE: (n, k // group_size), ZERO: (n, k // group_size)}


def quantize_codes(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor,
                                                               torch.Tensor]:
    """Codes (uint8 [N, K], 0..15), scale and zero (bf16 [N, K/group]) for a weight [N, K].

    Computed in fp32; the bf16-rounded scale and zero are the ones used to pick the codes, so the
    codes are the nearest grid points of the grid that is actually stored.
    """
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"K={k} does not divide by group_size={group_size}")
    g = w.float().reshape(n, k // group_size, group_size)
    lo = g.amin(dim=-1)
    hi = g.amax(dim=-1)
    scale = ((hi - lo) / 15).to(torch.bfloat16)
    zero = (lo + 8 * scale.float()).to(torch.bfloat16)
    s = scale.float()
    # The grid's minimum after bf16 rounding: zero - 8 * scale.
    base = zero.float() - 8 * s
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round((g - base.unsqueeze(-1)) / safe.unsqueeze(-1)).clamp_(0, 15)
    q = torch.where((s > 0).unsqueeze(-1), q, torch.full_like(q, 8))
    return q.to(torch.uint8).reshape(n, k), scale, zero


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (0..15) -> uint8 [N, K/2], even k in the low nibble."""
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> uint8 codes [N, K] (the inverse of :func:`pack_nibbles`)."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)


def dequantize_codes(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(q - 8) * scale + zero, per group, computed in fp32 and returned as ``dtype``."""
    n, k = codes.shape
    groups = scale.shape[1]
    q = codes.float().reshape(n, groups, k // groups) - 8
    w = q * scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)
    return w.reshape(n, k).to(dtype)


def quantize(w: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> QuantizedWeight:
    """A weight [N, K] in the checkpoint format."""
    codes, scale, zero = quantize_codes(w, group_size)
    return QuantizedWeight(pack_nibbles(codes), scale, zero)


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return dequantize_codes(unpack_nibbles(qw.packed), qw.scale, qw.zero, dtype)
