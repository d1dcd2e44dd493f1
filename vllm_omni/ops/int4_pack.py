"""The one weight layout cpu_int4 keeps at run time: torch's CPU int4 pack, and exact unpacking.

``torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes int32 [N, K], innerKTiles)`` returns
uint8 [N, K/2] arranged in blocks of ``BLOCK_N`` rows (64 on AVX-512 builds, 32 otherwise; see
aten/src/ATen/native/cpu/int4mm_kernel.cpp, ``weight_to_int4pack_kernel``). Block b occupies
bytes ``[b * BLOCK_N * K/2, (b+1) * BLOCK_N * K/2)`` of the flat tensor, k-major inside it:

- a full AVX-512 block: byte ``k * 32 + (n % 32)``, row n's code in the low nibble when
  ``n % 64 < 32``, in the high nibble otherwise;
- every other block (a partial last block, or any block on non-AVX-512 builds): with
  ``w = rows in the block``, byte ``k * w/2 + n_local // 2``, the low nibble for even n_local.

Which of the two the running torch uses is found once by packing a probe and comparing (see
:func:`layout`), so unpacking stays exact if the kernel's layout changes; an unknown layout raises
instead of dequantizing garbage. Rows at or past ``N`` do not exist: N must be a multiple of 16.

Because blocks are independent and laid out in row order, packing in chunks of whole blocks and
concatenating gives the same bytes as packing all rows at once: :func:`repack` uses that to keep
the int32 code buffer small.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from vllm_omni.quantization import grid

# innerKTiles argument of the CPU pack op. The CPU kernel checks it but does not change the
# layout with it; 2 is what torchao passes.
INNER_K_TILES = 2
# Rows whose int32 codes are materialised at once while repacking (times K x 4 bytes).
REPACK_CHUNK_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class PackLayout:
    block_n: int  # rows per block
    split_full_blocks: bool  # full blocks use the "low half / high half" AVX-512 arrangement

    def rows_bytes(self, n: int, k: int) -> list[tuple[int, int, int, bool]]:
        """(first row, rows, first flat byte, split) for each block of an [n, k] weight."""
        out, row = [], 0
        while row < n:
            w = min(self.block_n, n - row)
            out.append((row, w, row * k // 2, self.split_full_blocks and w == self.block_n))
            row += w
        return out


def _convert(codes: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        codes.to(torch.int32).contiguous(), INNER_K_TILES)


def _pack_with(lay: PackLayout, codes: torch.Tensor) -> torch.Tensor:
    """Our own implementation of the layout (used only to recognise the kernel's)."""
    n, k = codes.shape
    c = codes.to(torch.uint8)
    flat = torch.empty(n * k // 2, dtype=torch.uint8)
    for row, w, start, split in lay.rows_bytes(n, k):
        blk = c[row:row + w].t()  # [k, w]
        if split:
            half = w // 2
            b = blk[:, :half] | (blk[:, half:] << 4)
        else:
            b = blk[:, 0::2] | (blk[:, 1::2] << 4)
        flat[start:start + w * k // 2] = b.reshape(-1)
    return flat.view(n, k // 2)


CANDIDATES = (PackLayout(64, True), PackLayout(32, False), PackLayout(64, False))


@functools.cache
def layout() -> PackLayout:
    """The layout of this torch build's CPU int4 pack, found by packing a probe once."""
    gen = torch.Generator().manual_seed(0)
    probe = torch.randint(0, 16, (80, 64), dtype=torch.int32, generator=gen)  # 1 full + 1 tail
    got = _convert(probe)
    for cand in CANDIDATES:
        if torch.equal(_pack_with(cand, probe), got):
            return cand
    raise RuntimeError(
        "torch.ops.aten._convert_weight_to_int4pack_for_cpu uses a layout vllm_omni does not "
        f"know (torch {torch.__version__}); cpu_int4 cannot unpack it exactly")


def unpack_codes(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """uint8 codes [n, k] from the CPU pack (exact inverse of the pack op).

    ``packed`` may also be a slice of whole blocks of a bigger pack (``packed[r0:r1]`` with r0 a
    multiple of the block size): blocks are self-contained.
    """
    lay = layout()
    flat = packed.reshape(-1)
    bn = lay.block_n
    full = n // bn
    parts = []
    if full:
        b = flat[:full * bn * k // 2].view(full, k, bn // 2)
        lo, hi = b & 0x0F, b >> 4
        if lay.split_full_blocks:
            blk = torch.cat((lo, hi), dim=-1)  # [full, k, bn]: rows 0..bn/2-1 low, rest high
        else:
            blk = torch.stack((lo, hi), dim=-1).reshape(full, k, bn)
        parts.append(blk.transpose(1, 2).reshape(full * bn, k))
    if n % bn:
        w = n % bn
        b = flat[full * bn * k // 2:].view(k, w // 2)
        parts.append(torch.stack((b & 0x0F, b >> 4), dim=-1).reshape(k, w).t())
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)


def gather_codes(packed: torch.Tensor, rows: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """uint8 codes [len(rows), k] of the given rows only (an embedding lookup)."""
    lay = layout()
    rows = rows.reshape(-1).long()
    block = rows // lay.block_n
    first = block * lay.block_n
    width = torch.clamp(n - first, max=lay.block_n)
    local = rows - first
    split = lay.split_full_blocks & (width == lay.block_n)
    half = width // 2
    col = torch.where(split, local % half, local // 2)
    shift = torch.where(split, (local // half) * 4, (local % 2) * 4).to(torch.uint8)
    # flat byte of (row, kk) = first * k/2 + kk * width/2 + col
    base = first * (k // 2) + col
    idx = base.unsqueeze(1) + torch.arange(k).unsqueeze(0) * half.unsqueeze(1)
    b = packed.reshape(-1)[idx]
    return (b >> shift.unsqueeze(1)) & 0x0F


def scales_and_zeros(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """bf16 [N, G] scale and zero -> the kernel's [G, N, 2] (scale, zero)."""
    return torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)


def dequantize_t(packed: torch.Tensor, sz: torch.Tensor, k: int) -> torch.Tensor:
    """The transposed weight W^T, bf16 [K, N], from the CPU pack and its [G, N, 2] scales/zeros.

    K-major is the pack's own order inside a block, so unpacking copies runs of whole blocks
    instead of transposing element by element, and the scales broadcast as [G, 1, N]. The math
    is done in place: ``q - 8`` (exact in bf16), then ``addcmul`` computes ``(q - 8) * scale + zero``
    in fp32 and rounds once to bf16.
    """
    lay = layout()
    n = sz.shape[1]
    bn = lay.block_n
    full = n // bn
    flat = packed.reshape(-1)
    wt = torch.empty(k, n, dtype=torch.bfloat16)
    if full:
        b = flat[:full * bn * k // 2].view(full, k, bn // 2)
        dst = wt[:, :full * bn].view(k, full, bn)
        if lay.split_full_blocks:
            dst[:, :, :bn // 2].copy_((b & 0x0F).transpose(0, 1))
            dst[:, :, bn // 2:].copy_((b >> 4).transpose(0, 1))
        else:
            dst.copy_(torch.stack((b & 0x0F, b >> 4), dim=-1).reshape(full, k, bn)
                      .transpose(0, 1))
    if n % bn:
        w = n % bn
        b = flat[full * bn * k // 2:].view(k, w // 2)
        wt[:, full * bn:].copy_(torch.stack((b & 0x0F, b >> 4), dim=-1).reshape(k, w))
    groups = sz.shape[0]
    v = wt.view(groups, k // groups, n)
    scale = sz[:, :, 0].unsqueeze(1).contiguous()  # strided operands are ~3x slower
    zero = sz[:, :, 1].unsqueeze(1).contiguous()
    torch.addcmul(zero, v.sub_(8), scale, out=v)
    return wt


def dequantize(packed: torch.Tensor, sz: torch.Tensor, k: int) -> torch.Tensor:
    """The bf16 weight [N, K] (the transpose of :func:`dequantize_t`, same values)."""
    return dequantize_t(packed, sz, k).t().contiguous()


def dequantize_t_chunks(packed: torch.Tensor, sz: torch.Tensor, k: int,
                        chunk_bytes: int = REPACK_CHUNK_BYTES):
    """Yield (first row, W^T chunk bf16 [K, rows]) over chunks of whole blocks."""
    n = sz.shape[1]
    step = chunk_rows(k, chunk_bytes)
    for r in range(0, n, step):
        yield r, dequantize_t(packed[r:r + step], sz[:, r:r + step], k)


def dequantize_rows(packed: torch.Tensor, sz: torch.Tensor, rows: torch.Tensor, k: int
                    ) -> torch.Tensor:
    """Rows [len(rows), K] of the bf16 weight, same values as :func:`dequantize`: what an
    embedding lookup needs, without unpacking the other rows."""
    n = sz.shape[1]
    flat_rows = rows.reshape(-1).long()
    codes = gather_codes(packed, flat_rows, n, k)
    groups = sz.shape[0]
    scale = sz[:, :, 0].t()[flat_rows].unsqueeze(-1)
    zero = sz[:, :, 1].t()[flat_rows].unsqueeze(-1)
    w = codes.to(torch.bfloat16).view(-1, groups, k // groups).sub_(8)
    return torch.addcmul(zero, w, scale, out=w).view(-1, k)


def chunk_rows(k: int, chunk_bytes: int = REPACK_CHUNK_BYTES) -> int:
    """Rows per chunk: whole blocks, about ``chunk_bytes`` of 4-byte values per row of K."""
    block = layout().block_n
    return max(block, (chunk_bytes // max(1, 4 * k)) // block * block)


def repack(weight_packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
           chunk_bytes: int = REPACK_CHUNK_BYTES,
           empty=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint format -> (CPU pack uint8 [N, K/2], scales_and_zeros bf16 [G, N, 2]).

    Works in row chunks of whole blocks so only one chunk of int32 codes exists at a time.
    ``empty(shape, dtype)`` allocates the two results (cpu_int4 passes weight_arena's;
    default: torch's allocator).
    """
    n, half_k = weight_packed.shape
    k = half_k * 2
    out = _empty(empty, (n, half_k), torch.uint8)
    step = chunk_rows(k, chunk_bytes)
    for r in range(0, n, step):
        codes = grid.unpack_nibbles(weight_packed[r:r + step])
        out[r:r + step] = _convert(codes)
    return out, _placed(scales_and_zeros(scale, zero), empty)


def _empty(empty, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype) if empty is None else empty(shape, dtype)


def _placed(t: torch.Tensor, empty) -> torch.Tensor:
    """``t`` itself, or its values in a tensor from ``empty``."""
    if empty is None:
        return t
    out = empty(tuple(t.shape), t.dtype)
    out.copy_(t)
    return out


def quantize_and_pack(w: torch.Tensor, group_size: int,
                      chunk_bytes: int = REPACK_CHUNK_BYTES,
                      empty=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 weight [N, K] straight to the CPU pack (quantize at load), in row chunks;
    ``empty`` as in :func:`repack`."""
    n, k = w.shape
    out = _empty(empty, (n, k // 2), torch.uint8)
    scales, zeros = [], []
    step = chunk_rows(k, chunk_bytes)
    for r in range(0, n, step):
        codes, s, z = grid.quantize_codes(w[r:r + step], group_size)
        out[r:r + step] = _convert(codes)
        scales.append(s)
        zeros.append(z)
    return out, _placed(scales_and_zeros(torch.cat(scales), torch.cat(zeros)), empty)
