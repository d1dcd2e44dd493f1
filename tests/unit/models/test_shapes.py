import dataclasses

import pytest

from omni_ray.models.shapes import DEFAULT_SHAPE, SHAPES


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
