import dataclasses

import pytest

from omni_ray.models.shapes import DEFAULT_SHAPE, FULL_VOCAB_SUFFIX, SHAPES


def test_qwen_layer_shapes_with_the_local_vocabulary():
    s = SHAPES["qwen2.5-0.5b"]
    assert s.num_parameters() == 386_542_464  # tied: the embedding counts once
    assert round(s.num_parameters() / 1e6, 1) == 386.5
    assert round(s.num_parameters() * 2 / 1e6) == 773  # MB in bf16
    assert s.num_parameters(tie_embeddings=False) == 386_542_464 + 32_000 * 896
    assert s.head_dim == 64


def test_tiny_is_a_few_mb():
    s = SHAPES[DEFAULT_SHAPE]
    assert s.name == "tiny"
    assert 1e6 <= s.num_parameters() * 2 <= 10e6


def test_small_is_about_100m():
    assert 90e6 <= SHAPES["small"].num_parameters() <= 110e6


@pytest.mark.parametrize("name", list(SHAPES))
def test_int4_friendly_dimensions(name):
    """int4 groups of 128 and packing by 16 need every K and N divisible by them."""
    s = SHAPES[name]
    for dim in (s.hidden_size, s.intermediate_size, s.num_heads * s.head_dim,
                s.num_kv_heads * s.head_dim):
        assert dim % 128 == 0, (name, dim)
    assert s.num_heads % s.num_kv_heads == 0
    assert s.head_dim * s.num_heads == s.hidden_size


def test_kv_bytes_per_token():
    # K and V, every layer, every KV head, head_dim values of dtype_bytes each
    assert SHAPES["qwen2.5-0.5b"].kv_bytes_per_token() == 2 * 24 * 2 * 64 * 2 == 12_288
    assert SHAPES["tiny"].kv_bytes_per_token() == 2 * 2 * 2 * 64 * 2 == 1024
    assert SHAPES["small"].kv_bytes_per_token(dtype_bytes=4) == 2 * 12 * 4 * 64 * 4


def test_shapes_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SHAPES["tiny"].hidden_size = 1


# The published config.json values (Hugging Face Hub: Qwen/Qwen2.5-{1.5B,3B,7B}-Instruct,
# meta-llama/Llama-3.1-8B-Instruct), typed here as a literal table to check shapes.py against:
# hidden, intermediate, heads, kv heads, layers, vocab, tied, rope_theta, max positions, eps.
PUBLISHED = {
    "qwen2.5-0.5b": (896, 4864, 14, 2, 24, 151936, True, 1e6, 32768, 1e-6),
    "qwen2.5-1.5b": (1536, 8960, 12, 2, 28, 151936, True, 1e6, 32768, 1e-6),
    "qwen2.5-3b": (2048, 11008, 16, 2, 36, 151936, True, 1e6, 32768, 1e-6),
    "qwen2.5-7b": (3584, 18944, 28, 4, 28, 152064, False, 1e6, 32768, 1e-6),
    "llama-3.1-8b": (4096, 14336, 32, 8, 32, 128256, False, 500000.0, 131072, 1e-5),
}
# Parameter counts the model cards give (billions, rounded as they round them).
CARD_BILLIONS = {"qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09,
                 "qwen2.5-7b": 7.61, "llama-3.1-8b": 8.03}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_shapes(name):
    hidden, inter, heads, kv, layers, vocab, tied, theta, max_pos, eps = PUBLISHED[name]
    full, local = SHAPES[name + FULL_VOCAB_SUFFIX], SHAPES[name]
    for s in (full, local):
        assert (s.hidden_size, s.intermediate_size, s.num_heads, s.num_kv_heads, s.num_layers,
                s.tie_embeddings, s.rope_theta, s.max_position_embeddings, s.rms_norm_eps) == (
            hidden, inter, heads, kv, layers, tied, theta, max_pos, eps)
    assert full.vocab_size == vocab
    assert local.vocab_size == local.tokenizer_vocab == 32000
    assert full.tokenizer_vocab == 32000  # the local tokenizer; the rest are model-only rows
    assert abs(full.num_parameters() / 1e9 - CARD_BILLIONS[name]) <= 0.01  # no q/k/v biases


def test_llama31_rope_scaling():
    assert SHAPES["llama-3.1-8b-full-vocab"].rope_scaling.to_dict() == {
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert SHAPES["qwen2.5-7b"].rope_scaling is None
