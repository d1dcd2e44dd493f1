"""The one weight layout cpu_int4 keeps at run time, owned by vllm_omni, and exact unpacking.

The layout (every CPU, every kernel set: ``csrc/int4_avx512.cpp``, ``int4_avx2.cpp``,
``int4_portable.cpp`` and the Python code here all read it). A weight [N, K] of 4-bit codes is
uint8 [N, K/2], in blocks of ``BLOCK_N`` = 64 output rows (the last block has the ``w = N % 64``
rows left, when N is not a multiple of 64). Block b starts at flat byte ``first_row * K/2`` and is
k-major inside: byte ``k * w/2 + j`` (``j < w/2``) holds row ``j``'s code in its low nibble and
row ``j + w/2``'s in its high nibble. A full block is 32 bytes per k.

Full blocks are the arrangement torch's AVX-512 build of
``torch.ops.aten._convert_weight_to_int4pack_for_cpu`` makes; its AVX2 and default builds make
others (blocks of 32 rows, two neighbouring rows per byte), which is why vllm_omni packs the
weights itself rather than with torch's op: one checkpoint, one repacked layout on every CPU.
:func:`torch_reads_pack` probes (never raising) whether torch's own int4 GEMM reads this layout
here, which lets the Python fallback use it for full blocks.

Blocks are independent and laid out in row order, so packing in chunks of whole blocks and
concatenating gives the same bytes as packing all rows at once: :func:`repack` uses that to keep
the code buffers small. N must be a multiple of 16 (so that w is even).
"""

from __future__ import annotations

import functools
import logging

import torch

from vllm_omni.quantization import grid

logger = logging.getLogger(__name__)

BLOCK_N = 64
# Rows whose int32 codes are materialised at once while repacking (times K x 4 bytes).
REPACK_CHUNK_BYTES = 64 << 20
# Quantizing makes about five fp32 temporaries of a chunk (grid.quantize_codes): at 64 MiB that
# was a ~300 MiB transient on top of an engine quantizing at load; 8 MiB costs no time.
QUANTIZE_CHUNK_BYTES = 8 << 20


def blocks(n: int, k: int) -> list[tuple[int, int, int]]:
    """(first row, rows w, first flat byte) of each block of an [n, k] weight."""
    return [(row, min(BLOCK_N, n - row), row * k // 2) for row in range(0, n, BLOCK_N)]


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 [n, k] (any integer dtype) -> the layout, uint8 [n, k/2]."""
    n, k = codes.shape
    if n % 16 or k % 2:
        raise ValueError(f"int4 pack: N must be a multiple of 16 and K even, got [{n}, {k}]")
    c = codes.to(torch.uint8)
    flat = torch.empty(n * k // 2, dtype=torch.uint8)
    full = n // BLOCK_N
    if full:
        blk = c[:full * BLOCK_N].view(full, BLOCK_N, k).transpose(1, 2)  # [full, k, 64]
        half = BLOCK_N // 2
        flat[:full * BLOCK_N * k // 2].view(full, k, half).copy_(
            blk[..., :half] | (blk[..., half:] << 4))
    if n % BLOCK_N:
        w = n % BLOCK_N
        tail = c[full * BLOCK_N:].t()  # [k, w]
        flat[full * BLOCK_N * k // 2:].view(k, w // 2).copy_(tail[:, :w // 2] | (tail[:, w // 2:] << 4))
    return flat.view(n, k // 2)


@functools.cache
def torch_reads_pack() -> bool:
    """Whether torch's ``_weight_int4pack_mm_for_cpu`` reads full blocks of this layout here
    (torch's AVX-512 build does): its pack op is asked to pack a probe, and the bytes compared.
    Never raises: an op that is missing or fails means no."""
    gen = torch.Generator().manual_seed(0)
    probe = torch.randint(0, 16, (BLOCK_N, 64), dtype=torch.int32, generator=gen)
    try:
        theirs = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 2)
    except Exception as exc:  # an op that moved or refuses: the Python path dequantizes instead
        logger.info("vllm_omni: torch's int4 pack op is not usable here (%s)", exc)
        return False
    return theirs.shape == (BLOCK_N, 32) and torch.equal(theirs, pack(probe))


def _halves(b: torch.Tensor) -> torch.Tensor:
    """Bytes [..., w/2] of one k -> codes [..., w]: low nibbles are rows 0..w/2-1, high the rest."""
    return torch.cat((b & 0x0F, b >> 4), dim=-1)


def unpack_codes(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """uint8 codes [n, k] from the layout (exact inverse of :func:`pack`).

    ``packed`` may also be a slice of whole blocks of a bigger pack (``packed[r0:r1]`` with r0 a
    multiple of the block size): blocks are self-contained.
    """
    flat = packed.reshape(-1)
    full = n // BLOCK_N
    parts = []
    if full:
        b = flat[:full * BLOCK_N * k // 2].view(full, k, BLOCK_N // 2)
        parts.append(_halves(b).transpose(1, 2).reshape(full * BLOCK_N, k))
    if n % BLOCK_N:
        w = n % BLOCK_N
        parts.append(_halves(flat[full * BLOCK_N * k // 2:].view(k, w // 2)).t())
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)


def gather_codes(packed: torch.Tensor, rows: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """uint8 codes [len(rows), k] of the given rows only (an embedding lookup)."""
    rows = rows.reshape(-1).long()
    first = rows // BLOCK_N * BLOCK_N
    half = torch.clamp(n - first, max=BLOCK_N) // 2
    local = rows - first
    shift = ((local // half) * 4).to(torch.uint8)
    # flat byte of (row, kk) = first * k/2 + kk * w/2 + local % (w/2)
    base = first * (k // 2) + local % half
    idx = base.unsqueeze(1) + torch.arange(k).unsqueeze(0) * half.unsqueeze(1)
    b = packed.reshape(-1)[idx]
    return (b >> shift.unsqueeze(1)) & 0x0F


def scales_and_zeros(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """bf16 [N, G] scale and zero -> the kernels' [G, N, 2] (scale, zero)."""
    return torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)


def dequantize_t(packed: torch.Tensor, sz: torch.Tensor, k: int) -> torch.Tensor:
    """The transposed weight W^T, bf16 [K, N], from the layout and its [G, N, 2] scales/zeros.

    K-major is the layout's own order inside a block, so unpacking copies runs of whole blocks
    instead of transposing element by element, and the scales broadcast as [G, 1, N]. The math
    is done in place: ``q - 8`` (exact in bf16), then ``addcmul`` computes ``(q - 8) * scale + zero``
    in fp32 and rounds once to bf16.
    """
    n = sz.shape[1]
    full = n // BLOCK_N
    half = BLOCK_N // 2
    flat = packed.reshape(-1)
    wt = torch.empty(k, n, dtype=torch.bfloat16)
    if full:
        b = flat[:full * BLOCK_N * k // 2].view(full, k, half).transpose(0, 1)  # [k, full, 32]
        dst = wt[:, :full * BLOCK_N].view(k, full, BLOCK_N)
        dst[:, :, :half].copy_(b & 0x0F)
        dst[:, :, half:].copy_(b >> 4)
    if n % BLOCK_N:
        w = n % BLOCK_N
        wt[:, full * BLOCK_N:].copy_(_halves(flat[full * BLOCK_N * k // 2:].view(k, w // 2)))
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
    return max(BLOCK_N, (chunk_bytes // max(1, 4 * k)) // BLOCK_N * BLOCK_N)


def repack(weight_packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
           chunk_bytes: int = REPACK_CHUNK_BYTES,
           empty=None, after_chunk=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint format -> (the layout uint8 [N, K/2], scales_and_zeros bf16 [G, N, 2]).

    Works in row chunks of whole blocks so only one chunk of codes exists at a time.
    ``empty(shape, dtype)`` allocates the two results (cpu_int4 passes weight_arena's;
    default: torch's allocator); ``after_chunk`` as in :func:`quantize_and_pack`.
    """
    n, half_k = weight_packed.shape
    k = half_k * 2
    out = _empty(empty, (n, half_k), torch.uint8)
    step = chunk_rows(k, chunk_bytes)
    for r in range(0, n, step):
        out[r:r + step] = pack(grid.unpack_nibbles(weight_packed[r:r + step]))
        if after_chunk is not None:  # as in quantize_and_pack
            after_chunk()
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
                      chunk_bytes: int = QUANTIZE_CHUNK_BYTES,
                      empty=None, after_chunk=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 weight [N, K] straight to the layout (quantize at load), in row chunks;
    ``empty`` as in :func:`repack`; ``after_chunk()``, if given, runs after each chunk (the
    engine returns the chunk's freed temporaries to the kernel there)."""
    n, k = w.shape
    out = _empty(empty, (n, k // 2), torch.uint8)
    scales, zeros = [], []
    step = chunk_rows(k, chunk_bytes)
    for r in range(0, n, step):
        codes, s, z = grid.quantize_codes(w[r:r + step], group_size)
        out[r:r + step] = pack(codes)
        scales.append(s)
        zeros.append(z)
        del codes
        if after_chunk is not None:
            after_chunk()
    return out, _placed(scales_and_zeros(torch.cat(scales), torch.cat(zeros)), empty)
