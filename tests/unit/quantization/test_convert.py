"""The checkpoint converter on a hand-made tiny checkpoint (no vLLM engine)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_omni.errors import OmniInputError
from vllm_omni.quantization import convert, grid


def _src(tmp_path, odd_k_proj=False, tie=True):
    src = tmp_path / "src"
    src.mkdir()
    g = torch.Generator().manual_seed(0)
    h = 128
    kv = 24 if odd_k_proj else 32
    t = {
        "model.embed_tokens.weight": torch.randn(100, h, generator=g),  # vocab: any N
        "model.layers.0.self_attn.q_proj.weight": torch.randn(128, h, generator=g),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(kv, h, generator=g),
        "model.layers.0.self_attn.v_proj.weight": torch.randn(32, h, generator=g),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(h, 128, generator=g),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(256, h, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(256, h, generator=g),
        "model.layers.0.mlp.down_proj.weight": torch.randn(h, 256, generator=g),
        "model.layers.0.input_layernorm.weight": torch.ones(h),
        "model.norm.weight": torch.ones(h),
    }
    if not tie:
        t["lm_head.weight"] = torch.randn(100, h, generator=g)
    save_file({k: v.bfloat16() for k, v in t.items()}, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                 "tie_word_embeddings": tie}))
    (src / "tokenizer.json").write_text("{}")
    return src


def test_writes_format_config_record_and_tokenizer(tmp_path):
    src = _src(tmp_path)
    res = convert.quantize_checkpoint(src, tmp_path / "dst", group_size=64, row_threshold=5,
                                      dequant_rows=0)
    dst = tmp_path / "dst"
    t = load_file(str(dst / "model.safetensors"))
    p = "model.layers.0.self_attn.q_proj."
    assert t[p + "weight_packed"].dtype == torch.uint8 and t[p + "weight_packed"].shape == (128, 64)
    assert t[p + "weight_scale"].dtype == torch.bfloat16 and t[p + "weight_scale"].shape == (128, 2)
    assert t["model.embed_tokens.weight_zero"].shape == (100, 2)
    assert "model.norm.weight" in t and "lm_head.weight_packed" not in t
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc == {"quant_method": "cpu_int4", "group_size": 64, "ignored_modules": [],
                  "row_threshold": 5, "dequant_rows": 0}
    assert (dst / "tokenizer.json").read_text() == "{}"
    rec = json.loads((dst / convert.RECORD).read_text())
    assert set(rec["source_sha256"]) == {"config.json", "model.safetensors"}
    assert rec["source_hash"] == res.record["source_hash"] and len(rec["source_hash"]) == 64
    # values: what the grid gives
    w = load_file(str(src / "model.safetensors"))[p + "weight"]
    qw = grid.quantize(w, 64)
    assert torch.equal(t[p + "weight_packed"], qw.packed)


def test_unsupported_layer_and_its_fused_siblings_stay_bf16_and_are_listed(tmp_path, caplog):
    src = _src(tmp_path, odd_k_proj=True, tie=False)
    res = convert.quantize_checkpoint(src, tmp_path / "dst")
    a = "model.layers.0.self_attn."
    assert set(res.ignored) == {a + "q_proj", a + "k_proj", a + "v_proj"}
    assert "N=24" in res.ignored[a + "k_proj"]
    assert "lm_head" in res.quantized
    qc = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]
    assert qc["ignored_modules"] == sorted(res.ignored)
    t = load_file(str(tmp_path / "dst" / "model.safetensors"))
    assert t[a + "k_proj.weight"].dtype == torch.bfloat16
    assert a + "q_proj.weight_packed" not in t
    assert any("k_proj stays bf16" in r.getMessage() for r in caplog.records)


def test_bad_sources(tmp_path):
    with pytest.raises(OmniInputError, match="no config.json"):
        convert.quantize_checkpoint(tmp_path, tmp_path / "out")
    src = _src(tmp_path)
    convert.quantize_checkpoint(src, tmp_path / "dst")
    with pytest.raises(OmniInputError, match="exists and is not empty"):
        convert.quantize_checkpoint(src, tmp_path / "dst")
    with pytest.raises(OmniInputError, match="already quantized"):
        convert.quantize_checkpoint(tmp_path / "dst", tmp_path / "dst2")


def test_cli_verb(tmp_path, capsys):
    import argparse

    from omni_ray.cli import quantize

    p = argparse.ArgumentParser()
    quantize.add_arguments(p)
    args = p.parse_args([str(_src(tmp_path)), str(tmp_path / "dst"), "--group-size", "32"])
    assert quantize.run(args) == 0
    assert "group 32" in capsys.readouterr().out


def test_blocks_and_shards_give_the_same_values(tmp_path, monkeypatch):
    """Quantizing a few rows at a time into several files gives what one whole pass gives."""
    src = _src(tmp_path, tie=False)
    whole = convert.quantize_checkpoint(src, tmp_path / "whole", group_size=64).dst
    monkeypatch.setattr(convert, "BLOCK_ELEMS", 3 * 128)  # 3 rows a block, not dividing N
    monkeypatch.setattr(convert, "SHARD_BYTES", 40_000)
    split = convert.quantize_checkpoint(src, tmp_path / "split", group_size=64).dst
    index = json.loads((split / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    got = {}
    for f in files:
        got |= load_file(str(split / f))
    want = load_file(str(whole / "model.safetensors"))
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_not_enough_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    src = _src(tmp_path)
    monkeypatch.setattr(convert, "_free_bytes", lambda path: 10)
    with pytest.raises(OmniInputError, match=r"^\S+/dst: not enough disk space: the checkpoint "
                                             r"needs \d+ bytes \(0\.\d\d GB\), 10 bytes "
                                             r"\(0\.00 GB\) free$"):
        convert.quantize_checkpoint(src, tmp_path / "dst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_killed_run_s_partial_is_replaced(tmp_path):
    src = _src(tmp_path)
    (tmp_path / "dst.partial").mkdir()
    (tmp_path / "dst.partial" / "model-00001.safetensors").write_bytes(b"half")
    convert.quantize_checkpoint(src, tmp_path / "dst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == [
        "config.json", "model.safetensors", convert.RECORD, "tokenizer.json"]
