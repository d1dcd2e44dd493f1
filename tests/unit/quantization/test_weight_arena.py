"""cpu_int4's weight arena: packed weights in mappings advised for transparent huge pages."""

import gc
import mmap
import weakref
from pathlib import Path

import pytest
import torch

from vllm_omni.ops import int4_pack, weight_arena
from vllm_omni.quantization import grid

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
THP_MODE = THP.read_text().split("[")[1].split("]")[0] if THP.exists() else "never"
needs_thp = pytest.mark.skipif(THP_MODE == "never", reason="transparent huge pages are off")


@needs_thp
def test_tensors_sit_back_to_back_in_huge_pages():
    arena = weight_arena.Arena(chunk_bytes=8 << 20)
    ts = [arena.empty((1000, 450), torch.uint8) for _ in range(12)]  # 5.4 MB in one chunk
    for t in ts:
        t.fill_(7)
    assert ts[0].data_ptr() % weight_arena.HUGE_PAGE == 0
    # one after another, each on a cache line (450000 rounds up to 450048)
    assert [b.data_ptr() - a.data_ptr() for a, b in zip(ts, ts[1:])] == [450048] * 11
    assert weight_arena.huge_page_kib(ts[0]) >= 2048
    assert all(int(t.sum()) == 7 * 450000 for t in ts)


@needs_thp
def test_a_tensor_larger_than_a_chunk_gets_its_own_mapping():
    arena = weight_arena.Arena(chunk_bytes=1 << 20)
    small = arena.empty((64,), torch.uint8)
    big = arena.empty((2048, 1024), torch.bfloat16)  # 4 MiB
    big.fill_(1.5)
    assert big.shape == (2048, 1024) and big.dtype == torch.bfloat16 and big.is_contiguous()
    assert big.data_ptr() % weight_arena.HUGE_PAGE == 0
    assert weight_arena.huge_page_kib(big) >= 2048
    assert abs(big.data_ptr() - small.data_ptr()) >= 1 << 20


def test_a_mapping_lives_as_long_as_its_last_tensor(monkeypatch):
    maps = []
    real = mmap.mmap

    def recording(*args, **kwargs):
        maps.append(weakref.ref(m := real(*args, **kwargs)))
        return m

    monkeypatch.setattr(weight_arena.mmap, "mmap", recording)
    arena = weight_arena.Arena(chunk_bytes=1 << 20)
    a = arena.empty((100,), torch.float32)
    view = a[10:20]
    del a
    gc.collect()
    assert len(maps) == 1 and maps[0]() is not None  # the view keeps it
    del view
    gc.collect()
    assert maps[0]() is None  # the arena itself does not keep its mapping alive
    arena.empty((100,), torch.float32)
    assert len(maps) == 2  # so the next tensor starts a new one


def test_the_first_mapping_is_announced_in_the_line_the_engine_log_counts(caplog):
    from omni_ray.engine import launch

    arena = weight_arena.Arena(chunk_bytes=1 << 20)
    with caplog.at_level("INFO", logger="vllm.omni"):
        for _ in range(3):  # three mappings, one line
            arena.empty((1 << 20,), torch.uint8)
    assert launch.scan_log(caplog.text)["weight_arena"] == 1
    assert "packed weights go to mappings advised for huge pages (1 MiB each)" in caplog.text


def test_refused_advice_falls_back_to_torch(monkeypatch, caplog):
    class NoAdvice(mmap.mmap):
        def madvise(self, *args):
            raise OSError(22, "Invalid argument")

    monkeypatch.setattr(weight_arena.mmap, "mmap", NoAdvice)
    arena = weight_arena.Arena()
    with caplog.at_level("INFO", logger="vllm.omni"):
        t = arena.empty((3, 4), torch.bfloat16)
        arena.empty((3, 4), torch.bfloat16)
    assert t.shape == (3, 4) and t.dtype == torch.bfloat16
    assert "madvise(MADV_HUGEPAGE) failed" in caplog.text
    assert caplog.text.count("stay in torch's allocations") == 1  # said once


def test_an_empty_shape_is_an_empty_tensor(monkeypatch):
    monkeypatch.setattr(weight_arena.mmap, "mmap", None)  # would raise if called
    t = weight_arena.Arena().empty((0, 4), torch.bfloat16)
    assert t.shape == (0, 4) and t.dtype == torch.bfloat16


def test_off_switch_gives_torch_allocations(monkeypatch):
    monkeypatch.setenv("VLLM_OMNI_DISABLE_WEIGHT_ARENA", "1")
    monkeypatch.setattr(weight_arena.mmap, "mmap", None)  # would raise if called
    t = weight_arena.Arena().empty((5,), torch.int64)
    assert t.shape == (5,)


def test_repack_into_the_arena_gives_the_same_values():
    qw = grid.quantize(torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
                       .bfloat16(), 128)
    plain = int4_pack.repack(qw.packed, qw.scale, qw.zero)
    placed = int4_pack.repack(qw.packed, qw.scale, qw.zero, empty=weight_arena.empty)
    w = torch.randn(192, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    plain_q = int4_pack.quantize_and_pack(w, 64)
    placed_q = int4_pack.quantize_and_pack(w, 64, empty=weight_arena.empty)
    for a, b in zip(plain + plain_q, placed + placed_q):
        assert torch.equal(a, b) and b.is_contiguous()
    if THP_MODE != "never":
        assert weight_arena.huge_page_kib(placed[0]) > 0


def _mapped(addr: int) -> bool:
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
        if lo <= addr < hi:
            return True
    return False


def test_own_mapping_is_unmapped_when_its_tensor_goes_even_when_small():
    """A bf16 weight quantized at load lives on a mapping of its own: freeing it lowers RSS,
    which a small tensor from torch's allocator (glibc's heap) would not."""
    t = weight_arena.own_mapping((256, 384), torch.bfloat16)  # 192 KiB: glibc would use its heap
    assert t.shape == (256, 384) and t.dtype == torch.bfloat16 and t.is_contiguous()
    t.fill_(1.5)
    assert float(t.sum()) == 1.5 * 256 * 384
    addr = t.data_ptr()
    assert _mapped(addr)
    del t
    gc.collect()
    assert not _mapped(addr)
    assert weight_arena.own_mapping((0, 5), torch.bfloat16).shape == (0, 5)


def test_after_chunk_trims_the_heap_every_few_chunks(monkeypatch):
    calls = []
    monkeypatch.setattr(weight_arena, "trim_heap", lambda: calls.append(1) or True)
    monkeypatch.setattr(weight_arena, "_chunks_since_trim", 0)
    for _ in range(weight_arena.TRIM_EVERY_CHUNKS * 2 + 1):
        weight_arena.after_chunk()
    assert len(calls) == 2
    assert weight_arena.trim_heap.__name__ == "<lambda>"  # the real one is glibc's call:
    monkeypatch.undo()
    assert weight_arena.trim_heap() in (True, False)
