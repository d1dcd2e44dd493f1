import json

import pytest
import torch
from safetensors.torch import save_file

from omni_ray.measure.regime import (CACHE_RESIDENT, DRAM_BOUND, checkpoint_bytes_per_token,
                                     describe, regime)

MiB = 1 << 20


def test_weights_that_fit_in_the_llc_are_cache_resident():
    assert regime(3_410_432, 32 * MiB) == CACHE_RESIDENT  # tiny on this EPYC's L3
    assert regime(32 * MiB, 32 * MiB) == CACHE_RESIDENT   # exactly the LLC still fits


def test_weights_larger_than_the_llc_are_dram_bound():
    assert regime(773_000_000, 32 * MiB) == DRAM_BOUND    # qwen2.5-0.5b
    assert regime(32 * MiB + 1, 32 * MiB) == DRAM_BOUND
    # the same weights on a 2-socket Xeon reaching 210 MiB of L3 are resident
    assert regime(200 * MiB, 210 * MiB) == CACHE_RESIDENT


@pytest.mark.parametrize("b,llc", [(None, MiB), (MiB, None), (0, MiB)])
def test_unknown_gives_no_regime(b, llc):
    assert regime(b, llc) is None


def test_describe_keeps_both_numbers():
    d = describe(100, 1000)
    assert d["decode_regime"] == CACHE_RESIDENT
    assert d["decode_weight_bytes_per_token"] == 100 and d["llc_bytes"] == 1000


@pytest.mark.parametrize("tie", [True, False])
def test_checkpoint_bytes_count_the_head_and_not_an_untied_embedding(tmp_path, tie):
    t = {"model.embed_tokens.weight": torch.zeros(100, 8, dtype=torch.bfloat16),
         "model.layers.0.mlp.up_proj.weight_packed": torch.zeros(16, 4, dtype=torch.uint8),
         "model.norm.weight": torch.zeros(8, dtype=torch.float32)}
    if not tie:
        t["lm_head.weight"] = torch.zeros(100, 8, dtype=torch.bfloat16)
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": tie}))
    # the head (tied: the embedding itself) 1600 B + packed 64 B + norm 32 B
    assert checkpoint_bytes_per_token(tmp_path) == 1600 + 64 + 32
