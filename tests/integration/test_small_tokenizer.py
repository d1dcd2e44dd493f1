"""The small shape's 32,000-token tokenizer: training it takes ~20 s of CPU, so it is built here
(the session's ``small_model``, which the engine tests share) rather than in the unit tests."""

import pytest

pytestmark = pytest.mark.integration

TEXT = "Hello, world! The quick brown fox; 0123456789 (x+y)*z = {a: [b]}"


def test_vocab_size_matches_config_small(small_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(small_model, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(small_model, local_files_only=True)
    assert len(tok) == config.vocab_size == 32000
    assert tok.decode(tok.encode(TEXT, add_special_tokens=False)) == TEXT
