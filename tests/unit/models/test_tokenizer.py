"""The built directory loads with plain transformers, offline, and its tokenizer round-trips."""

import json

import pytest

from omni_ray.models.build import build_model

TEXTS = ["Hello, world! The quick brown fox; 0123456789 (x+y)*z = {a: [b]}",
         "  leading spaces, tabs\tand\nnewlines",
         "non-ASCII: wörld, naïve, 東京, emoji 🙂"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_model("tiny", tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def load(model_dir):
    from transformers import AutoConfig, AutoTokenizer

    return (AutoConfig.from_pretrained(model_dir, local_files_only=True),
            AutoTokenizer.from_pretrained(model_dir, local_files_only=True))


def test_config_loads_with_transformers(tiny_dir):
    config, _ = load(tiny_dir)
    assert config.model_type == "llama"
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim) == (256, 2, 4, 2, 64)
    assert config.tie_word_embeddings is True


def test_tokenizer_round_trips(tiny_dir):
    _, tok = load(tiny_dir)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert max(ids) < tok.vocab_size
    assert tok.encode("Hello", add_special_tokens=False) != tok.encode("hello",
                                                                       add_special_tokens=False)


def test_vocab_size_matches_config_tiny(tiny_dir):
    config, tok = load(tiny_dir)
    assert len(tok) == tok.vocab_size == config.vocab_size == 2048
    assert tok.eos_token_id == config.eos_token_id == 0
    assert tok.bos_token_id == config.bos_token_id == 0


def test_tokenizer_depends_on_seed(tmp_path, tiny_dir):
    other = build_model("tiny", tmp_path / "seed1", seed=1)
    vocab = json.loads((tiny_dir / "tokenizer.json").read_text())["model"]["vocab"]
    assert json.loads((other / "tokenizer.json").read_text())["model"]["vocab"] != vocab
