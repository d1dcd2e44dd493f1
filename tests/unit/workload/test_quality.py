"""The quality probe's fixed ids and the names every engine reports from it."""

from __future__ import annotations

import json
import math

import pytest

from omni_ray.workload.quality import (ids_digest, probe_figures, probe_ids, source_of,
                                       vocab_size_of, weights_of)


def test_the_sequence_is_fixed_and_depends_on_the_vocabulary_only() -> None:
    a = probe_ids(2048, 128)
    assert a == probe_ids(2048, 128) and len(a) == 128
    assert all(260 <= t < 2048 for t in a)
    assert probe_ids(2048, 16) == a[:16]  # a shorter probe reads the same ids' start
    assert probe_ids(4096, 128) != a
    assert ids_digest(a) == ids_digest(list(a)) != ids_digest(a[:-1])


def test_figures_carry_the_names_and_the_perplexity(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    ids = [300, 301, 302]
    m = probe_figures(ids=ids, logprobs=[-1.0, -3.0], greedy_ids=[5, 6], tokens=2,
                      model_path=str(tmp_path), dtype="bfloat16", quantization=None)
    assert m["quality_mean_logprob"] == -2.0
    assert m["quality_perplexity"] == pytest.approx(math.exp(2.0))
    assert (m["quality_sequence_len"], m["quality_greedy_ids"], m["quality_weights"]) == (
        3, [5, 6], "bfloat16")
    assert m["quality_ids_digest"] == ids_digest(ids)
    assert m["quality_source"] == str(tmp_path.resolve())
    with pytest.raises(ValueError, match="2 log-probabilities for a sequence of 4 ids"):
        probe_figures(ids=[*ids, 303], logprobs=[-1.0, -3.0], greedy_ids=[5, 6], tokens=2,
                      model_path=str(tmp_path), dtype="bfloat16", quantization=None)
    with pytest.raises(ValueError, match="1 greedy ids, want 2"):
        probe_figures(ids=ids, logprobs=[-1.0, -3.0], greedy_ids=[5], tokens=2,
                      model_path=str(tmp_path), dtype="bfloat16", quantization=None)


def test_a_converted_checkpoint_names_its_bf16_source(tmp_path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (dst / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "cpu_int4"}}))
    (dst / "omni_quantize.json").write_text(json.dumps({"source": str(src)}))
    assert source_of(str(dst)) == source_of(str(src)) == str(src.resolve())
    assert weights_of(str(dst), "bfloat16", None) == "cpu_int4"
    assert weights_of(str(src), "bfloat16", None) == "bfloat16"
    assert weights_of(str(src), "bfloat16", "cpu_int4") == "cpu_int4"  # quantized at load


def test_the_vocabulary_comes_from_the_checkpoints_config(tmp_path) -> None:
    """What an engine that reads a converted file (llama.cpp's GGUF) draws the ids from."""
    (tmp_path / "config.json").write_text('{"vocab_size": 2048}')
    assert vocab_size_of(str(tmp_path)) == 2048
    (tmp_path / "config.json").write_text('{"text_config": {"vocab_size": 4096}}')
    assert vocab_size_of(str(tmp_path)) == 4096
    (tmp_path / "config.json").write_text('{}')
    with pytest.raises(ValueError, match="config.json: no vocab_size"):
        vocab_size_of(str(tmp_path))
