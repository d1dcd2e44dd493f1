"""Token-exact prompts: built from token ids, so a prompt of N tokens is exactly N tokens."""

from __future__ import annotations

import random

# Ids below this are left out: the special token(s) and single bytes sit at the start of the
# local vocabulary, and an EOS id in a prompt would change nothing but is confusing to read.
FIRST_ORDINARY_ID = 260


def token_prompts(n: int, length: int, vocab_size: int, *, seed: int) -> list[list[int]]:
    """``n`` distinct prompts of exactly ``length`` token ids (distinct, so no prefix-cache hit)."""
    if length <= 0 or n <= 0:
        raise ValueError(f"need n > 0 and length > 0, got n={n}, length={length}")
    lo = min(FIRST_ORDINARY_ID, vocab_size // 2)
    rng = random.Random(seed)
    return [[rng.randrange(lo, vocab_size) for _ in range(length)] for _ in range(n)]


def decode_seconds_per_token(t_one: float, t_n: float, n: int) -> float:
    """Decode time per step by difference: (t(n) - t(1)) / (n - 1), prefill cancels out."""
    if n < 2:
        raise ValueError(f"decode by difference needs n >= 2, got {n}")
    return (t_n - t_one) / (n - 1)
