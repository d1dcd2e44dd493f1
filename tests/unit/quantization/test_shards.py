"""The streaming safetensors writer and reader."""

import pytest
import torch
from safetensors.torch import load_file

from vllm_omni.quantization.shards import (ShardWriter, TensorSpec, plan_shards, read_header,
                                           read_rows, row_blocks, shard_names)


def test_pieces_make_a_file_safetensors_reads(tmp_path):
    a = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    b = torch.tensor([1, 2, 3], dtype=torch.uint8)
    specs = [TensorSpec("a", torch.float32, (4, 3)), TensorSpec("empty", torch.bfloat16, (0, 8)),
             TensorSpec("b", torch.uint8, (3,))]
    w = ShardWriter(tmp_path / "x.safetensors", specs, {"format": "pt"})
    w.write("a", a[:1])
    w.write("a", a[1:])
    w.write("b", b)  # the empty tensor needs no piece
    w.close()
    got = load_file(str(tmp_path / "x.safetensors"))
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b) and got["empty"].shape == (0, 8)
    stored = {t.spec.name: t for t in read_header(tmp_path / "x.safetensors")}
    assert torch.equal(read_rows(stored["a"], 1, 3), a[1:3])
    assert torch.equal(read_rows(stored["b"]), b)


@pytest.mark.parametrize("pieces,match", [
    ([("b", torch.zeros(3, dtype=torch.uint8))], "got b, expected a"),
    ([("a", torch.zeros(5, dtype=torch.float32))], "20 bytes written, declared 16"),
    ([("a", torch.zeros(4, dtype=torch.float64))], "dtype torch.float64, declared"),
])
def test_writer_refuses_what_was_not_declared(tmp_path, pieces, match):
    specs = [TensorSpec("a", torch.float32, (4,)), TensorSpec("b", torch.uint8, (3,))]
    w = ShardWriter(tmp_path / "x.safetensors", specs)
    with pytest.raises(ValueError, match=match):
        for name, t in pieces:
            w.write(name, t)
    w.abort()


def test_close_names_unwritten_bytes(tmp_path):
    w = ShardWriter(tmp_path / "x.safetensors", [TensorSpec("a", torch.float32, (4,))])
    w.write("a", torch.zeros(2))
    with pytest.raises(ValueError, match="closed with 8 declared bytes unwritten"):
        w.close()


def test_shard_plan_and_names():
    specs = [TensorSpec(n, torch.uint8, (s,)) for n, s in (("a", 6), ("b", 6), ("c", 20))]
    assert [[s.name for s in shard] for shard in plan_shards(specs, 12)] == [["a", "b"], ["c"]]
    assert shard_names(1) == ["model.safetensors"]
    assert shard_names(2) == ["model-00001-of-00002.safetensors",
                              "model-00002-of-00002.safetensors"]
    assert list(row_blocks(5, 4, 8)) == [(0, 2), (2, 4), (4, 5)]
    assert list(row_blocks(2, 100, 8)) == [(0, 1), (1, 2)]  # at least one row a block
