"""Where cpu_int4 keeps its packed weights: anonymous mappings advised for transparent huge pages.

Why: a decode step streams every packed weight once, ~205 MB for the qwen2.5-0.5b shape, which
in 4 KiB pages is ~50,000 pages a step, each a TLB miss with a page walk while the weights
stream. With the kernel's transparent-huge-page mode at ``madvise`` (this machine's), memory
gets 2 MiB pages only where a program asks for them, and torch's CPU allocator asks only when
``THP_MEM_ALLOC_ENABLE`` is set, and then only for buffers of 2 MiB and more (not the qwen2.5-0.5b
q/k/v and o projections). Here the weights are placed one after another in mappings of
``CHUNK_BYTES`` advised ``MADV_HUGEPAGE``, so all of them, small ones included, sit in huge
pages. Measured on this machine: a compiled int4 decode step 10.59 ms with the packed weights in
torch's allocations, 9.63 ms in the arena (``omni_ray.bench.step_ab --switch weight_pages``,
40 pairs, pairwise 1.103x, same tokens; results/step_ab/20261204T195859Z.json); the GEMVs
alone over the shape's weights 7.06 vs 6.71 ms a pass (``omni_ray.bench.int4_kernels``,
results/int4_kernels/20261204T200219Z.json).

Lifetime: each tensor keeps its mapping alive (``torch.frombuffer`` holds the ``mmap``); the
arena holds the mapping it is filling only weakly, so a mapping is unmapped once every weight
in it is gone. With THP "never" the advice is accepted and changes nothing (the weights are
still contiguous); where it is refused (a kernel without THP, not Linux) or
``VLLM_OMNI_DISABLE_WEIGHT_ARENA`` is set, :func:`empty` is ``torch.empty``.
"""

from __future__ import annotations

import logging
import mmap
import threading
import weakref

import torch

from vllm_omni import envs, events

# vLLM's logger tree, so the lines reach the engine's log (omni_ray.engine.launch counts them).
logger = logging.getLogger("vllm.omni")

CHUNK_BYTES = 64 << 20
HUGE_PAGE = 2 << 20
ALIGN = 64  # bytes; each tensor starts on a cache line


class Arena:
    """A bump allocator over ``MADV_HUGEPAGE`` mappings of ``chunk_bytes`` (a tensor larger
    than that gets a mapping of its own)."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._lock = threading.Lock()
        self._chunk: weakref.ref | None = None  # the mapping being filled
        self._offset = 0
        self._refused: str | None = None  # why the kernel refused the advice, once
        self._announced = False

    def _map(self, nbytes: int) -> tuple[mmap.mmap, int] | None:
        """A new mapping with room for ``nbytes`` from a 2 MiB boundary, and that offset."""
        m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError) as exc:  # no THP here: torch's allocator will do
            self._refused = f"madvise(MADV_HUGEPAGE) failed: {exc}"
            logger.info("vllm_omni: packed weights stay in torch's allocations (%s)",
                        self._refused)
            m.close()
            return None
        if not self._announced:
            self._announced = True
            events.emit("weight_arena", "vllm_omni: cpu_int4 packed weights go to mappings "
                        "advised for huge pages (%s MiB each)", self.chunk_bytes >> 20,
                        chunk_mib=self.chunk_bytes >> 20)
        base = torch.frombuffer(m, dtype=torch.uint8, count=1).data_ptr()
        return m, -base % HUGE_PAGE

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor in huge-page memory (or ``torch.empty``)."""
        if self._refused is not None or envs.weight_arena_disabled():
            return torch.empty(shape, dtype=dtype)
        count = 1
        for d in shape:
            count *= int(d)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        nbytes = count * dtype.itemsize
        with self._lock:
            chunk = self._chunk() if self._chunk is not None else None
            if nbytes > self.chunk_bytes:
                got = self._map(nbytes)
                if got is None:
                    return torch.empty(shape, dtype=dtype)
                chunk, offset = got
            else:
                if chunk is None or self._offset + nbytes > len(chunk):
                    got = self._map(self.chunk_bytes)
                    if got is None:
                        return torch.empty(shape, dtype=dtype)
                    chunk, self._offset = got
                    self._chunk = weakref.ref(chunk)
                offset = self._offset
                self._offset = -(-(offset + nbytes) // ALIGN) * ALIGN
        flat = torch.frombuffer(chunk, dtype=torch.uint8, count=nbytes, offset=offset)
        return flat.view(dtype).view(shape)

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s values in a tensor of this arena."""
        out = self.empty(t.shape, t.dtype)
        out.copy_(t)
        return out


ARENA = Arena()


def empty(shape, dtype: torch.dtype) -> torch.Tensor:
    return ARENA.empty(shape, dtype)


def copy(t: torch.Tensor) -> torch.Tensor:
    return ARENA.copy(t)


def huge_page_kib(t: torch.Tensor) -> int:
    """KiB of the mapping that holds ``t``'s first byte that the kernel backs with huge pages
    (``AnonHugePages`` in /proc/self/smaps); 0 if none or unknown."""
    addr = t.data_ptr()
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and ":" not in head:
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= addr < hi
                elif inside and head == "AnonHugePages:":
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def own_mapping(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor on an anonymous mapping of its own, unmapped the moment the tensor
    is gone, whatever its size. For a weight that lives only while it is loaded (quantized at
    load): torch's allocator takes a tensor under glibc's mmap threshold (32 MiB at most) from
    the heap, whose freed pages stay resident, so freeing the bf16 weights one by one would not
    lower the process's RssAnon. Untouched pages are not resident here either."""
    count = 1
    for d in shape:
        count *= int(d)
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(m, dtype=torch.uint8).view(dtype).view(shape)


_LIBC_TRIM = None
# How many chunks between two trims: malloc_trim walks every heap, ~13 ms a call while a 3B
# model loads. Measured on the 3B shape quantized at load (init_s, then peak RssAnon during
# load against the 2,411 MiB it keeps): no trim 19-20 s and up to 3,748 MiB; after every chunk
# 38-40 s, 2,415; every 8 chunks 26.2 s, 2,413; every 32 chunks 19.2 s, 2,419.
TRIM_EVERY_CHUNKS = 32
_chunks_since_trim = 0


def after_chunk() -> None:
    """What cpu_int4 runs after each chunk it quantizes or repacks at load: ``trim_heap`` every
    ``TRIM_EVERY_CHUNKS`` chunks."""
    global _chunks_since_trim
    _chunks_since_trim += 1
    if _chunks_since_trim >= TRIM_EVERY_CHUNKS:
        _chunks_since_trim = 0
        trim_heap()


def trim_heap() -> bool:
    """Give the C heap's free pages back to the kernel (glibc's ``malloc_trim(0)``, every
    arena); False where there is no such call (another libc).

    Why: quantizing at load makes fp32 temporaries of a few MiB per chunk, some in OpenMP worker
    threads; glibc keeps what they free in its heaps (under its mmap threshold, and in each
    thread's arena), so a 593 MiB embedding packed in 8 MiB chunks left ~1 GiB resident
    (``omni_ray``'s RssAnon) until something reused it, and ~1 GiB more at its peak. Called
    every few chunks quantized at load (``after_chunk``)."""
    global _LIBC_TRIM
    if _LIBC_TRIM is None:
        try:
            import ctypes

            _LIBC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _LIBC_TRIM = False
    if _LIBC_TRIM is False:
        return False
    _LIBC_TRIM(0)
    return True
