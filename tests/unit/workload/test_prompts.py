import pytest

from omni_ray.workload.prompts import decode_seconds_per_token, token_prompts


def test_prompts_are_token_exact_distinct_and_seeded():
    a = token_prompts(4, 33, 2048, seed=7)
    assert [len(p) for p in a] == [33] * 4 and len({tuple(p) for p in a}) == 4
    assert a == token_prompts(4, 33, 2048, seed=7) and a != token_prompts(4, 33, 2048, seed=8)
    assert all(260 <= t < 2048 for p in a for t in p)


def test_decode_by_difference():
    assert decode_seconds_per_token(0.5, 2.0, 16) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="n >= 2"):
        decode_seconds_per_token(0.5, 2.0, 1)
