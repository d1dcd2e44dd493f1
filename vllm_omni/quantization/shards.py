"""Safetensors files written and read a piece at a time, so no whole checkpoint is ever in memory.

``safetensors.torch.save_file`` needs every tensor of a file in memory at once, and
``safe_open`` maps the file, so every page it reads stays in the process's RSS until it is
closed: a 6 GB checkpoint read through it costs 6 GB of RSS. Here the header is written first
from the tensors' declared dtypes and shapes, then each tensor's bytes are appended in
whatever pieces the caller produces (rows of an embedding, say), and tensors are read back with
``pread`` into a buffer of the size asked for. The files are ordinary safetensors files that
``safe_open`` and vLLM read.

Pure torch and the standard library; no vLLM import.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

DTYPES: dict[torch.dtype, str] = {
    torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
    torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.bool: "BOOL",
}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}
_ALIGN = 8  # the header is padded with spaces so the data starts 8-byte aligned
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def header_bytes(specs: Iterable[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length and the JSON header of a file holding ``specs`` in this order."""
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for s in specs:
        header[s.name] = {"dtype": DTYPES[s.dtype], "shape": list(s.shape),
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % _ALIGN)
    return struct.pack("<Q", len(text)) + text


def file_bytes(specs: list[TensorSpec], metadata: dict[str, str] | None = None) -> int:
    return len(header_bytes(specs, metadata)) + sum(s.nbytes for s in specs)


def plan_shards(specs: list[TensorSpec], shard_bytes: int) -> list[list[TensorSpec]]:
    """Tensors in order, cut into files of at most ``shard_bytes`` (a bigger tensor goes alone)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return [s for s in shards if s]


def shard_names(n: int) -> list[str]:
    """Hugging Face's file names: ``model.safetensors`` alone, else ``model-0000i-of-0000n``."""
    if n == 1:
        return [SINGLE]
    return [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def index_json(shards: list[list[TensorSpec]], names: list[str]) -> str:
    weight_map = {s.name: f for f, specs in zip(names, shards) for s in specs}
    total = sum(s.nbytes for specs in shards for s in specs)
    return json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                      indent=2) + "\n"


class ShardWriter:
    """Writes one safetensors file: the header at once, then the tensors' bytes as they come.

    ``write(name, piece)`` appends ``piece`` (any shape; its bytes follow the previous piece's)
    to tensor ``name``; tensors must arrive in the declared order and each must be complete
    before the next begins; ``close()`` checks that every byte was written. ``sha256`` is the
    digest of the whole file, computed on the way.
    """

    def __init__(self, path: str | os.PathLike, specs: list[TensorSpec],
                 metadata: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self._specs = list(specs)
        self._i = 0
        self._done = 0  # bytes of the current tensor written
        self._hash = hashlib.sha256()
        self._f = open(self.path, "wb")
        self._put(header_bytes(self._specs, metadata))

    def _put(self, data) -> None:
        self._f.write(data)
        self._hash.update(data)

    def write(self, name: str, piece: torch.Tensor) -> None:
        while (self._i < len(self._specs) and self._done == self._specs[self._i].nbytes
               and self._specs[self._i].name != name):  # the previous tensor is complete
            self._i, self._done = self._i + 1, 0
        if self._i == len(self._specs):
            raise ValueError(f"{self.path}: {name}: every declared tensor is already written")
        spec = self._specs[self._i]
        if name != spec.name:
            raise ValueError(f"{self.path}: got {name}, expected {spec.name} "
                             f"({self._done} of {spec.nbytes} bytes written)")
        if piece.dtype != spec.dtype:
            raise ValueError(f"{self.path}: {name}: dtype {piece.dtype}, declared {spec.dtype}")
        data = _as_bytes(piece)
        if self._done + len(data) > spec.nbytes:
            raise ValueError(f"{self.path}: {name}: {self._done + len(data)} bytes written, "
                             f"declared {spec.nbytes}")
        self._put(data)
        self._done += len(data)

    def close(self) -> str:
        """Close the file; the sha256 of its bytes. Raises if a declared tensor is incomplete."""
        self._f.close()
        left = sum(s.nbytes for s in self._specs[self._i:]) - self._done
        if left:
            raise ValueError(f"{self.path}: closed with {left} declared bytes unwritten")
        return self._hash.hexdigest()

    def abort(self) -> None:
        self._f.close()


def _as_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (a contiguous copy first if it is not contiguous)."""
    t = t.detach().contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()).cast("B") if t.numel() else memoryview(b"")


# ------------------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    path: Path
    spec: TensorSpec
    offset: int  # of its first byte in the file

    @property
    def row_bytes(self) -> int:
        return self.spec.nbytes // self.spec.shape[0] if self.spec.shape else self.spec.nbytes


def read_header(path: str | os.PathLike) -> list[StoredTensor]:
    """The tensors of one safetensors file, in the order of their data."""
    path = Path(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    out = []
    for name, h in header.items():
        begin, _ = h["data_offsets"]
        spec = TensorSpec(name, TORCH_DTYPES[h["dtype"]], tuple(h["shape"]))
        out.append(StoredTensor(path, spec, 8 + n + begin))
    return sorted(out, key=lambda t: t.offset)


def read_rows(t: StoredTensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Rows ``start:stop`` of a stored tensor (all of it for a 0-d or 1-d one with defaults),
    read with ``pread`` into a fresh tensor: only those bytes are ever in memory."""
    shape = t.spec.shape
    if not shape:
        start, stop, rows_shape = 0, 1, ()
    else:
        stop = shape[0] if stop is None else stop
        rows_shape = (stop - start, *shape[1:])
    out = torch.empty(rows_shape, dtype=t.spec.dtype)
    want = (stop - start) * t.row_bytes
    if want:
        buf = memoryview(out.reshape(-1).view(torch.uint8).numpy()).cast("B")
        fd = os.open(t.path, os.O_RDONLY)
        try:
            got = 0
            while got < want:
                n = os.preadv(fd, [buf[got:]], t.offset + start * t.row_bytes + got)
                if n <= 0:
                    raise ValueError(f"{t.path}: {t.spec.name}: file ends early")
                got += n
        finally:
            os.close(fd)
    return out


def row_blocks(n_rows: int, row_elems: int, block_elems: int) -> Iterator[tuple[int, int]]:
    """(start, stop) row ranges of about ``block_elems`` elements each (at least one row)."""
    step = max(1, block_elems // max(1, row_elems))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)
