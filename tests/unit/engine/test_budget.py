import json

import pytest

from omni_ray.engine.budget import check_budget, kv_bytes_per_token


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_attention_heads": 14, "num_key_value_heads": 2, "hidden_size": 896,
        "num_hidden_layers": 24}))
    return tmp_path


def test_bytes_per_token_qwen_shape(model):
    # 2 (K,V) x 24 layers x 2 KV heads x 64 dims x 2 bytes
    assert kv_bytes_per_token(model) == 12288
    assert kv_bytes_per_token(model, "float32") == 24576


def test_head_dim_from_config_wins(model):
    cfg = json.loads((model / "config.json").read_text()) | {"head_dim": 128}
    (model / "config.json").write_text(json.dumps(cfg))
    assert kv_bytes_per_token(model) == 24576


def test_a_budget_below_one_sequence_is_refused():
    msg = check_budget(1, per_token=1024, max_model_len=2048, free_mib=None)
    assert msg.startswith("kv_cache_mib: 1 MiB holds 1024 tokens, fewer than one sequence")


def test_a_budget_above_free_memory_is_refused():
    msg = check_budget(4096, per_token=1024, max_model_len=512, free_mib=1000.0)
    assert "more than the node's available memory (1000 MiB)" in msg


def test_a_sound_budget_passes():
    assert check_budget(64, per_token=1024, max_model_len=512, free_mib=8000.0) is None


def test_a_budget_of_exactly_one_sequence_passes_and_one_byte_less_does_not():
    # 2 MiB at 1024 bytes/token is 2048 tokens: exactly one sequence of 2048
    assert check_budget(2, per_token=1024, max_model_len=2048, free_mib=None) is None
    assert check_budget(2, per_token=1024 + 1, max_model_len=2048, free_mib=None) is not None
    assert check_budget(2, per_token=1024, max_model_len=2048, free_mib=2.0) is None
    assert check_budget(2, per_token=1024, max_model_len=2048, free_mib=1.9) is not None
