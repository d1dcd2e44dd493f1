"""A byte-level BPE tokenizer (GPT-2 style) trained locally on a seeded synthetic corpus.

Nothing is downloaded. The corpus is pseudo-words made of random syllables with a Zipf-like
frequency, which gives BPE enough distinct pairs to reach any vocabulary size used here.
llama.cpp's converter knows this pre-tokenizer as "gpt-2".
"""

from __future__ import annotations

import json
import random
from pathlib import Path

BOS = EOS = "<|endoftext|>"
_ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t",
           "v", "w", "x", "z", "ch", "sh", "th", "st", "pr", "tr", "gr", "bl", "cl"]
_NUCLEI = ["a", "e", "i", "o", "u", "y", "ae", "ai", "ea", "ee", "io", "oo", "ou"]
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng"]


def _corpus(vocab_size: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    n_words = max(2000, vocab_size * 2)
    words = set()
    while len(words) < n_words:
        syl = rng.randint(1, 4)
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
                          for _ in range(syl)))
    ranked = sorted(words)
    rng.shuffle(ranked)
    lines, weights = [], [1.0 / (i + 1) ** 0.8 for i in range(len(ranked))]
    for _ in range(n_words // 4):
        sentence = rng.choices(ranked, weights=weights, k=12)
        lines.append(" ".join(sentence).capitalize() + rng.choice([".", ",", "?", "!", ";"]))
    lines.extend(ranked)  # every word at least once
    lines.append("0123456789 ()[]{}<>+-*/=_:'\"#@$%&|\\^~`")
    return lines


def train_tokenizer(vocab_size: int, seed: int = 0):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(vocab_size, seed), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer reached {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def save_tokenizer(tok, out_dir: Path, max_len: int) -> None:
    tok.save(str(out_dir / "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "unk_token": None, "pad_token": EOS,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
    }, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}, indent=2))
    assert eos_id == 0, eos_id
