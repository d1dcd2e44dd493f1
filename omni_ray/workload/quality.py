"""The quality probe (``workload.quality``): the same fixed ids for every engine, the same names.

After an arm's speed is measured, its engine (the same process, the same loaded weights) reads
the log-probability of each id of one fixed sequence given the ids before it (teacher-forced:
every engine sees the same ids), then generates ``tokens`` greedy ids after the whole sequence.
The sequence is ``sequence_len`` ids drawn with one fixed seed in the model's vocabulary
(``token_prompts``' ordinary ids), so it depends on the vocabulary size only: a quantized model
and its bf16 source read the very same ids. ``results/quality.py`` pairs the records and
computes the figures; docs/quality.md says what they are worth.

Each engine returns ``probe_figures(...)``: ``quality_logprobs`` (``sequence_len - 1`` floats,
position i the log-probability of id i+1), ``quality_greedy_ids``, their summary
(``quality_mean_logprob``, ``quality_perplexity``), a digest of the ids read, and what the
pairing needs: ``quality_source`` (the bf16 checkpoint the weights come from) and
``quality_weights`` (what ran: the dtype, or the quantization).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence

from omni_ray.workload.prompts import token_prompts

# The one seed of the probe's ids: never the pass's seed, so every pass and engine reads the same.
QUALITY_SEED = 23_000_023
# A checkpoint written by vllm_omni.quantization.convert names its source here.
CONVERT_RECORD = "omni_quantize.json"


def probe_ids(vocab_size: int, sequence_len: int) -> list[int]:
    """The fixed sequence: ``sequence_len`` ids of a ``vocab_size`` vocabulary, always the same."""
    return token_prompts(1, sequence_len, vocab_size, seed=QUALITY_SEED)[0]


def ids_digest(ids: Sequence[int]) -> str:
    """First 16 hex digits of sha256 over the ids as JSON: two records read the same sequence
    exactly when their digests are equal."""
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:16]


def vocab_size_of(model_path: str) -> int:
    """The vocabulary size the probe's ids are drawn from, from the checkpoint's config.json
    (``text_config``'s for a multimodal one): what vLLM's and transformers' configs give, for an
    engine that reads a converted file (a GGUF) instead."""
    with open(os.path.join(model_path, "config.json")) as fh:
        config = json.load(fh)
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{model_path}/config.json: no vocab_size")
    return size


def source_of(model_path: str) -> str:
    """The bf16 checkpoint these weights come from: a converted checkpoint's recorded source
    (``omni_quantize.json``), else the directory itself (resolved)."""
    record = os.path.join(model_path, CONVERT_RECORD)
    if os.path.isfile(record):
        with open(record) as fh:
            source = json.load(fh).get("source")
        if source:
            return os.path.realpath(source)
    return os.path.realpath(model_path)


def weights_of(model_path: str, dtype: str, quantization: str | None) -> str:
    """What ran: the stage's quantization, else the checkpoint's own (``quantization_config``
    of its config.json), else the dtype."""
    if quantization:
        return quantization
    try:
        with open(os.path.join(model_path, "config.json")) as fh:
            method = (json.load(fh).get("quantization_config") or {}).get("quant_method")
    except (OSError, ValueError):
        method = None
    return method or dtype


def probe_figures(*, ids: Sequence[int], logprobs: Sequence[float], greedy_ids: Sequence[int],
                  tokens: int, model_path: str, dtype: str, quantization: str | None) -> dict:
    """The record's quality names, from one engine's probe: ``logprobs[i]`` is the
    log-probability of ``ids[i + 1]`` after ``ids[:i + 1]``; ``greedy_ids`` the ``tokens`` ids
    generated after the whole sequence."""
    logprobs = [float(v) for v in logprobs]
    if len(logprobs) != len(ids) - 1:
        raise ValueError(f"quality probe: {len(logprobs)} log-probabilities for a sequence of "
                         f"{len(ids)} ids (want {len(ids) - 1})")
    if len(greedy_ids) != tokens:
        raise ValueError(f"quality probe: {len(greedy_ids)} greedy ids, want {tokens}")
    mean = sum(logprobs) / len(logprobs)
    return {
        "quality_sequence_len": len(ids),
        "quality_ids_digest": ids_digest(ids),
        "quality_logprobs": logprobs,
        "quality_greedy_ids": [int(t) for t in greedy_ids],
        "quality_mean_logprob": mean,
        "quality_perplexity": math.exp(-mean),
        "quality_source": source_of(model_path),
        "quality_weights": weights_of(model_path, dtype, quantization),
    }
