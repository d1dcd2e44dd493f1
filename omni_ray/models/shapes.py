"""Synthetic model shapes: real Llama-architecture layer shapes with seeded random weights."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def num_parameters(self, tie_embeddings: bool | None = None) -> int:
        tie = self.tie_embeddings if tie_embeddings is None else tie_embeddings
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        per_layer = (
            h * self.num_heads * d * 2          # q_proj, o_proj
            + h * self.num_kv_heads * d * 2     # k_proj, v_proj
            + h * i * 3                         # gate, up, down
            + h * 2                             # two RMSNorms
        )
        embed = self.vocab_size * h
        return embed * (1 if tie else 2) + self.num_layers * per_layer + h

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        # A few MB: for tests. Dimensions divide by 128 (int4 groups) and 16 (int4 packing).
        Shape("tiny", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
              intermediate_size=512, vocab_size=2048, tie_embeddings=True),
        # ~100M parameters.
        Shape("small", hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4,
              intermediate_size=2048, vocab_size=32000, tie_embeddings=True),
        # The layer shapes of Qwen2.5-0.5B (Llama architecture, no q/k/v bias), with the local
        # 32,000-token vocabulary: 386.5M parameters, 773 MB in bf16.
        Shape("qwen2.5-0.5b", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
              intermediate_size=4864, vocab_size=32000, tie_embeddings=True,
              max_position_embeddings=32768, rope_theta=1000000.0),
    )
}

DEFAULT_SHAPE = "tiny"
