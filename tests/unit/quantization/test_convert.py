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
    res = convert.quantize_checkpoint(src, tmp_path / "dst", group_size=64, row_threshold=5)
    dst = tmp_path / "dst"
    t = load_file(str(dst / "model.safetensors"))
    p = "model.layers.0.self_attn.q_proj."
    assert t[p + "weight_packed"].dtype == torch.uint8 and t[p + "weight_packed"].shape == (128, 64)
    assert t[p + "weight_scale"].dtype == torch.bfloat16 and t[p + "weight_scale"].shape == (128, 2)
    assert t["model.embed_tokens.weight_zero"].shape == (100, 2)
    assert "model.norm.weight" in t and "lm_head.weight_packed" not in t
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc == {"quant_method": "cpu_int4", "group_size": 64, "ignored_modules": [],
                  "row_threshold": 5}
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
