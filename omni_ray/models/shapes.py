"""Synthetic model shapes: real Llama-architecture layer shapes with seeded random weights."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent RoPE scaling (``rope_type: llama3`` in config.json)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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
    rope_scaling: RopeScaling | None = None
    # Tokens the local tokenizer is trained to; None: ``vocab_size`` (see the module docstring).
    tokenizer_vocab_size: int | None = None

    @property
    def tokenizer_vocab(self) -> int:
        return self.vocab_size if self.tokenizer_vocab_size is None else self.tokenizer_vocab_size

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


# The published layer shapes of models users run, as their config.json files on the Hugging Face
# Hub give them (Qwen/Qwen2.5-{1.5B,3B,7B}-Instruct, meta-llama/Llama-3.1-8B-Instruct), written
# here from those public configs. Built as the Llama architecture: Qwen2's q/k/v biases (a few
# KB a layer) are left out, the weight matrices are the same. Each comes twice: ``NAME`` with the
# local 32,000-token vocabulary (quick to build, like qwen2.5-0.5b), and ``NAME-full-vocab`` with
# the published vocabulary, whose embedding and output head are what a user's model reads. The
# tokenizer stays the local 32,000-token one (training BPE to 150k tokens takes many minutes):
# the ids above it exist only in the model, as Qwen2.5's own 271 padding rows do, which vLLM
# accepts (it checks prompt ids against the larger of the two) and llama.cpp's converter pads.
LOCAL_VOCAB = 32000
FULL_VOCAB_SUFFIX = "-full-vocab"
_QWEN = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
PUBLISHED: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("qwen2.5-0.5b", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
              intermediate_size=4864, vocab_size=151936, tie_embeddings=True, **_QWEN),
        Shape("qwen2.5-1.5b", hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
              intermediate_size=8960, vocab_size=151936, tie_embeddings=True, **_QWEN),
        Shape("qwen2.5-3b", hidden_size=2048, num_layers=36, num_heads=16, num_kv_heads=2,
              intermediate_size=11008, vocab_size=151936, tie_embeddings=True, **_QWEN),
        Shape("qwen2.5-7b", hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
              intermediate_size=18944, vocab_size=152064, tie_embeddings=False, **_QWEN),
        Shape("llama-3.1-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
              intermediate_size=14336, vocab_size=128256, tie_embeddings=False,
              max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
              rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=8192)),
    )
}


def _variants(published: Shape) -> tuple[Shape, Shape]:
    return (dataclasses.replace(published, vocab_size=LOCAL_VOCAB),
            dataclasses.replace(published, name=published.name + FULL_VOCAB_SUFFIX,
                                tokenizer_vocab_size=LOCAL_VOCAB))


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        # A few MB: for tests. Dimensions divide by 128 (int4 groups) and 16 (int4 packing).
        Shape("tiny", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
              intermediate_size=512, vocab_size=2048, tie_embeddings=True),
        # ~100M parameters.
        Shape("small", hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4,
              intermediate_size=2048, vocab_size=32000, tie_embeddings=True),
        # qwen2.5-0.5b with the local vocabulary: 386.5M parameters, 773 MB in bf16.
        *(v for p in PUBLISHED.values() for v in _variants(p)),
    )
}

DEFAULT_SHAPE = "tiny"
